"""A pull stream's turns in a fleet's pool of pullers (:mod:`event_etl.sources.pubsub_pool`), in place of its thread.

:class:`PooledStream` runs one pass of a :class:`~event_etl.sources.pubsub_stream.PullStream`'s loop at a time
(the stream's own steps: the same pull, the same spool rules) and says when the next is due: at once while the
subscription has a backlog, ``segment_age`` (``EVENT_ETL_PUBSUB_SEGMENT_AGE``, 0.5 s) after a pull that drained
it for now (fewer than :data:`SMALL_PULL` messages: a trickle), doubling up to :data:`IDLE_CAP` seconds while it is
quiet.  With no age thread, a turn closes the stream's open segment itself: when a pull finds the subscription
drained for now, or once the segment is old while a backlog keeps it growing.  A trickle's next pull waits as a
thread's open segment would wait for its age: pulled again at once, each pull of a few messages was a segment of its
own, its fsyncs and an acknowledgement (300 types at 10 events/s each kept the pool busy with them: issue 58,
bench/RESULTS.md "fleet-scale-live").
"""

from __future__ import annotations

import math
import time
from typing import Any

from event_etl import faults
from event_etl.sources.pubsub_pool import PooledRunner
from event_etl.sources.pubsub_stream import PAUSE_FIRST, PULL_MAX, PullStream, _deadline_exceeded

SUSPENDED = math.inf
"""A turn's answer while its pull is in flight: no next turn until the pull's answer schedules it."""


def err_no_answer() -> Exception:
    return _deadline_exceeded("no answer")

__all__ = ["PooledStream", "IDLE_CAP", "SMALL_PULL"]

IDLE_CAP = 2.0
"""Seconds: the longest pause of a pooled stream between two empty pulls (a thousand quiet subscriptions, a pull
every two seconds each)."""
SMALL_PULL = 100
"""A pull of fewer messages than this found the subscription drained for now (the emulator answers at most 100)."""


