"""Pulling a Pub/Sub subscription continuously, in parallel, off the trigger's path.

:class:`Fetcher` runs beside the micro-batches (threads of the job's driver process).
Several *streams* each loop on a synchronous pull of up to 1,000 messages and write what
they get to spool segments in the checkpoint (:class:`~event_etl.sources.spool.Spool`).  The planner
(:class:`event_etl.sources.pubsub.PubSubPlanner`) offers Spark the segments that exist; a
micro-batch takes what has accumulated, while the streams go on pulling for the next one.

When a message is acknowledged is a setting, ``EVENT_ETL_PUBSUB_ACK`` (docs/production.md):

- ``spooled`` (the default), as Dataflow, Spark Streaming's write-ahead log and Flink's
  Pub/Sub source do: **pull, make durable, acknowledge, pull again**.  Each pull's
  messages become one segment, written durably (the file and its directory synced), then
  acknowledged in one request before the stream pulls again: nothing stays leased longer
  than one pull's write, no deadline is ever extended, and a killed process leaves at most
  one pull per stream to be delivered again.  The spool is then the write-ahead log: the
  only copy of an acknowledged message until its batch commits, so the checkpoint must be
  on durable storage (the job warns at start when it can tell it is not).
- ``committed``: the segments are written as above (several pulls to a segment, up to
  ``segment_messages`` or ``segment_age``), the messages stay leased, their deadlines
  extended in bulk every quarter of ``ack_deadline``, and they are acknowledged when the
  batch that read them is saved (:meth:`Fetcher.ack`).  Nothing acknowledged is ever only on
  the job's disk; the cost is every lease held (on the emulator, a pull's time grows with
  what is leased; on the service, modifyAckDeadline requests and, after a kill, every held
  message delivered again one deadline later).

Either way:

- **Durable before offered.**  A message is in a segment on disk before Spark can see an
  offset covering it; a replayed batch reads the same segments, which are deleted only once
  the batch that read them has committed.
- **Bounded by the spool.**  Streams stop pulling while the spool holds ``max_held_messages``
  messages or ``max_held_bytes`` bytes that no batch has saved yet: a backlog of ten million
  messages stays in Pub/Sub, never on the job's disk or in its memory at once.
- **A restart after an unclean stop waits out the leases.**  A run records in the spool
  (``run.json``) the longest lease it may grant and, when it stops, whether it left any
  message leased.  The next run, finding an unclean stop, is *settling* until that lease has
  run out (on the monotonic clock, from its start): the messages the killed run held come
  back meanwhile, and until then the watermark holds, no hour is marked, the quiet time of
  the idle rule does not run, and ``once`` does not take the subscription for empty
  (:meth:`Fetcher.activity`, ``settling``; :mod:`event_etl.sources.pubsub_run`).

An empty pull is empty, whether the service answers with no messages (the emulator) or
lets the call run out (``DeadlineExceeded``, what the real service does on a quiet
subscription); whether the service is reachable at all is then checked with a cheap call,
so that an outage is never taken for a quiet subscription.  Transient errors are retried
with backoff for up to ``outage_timeout``, reported meanwhile as an outage (the watermark
does not follow the clock); then, or at once for a permanent error, the fetcher records the
error where the planner finds it, and the job stops with it.  With ``once``, the fetcher
stops when the subscription has stayed empty for ``once_quiet`` seconds (once per run) and
leaves a ``DRAINED`` mark for the planner.

The fetcher is made of parts, a module each, held together by :class:`Fetcher`:

- :mod:`~event_etl.sources.pubsub_stream`: a pull stream (:class:`~event_etl.sources.pubsub_stream.PullStream`),
  its thread's loop from the wait for room in the spool to the segment closed;
- :mod:`~event_etl.sources.pubsub_ack`: acknowledgements, deadlines and hand-backs, and the
  ledger of what the run holds (:class:`~event_etl.sources.pubsub_ack.Acknowledger`);
- :mod:`~event_etl.sources.pubsub_run`: the run record and the settling after an unclean stop
  (:class:`~event_etl.sources.pubsub_run.FetchRun`);
- :mod:`~event_etl.sources.pubsub_stalls`: outages and full disks, since when and how long to wait;
- :mod:`~event_etl.sources.spool`: the spool itself (:class:`~event_etl.sources.spool.Spool`),
  the only code that knows its files.

:class:`Fetcher` starts and stops the threads (the streams, the age loop that closes or writes
segments once they are old, and, ``committed``, the deadline extender), answers the job
(:meth:`~Fetcher.activity`, :meth:`~Fetcher.ack`, :meth:`~Fetcher.settling`), stops the job
with the cause of an error, and ends a ``once`` run (``DRAINED``).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from event_etl.errors import SourceError
from event_etl.rules.watermark import SourceActivity
from event_etl.sources import live
from event_etl.sources.pubsub_ack import ACK_CHUNK, Acknowledger, HeldSegments, acknowledge_in_bulk
from event_etl.sources.pubsub_pool import PooledRunner, PullerPool
from event_etl.sources.pubsub_run import FetchRun, subscription_deadline
from event_etl.sources.pubsub_settings import ACK_MODES, FetchSettings, spool_warning
from event_etl.sources.pubsub_stalls import WAIT_CAP, WAIT_FIRST, Stalls, waited_since
from event_etl.sources.pubsub_stream import Parking, PullStream
from event_etl.sources.pubsub_turns import PooledStream
from event_etl.sources.spool import DRAINED, AppendFailed, RunRecord, Spool

__all__ = ["Fetcher", "SharedRun", "FetchSettings", "RunRecord", "DRAINED", "ACK_CHUNK", "ACK_MODES", "subscriber",
           "acknowledge_in_bulk", "stats_line", "subscription_deadline", "spool_warning", "waited_since", "WAIT_FIRST",
           "WAIT_CAP"]

log = logging.getLogger(__name__)


def subscriber(factory: Callable[[], Any] | None) -> Any:
    """A subscriber client: ``factory()`` (tests: a fake of the real service, with the library client's methods),
    else Pull and Acknowledge on the gRPC wire (:mod:`event_etl.sources.pubsub_wire`), from the environment."""
    if factory is not None:
        return factory()
    from event_etl.sources.pubsub_wire import shared_subscriber

    return shared_subscriber()  # one channel for every fetcher of the process (a fleet's thousand types too)


def _within(seconds: float, work: Callable[[], bool], name: str) -> bool | None:
    """``work()`` in a thread of its own named ``name``, waited for at most ``seconds``: what it returned, or None if
    it still runs (it goes on in its thread).  What it raised is raised here, as if the caller had."""
    result: list[bool | BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as err:  # noqa: BLE001 - raised again by the caller that waits for it
            result.append(err)

    th = threading.Thread(target=run, name=name, daemon=True)
    th.start()
    th.join(seconds)
    if not result:
        return None
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def stats_line(name: str, stats: dict[str, Any]) -> str:
    """What a run asked of Pub/Sub, for the end of a run (API requests are what quotas and bills count)."""
    req = stats["requests"]
    total = sum(req.values())
    per = (
        f"{stats['requests_per_1000']:,.1f} per 1,000 messages"
        if stats["requests_per_1000"] is not None
        else "no messages"
    )
    parts = ", ".join(f"{label} {req.get(key, 0):,}" for key, label in (
        ("pull", "pull"), ("acknowledge", "acknowledge"), ("modify_ack_deadline", "modifyAckDeadline"),
        ("get_subscription", "getSubscription")))
    return (f"[{name}] Pub/Sub: pulled {stats['pulled']:,}, acknowledged {stats['acked']:,}, {total:,} requests "
            f"({per}: {parts})")



@dataclass(frozen=True)
class SharedRun:
    """The run a fetch partition's fetcher (:mod:`event_etl.sources.pubsub_partitions`) pulls in, its driver's: the
    ``run`` its segments are named by (the run's record and hold are the driver's), and the number of its first
    stream (``stream_base``: the partitions' streams are numbered apart)."""

    run: str
    stream_base: int = 0


class Fetcher:
    """Background pulling of one subscription into spool segments.  See the module docstring.

    ``shared``: a fetch partition's fetcher, pulling in its driver's run; without it the fetcher owns a run of its
    own (``fresh``: its record, the hold)."""

    def __init__(self, subscription: str, spool_dir: str | os.PathLike[str], *, settings: FetchSettings | None = None,
                 once: bool = False, client_factory: Callable[[], Any] | None = None,
                 clock: Callable[[], int] | None = None, shared: SharedRun | None = None,
                 pool: PullerPool | None = None) -> None:
        from event_etl.timeutil import now_millis

        self.subscription = subscription
        self.spool = Spool(spool_dir)
        self.dir, self.segdir = self.spool.dir, self.spool.segdir  # where it lies (the job reads segdir, for now)
        self.settings = settings or FetchSettings.from_env()
        self.once = once
        if once:
            self.settings.pull_timeout = min(self.settings.pull_timeout, max(1.0, self.settings.once_quiet))
        self._client_factory = client_factory
        self._client: Any = None
        self.clock = clock or now_millis
        self.run = shared.run if shared is not None else secrets.token_hex(4)
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # streams wait here for room in the spool
        self.parking = Parking(self.lock)
        self.wake = self.parking.wake
        self.requests: Counter[str] = Counter()
        self.acks = Acknowledger(subscription, self.settings, client=lambda: self.client, requests=self.requests,
                                 room=self.room, clock=self.clock)
        self.held: HeldSegments = self.acks.held  # the segments this run wrote and no batch saved yet
        stream_base = shared.stream_base if shared is not None else 0
        self.streams = [PullStream(self, stream_base + i) for i in range(max(1, self.settings.streams))]
        self.pulled = 0
        self.delivered_at: int | None = None
        self.stalls = Stalls(self.settings.outage_timeout)  # an outage, a full disk: since when, how long to wait
        self.error: SourceError | None = None
        self.drained = False
        self._stop = threading.Event()  # everything: pulling and extending deadlines
        self._no_more_pulls = threading.Event()  # pulling only (``once``: the subscription stayed empty)
        self._threads: list[threading.Thread | PooledRunner] = []
        self.pool = pool  # a fleet's pullers: its streams take turns there instead of running threads of their own
        self._pooled: list[PooledStream] = []
        self.fresh = shared is None  # this fetcher owns the run (its record, the hold): a fetch partition's driver does
        self.this_run = FetchRun(self.spool, subscription, clock=self.clock)
        self.settle_until = 0.0  # monotonic: until then a killed run's leases may still come back (settling)
        self.settle_seconds = 0.0
        # monotonic: when the job took its checkpoint's lease (the killed run was gone by then, so its leases run
        # out by that time + their length: the settling runs while Spark starts); None: when this run begins
        self.leased_at: float | None = None
        self.fenced = False  # another writer finished one of its open segments: it pulls no more
        if self.fresh:  # a fetch partition leaves this to the driver's coordinator
            self.spool.clear_drained()
            self.spool.clear_error()  # an earlier run's error: this run tries again

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = subscriber(self._client_factory)
        return self._client

    @property
    def spooled(self) -> bool:
        return self.settings.spooled

    @property
    def acked(self) -> int:
        """Messages acknowledged in time (``spooled``: once durable; ``committed``: once their batch was saved)."""
        return self.acks.acked

    def pulling(self) -> bool:
        return not (self._stop.is_set() or self._no_more_pulls.is_set())

    def stopping(self) -> bool:
        return self._stop.is_set()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the fetcher stops meanwhile."""
        self._stop.wait(seconds)

    # -- its run -------------------------------------------------------------------------------
    def start(self) -> Fetcher:
        """Start pulling (once; calling it again changes nothing)."""
        if self._threads:
            return self
        if self.fresh:
            self.begin_run()
            live.register(self.dir, self)
        self.count_leftovers()
        if self.pool is not None and self.spooled:  # a fleet's: turns in its pool, no thread, no age thread
            self.pool.join(self)
            for s in self.streams:
                pooled = PooledStream(s)
                runner = pooled.runner = PooledRunner(self.pool, pooled.turn, f"pubsub-pull-{s.index}")
                self._pooled.append(pooled)
                runner.start()
                self._threads.append(runner)
            return self
        for s in self.streams:
            t = threading.Thread(target=s.run, name=f"pubsub-pull-{s.index}", daemon=True)
            t.start()
            self._threads.append(t)
        # spooled: no deadline is ever extended
        loops = ((self._age_loop, "pubsub-age"),) + (() if self.spooled else ((self._extend_loop, "pubsub-extend"),))
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def begin_run(self) -> None:
        """Finish the open segments a killed run left, settle for the leases an unclean stop of the last run may have
        left, and record this run's (:meth:`FetchRun.begin`)."""
        self.acks.lease_seconds, self.settle_seconds, self.settle_until = self.this_run.begin(
            self.run, self.settings.ack, self.client, self.requests, leased_at=self.leased_at,
            extensions=0 if self.spooled else self.settings.ack_deadline)  # the extensions this run grants

    def settling(self) -> bool:
        """Whether messages a killed run left leased may still come back (see the module docstring)."""
        return time.monotonic() < self.settle_until

    def request_stop(self) -> None:
        """Ask every stream to stop, without waiting (:meth:`stop` then finds them ended: a fleet asks all its fetchers
        first, then waits for each); a pooled stream's pull in flight is cancelled."""
        self._stop.set()
        for pooled in self._pooled:
            pooled.cancel_in_flight()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling; messages pulled but not written are left to be delivered again.  Returns within about
        ``timeout`` (at most a second more for the close of an open segment) even while a stream is stuck under the
        fetcher's lock, or the stop's own close of a segment hangs (a folder sync on a dead disk): what it gives up
        waiting for is the next start's, as after a kill, with a line in the log."""
        self.request_stop()
        deadline = time.monotonic() + timeout
        if self.lock.acquire(timeout=timeout):  # the waits below wake at once; else within their own timeouts
            try:
                self.room.notify_all()
                self.wake.notify_all()
            finally:
                self.lock.release()
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        stopped = not any(t.is_alive() for t in self._threads)
        # The close gets at least a second: a sync under load, after streams that took the timeout to end, is not a
        # hanging disk (found by the spool campaign in CI: a stop then went unrecorded, and the next run settled).
        # None: it hangs on the disk, holding the lock; it goes on in its thread, and the next start fences and
        # finishes the segment, so whatever it does later changes nothing that was acknowledged.  Its thread is not
        # named pubsub-*: the spool campaign's tap counts those as the pulling threads (the stop's calls are not).
        closed = (_within(max(1.0, deadline - time.monotonic()), self._close_open_segments, f"spool-stop-{self.run}")
                  if stopped else False)
        if closed is None:
            log.warning("stopping %s: closing its open spool segment did not finish within %.1f s (the checkpoint's "
                        "disk hangs?); not waited for: the next start finishes the segment (what it holds is durable "
                        "and acknowledged) and, this stop unrecorded, waits out the run's leases",
                        self.subscription, timeout)
        elif stopped and not closed:
            log.warning("a spool segment of %s was left open (its disk had no room to close it): the next start "
                        "finishes it", self.subscription)
        if self.pool is not None:
            self.pool.leave(self)
        if self.fresh and self._threads:
            if closed is not None:  # else the close holds the lock, and the disk hangs: the record stays not clean
                self._record_stop(stopped)
            live.unregister(self.dir, self)

    def _record_stop(self, stopped: bool) -> None:
        """Record how this run stopped (``stopped``: every thread of it ended; clean if nothing it pulled may still
        be leased)."""
        clean = stopped and not self.acks.leaves_leased(self.streams)
        until = self.acks.left_leased_until(self.streams) if stopped else None
        try:
            self.this_run.end(self.run, clean=clean, leased_until=until)
        except OSError as err:  # a full disk: the record still says "not clean", and the next run waits it out
            log.warning("could not record how %s stopped (%s): the next run waits out its whole lease",
                        self.subscription, err)

    def _close_open_segments(self) -> bool:
        """``spooled``: make every stream's open segment a segment (its pulls are durable and acknowledged).  One
        that cannot be closed (a failing disk, a full one) stays open: the next start finishes it.  Whether every
        one was closed."""
        with self.lock:
            for s in self.streams:
                try:
                    s.close_if_idle()
                except OSError as err:
                    log.error("could not close the spool segment of stream %d (%s); the next start finishes "
                              "it", s.index, err)
            return all(s.open is None for s in self.streams)

    # -- what holds pulling up: errors, outages, a full disk, another writer ---------------------------------
    def fail(self, err: SourceError) -> None:
        """Stop the job with ``err``: known in memory first (:mod:`event_etl.sources.live`), then left in the spool for
        whoever runs in another process; a file that cannot be written (a full disk) changes nothing of that."""
        if self.error is None:
            self.error = err
        self._stop.set()
        with self.room:
            self.room.notify_all()
            self.wake.notify_all()
        try:
            self.spool.leave_error(self.error)
        except OSError as werr:
            log.error("could not leave the error in %s (%s); the job stops with it all the same: %s",
                      self.spool.error_file, werr, self.error.message)

    def died(self, doing: str, err: Exception) -> None:
        """A background thread failed unexpectedly: log it, and stop the job with the cause."""
        log.exception("%s failed", doing)
        self.fail(SourceError(f"{doing} failed: {type(err).__name__}: {err}",
                              fix="see the log for the cause; the job can be restarted on the same checkpoint"))

    def outage(self, what: str, err: Exception) -> float:
        """An unreachable service: wait a little, or give up after ``outage_timeout``.  Returns the wait.

        The wait grows with the outage, not with one stream's tries (:func:`waited_since`): the outage is the
        fetcher's (any stream's pull that succeeds ends it), and between two tries a stream goes back through its
        loop (room in the spool, parking), so this is no one call to retry."""
        wait = self.stalls.outage(time.monotonic())
        if wait is None:
            self.fail(SourceError(
                f"Pub/Sub was unreachable for {self.settings.outage_timeout:.0f}s while trying to {what} "
                f"({self.subscription}): {err}",
                fix="check the network (or the emulator); the job can be restarted on the same checkpoint and "
                    "loses nothing Pub/Sub still holds"))
            return 0.0
        log.warning("Pub/Sub %s failed (%s); retrying", what, type(err).__name__)
        return wait

    def room_again(self) -> None:
        """An append or a close found room on the spool's disk (with the lock held): pulling goes on."""
        if self.stalls.room_again():
            log.warning("the spool's disk has room again: pulling %s goes on", self.subscription)

    def disk_full(self, err: AppendFailed) -> None:
        """The spool's disk had no room for a pull (handed back already): wait for room, as in an outage (the
        watermark does not follow the clock, no hour is marked by the idle rule), and stop the job with the cause
        once it lasts ``outage_timeout``."""
        with self.lock:
            first, too_long = self.stalls.disk_full(time.monotonic(), err.cause.strerror or str(err.cause))
        if first:
            log.warning("the spool's disk is full (%s at %s): pulling %s waits for room; no hour is marked meanwhile",
                        err.cause.strerror, self.segdir, self.subscription)
        if too_long:
            self.fail(SourceError(
                f"the disk of the checkpoint's spool {self.segdir} has had no room for "
                f"{self.settings.outage_timeout:.0f}s ({err.cause.strerror}): {self.subscription} cannot be pulled",
                fix=f"free space on the disk that holds --checkpoint ({self.dir}), or give it a larger volume; "
                    "the job can be restarted on the same checkpoint and loses nothing (what it acknowledged is in "
                    "the spool, what it did not is still in Pub/Sub)"))

    def was_fenced(self, stream: PullStream, why: str) -> None:
        """Another writer finished ``stream``'s open segment (a retried or speculative attempt of a fetch
        partition, a job that restarted on this checkpoint): what this one acknowledged before is in the finished
        segment, and it pulls no more (every stream stops: another writer has taken over)."""
        with self.lock:
            stream.forget_open()
            first = not self.fenced
            self.fenced = True
        if first:
            log.warning("stopping the pulls of %s: %s (another writer took over this spool)", self.subscription, why)
        self._stop.set()
        with self.room:
            self.room.notify_all()
            self.wake.notify_all()

    def fenced_out(self) -> None:
        """A close found its segment finished by another writer (with the lock held): it pulls no more."""
        self.fenced = True
        self._stop.set()

    # -- the spool: what it holds, what was saved ------------------------------------------------
    def segment_acked(self, name: str, ok: bool) -> None:
        """A segment's messages were acknowledged once durable (``ok``: all of them); a fetch partition tells the
        driver (:mod:`event_etl.sources.pubsub_partitions`)."""

    def _forget_acked(self) -> None:
        """Drop from :attr:`held` what someone else acknowledged (a fetch partition: the driver); here nothing."""

    def count_leftovers(self) -> None:
        """Messages and bytes in the spool's segments of earlier runs (no batch of this run has saved them)."""
        self.acks.leftover = self.spool.earlier_runs(self.run)

    def held_totals(self) -> tuple[int, int]:
        """Messages and bytes pulled and not yet acknowledged (in segments or in the streams' buffers)."""
        opened = [s.open for s in self.streams if s.open is not None]
        msgs, size = self.acks.totals()
        msgs += sum(s.count for s in self.streams) + sum(o.count for o in opened)
        size += sum(s.bytes for s in self.streams) + sum(o.bytes for o in opened)
        return msgs, size

    def ack(self, names: set[str] | list[str]) -> bool:
        """A batch saved the segments ``names``: acknowledge their messages (:meth:`Acknowledger.ack`).  True if
        every one of them was pulled by this run and acknowledged: otherwise Pub/Sub will deliver some again."""
        return self.acks.ack(names)

    # -- the threads beside the streams -----------------------------------------------------------
    def _age_loop(self) -> None:
        """Write (``committed``) or close (``spooled``) every stream's open segment once it is ``segment_age`` old,
        while its stream waits in a pull.

        A stream otherwise does it only when a pull returns, and a pull on a quiet subscription waits: up to
        ``pull_timeout`` on the real service, until its deadline is nearly over on the emulator.  The last
        messages before a pause would wait that long before a batch could take them."""
        age = self.settings.segment_age
        while not self._stop.wait(max(0.02, min(0.1, age / 2))):
            now = time.monotonic()
            try:
                if self.spooled:
                    with self.lock:
                        for s in self.streams:
                            s.close_if_old(now, age)
                        unclosed = [s.unclosed for s in self.streams if s.unclosed is not None]
                    for err in unclosed[:1]:  # tried again at each turn until there is room, or for outage_timeout
                        self.disk_full(err)
                    continue
                for s in self.streams:
                    s.flush_if_old(now, age)
            except Exception as err:  # noqa: BLE001 - as a stream that dies: the job stops, with the cause
                self.died(f"writing a spool segment of {self.subscription}", err)
                return

    def _extend_loop(self) -> None:
        """``committed``: extend the deadlines of what is held every quarter of ``ack_deadline``."""
        period = max(1.0, self.settings.ack_deadline / 4)
        while not self._stop.wait(period):
            self._forget_acked()
            self.acks.extend()

    def check_drained(self) -> None:
        """``once``: the subscription stayed empty for ``once_quiet`` seconds on every stream.

        Pulling stops; ``DRAINED`` is written only once every stream has finished the pull it was
        in and written what that pull brought (a pull may return messages after the others found
        the subscription empty), so the planner sees every segment before it ends the run."""
        now = time.monotonic()
        if now < self.settle_until:  # what a killed run held may still come back: the subscription is not empty
            return
        with self.lock:
            if self.drained or any(s.empty_since is None or now - s.empty_since < self.settings.once_quiet
                                   or s.buffer for s in self.streams):
                return
            self.drained = True
        self._no_more_pulls.set()
        if self.pool is not None:  # a fleet's: a few threads mark every type's spool drained, not one each
            self.pool.in_background(self._mark_drained)
        else:
            threading.Thread(target=self._mark_drained, name="pubsub-drained", daemon=True).start()

    def _mark_drained(self) -> None:
        for t in self._threads:
            if t.name.startswith("pubsub-pull-"):
                t.join()
        closed = self._close_open_segments()
        while not closed and not self._stop.wait(0.5):  # no room to close one: DRAINED once the planner sees all
            closed = self._close_open_segments()
        while any(not h.written for h in list(self.held.values())) and not self._stop.is_set():
            time.sleep(0.01)  # a segment the age timer is still writing
        if self.error is None and closed:
            self.spool.mark_drained({"run": self.run, "at": self.clock(), "pulled": self.pulled})

    # -- what the controller asks ----------------------------------------------------------
    def down(self) -> str | None:
        """Why it cannot deliver what the subscription holds right now (None: it can): an error that stops the job,
        a full disk, an outage, a pull stream that is not running.  Never taken for a quiet subscription."""
        if self.error is not None:
            return f"stopped: {self.error.message}"
        stalled = self.stalls.down(time.monotonic())
        if stalled is not None:
            return stalled
        if self._threads and self.pulling() and not self.fenced:
            dead = [t.name for t in self._threads if t.name.startswith("pubsub-pull-") and not t.is_alive()]
            if dead:
                return f"{', '.join(dead)} not running"
        return None

    def activity(self) -> SourceActivity:
        """Backlog (pulled, not yet saved by a batch), whether it can deliver (an outage, a full disk, a stream
        down: :meth:`down`), last delivery and whether a killed run's leases may still come back (settling), for the
        idle rule and the markers."""
        if self.acks.leftover[0]:
            # an earlier run's segments: a batch of this run saves them (ack()), or, one the killed run's batch had
            # read and Spark had committed, the planner deletes it unoffered: counted again, or it stays backlog
            Fetcher.count_leftovers(self)  # the spool only (a fetch partition's also drops its held segments)
        msgs, _ = self.held_totals()
        down = self.down()
        return SourceActivity(self.clock(), msgs, down is not None, self.delivered_at, settling=self.settling(),
                              down=down)

    def stats(self) -> dict[str, Any]:
        msgs, size = self.held_totals()
        requests = dict(self.requests)
        total = sum(requests.values())
        return {"pulled": self.pulled, "acked": self.acks.acked, "held_messages": msgs, "held_bytes": size,
                "requests": requests, "requests_per_1000": (1000 * total / self.pulled) if self.pulled else None,
                "late_acks": self.acks.late_acks, "down": self.down()}

    def summary_line(self, name: str) -> str:
        """What this run asked of Pub/Sub (:func:`stats_line`)."""
        return stats_line(name, self.stats())

    def describe(self) -> str:
        s = self.settings
        if self.spooled:
            return (f"{s.streams} pull streams acknowledging once spooled, at most {s.max_held_messages:,} messages / "
                    f"{s.max_held_bytes >> 20} MiB spooled and not yet saved")
        return (f"{s.streams} pull streams, at most {s.max_held_messages:,} messages / {s.max_held_bytes >> 20} MiB "
                f"held until saved, segments of {s.segment_messages:,} messages or {s.segment_age}s")
