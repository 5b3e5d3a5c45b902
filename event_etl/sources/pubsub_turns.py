"""A pull stream's turns in a fleet's pool of pullers (:mod:`event_etl.sources.pubsub_pool`), in place of its thread.

:class:`PooledStream` runs one pass of a :class:`~event_etl.sources.pubsub_stream.PullStream`'s loop at a time
(the stream's own steps: the same pull, the same spool rules) and says when the next is due: at once while the
subscription has a backlog, doubling up to :data:`IDLE_CAP` seconds while it is quiet.  With no age thread, a turn
closes the stream's open segment itself: when a pull finds the subscription drained for now (fewer than
:data:`SMALL_PULL` messages), or once the segment is old while a backlog keeps it growing.
"""

from __future__ import annotations

import time

from event_etl import faults
from event_etl.sources.pubsub_stream import PAUSE_FIRST, PullStream

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

    def _turn(self) -> float | None:
        """A pooled stream's turn (``spooled`` only: a fleet's fetchers acknowledge once durable)."""
        f = self.stream.fetcher
        wait = self._held_up()
        if wait is not None:
            return wait if f.pulling() else None
        pulled = self.stream._pull()
        if pulled is None:  # an outage waited for, or an error that stops the job
            return 0.0 if f.pulling() else None
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
        else:  # a backlog: the open segment grows until it is full or old, as a thread's age loop closes it
            self._close_if_old()
        return 0.0

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