class PooledStream:
    """One stream's turns (see the module docstring); ``idle``: the pause before its next turn while it is quiet."""

    def __init__(self, stream: PullStream) -> None:
        self.stream = stream
        self.idle = PAUSE_FIRST
        self.runner: PooledRunner | None = None  # its place in the pool (its answer's callback schedules it)
        self.sent: tuple[Any, float, int] | None = None  # a pull sent and not yet taken: (future, sent, sent ms)
        self.wait = 0.0  # after an outage: the seconds before the next pull

    def turn(self) -> float | None:
        """One turn of the stream in a fleet's pool of pullers (:mod:`event_etl.sources.pubsub_pool`), in place of a
        pass of its thread's loop (:meth:`PullStream._pull_loop`: the same steps, the same spool rules): one pull,
        made durable and acknowledged.  Returns the seconds until its next turn (0 while the subscription has a
        backlog, growing while it is quiet), or None once it has ended: the fetcher stopped (what it held written
        or handed back, as at the end of :meth:`PullStream.run`), or it died (the job stops with the cause)."""
        f = self.stream.fetcher
        try:
            delay = self._turn()
        except Exception as err:  # noqa: BLE001 - a stream that dies stops the job, with the cause
            f.died(f"pulling from {f.subscription}", err)
            delay = None
        if delay is None:
            try:
                self.stream._flush()
            finally:
                self.stream.hand_back()  # pulled and not spooled (a stop, a death): delivered again at once
        return delay

    def cancel_in_flight(self) -> None:
        """The fetcher stops: cancel a pull sent and unanswered (its callback brings the turn that ends the stream;
        what the service may have leased for it stays leased until its lease runs out: :meth:`_landed`)."""
        sent = self.sent
        if sent is not None:
            sent[0].cancel()

    def _turn(self) -> float | None:
        """A pooled stream's turn (``spooled`` only: a fleet's fetchers acknowledge once durable)."""
        f = self.stream.fetcher
        if self.sent is None:
            wait = self._held_up()
            if wait is not None:
                return wait if f.pulling() else None
            if self.runner is not None and hasattr(f.client, "pull_future"):
                return self._send()  # its answer brings the next turn: no puller waits for it
            pulled = self.stream._pull()  # a client without futures (a test's fake of the service): waited for
        else:
            if not self.sent[0].done():
                return SUSPENDED  # a turn brought forward (a stop): the answer still brings the next one
            pulled = self._landed()
        if pulled is None:  # an outage waited for, or an error that stops the job
            return self.wait if f.pulling() else None
        data, raw, sent, _sent_ms = pulled
        n = len(raw.received_messages) if raw is not None else 0
        if n == 0:
            self.stream._pulled_none(sent)
            self._quiet()
            self.idle = min(IDLE_CAP, self.idle * 2)
            return self.idle
        self.idle = PAUSE_FIRST
        ids = self.stream.pending  # in hand since the pull read the answer: handed back if the stream ends from here
        if f.stopping():
            return None
        faults.point("pulled", str(n))  # pulled, not yet in a segment
        self.stream._take(data, ids, n)
        if not self.stream._spool_pull(data, raw, ids, n, sent):  # durable and acknowledged before the next pull
            return None if f.fenced else f.stalls.disk_full_wait(time.monotonic())
        if n < SMALL_PULL:  # the subscription gave what it had: offered at the next trigger, no age thread needed
            self._quiet()
            return f.settings.segment_age  # a trickle: what comes meanwhile is the next segment
        self._close_if_old()  # a backlog: the open segment grows until it is full or old, as a thread's age loop
        return 0.0

    def _send(self) -> float:
        """Send the pull without waiting for it: its answer schedules the stream's next turn, which takes it
        (:meth:`_landed`).  A quiet subscription's pull waits in the service for messages while no puller does."""
        f = self.stream.fetcher
        sent, sent_ms = time.monotonic(), f.clock()
        f.requests["pull"] += 1
        future = f.client.pull_future(subscription=f.subscription, max_messages=PULL_MAX,
                                      timeout=f.settings.pull_timeout)
        self.sent = (future, sent, sent_ms)
        runner = self.runner
        if runner is not None:
            future.add_done_callback(lambda _f: runner.pool.schedule(runner, 0.0))
        return SUSPENDED

    def _landed(self) -> tuple[bytes, Any, float, int] | None:
        """The answer of the pull :meth:`_send` sent, taken as a stream's :meth:`PullStream._pull` takes its own
        (the same outcomes: messages in hand, a quiet subscription, an outage waited for, an error that stops the
        job); ``self.wait``: the seconds to wait before the next pull after an outage."""
        from google.api_core import exceptions as ex

        from event_etl.sources.pubsub_stream import transient_errors
        from event_etl.sources.pubsub_wire import pull_bytes

        assert self.sent is not None
        future, sent, sent_ms = self.sent
        self.sent, self.wait = None, 0.0
        f = self.stream.fetcher
        if future.cancelled():  # the fetcher stops: the service may have leased what it was about to answer
            f.acks.maybe_served(sent_ms)  # so the stop is not clean, and the next run settles, as after a kill
            return None
        try:
            data, raw = pull_bytes(f.client.answer(future))
        except ex.DeadlineExceeded:  # a quiet subscription's pull ran out (the real service), or an outage
            f.acks.maybe_served(sent_ms)
            if self.stream._reachable():
                f.stalls.answered()
                return b"", None, sent, sent_ms
            if f.error is None:
                self.wait = f.outage("pull", err_no_answer())
            return None
        except transient_errors() as err:
            f.acks.maybe_served(sent_ms)  # a connection dropped after the service answered leaves messages leased
            self.wait = f.outage("pull", err)
            return None
        except ex.GoogleAPICallError as err:
            from event_etl.sources.pubsub import permanent_error

            f.fail(permanent_error(f.subscription, err))
            return None
        except BaseException:  # as PullStream._pull: what it may have leased stays leased, the stream dies
            f.acks.maybe_served(sent_ms)
            raise
        f.stalls.answered()
        if f.pool is not None:
            f.pool.answered_at = time.monotonic()
        with f.lock:  # in hand: from here any end of the stream hands them back
            self.stream.pending, self.stream.pending_sent = [rm.ack_id for rm in raw.received_messages], sent_ms
        return data, raw, sent, sent_ms

    def _held_up(self) -> float | None:
        """Seconds until a pooled stream may pull again, or None if it may pull now: stopped (0), no room in its
        spool or over its share of the fleet's, or parked while another stream watches the quiet subscription."""
        f = self.stream.fetcher
        s = f.settings
        if not f.pulling():
            return 0.0
        with f.lock:
            msgs, size = f.held_totals()
            if msgs >= s.max_held_messages or size >= s.max_held_bytes:  # no room: the next turn looks again
                f.count_leftovers()
                return 0.5
        if f.pool is not None and not f.pool.room_for(f):  # the application's bound: above its fair share
            return 0.5
        with f.lock:
            if f.parking.parked(self.stream.index):  # quiet, and another stream of the type watches it
                return self.idle
        return None

    def _close_if_old(self) -> None:
        f = self.stream.fetcher
        with f.lock:
            self.stream.close_if_old(time.monotonic(), f.settings.segment_age)
            unclosed = self.stream.unclosed
        if unclosed is not None:
            f.disk_full(unclosed)

    def _quiet(self) -> None:
        """A pooled stream found its subscription drained for now: close its open segment (no thread closes it when
        it is old), or retry a close that found no room."""
        f = self.stream.fetcher
        if not f.settings.spooled:
            return
        with f.lock:
            self.stream.close_if_idle()
            unclosed = self.stream.unclosed
        if unclosed is not None:
            f.disk_full(unclosed)
