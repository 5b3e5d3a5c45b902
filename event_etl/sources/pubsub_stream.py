"""One pull stream of a Pub/Sub fetcher: pull, make durable, acknowledge, pull again.

A fetcher (:class:`~event_etl.sources.pubsub_fetch.Fetcher`) runs ``streams`` of these, each
a thread looping on a synchronous pull of up to :data:`PULL_MAX` messages:

- **Flow control first.**  Before each pull a stream waits while the spool holds
  ``max_held_messages`` or ``max_held_bytes`` that no batch has saved, and parks while the
  subscription is empty and another stream is watching it (:class:`Parking`).
- **The pull** (:meth:`PullStream._pull`): an empty answer, or a pull that runs out while the
  service is reachable, is a quiet subscription; a transient error is an outage, retried with
  backoff by the fetcher (:meth:`~event_etl.sources.pubsub_fetch.Fetcher.outage`); a permanent
  one stops the job.  Its ack ids are *in hand* from the moment its answer is read: however
  the stream ends from there, they are handed back (:meth:`PullStream.hand_back`).
- **Durable** (``spooled``, :meth:`PullStream._spool_pull`): the pull is appended to the
  stream's open segment and synced, then acknowledged, before the next pull; the segment is
  closed (:meth:`PullStream._roll`) once full or old, and the planner may offer it from then.
  A full disk hands the pull back and waits for room, as in an outage; a segment another
  writer fenced stops every stream of the fetcher.  ``committed``: pulls collect in the
  stream's buffer and are written as one segment (:meth:`PullStream._flush`) once full or old,
  their deadlines extended from then until their batch is saved.

The spool sweep (tests/sweeps/spool_sweep.py) names its windows by the functions on the stack,
e.g. ``_spool_pull > append > _append: fdatasync segments/*.open``: renaming a method here renames
windows there.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from event_etl import faults
from event_etl.errors import SourceError
from event_etl.sources.pubsub_ack import Acknowledger, Held, acknowledge_in_bulk
from event_etl.sources.pubsub_pool import PullerPool
from event_etl.sources.pubsub_settings import FetchSettings
from event_etl.sources.pubsub_stalls import Stalls
from event_etl.sources.spool import AppendFailed, OpenSegment, SegmentFenced, SegmentName, Spool, oldest_of

__all__ = ["PullStream", "Parking", "StreamOwner", "PULL_MAX", "PAUSE_FIRST", "PAUSE_CAP"]

PULL_MAX = 1000
PAUSE_FIRST, PAUSE_CAP = 0.05, 0.5
"""Seconds: the shortest and the longest pause of a stream between two empty pulls (doubling while they are)."""
POOLED_PULL_TIMEOUT = 2.0
"""Seconds: the longest a pooled stream's pull waits for messages (the real service holds a pull on a quiet
subscription until its deadline)."""
REACHABLE_FOR = 10.0
"""Seconds: how long the service answering a call of a fleet's pool vouches that it is there, for pulls that ran out
(a blackhole is the network's, not one subscription's)."""



def transient_errors() -> tuple[type[Exception], ...]:
    from google.api_core import exceptions as ex

    return (ex.ServiceUnavailable, ex.DeadlineExceeded, ex.InternalServerError, ex.Aborted,
            ex.ResourceExhausted, ex.Unknown, ex.RetryError, ex.GatewayTimeout, ex.BadGateway)


def _deadline_exceeded(message: str) -> Exception:
    """api_core's ``DeadlineExceeded`` (what a pull that ran out raises), whose class carries no annotations."""
    from google.api_core import exceptions as ex

    make: Callable[[str], Exception] = ex.DeadlineExceeded
    return make(message)


