"""Pulling a Pub/Sub subscription continuously, in parallel, off the trigger's path.

:class:`Fetcher` runs beside the streaming query (threads of the job's driver process).
Several *streams* each loop on a synchronous pull of up to 1,000 messages and append what
they get to their open spool segment; a segment is written durably (:mod:`event_etl.sources.spool`)
when it holds ``segment_messages`` messages or is ``segment_age`` old.  The planner
(:class:`event_etl.sources.pubsub.PubSubPlanner`, in Spark's source process) offers Spark
the segments that exist; a micro-batch takes what has accumulated, while the streams go
on pulling for the next one.

The contract is the one of the synchronous source it replaces:

- **Durable before offered.**  A message is in a segment on disk before Spark can see an
  offset covering it; a replayed batch reads the same segments.
- **Acknowledged after the batch is saved.**  The controller calls :meth:`Fetcher.ack` with
  the segments a batch read once its files, markers and state are durable; the messages
  are acknowledged then, in bulk (up to 2,500 ids a request), not at the next batch, so a
  clean stop leaves nothing unacknowledged.
- **Deadlines extended.**  Until then, the deadlines of everything held are extended in
  bulk every quarter of the ack deadline, however long a batch takes.
- **Bounded.**  Streams stop pulling while the spool holds ``max_held_messages`` messages
  or ``max_held_bytes`` bytes that are not yet acknowledged: a backlog of ten million
  messages is never pulled into memory or onto disk at once.

An empty pull is empty, whether the service answers with no messages (the emulator) or
lets the call run out (``DeadlineExceeded``, what the real service does on a quiet
subscription); whether the service is reachable at all is then checked with a cheap call,
so that an outage is never taken for a quiet subscription.  Transient errors are retried
with backoff for up to ``outage_timeout``, reported meanwhile as an outage (the watermark
does not follow the clock); then, or at once for a permanent error, the fetcher records the
error where the planner finds it, and the job stops with it.  With ``once``, the fetcher
stops when the subscription has stayed empty for ``once_quiet`` seconds (once per run) and
leaves a ``DRAINED`` mark for the planner.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from event_etl import faults
from event_etl.errors import SourceError
from event_etl.rules.watermark import SourceActivity
from event_etl.sources.spool import SegmentName, segment_count, write_segment

__all__ = ["Fetcher", "FetchSettings", "DRAINED", "ACK_CHUNK", "subscriber", "acknowledge_in_bulk", "stats_line"]

log = logging.getLogger(__name__)

DRAINED = "DRAINED"
ACK_CHUNK = 2500  # acknowledgement ids per Acknowledge / ModifyAckDeadline request (the client library's own limit)
PULL_MAX = 1000


def subscriber(factory: Callable[[], Any] | None) -> Any:
    """A subscriber client: ``factory()`` (tests: a fake of the real service), else Google's, from the environment."""
    if factory is not None:
        return factory()
    from event_etl.sources.pubsub import subscriber_client

    return subscriber_client()


def acknowledge_in_bulk(client, subscription: str, ids: list[str], requests: Counter) -> bool:
    """Acknowledge ``ids`` up to :data:`ACK_CHUNK` a request; False if any request failed (those messages come
    again, and dedupe drops them)."""
    ok = True
    for i in range(0, len(ids), ACK_CHUNK):
        faults.point("acknowledging", str(i))  # the batch saved; its messages from here on not acknowledged
        try:
            requests["acknowledge"] += 1
            client.acknowledge(subscription=subscription, ack_ids=ids[i:i + ACK_CHUNK], timeout=30)
        except Exception as err:  # noqa: BLE001 - unacknowledged messages come again; dedupe drops them
            log.warning("acknowledging %d messages failed: %s", len(ids[i:i + ACK_CHUNK]), err)
            ok = False
    return ok


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