class Parking:
    """While the subscription is empty, one stream (the watcher) keeps pulling and the others wait here until it
    brings messages: a quiet subscription costs one pending pull, not one per stream (on the emulator every pending
    pull scans every unacknowledged message 20 times a second).  On the fetcher's lock."""

    def __init__(self, lock: threading.Lock) -> None:
        self.wake = threading.Condition(lock)  # parked streams wait here for the watcher to find messages
        self.empty = False  # the last pull found the subscription empty
        self.watcher: int | None = None  # the one stream that keeps pulling while it is empty

    def park(self, index: int, pulling: Callable[[], bool]) -> None:
        with self.wake:
            while pulling() and self.empty and self.watcher not in (None, index):
                self.wake.wait(0.25)
            if self.empty and self.watcher is None:
                self.watcher = index

    def parked(self, index: int) -> bool:
        """Whether stream ``index`` waits now, without waiting (a pooled stream's turn, with the lock held): the
        subscription is empty and another stream watches it; else it pulls (and watches, if none does)."""
        if self.empty and self.watcher is None:
            self.watcher = index
        return self.empty and self.watcher != index

    def found_empty(self, index: int) -> None:
        """Stream ``index``'s pull brought nothing (with the lock held): it watches, if no stream does."""
        self.empty = True
        if self.watcher is None:
            self.watcher = index

    def found_messages(self) -> None:
        """A pull brought messages (with the lock held): every stream pulls again."""
        if self.empty:
            self.empty, self.watcher = False, None
            self.wake.notify_all()


class StreamOwner(Protocol):
    """What a stream asks of its fetcher (:class:`~event_etl.sources.pubsub_fetch.Fetcher`): its settings and
    spool, the state every stream shares (read and changed with ``lock`` held), and what ends or holds up pulling."""

    subscription: str
    settings: FetchSettings
    run: str
    once: bool
    spool: Spool
    pool: PullerPool | None
    acks: Acknowledger
    lock: threading.Lock
    room: threading.Condition
    parking: Parking
    stalls: Stalls
    requests: Counter[str]
    error: SourceError | None
    fenced: bool
    pulled: int
    delivered_at: int | None
    clock: Callable[[], int]

    @property
    def client(self) -> Any: ...
    def pulling(self) -> bool: ...
    def stopping(self) -> bool: ...
    def pause(self, seconds: float) -> None: ...
    def held_totals(self) -> tuple[int, int]: ...
    def count_leftovers(self) -> None: ...
    def fail(self, err: SourceError) -> None: ...
    def died(self, doing: str, err: Exception) -> None: ...
    def outage(self, what: str, err: Exception) -> float: ...
    def disk_full(self, err: AppendFailed) -> None: ...
    def room_again(self) -> None: ...
    def was_fenced(self, stream: PullStream, why: str) -> None: ...
    def fenced_out(self) -> None: ...
    def check_drained(self) -> None: ...
    def segment_acked(self, name: str, ok: bool) -> None: ...


class PullStream:
    """One stream of ``fetcher`` (see the module docstring).  Its fields are read and changed with the fetcher's
    lock held (its own thread's pull aside), so that a look at the backlog or a stop sees them whole."""

    def __init__(self, fetcher: StreamOwner, index: int) -> None:
        self.fetcher = fetcher
        self.index = index
        self.seq = 0
        self.buffer: list[bytes] = []  # committed: the pulls of its next segment
        self.ack_ids: list[str] = []
        self.count = 0
        self.bytes = 0
        self.opened = 0.0
        self.empty_since: float | None = None  # monotonic time of its first empty pull after messages
        self.open: OpenSegment | None = None  # spooled: the segment its pulls are appended to
        self.open_acked = True  # spooled: every pull appended to it was acknowledged
        self.inflight = 0  # spooled: pulls appended and not yet acknowledged (the segment is not closed meanwhile)
        self.pending: list[str] = []  # ack ids pulled, neither acknowledged nor handed back yet
        self.pending_sent = 0  # when (ms, wall clock) the pull that brought them was sent
        self.unclosed: AppendFailed | None = None  # spooled: its open segment's close found no room (it stays open)

    def run(self) -> None:
        """The stream's thread.  However it ends (a stop, a full disk, any exception, a bug's included), the pull it
        has in hand is not left leased unsaid: its messages are handed back (a deadline of 0, as on a full disk:
        delivered again at once, and a stop that handed everything back is clean), and what cannot be handed back
        (the hand-back fails, or the answer was never read, so no id is known) is recorded as leased until its lease
        runs out (:meth:`Acknowledger.maybe_served`), so the stop is not clean and the next run settles, as after a
        kill."""
        try:
            self._pull_loop()
        except Exception as err:  # noqa: BLE001 - a stream that dies stops the job, with the cause
            self.fetcher.died(f"pulling from {self.fetcher.subscription}", err)
        finally:
            self.hand_back()  # pulled and not spooled (a stop, a death): delivered again at once

    def hand_back(self) -> None:
        """Give the stream's pulled, unspooled messages back to Pub/Sub at once (:meth:`Acknowledger.hand_back`)."""
        with self.fetcher.lock:
            ids, sent, self.pending = self.pending, self.pending_sent, []
        if ids:
            self.fetcher.acks.hand_back(ids, sent)

    def _wait_for_room(self) -> None:
        f = self.fetcher
        s = f.settings
        with f.room:
            while f.pulling():
                msgs, size = f.held_totals()
                if msgs < s.max_held_messages and size < s.max_held_bytes:
                    return
                f.count_leftovers()  # the planner deletes committed segments of earlier runs
                f.room.wait(0.5)

    def _pull_loop(self) -> None:
        """Pull, make durable (and, ``spooled``, acknowledge), pull again, while the fetcher pulls.

        What touches the spool or Pub/Sub is called from here, as the spool sweep names its windows
        (``_spool_pull > acknowledge_in_bulk: acknowledge``, tests/sweeps/spool_sweep.py): the pull itself and its
        failures (:meth:`_pull`), the segment written (:meth:`_flush`, ``committed``) or appended to and
        acknowledged (:meth:`_spool_pull`, ``spooled``)."""
        f = self.fetcher
        pause, segment_age = PAUSE_FIRST, f.settings.segment_age
        while f.pulling():
            self._wait_for_room()
            f.parking.park(self.index, f.pulling)
            if not f.pulling():
                break
            pulled = self._pull()
            if pulled is None:  # an outage waited for, or an error that stops the job
                continue
            data, raw, sent, _sent_ms = pulled
            n = len(raw.received_messages) if raw is not None else 0
            if n == 0:
                self._flush()
                self._pulled_none(sent)
                f.pause(pause)
                pause = min(PAUSE_CAP, pause * 2)
                continue
            pause = PAUSE_FIRST
            ids = self.pending  # in hand since :meth:`_pull` read the answer: handed back if the stream dies from here
            if f.stopping():  # stopping (a stop whose wait for this pull ran out): hand them back
                break
            faults.point("pulled", str(n))  # pulled, not yet in a segment
            self._take(data, ids, n)
            if not f.settings.spooled:
                if self.count >= f.settings.segment_messages or time.monotonic() - self.opened >= segment_age:
                    self._flush()  # the stream's segment, once full or old
            elif not self._spool_pull(data, raw, ids, n, sent):  # durable and acknowledged before the next pull
                if f.fenced:
                    break
                f.pause(f.stalls.disk_full_wait(time.monotonic()))
        self._flush()

    def _pull(self) -> tuple[bytes, Any, float, int] | None:
        """One pull: ``(its bytes, the parsed PullResponse or None for an empty pull, when it was sent on the
        monotonic clock and in ms on the wall clock)``; None when it failed (an outage, waited for before the next
        try, or a permanent error, which stops the job)."""
        from google.api_core import exceptions as ex

        from event_etl.sources.pubsub_wire import pull_bytes

        f = self.fetcher
        sent = time.monotonic()
        sent_ms = f.clock()
        try:
            f.requests["pull"] += 1
            data, raw = pull_bytes(f.client.pull(subscription=f.subscription, max_messages=PULL_MAX,
                                                 timeout=self._pull_timeout()))
            if not raw.received_messages and faults.empty_pulls_run_out():
                time.sleep(f.settings.pull_timeout)  # as the real service answers a quiet subscription
                raise _deadline_exceeded("Deadline Exceeded")
        except ex.DeadlineExceeded:
            # the real service lets a pull on a quiet subscription run out: empty, if the service is there.  Its
            # answer may also have been lost after it leased messages: they may stay leased for a lease
            f.acks.maybe_served(sent_ms)
            if self._reachable():
                f.stalls.answered()
                return b"", None, sent, sent_ms
            if f.error is None:
                time.sleep(f.outage("pull", _deadline_exceeded("no answer")))
            return None
        except transient_errors() as err:
            f.acks.maybe_served(sent_ms)  # a connection dropped after the service answered leaves messages leased
            time.sleep(f.outage("pull", err))
            return None
        except ex.GoogleAPICallError as err:
            from event_etl.sources.pubsub import permanent_error

            f.fail(permanent_error(f.subscription, err))
            return None
        except BaseException:
            # Anything else (a bug, an answer that cannot be read): the stream dies (the job stops with the cause),
            # and the service may have leased what it served with no id of it known here to hand back.  As for an
            # answer lost in a dropped connection, they stay leased for a lease from the pull's sending: the stop is
            # not clean and the next run settles until then (RELIABILITY.md, "The spool as a write-ahead log").
            f.acks.maybe_served(sent_ms)
            raise
        f.stalls.answered()
        if f.pool is not None:
            f.pool.answered_at = time.monotonic()
        with f.lock:  # in hand: from here any exit of the stream hands them back (:meth:`run`)
            self.pending, self.pending_sent = [rm.ack_id for rm in raw.received_messages], sent_ms
        return data, raw, sent, sent_ms

    def _pull_timeout(self) -> float:
        """How long a pull may wait for messages: ``pull_timeout``; a pooled stream's at most
        :data:`POOLED_PULL_TIMEOUT` (it holds one of the fleet's few pullers while it waits)."""
        f = self.fetcher
        return f.settings.pull_timeout if f.pool is None else min(f.settings.pull_timeout, POOLED_PULL_TIMEOUT)

    def _reachable(self) -> bool:
        """After a pull ran out: is the service there (the subscription quiet), or is this an outage?  In a fleet's
        pool, the service answering any of its calls within :data:`REACHABLE_FOR` seconds vouches for it (a thousand
        quiet subscriptions would otherwise each ask it after every pull); a single type's stream always asks."""
        from google.api_core import exceptions as ex

        f = self.fetcher
        if f.pool is not None and time.monotonic() - f.pool.answered_at < REACHABLE_FOR:
            return True
        try:
            f.requests["get_subscription"] += 1
            f.client.get_subscription(subscription=f.subscription, timeout=5)
            if f.pool is not None:
                f.pool.answered_at = time.monotonic()
            return True
        except transient_errors():
            return False
        except ex.GoogleAPICallError as err:
            from event_etl.sources.pubsub import permanent_error

            f.fail(permanent_error(f.subscription, err))
            return False

    def _pulled_none(self, sent: float) -> None:
        """A pull sent at ``sent`` (monotonic) brought nothing: the subscription is empty for now (``once``: maybe
        drained)."""
        f = self.fetcher
        with f.lock:
            f.parking.found_empty(self.index)
            if self.empty_since is None:
                self.empty_since = sent  # the pull waited for messages from then on, and none came
        if f.once:
            f.check_drained()

    def _take(self, data: bytes, ids: list[str], n: int) -> None:
        """The stream holds a pull of ``n`` messages (``committed``: in its buffer, for its next segment)."""
        f = self.fetcher
        with f.lock:
            self.empty_since = None
            f.parking.found_messages()  # messages again: every stream pulls
            f.pulled += n
            f.delivered_at = f.clock()
            if not f.settings.spooled:
                if not self.buffer:
                    self.opened = time.monotonic()
                self.buffer.append(data)
                self.ack_ids.extend(ids)
                self.count += n
                self.bytes += len(data)
                self.pending = []  # held for the batch from here on (and extended)

    def _spool_pull(self, data: bytes, raw: Any, ids: list[str], n: int, sent: float) -> bool:
        """``spooled``: append the pull to the stream's open segment durably, acknowledge it, and close the segment
        (the planner may offer it from then on) once it is full or old.

        False if it could not be made durable: the disk is full (the pull is handed back, and the stream waits for
        room), or another writer finished the segment (the fetcher is fenced: it pulls no more).  Any other failure
        raises (the job stops with it).  The append runs outside the fetcher's lock: one stream's sync never waits
        for another's."""
        f = self.fetcher
        try:
            with f.lock:
                seg = self.open
                if seg is not None:
                    self.inflight += 1  # from here until it is acknowledged, the segment is not closed under it
            if seg is None:
                seg = f.spool.open_segment(f.run, self.index, self.seq)
                with f.lock:
                    self.open, self.open_acked, self.opened, self.seq = seg, True, time.monotonic(), self.seq + 1
                    self.inflight += 1
            try:
                seg.append(data, n, oldest_of(raw))
            except BaseException:
                with f.lock:
                    self.inflight -= 1
                raise
        except AppendFailed as err:
            self.hand_back()
            if not err.full:
                raise
            f.disk_full(err)
            return False
        except SegmentFenced as err:
            self.hand_back()
            f.was_fenced(self, str(err))
            return False
        if f.stalls.disk_full_since is not None:
            with f.lock:
                f.room_again()
        faults.point("spooled", seg.path.name)  # durable, not yet acknowledged nor offered to Spark
        try:
            ok = acknowledge_in_bulk(f.client, f.subscription, ids, f.requests)
        except BaseException:
            with f.lock:
                # durable and not acknowledged: the stream's death hands them back (:meth:`run`), so they come again,
                # and the segment holding this copy is not all acknowledged (the batch that reads it keeps its
                # dedupe keys for the redelivery, as after a failed acknowledgement)
                self.open_acked = False
                self.inflight -= 1
            raise
        in_time = time.monotonic() - sent < f.acks.lease_seconds
        faults.point("spool_acked", seg.path.name)  # acknowledged: the spool is the only copy until its batch commits
        with f.lock:
            self.inflight -= 1  # with the flags below set: the segment is closed knowing whether all was acknowledged
            self.pending = []
            if not f.acks.pull_acked(n, sent, ok=ok, in_time=in_time):
                self.open_acked = False
            if self.open is seg and (seg.count >= f.settings.segment_messages
                                     or time.monotonic() - self.opened >= f.settings.segment_age):
                self._roll()
        if self.unclosed is not None:
            f.disk_full(self.unclosed)
        return True

    def close_if_idle(self) -> None:
        """Close its open segment unless a pull is being appended to it (with the lock held)."""
        if self.open is not None and not self.inflight:
            self._roll()

    def close_if_old(self, now: float, age: float) -> None:
        """Close its open segment once it is ``age`` old, or retry a close that found no room (lock held)."""
        due = now - self.opened >= age or self.unclosed is not None
        if self.open is not None and not self.inflight and due:
            self._roll()

    def _roll(self) -> None:
        """Close the stream's open segment (with the lock held): a segment from now on, held until a batch saves it."""
        f = self.fetcher
        seg = self.open  # still counted as open while it closes: a look at the backlog never misses it
        if seg is None:
            return
        try:
            name = seg.close()
        except SegmentFenced:
            self.open = None
            f.fenced_out()  # finished by another writer, with everything acknowledged in it
            return
        except AppendFailed as err:
            if not err.full:
                self.open = None
                raise
            # no room for its rename: it stays open (and counted), its pulls durable and acknowledged; the disk is
            # full (:meth:`Fetcher.disk_full`, called by whoever rolled it, outside the lock) until a close or an
            # append finds room
            self.unclosed = err
            return
        except BaseException:
            self.open = None
            raise
        if self.unclosed is not None:
            self.unclosed = None
            f.room_again()
        if name is not None:
            f.acks.held[name.name] = Held([], name.count, seg.bytes, written=True, acked=self.open_acked)
            f.segment_acked(name.name, self.open_acked)
        self.open = None

    def forget_open(self) -> None:
        """Another writer finished its open segment: let go of it without closing it (with the lock held)."""
        if self.open is not None:
            try:
                os.close(self.open.fd)
            except OSError:
                pass
            self.open = None

    def flush_if_old(self, now: float, age: float) -> None:
        """``committed``: write its buffer as a segment once it is ``age`` old."""
        with self.fetcher.lock:
            due = bool(self.buffer) and now - self.opened >= age
        if due:
            self._flush()

    def _flush(self) -> None:
        """``committed``: write the stream's open segment durably, then extend its messages' deadlines at once."""
        f = self.fetcher
        with f.lock:
            if not self.buffer:
                return
            name = SegmentName(f.run, self.index, self.seq, self.count)
            buffer, ids, count, size = self.buffer, self.ack_ids, self.count, self.bytes
            self.buffer, self.ack_ids, self.count, self.bytes = [], [], 0, 0
            self.seq += 1
            # held before it is written: flow control and the extender count it from now on
            held = f.acks.held[name.name] = Held(ids, count, size, written=False)
        f.spool.write_segment(name, buffer)
        held.written = True
        faults.point("spooled", name.name)  # durable, not yet offered to Spark
        f.acks.modify(ids, f.settings.ack_deadline)