@dataclass
class FetchSettings:
    """How a fetcher pulls (``EVENT_ETL_PUBSUB_*`` settings, see :meth:`from_env`)."""

    streams: int = 4
    max_held_messages: int = 200_000
    max_held_bytes: int = 256 << 20
    segment_messages: int = 5_000
    segment_age: float = 0.5
    ack_deadline: int = 60
    outage_timeout: float = 120.0
    pull_timeout: float = 10.0
    once_quiet: float = 3.0
    fetch_partitions: int = 0
    """0: pull in the driver (threads beside the query).  N: pull in N tasks on the cluster's executors
    (:mod:`event_etl.sources.pubsub_partitions`), each with ``streams`` streams; they take N cores."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "FetchSettings":
        env = dict(os.environ if env is None else env)
        s = cls()
        for name, conv in (("streams", int), ("max_held_messages", int), ("max_held_bytes", int),
                           ("segment_messages", int), ("segment_age", float), ("ack_deadline", int),
                           ("outage_timeout", float), ("pull_timeout", float), ("once_quiet", float),
                           ("fetch_partitions", int)):
            key = f"EVENT_ETL_PUBSUB_{name.upper()}"
            if name == "outage_timeout":
                key = "EVENT_ETL_PUBSUB_OUTAGE_SECONDS"
            if key in env:
                setattr(s, name, conv(env[key]))
        for k, v in overrides.items():
            setattr(s, k, v)
        return s


@dataclass
class _Held:
    ack_ids: list[str]
    count: int
    bytes: int
    written: bool = True  # False while its segment is being written


@dataclass
class _Stream:
    index: int
    seq: int = 0
    buffer: list[bytes] = field(default_factory=list)
    ack_ids: list[str] = field(default_factory=list)
    count: int = 0
    bytes: int = 0
    opened: float = 0.0
    empty_since: float | None = None  # monotonic time of its first empty pull after messages


def _transient_errors() -> tuple[type, ...]:
    from google.api_core import exceptions as ex

    return (ex.ServiceUnavailable, ex.DeadlineExceeded, ex.InternalServerError, ex.Aborted,
            ex.ResourceExhausted, ex.Unknown, ex.RetryError, ex.GatewayTimeout, ex.BadGateway)


class Fetcher:
    """Background pulling of one subscription into spool segments.  See the module docstring."""

    def __init__(self, subscription: str, spool_dir: str | os.PathLike[str], *, settings: FetchSettings | None = None,
                 once: bool = False, client_factory: Callable[[], Any] | None = None,
                 clock: Callable[[], int] | None = None, run: str | None = None, stream_base: int = 0,
                 fresh: bool = True) -> None:
        from event_etl.timeutil import now_millis

        self.subscription = subscription
        self.dir = Path(spool_dir)
        self.segdir = self.dir / "segments"
        self.segdir.mkdir(parents=True, exist_ok=True)
        self.settings = settings or FetchSettings.from_env()
        self.once = once
        if once:
            self.settings.pull_timeout = min(self.settings.pull_timeout, max(1.0, self.settings.once_quiet))
        self._client_factory = client_factory
        self._client = None
        self.clock = clock or now_millis
        self.run = run or secrets.token_hex(4)
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.wake = threading.Condition(self.lock)  # parked streams wait here for the watcher to find messages
        self._empty = False  # the last pull found the subscription empty
        self._watcher: int | None = None  # the one stream that keeps pulling while it is empty
        self.held: dict[str, _Held] = {}
        self.leftover = (0, 0)  # messages and bytes of segments of earlier runs still in the spool
        self.streams = [_Stream(stream_base + i) for i in range(max(1, self.settings.streams))]
        self.requests: Counter = Counter()
        self.pulled = 0
        self.acked = 0
        self.delivered_at: int | None = None
        self.outage_since: float | None = None
        self.error: SourceError | None = None
        self.drained = False
        self._stop = threading.Event()  # everything: pulling and extending deadlines
        self._no_more_pulls = threading.Event()  # pulling only (``once``: the subscription stayed empty)
        self._threads: list[threading.Thread] = []
        if fresh:  # a fetch partition leaves this to the driver's coordinator
            (self.segdir / DRAINED).unlink(missing_ok=True)
            from event_etl.sources.pubsub import ERROR_FILE

            (self.dir / ERROR_FILE).unlink(missing_ok=True)  # an earlier run's error: this run tries again

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            self._client = subscriber(self._client_factory)
        return self._client

    def start(self) -> "Fetcher":
        """Start pulling (once; calling it again changes nothing)."""
        if self._threads:
            return self
        self._count_leftovers()
        for s in self.streams:
            t = threading.Thread(target=self._stream_loop, args=(s,), name=f"pubsub-pull-{s.index}", daemon=True)
            t.start()
            self._threads.append(t)
        for target, name in ((self._extend_loop, "pubsub-extend"), (self._age_loop, "pubsub-age")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling; messages pulled but not written are left to be delivered again."""
        self._stop.set()
        with self.room:
            self.room.notify_all()
            self.wake.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))

    def _count_leftovers(self) -> None:
        msgs = size = 0
        for p in self.segdir.glob("*.seg"):
            n = SegmentName.parse(p.name)
            if n is not None and n.run != self.run:
                msgs += n.count
                try:
                    size += p.stat().st_size
                except FileNotFoundError:
                    continue
        self.leftover = (msgs, size)

    def held_totals(self) -> tuple[int, int]:
        """Messages and bytes pulled and not yet acknowledged (in segments or in the streams' buffers)."""
        msgs = self.leftover[0] + sum(h.count for h in self.held.values()) + sum(s.count for s in self.streams)
        size = self.leftover[1] + sum(h.bytes for h in self.held.values()) + sum(s.bytes for s in self.streams)
        return msgs, size

    def _fail(self, err: SourceError) -> None:
        from event_etl.sources.pubsub import ERROR_FILE
        from event_etl.storage.atomic import write_json_atomic

        self.error = err
        write_json_atomic(self.dir / ERROR_FILE, {"message": err.message, "fix": err.fix})
        self._stop.set()

    def _outage(self, what: str, err: Exception) -> float:
        """An unreachable service: wait a little, or give up after ``outage_timeout``.  Returns the wait."""
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = now
        if now - self.outage_since > self.settings.outage_timeout:
            self._fail(SourceError(
                f"Pub/Sub was unreachable for {self.settings.outage_timeout:.0f}s while trying to {what} "
                f"({self.subscription}): {err}",
                fix="check the network (or the emulator); the job can be restarted on the same checkpoint and "
                    "loses nothing Pub/Sub still holds"))
            return 0.0
        log.warning("Pub/Sub %s failed (%s); retrying", what, type(err).__name__)
        return min(10.0, 0.5 * 2 ** min(5, int(now - self.outage_since)))

    def _reachable(self) -> bool:
        """After a pull ran out: is the service there (the subscription quiet), or is this an outage?"""
        from google.api_core import exceptions as ex

        try:
            self.requests["get_subscription"] += 1
            self.client.get_subscription(subscription=self.subscription, timeout=5)
            return True
        except _transient_errors():
            return False
        except ex.GoogleAPICallError as err:
            from event_etl.sources.pubsub import permanent_error

            self._fail(permanent_error(self.subscription, err))
            return False

    # -- pulling -------------------------------------------------------------------------------
    def _pulling(self) -> bool:
        return not (self._stop.is_set() or self._no_more_pulls.is_set())

    def _wait_for_room(self) -> None:
        s = self.settings
        with self.room:
            while self._pulling():
                msgs, size = self.held_totals()
                if msgs < s.max_held_messages and size < s.max_held_bytes:
                    return
                self._count_leftovers()  # the planner deletes committed segments of earlier runs
                self.room.wait(0.5)

    def _stream_loop(self, s: _Stream) -> None:
        try:
            self._pull_loop(s)
        except Exception as err:  # noqa: BLE001 - a stream that dies stops the job, with the cause
            self._died(f"pulling from {self.subscription}", err)

    def _died(self, doing: str, err: Exception) -> None:
        """A background thread failed unexpectedly: log it, and stop the job with the cause."""
        log.exception("%s failed", doing)
        self._fail(SourceError(f"{doing} failed: {type(err).__name__}: {err}",
                               fix="see the log for the cause; the job can be restarted on the same checkpoint"))

    def _park(self, s: _Stream) -> None:
        """While the subscription is empty, one stream (the watcher) keeps pulling and the others wait here
        until it brings messages: a quiet subscription costs one pending pull, not one per stream (on the
        emulator every pending pull scans every unacknowledged message 20 times a second)."""
        with self.wake:
            while self._pulling() and self._empty and self._watcher not in (None, s.index):
                self.wake.wait(0.25)
            if self._empty and self._watcher is None:
                self._watcher = s.index

    def _pull_loop(self, s: _Stream) -> None:
        from google.api_core import exceptions as ex
        from google.pubsub_v1.types import PullResponse

        pause = 0.05
        while self._pulling():
            self._wait_for_room()
            self._park(s)
            if not self._pulling():
                break
            sent = time.monotonic()
            try:
                self.requests["pull"] += 1
                resp = self.client.pull(subscription=self.subscription, max_messages=PULL_MAX,
                                        timeout=self.settings.pull_timeout)
                raw = PullResponse.pb(resp)
                if not raw.received_messages and faults.empty_pulls_run_out():
                    time.sleep(self.settings.pull_timeout)  # as the real service answers a quiet subscription
                    raise ex.DeadlineExceeded("Deadline Exceeded")
            except ex.DeadlineExceeded:
                # the real service lets a pull on a quiet subscription run out: empty, if the service is there
                if not self._reachable():
                    if self.error is None:
                        time.sleep(self._outage("pull", ex.DeadlineExceeded("no answer")))
                    continue
                raw = None
            except _transient_errors() as err:
                time.sleep(self._outage("pull", err))
                continue
            except ex.GoogleAPICallError as err:
                from event_etl.sources.pubsub import permanent_error

                self._fail(permanent_error(self.subscription, err))
                break
            self.outage_since = None
            n = len(raw.received_messages) if raw is not None else 0
            if n == 0:
                self._flush(s)
                with self.lock:
                    self._empty = True
                    if self._watcher is None:
                        self._watcher = s.index
                    if s.empty_since is None:
                        s.empty_since = sent  # the pull waited for messages from then on, and none came
                if self.once:
                    self._check_drained()
                self._stop.wait(pause)
                pause = min(0.5, pause * 2)
                continue
            pause = 0.05
            data = raw.SerializeToString()
            ids = [rm.ack_id for rm in raw.received_messages]
            faults.point("pulled", str(n))  # pulled, not yet in a segment
            with self.lock:
                s.empty_since = None
                if self._empty:  # messages again: every stream pulls
                    self._empty, self._watcher = False, None
                    self.wake.notify_all()
                if not s.buffer:
                    s.opened = time.monotonic()
                s.buffer.append(data)
                s.ack_ids.extend(ids)
                s.count += n
                s.bytes += len(data)
                self.pulled += n
                self.delivered_at = self.clock()
            if s.count >= self.settings.segment_messages or time.monotonic() - s.opened >= self.settings.segment_age:
                self._flush(s)
        self._flush(s)

    def _age_loop(self) -> None:
        """Write every stream's open segment once it is ``segment_age`` old, while its stream waits in a pull.

        A stream otherwise writes its segment only when a pull returns, and a pull on a quiet subscription
        waits: up to ``pull_timeout`` on the real service, until its deadline is nearly over on the emulator.
        The last messages before a pause would wait that long before a batch could take them."""
        age = self.settings.segment_age
        while not self._stop.wait(max(0.02, min(0.1, age / 2))):
            now = time.monotonic()
            with self.lock:
                old = [s for s in self.streams if s.buffer and now - s.opened >= age]
            try:
                for s in old:
                    self._flush(s)
            except Exception as err:  # noqa: BLE001 - as a stream that dies: the job stops, with the cause
                self._died(f"writing a spool segment of {self.subscription}", err)
                return

    def _flush(self, s: _Stream) -> None:
        """Write the stream's open segment durably, then extend its messages' deadlines at once."""
        with self.lock:
            if not s.buffer:
                return
            name = SegmentName(self.run, s.index, s.seq, s.count)
            buffer, ids, count, size = s.buffer, s.ack_ids, s.count, s.bytes
            s.buffer, s.ack_ids, s.count, s.bytes = [], [], 0, 0
            s.seq += 1
            # held before it is written: flow control and the extender count it from now on
            held = self.held[name.name] = _Held(ids, count, size, written=False)
        write_segment(self.segdir, name, buffer)
        held.written = True
        faults.point("spooled", name.name)  # durable, not yet offered to Spark
        self._modify(ids, self.settings.ack_deadline)

    def _check_drained(self) -> None:
        """``once``: the subscription stayed empty for ``once_quiet`` seconds on every stream.

        Pulling stops; ``DRAINED`` is written only once every stream has finished the pull it was
        in and written what that pull brought (a pull may return messages after the others found
        the subscription empty), so the planner sees every segment before it ends the run."""
        now = time.monotonic()
        with self.lock:
            if self.drained or any(s.empty_since is None or now - s.empty_since < self.settings.once_quiet
                                   or s.buffer for s in self.streams):
                return
            self.drained = True
        self._no_more_pulls.set()
        threading.Thread(target=self._mark_drained, name="pubsub-drained", daemon=True).start()

    def _mark_drained(self) -> None:
        from event_etl.storage.atomic import write_json_atomic

        for t in self._threads:
            if t.name.startswith("pubsub-pull-"):
                t.join()
        while any(not h.written for h in list(self.held.values())) and not self._stop.is_set():
            time.sleep(0.01)  # a segment the age timer is still writing
        if self.error is None:
            write_json_atomic(self.segdir / DRAINED, {"run": self.run, "at": self.clock(), "pulled": self.pulled})

    # -- deadlines and acknowledgements -----------------------------------------------------
    def _modify(self, ids: list[str], seconds: int) -> None:
        for i in range(0, len(ids), ACK_CHUNK):
            try:
                self.requests["modify_ack_deadline"] += 1
                self.client.modify_ack_deadline(subscription=self.subscription, ack_ids=ids[i:i + ACK_CHUNK],
                                                ack_deadline_seconds=seconds, timeout=30)
            except Exception as err:  # noqa: BLE001 - a missed extension means a redelivery, which dedupe absorbs
                log.warning("extending ack deadlines failed: %s", err)

    def _forget_acked(self) -> None:
        """Drop from :attr:`held` what someone else acknowledged (a fetch partition: the driver); here nothing."""

    def _extend_loop(self) -> None:
        period = max(1.0, self.settings.ack_deadline / 4)
        while not self._stop.wait(period):
            self._forget_acked()
            with self.lock:
                ids = [a for h in self.held.values() for a in h.ack_ids]
            if ids:
                self._modify(ids, self.settings.ack_deadline)

    def ack(self, names: set[str] | list[str]) -> bool:
        """Acknowledge the messages of the segments ``names`` (a batch saved them).

        True if every one of them was pulled by this run and acknowledged: otherwise Pub/Sub
        will deliver some of them again (an earlier run's ids have expired)."""
        all_fresh = True
        ids: list[str] = []
        done: list[str] = []
        with self.lock:
            for name in names:
                h = self.held.get(os.path.basename(name))
                if h is None:
                    all_fresh = False
                    continue
                ids.extend(h.ack_ids)
                done.append(os.path.basename(name))
        ok = acknowledge_in_bulk(self.client, self.subscription, ids, self.requests)
        with self.room:
            for name in done:
                h = self.held.pop(name, None)
                if h is not None and ok:
                    self.acked += h.count
            self.room.notify_all()
        for name in names:  # an earlier run's segment: no longer held once saved
            if SegmentName.parse(os.path.basename(name)) and os.path.basename(name) not in done:
                with self.room:
                    m, b = self.leftover
                    self.leftover = (max(0, m - segment_count(name)), b)
                    self.room.notify_all()
        return all_fresh and ok

    # -- what the controller asks ----------------------------------------------------------
    def activity(self) -> SourceActivity:
        """Backlog (pulled, not yet acknowledged), outage and last delivery, for the idle rule."""
        msgs, _ = self.held_totals()
        return SourceActivity(self.clock(), msgs, self.outage_since is not None, self.delivered_at)

    def stats(self) -> dict[str, Any]:
        msgs, size = self.held_totals()
        requests = dict(self.requests)
        total = sum(requests.values())
        return {"pulled": self.pulled, "acked": self.acked, "held_messages": msgs, "held_bytes": size,
                "requests": requests, "requests_per_1000": (1000 * total / self.pulled) if self.pulled else None}

    def summary_line(self, name: str) -> str:
        """What this run asked of Pub/Sub (:func:`stats_line`)."""
        return stats_line(name, self.stats())

    def describe(self) -> str:
        s = self.settings
        return (f"{s.streams} pull streams, at most {s.max_held_messages:,} messages / {s.max_held_bytes >> 20} MiB "
                f"held, segments of {s.segment_messages:,} messages or {s.segment_age}s")

