"""Pulling a Pub/Sub subscription continuously, in parallel, off the trigger's path.

:class:`Fetcher` runs beside the micro-batches (threads of the job's driver process).
Several *streams* each loop on a synchronous pull of up to 1,000 messages and write what
they get to spool segments (:mod:`event_etl.sources.spool`) in the checkpoint.  The planner
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
  (:meth:`Fetcher.activity`, ``settling``).

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

import errno
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from event_etl import faults
from event_etl.errors import SourceError, UsageError
from event_etl.rules.watermark import SourceActivity
from event_etl.settings import current_settings
from event_etl.sources import live
from event_etl.sources.pubsub_stalls import WAIT_CAP, WAIT_FIRST, Stalls, waited_since
from event_etl.sources.spool import (
    AppendFailed,
    OpenSegment,
    SegmentFenced,
    SegmentName,
    finish_open_segments,
    oldest_of,
    segment_count,
    write_segment,
)

__all__ = ["Fetcher", "FetchSettings", "RunRecord", "DRAINED", "ACK_CHUNK", "ACK_MODES", "subscriber",
           "acknowledge_in_bulk", "stats_line", "subscription_deadline", "spool_warning",
           "waited_since", "WAIT_FIRST", "WAIT_CAP"]

log = logging.getLogger(__name__)

DRAINED = "DRAINED"
ACK_CHUNK = 2500  # acknowledgement ids per Acknowledge / ModifyAckDeadline request (the client library's own limit)
PULL_MAX = 1000
ACK_MODES = ("spooled", "committed")
"""When messages are acknowledged (``EVENT_ETL_PUBSUB_ACK``): once durable in the spool, or once their batch is
saved.  See the module docstring."""
RUN_FILE = "run.json"
EMULATOR_STREAMS = 1
"""Pull streams by default against the emulator (see :meth:`FetchSettings.from_env`); 4 against the service."""
DEFAULT_SUBSCRIPTION_DEADLINE = 10
"""Seconds: a subscription's ack deadline when it was created without one (Pub/Sub's default)."""
MAX_LEASE_SECONDS = 600
"""The longest ack deadline Pub/Sub grants: what a run assumes when it cannot learn its subscription's."""
SETTLE_MARGIN_SECONDS = 2.0
"""Added to the longest lease a killed run may have left: requests in flight, and the service's own delay."""


def settle_until(seconds: float, leased_at: float | None) -> float:
    """The monotonic time until which a restart settles for ``seconds`` of leases a killed run may have left.

    Counted from ``leased_at``, when the job took its checkpoint's lease (the killed run was gone by then), not from
    when pulling starts: the wait then overlaps the start of Spark.  None: from now."""
    now = time.monotonic()
    return (min(leased_at, now) if leased_at is not None else now) + seconds


PAUSE_FIRST, PAUSE_CAP = 0.05, 0.5
"""Seconds: the shortest and the longest pause of a stream between two empty pulls (doubling while they are)."""


def subscriber(factory: Callable[[], Any] | None) -> Any:
    """A subscriber client: ``factory()`` (tests: a fake of the real service, with the library client's methods),
    else Pull and Acknowledge on the gRPC wire (:mod:`event_etl.sources.pubsub_wire`), from the environment."""
    if factory is not None:
        return factory()
    from event_etl.sources.pubsub_wire import WireSubscriber

    return WireSubscriber()


def acknowledge_in_bulk(client: Any, subscription: str, ids: list[str], requests: Counter[str]) -> bool:
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


def subscription_deadline(client: Any, subscription: str) -> int:
    """The subscription's ack deadline in seconds (the lease a pull grants), or :data:`MAX_LEASE_SECONDS` when it
    cannot be learnt: what a killed run may have left leased is then assumed as long as Pub/Sub allows."""
    try:
        sub = client.get_subscription(subscription=subscription, timeout=10)
    except Exception as err:  # noqa: BLE001 - unknown: assume the longest
        log.warning("could not read the ack deadline of %s (%s); assuming %d s", subscription, err,
                    MAX_LEASE_SECONDS)
        return MAX_LEASE_SECONDS
    return int(getattr(sub, "ack_deadline_seconds", 0) or DEFAULT_SUBSCRIPTION_DEADLINE)


class RunRecord:
    """``run.json`` in the spool: the longest lease the current run may grant, and whether the last run stopped
    leaving nothing leased.  A run that finds an unclean stop before it settles for that lease (see the module
    docstring); a spool that has no record but holds an earlier release's log or segments was written by a
    release that held every message until its batch was saved (``committed``, 60-s extensions)."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        self.path = Path(spool_dir) / RUN_FILE

    def previous_lease(self, now_ms: int | None = None) -> float:
        """Seconds the last run may have left messages leased for, from now (0: it stopped cleanly, or none ran).

        A run that stopped knowing until when what it left may stay leased (``leased_until``: a pull that failed
        after the service may have served it, messages it could not hand back) is waited for until then, at most
        its lease; one killed before it could say is waited for its whole lease."""
        import json

        from event_etl.timeutil import now_millis

        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            d = self.path.parent
            used = any((d / "segments").glob("*.seg")) or any((d / "log").glob("*.json"))
            return float(FetchSettings.ack_deadline) if used else 0.0
        except ValueError:
            return float(MAX_LEASE_SECONDS)
        if doc.get("clean"):
            return 0.0
        lease = float(doc.get("lease_seconds", MAX_LEASE_SECONDS))
        if doc.get("leased_until") is not None and doc.get("stopped_at") is not None:
            now = now_millis() if now_ms is None else now_ms
            return max(0.0, min(lease, (int(doc["leased_until"]) - now) / 1000))
        return lease

    def begin(self, run: str, ack: str, lease_seconds: int, *, clock: Callable[[], int]) -> None:
        """This run starts: until it ends cleanly, whatever it leases may be left leased for ``lease_seconds``."""
        from event_etl.storage.atomic import write_json_atomic

        write_json_atomic(self.path, {"run": run, "ack": ack, "lease_seconds": lease_seconds,
                                      "started_at": clock(), "clean": False})

    def end(self, run: str, *, clean: bool, clock: Callable[[], int], leased_until: int | None = None) -> None:
        """This run stops; ``clean``: no message it pulled is still leased.  ``leased_until`` (ms, wall clock): an
        unclean run that stopped knows until when what it left may stay leased."""
        import json

        from event_etl.storage.atomic import write_json_atomic

        try:
            doc = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return
        if doc.get("run") == run:
            extra = {} if clean or leased_until is None else {"leased_until": int(leased_until)}
            write_json_atomic(self.path, {**{k: v for k, v in doc.items() if k != "leased_until"}, "clean": clean,
                                          "stopped_at": clock(), **extra})


_VOLATILE = {
    "tmpfs": "on tmpfs, which a restart of this machine empties",
    "ramfs": "on ramfs, which a restart of this machine empties",
    "overlay": ("on an overlay file system (a container's writable layer, a pod's ephemeral disk), which is lost "
                "with the container when it is replaced or rescheduled"),
}
VOLATILE_FILESYSTEMS = frozenset(_VOLATILE)
"""File systems whose files do not outlive the machine or the container: the spool must not be on one."""


def filesystem_type(path: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> str | None:
    """The type of the file system ``path`` lies on (the longest mount point that holds it), or None if unknown."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, parts[2]
    except OSError:
        return None
    return kind


def spool_warning(name: str, spool_dir: str | os.PathLike[str], settings: FetchSettings,
                  mounts: str = "/proc/self/mounts") -> str | None:
    """The one-line warning for ``spooled`` acknowledgements over a checkpoint that does not outlive the machine
    (tmpfs, ramfs) or the container (an overlay: a container's writable layer), or None.  Each fetch partition
    checks its own host's mount too (:mod:`event_etl.sources.pubsub_partitions`)."""
    kind = filesystem_type(spool_dir, mounts)
    if not settings.spooled or kind not in _VOLATILE:
        return None
    return (f"[{name}] warning: the checkpoint is {_VOLATILE[kind]}, and with EVENT_ETL_PUBSUB_ACK=spooled an "
            "acknowledged message is only in its spool until its batch commits: losing the spool loses it; fix: put "
            "--checkpoint on durable storage (a persistent volume), or set EVENT_ETL_PUBSUB_ACK=committed")


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
    ack: str = "spooled"
    """When messages are acknowledged: ``spooled`` (once durable in the spool) or ``committed`` (once their batch is
    saved); see the module docstring."""

    @property
    def spooled(self) -> bool:
        return self.ack == "spooled"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *, emulator: bool = False,
                 **overrides: Any) -> FetchSettings:
        """The ``EVENT_ETL_PUBSUB_*`` settings of ``env`` (default: those in force, :func:`current_settings`).
        ``emulator``: the job pulls from Google's Pub/Sub emulator (``PUBSUB_EMULATOR_HOST``), where the streams
        default to 1: its pulls slow down in proportion to the backlog as soon as anything is leased, so a second
        stream, whose pull always finds the first one's messages leased, cuts the rate instead of doubling it (to
        ~1,100 msg/s against 17,500 at 20,000 msg/s published, bench/RESULTS.md)."""
        env = dict(current_settings().pubsub if env is None else env)
        s = cls()
        if emulator:
            s.streams = EMULATOR_STREAMS
        for name, conv in (("streams", int), ("max_held_messages", int), ("max_held_bytes", int),
                           ("segment_messages", int), ("segment_age", float), ("ack_deadline", int),
                           ("outage_timeout", float), ("pull_timeout", float), ("once_quiet", float),
                           ("fetch_partitions", int), ("ack", _ack_mode)):
            key = f"EVENT_ETL_PUBSUB_{name.upper()}"
            if name == "outage_timeout":
                key = "EVENT_ETL_PUBSUB_OUTAGE_SECONDS"
            if key in env:
                setattr(s, name, conv(env[key]))
        for k, v in overrides.items():
            setattr(s, k, v)
        return s


def _ack_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ACK_MODES:
        raise UsageError(f"EVENT_ETL_PUBSUB_ACK={text!r} is not a way to acknowledge",
                         fix="set it to 'spooled' (the default: once durable in the spool) or 'committed' (once the "
                             "batch is saved); docs/production.md says what each promises and costs")
    return mode


@dataclass
class _Held:
    ack_ids: list[str]  # still to acknowledge (committed: when the batch is saved; spooled: none once acknowledged)
    count: int
    bytes: int
    written: bool = True  # False while its segment is being written
    acked: bool = False  # spooled: acknowledged once durable


class _HeldSegments(dict[str, _Held]):
    """The segments held (by name): their messages and bytes summed as they come and go, so that flow control
    looks at two numbers before every pull instead of adding up thousands of segments."""

    def __init__(self) -> None:
        super().__init__()
        self.messages = 0
        self.bytes = 0

    def __setitem__(self, name: str, held: _Held) -> None:
        self.pop(name)
        super().__setitem__(name, held)
        self.messages += held.count
        self.bytes += held.bytes

    def pop(self, name: str, default: Any = None) -> Any:
        held = super().pop(name, None)
        if held is None:
            return default
        self.messages -= held.count
        self.bytes -= held.bytes
        return held


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
    open: OpenSegment | None = None  # spooled: the segment its pulls are appended to
    open_acked: bool = True  # spooled: every pull appended to it was acknowledged
    inflight: int = 0  # spooled: pulls appended and not yet acknowledged (the segment is not closed meanwhile)
    pending: list[str] = field(default_factory=list)  # ack ids pulled, neither acknowledged nor handed back yet
    pending_sent: int = 0  # when (ms, wall clock) the pull that brought them was sent
    unclosed: AppendFailed | None = None  # spooled: its open segment's close found no room (it stays open till then)


def _transient_errors() -> tuple[type[Exception], ...]:
    from google.api_core import exceptions as ex

    return (ex.ServiceUnavailable, ex.DeadlineExceeded, ex.InternalServerError, ex.Aborted,
            ex.ResourceExhausted, ex.Unknown, ex.RetryError, ex.GatewayTimeout, ex.BadGateway)


def _deadline_exceeded(message: str) -> Exception:
    """api_core's ``DeadlineExceeded`` (what a pull that ran out raises), whose class carries no annotations."""
    from google.api_core import exceptions as ex

    make: Callable[[str], Exception] = ex.DeadlineExceeded
    return make(message)


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
        self._client: Any = None
        self.clock = clock or now_millis
        self.run = run or secrets.token_hex(4)
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.wake = threading.Condition(self.lock)  # parked streams wait here for the watcher to find messages
        self._empty = False  # the last pull found the subscription empty
        self._watcher: int | None = None  # the one stream that keeps pulling while it is empty
        self.held = _HeldSegments()
        self.leftover = (0, 0)  # messages and bytes of segments of earlier runs still in the spool
        self.streams = [_Stream(stream_base + i) for i in range(max(1, self.settings.streams))]
        self.requests: Counter[str] = Counter()
        self.pulled = 0
        self.acked = 0
        self.delivered_at: int | None = None
        self.stalls = Stalls(self.settings.outage_timeout)  # an outage, a full disk: since when, how long to wait
        self.error: SourceError | None = None
        self.drained = False
        self._stop = threading.Event()  # everything: pulling and extending deadlines
        self._no_more_pulls = threading.Event()  # pulling only (``once``: the subscription stayed empty)
        self._threads: list[threading.Thread] = []
        self.fresh = fresh  # this fetcher owns the run (its record, the hold): a fetch partition's driver does
        self.record = RunRecord(self.dir)
        self.settle_until = 0.0  # monotonic: until then a killed run's leases may still come back (settling)
        self.settle_seconds = 0.0
        # monotonic: when the job took its checkpoint's lease (the killed run was gone by then, so its leases run
        # out by that time + their length: the settling runs while Spark starts); None: when this run begins
        self.leased_at: float | None = None
        self.left_leased = False  # spooled: an acknowledgement failed, so messages stay leased after this run
        # ms on the wall clock: until then messages this run pulled may still be leased to it although it holds none
        # of them (a pull that failed after the service may have served it, a pull it could not hand back)
        self.leased_until = 0
        # the subscription's ack deadline (the lease a pull grants), learnt when the run begins (a fetch partition is
        # told it); until then the longest Pub/Sub grants
        self.lease_seconds = MAX_LEASE_SECONDS
        self.fenced = False  # another writer finished one of its open segments: it pulls no more
        self.late_acks = 0  # messages acknowledged after their lease ran out (they may come again)
        if fresh:  # a fetch partition leaves this to the driver's coordinator
            (self.segdir / DRAINED).unlink(missing_ok=True)
            from event_etl.sources.pubsub import ERROR_FILE

            (self.dir / ERROR_FILE).unlink(missing_ok=True)  # an earlier run's error: this run tries again

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = subscriber(self._client_factory)
        return self._client

    @property
    def spooled(self) -> bool:
        return self.settings.spooled

    def start(self) -> Fetcher:
        """Start pulling (once; calling it again changes nothing)."""
        if self._threads:
            return self
        if self.fresh:
            self.begin_run()
            live.register(self.dir, self)
        self._count_leftovers()
        for s in self.streams:
            t = threading.Thread(target=self._stream_loop, args=(s,), name=f"pubsub-pull-{s.index}", daemon=True)
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
        left, and record this run's."""
        finish_open_segments(self.segdir)
        lease = self.record.previous_lease()
        if lease > 0:
            self.settle_seconds = lease + SETTLE_MARGIN_SECONDS
            self.settle_until = settle_until(self.settle_seconds, self.leased_at)
            log.warning("the last run of %s did not stop cleanly: messages it held may come back within %.0f s; "
                        "until then no hour is marked", self.subscription, self.settle_until - time.monotonic())
        own = subscription_deadline(self.client, self.subscription)
        self.requests["get_subscription"] += 1
        self.lease_seconds = own
        if not self.spooled:
            own = max(own, self.settings.ack_deadline)  # the extensions this run grants
        try:
            self.record.begin(self.run, self.settings.ack, own, clock=self.clock)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise SourceError(
                f"the disk of the checkpoint's spool {self.dir} has no room to begin a run ({err.strerror})",
                fix=f"free space on the disk that holds --checkpoint ({self.dir}), or give it a larger volume, then "
                    "start the job again: it loses nothing") from err

    def settling(self) -> bool:
        """Whether messages a killed run left leased may still come back (see the module docstring)."""
        return time.monotonic() < self.settle_until

    def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling; messages pulled but not written are left to be delivered again.  Returns within about
        ``timeout`` (at most a second more for the close of an open segment) even while a stream is stuck under the
        fetcher's lock, or the stop's own close of a segment hangs (a folder sync on a dead disk): what it gives up
        waiting for is the next start's, as after a kill (see :meth:`_close_within`), with a line in the log."""
        self._stop.set()
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
        # the close gets at least a second: a sync under load, after streams that took the timeout to end, is not a
        # hanging disk (found by the spool campaign in CI: a stop then went unrecorded, and the next run settled)
        closed = self._close_within(max(1.0, deadline - time.monotonic())) if stopped else False
        if closed is None:
            log.warning("stopping %s: closing its open spool segment did not finish within %.1f s (the checkpoint's "
                        "disk hangs?); not waited for: the next start finishes the segment (what it holds is durable "
                        "and acknowledged) and, this stop unrecorded, waits out the run's leases",
                        self.subscription, timeout)
        elif stopped and not closed:
            log.warning("a spool segment of %s was left open (its disk had no room to close it): the next start "
                        "finishes it", self.subscription)
        if self.fresh and self._threads:
            if closed is not None:  # else the close holds the lock, and the disk hangs: the record stays not clean
                self._record_stop(stopped)
            live.unregister(self.dir, self)

    def _close_within(self, seconds: float) -> bool | None:
        """:meth:`_close_open_segments` for a stop, waited for at most ``seconds``: whether every segment was closed,
        or None if the close is still running (it hangs on the disk, holding the lock: it goes on in its thread, and
        the next start fences and finishes the segment, so whatever it does later changes nothing that was
        acknowledged).  An error of the close is raised here, as if the stop had made it."""
        result: list[bool | BaseException] = []
        # not named pubsub-*: the spool campaign's tap counts those as the pulling threads (the stop's calls are not)
        th = threading.Thread(target=self._stop_close, args=(result,), name=f"spool-stop-{self.run}", daemon=True)
        th.start()
        th.join(seconds)
        if not result:
            return None
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def _stop_close(self, result: list[bool | BaseException]) -> None:
        try:
            result.append(self._close_open_segments())
        except BaseException as err:  # noqa: BLE001 - raised again by the stop that waits for it
            result.append(err)

    def _record_stop(self, stopped: bool) -> None:
        """Record how this run stopped (``stopped``: every thread of it ended; clean if nothing it pulled may still
        be leased)."""
        clean = stopped and not self._leaves_leased()
        try:
            self.record.end(self.run, clean=clean, clock=self.clock,
                            leased_until=None if not stopped else self._leased_until())
        except OSError as err:  # a full disk: the record still says "not clean", and the next run waits it out
            log.warning("could not record how %s stopped (%s): the next run waits out its whole lease",
                        self.subscription, err)

    def _close_open_segments(self) -> bool:
        """``spooled``: make every stream's open segment a segment (its pulls are durable and acknowledged).  One
        that cannot be closed (a failing disk, a full one) stays open: the next start finishes it.  Whether every
        one was closed."""
        with self.lock:
            for s in self.streams:
                if s.open is not None and not s.inflight:
                    try:
                        self._roll(s)
                    except OSError as err:
                        log.error("could not close the spool segment of stream %d (%s); the next start finishes "
                                  "it", s.index, err)
            return all(s.open is None for s in self.streams)

    def _leaves_leased(self) -> bool:
        """Whether messages this run pulled may still be leased (they come back when their lease runs out): held
        for a batch (``committed``), not acknowledged, pulled and neither spooled nor handed back, or brought by a
        pull that failed after the service may have served it."""
        with self.lock:
            if any(s.count or s.pending for s in self.streams) or self.left_leased:
                return True
            if self.leased_until > self.clock():
                return True
            return any(h.ack_ids for h in self.held.values())

    def _leased_until(self) -> int:
        """Until when (ms, wall clock) what this run leaves leased may stay so: its last pulls' leases."""
        with self.lock:
            until = self.leased_until
            for s in self.streams:
                if s.pending:
                    until = max(until, s.pending_sent + self.lease_seconds * 1000)
            if self.left_leased or any(h.ack_ids for h in self.held.values()) or any(s.count for s in self.streams):
                until = max(until, self.clock() + max(self.lease_seconds, self.settings.ack_deadline) * 1000)
            return until

    def _maybe_served(self, sent_ms: int) -> None:
        """A pull sent at ``sent_ms`` failed after the service may have served it (its answer lost: a deadline, a
        dropped connection): its messages, if any, stay leased for a lease from then."""
        with self.lock:
            self.leased_until = max(self.leased_until, sent_ms + self.lease_seconds * 1000)

    def _hand_back(self, s: _Stream) -> None:
        """Give the stream's pulled, unspooled messages back to Pub/Sub at once (a deadline of 0, as the client
        libraries do when they shut down): they are delivered again now, not after their lease.  If that fails
        they stay leased until their lease runs out, and this run is not clean."""
        with self.lock:
            ids, sent, s.pending = s.pending, s.pending_sent, []
        if not ids:
            return
        failed = 0
        for i in range(0, len(ids), ACK_CHUNK):
            try:
                self.requests["modify_ack_deadline"] += 1
                self.client.modify_ack_deadline(subscription=self.subscription, ack_ids=ids[i:i + ACK_CHUNK],
                                                ack_deadline_seconds=0, timeout=30)
            except Exception as err:  # noqa: BLE001 - then they come back when their lease runs out
                log.warning("handing %d messages back failed: %s", len(ids[i:i + ACK_CHUNK]), err)
                failed += 1
        if failed:
            self._maybe_served(sent)

    def _count_leftovers(self) -> None:
        """Messages and bytes in the spool's segments of earlier runs (no batch of this run has saved them)."""
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
        opened = [s.open for s in self.streams if s.open is not None]
        msgs = self.leftover[0] + self.held.messages + sum(s.count for s in self.streams) + sum(o.count for o in opened)
        size = self.leftover[1] + self.held.bytes + sum(s.bytes for s in self.streams) + sum(o.bytes for o in opened)
        return msgs, size

    def _fail(self, err: SourceError) -> None:
        """Stop the job with ``err``: known in memory first (:mod:`event_etl.sources.live`), then left in the spool for
        whoever runs in another process; a file that cannot be written (a full disk) changes nothing of that."""
        from event_etl.sources.pubsub import ERROR_FILE
        from event_etl.storage.atomic import write_json_atomic

        if self.error is None:
            self.error = err
        self._stop.set()
        with self.room:
            self.room.notify_all()
            self.wake.notify_all()
        try:
            write_json_atomic(self.dir / ERROR_FILE, {"message": self.error.message, "fix": self.error.fix})
        except OSError as werr:
            log.error("could not leave the error in %s (%s); the job stops with it all the same: %s",
                      self.dir / ERROR_FILE, werr, self.error.message)

    def _outage(self, what: str, err: Exception) -> float:
        """An unreachable service: wait a little, or give up after ``outage_timeout``.  Returns the wait.

        The wait grows with the outage, not with one stream's tries (:func:`waited_since`): the outage is the
        fetcher's (any stream's pull that succeeds ends it), and between two tries a stream goes back through its
        loop (room in the spool, parking), so this is no one call to retry."""
        wait = self.stalls.outage(time.monotonic())
        if wait is None:
            self._fail(SourceError(
                f"Pub/Sub was unreachable for {self.settings.outage_timeout:.0f}s while trying to {what} "
                f"({self.subscription}): {err}",
                fix="check the network (or the emulator); the job can be restarted on the same checkpoint and "
                    "loses nothing Pub/Sub still holds"))
            return 0.0
        log.warning("Pub/Sub %s failed (%s); retrying", what, type(err).__name__)
        return wait

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
        """One stream's thread.  However it ends (a stop, a full disk, any exception, a bug's included), the pull it
        has in hand is not left leased unsaid: its messages are handed back (a deadline of 0, as on a full disk:
        delivered again at once, and a stop that handed everything back is clean), and what cannot be handed back
        (the hand-back fails, or the answer was never read, so no id is known) is recorded as leased until its lease
        runs out (:meth:`_maybe_served`), so the stop is not clean and the next run settles, as after a kill."""
        try:
            self._pull_loop(s)
        except Exception as err:  # noqa: BLE001 - a stream that dies stops the job, with the cause
            self._died(f"pulling from {self.subscription}", err)
        finally:
            self._hand_back(s)  # pulled and not spooled (a stop, a death): delivered again at once

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
        """Pull, make durable (and, ``spooled``, acknowledge), pull again, while the fetcher pulls.

        What touches the spool or Pub/Sub is called from here, as the spool sweep names its windows
        (``_spool_pull > acknowledge_in_bulk: acknowledge``, tests/spool_sweep.py): the pull itself and its failures
        (:meth:`_pull`), the segment written (:meth:`_flush`, ``committed``) or appended to and acknowledged
        (:meth:`_spool_pull`, ``spooled``)."""
        pause, segment_age = PAUSE_FIRST, self.settings.segment_age
        while self._pulling():
            self._wait_for_room()
            self._park(s)
            if not self._pulling():
                break
            pulled = self._pull(s)
            if pulled is None:  # an outage waited for, or an error that stops the job
                continue
            data, raw, sent, sent_ms = pulled
            n = len(raw.received_messages) if raw is not None else 0
            if n == 0:
                self._flush(s)
                self._pulled_none(s, sent)
                self._stop.wait(pause)
                pause = min(PAUSE_CAP, pause * 2)
                continue
            pause = PAUSE_FIRST
            ids = s.pending  # in hand since :meth:`_pull` read the answer: handed back if the stream dies from here
            if self._stop.is_set():  # stopping (a stop whose wait for this pull ran out): hand them back
                break
            faults.point("pulled", str(n))  # pulled, not yet in a segment
            self._take(s, data, ids, n)
            if not self.spooled:
                if s.count >= self.settings.segment_messages or time.monotonic() - s.opened >= segment_age:
                    self._flush(s)  # the stream's segment, once full or old
            elif not self._spool_pull(s, data, raw, ids, n, sent):  # durable and acknowledged before the next pull
                if self.fenced:
                    break
                self._stop.wait(self._disk_full_wait())
        self._flush(s)

    def _pull(self, s: _Stream) -> tuple[bytes, Any, float, int] | None:
        """One pull: ``(its bytes, the parsed PullResponse or None for an empty pull, when it was sent on the
        monotonic clock and in ms on the wall clock)``; None when it failed (an outage, waited for before the next
        try, or a permanent error, which stops the job)."""
        from google.api_core import exceptions as ex

        from event_etl.sources.pubsub_wire import pull_bytes

        sent = time.monotonic()
        sent_ms = self.clock()
        try:
            self.requests["pull"] += 1
            data, raw = pull_bytes(self.client.pull(subscription=self.subscription, max_messages=PULL_MAX,
                                                    timeout=self.settings.pull_timeout))
            if not raw.received_messages and faults.empty_pulls_run_out():
                time.sleep(self.settings.pull_timeout)  # as the real service answers a quiet subscription
                raise _deadline_exceeded("Deadline Exceeded")
        except ex.DeadlineExceeded:
            # the real service lets a pull on a quiet subscription run out: empty, if the service is there.  Its
            # answer may also have been lost after it leased messages: they may stay leased for a lease
            self._maybe_served(sent_ms)
            if self._reachable():
                self.stalls.answered()
                return b"", None, sent, sent_ms
            if self.error is None:
                time.sleep(self._outage("pull", _deadline_exceeded("no answer")))
            return None
        except _transient_errors() as err:
            self._maybe_served(sent_ms)  # a connection dropped after the service answered leaves messages leased
            time.sleep(self._outage("pull", err))
            return None
        except ex.GoogleAPICallError as err:
            from event_etl.sources.pubsub import permanent_error

            self._fail(permanent_error(self.subscription, err))
            return None
        except BaseException:
            # Anything else (a bug, an answer that cannot be read): the stream dies (the job stops with the cause),
            # and the service may have leased what it served with no id of it known here to hand back.  As for an
            # answer lost in a dropped connection, they stay leased for a lease from the pull's sending: the stop is
            # not clean and the next run settles until then (RELIABILITY.md, "The spool as a write-ahead log").
            self._maybe_served(sent_ms)
            raise
        self.stalls.answered()
        with self.lock:  # in hand: from here any exit of the stream hands them back (:meth:`_stream_loop`)
            s.pending, s.pending_sent = [rm.ack_id for rm in raw.received_messages], sent_ms
        return data, raw, sent, sent_ms

    def _pulled_none(self, s: _Stream, sent: float) -> None:
        """A pull sent at ``sent`` (monotonic) brought nothing: the subscription is empty for now (``once``: maybe
        drained)."""
        with self.lock:
            self._empty = True
            if self._watcher is None:
                self._watcher = s.index
            if s.empty_since is None:
                s.empty_since = sent  # the pull waited for messages from then on, and none came
        if self.once:
            self._check_drained()

    def _take(self, s: _Stream, data: bytes, ids: list[str], n: int) -> None:
        """The stream holds a pull of ``n`` messages (``committed``: in its buffer, for its next segment)."""
        with self.lock:
            s.empty_since = None
            if self._empty:  # messages again: every stream pulls
                self._empty, self._watcher = False, None
                self.wake.notify_all()
            self.pulled += n
            self.delivered_at = self.clock()
            if not self.spooled:
                if not s.buffer:
                    s.opened = time.monotonic()
                s.buffer.append(data)
                s.ack_ids.extend(ids)
                s.count += n
                s.bytes += len(data)
                s.pending = []  # held for the batch from here on (and extended)

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
                            due = now - s.opened >= age or s.unclosed is not None  # or its close found no room
                            if s.open is not None and not s.inflight and due:
                                self._roll(s)
                        unclosed = [s.unclosed for s in self.streams if s.unclosed is not None]
                    for err in unclosed[:1]:  # tried again at each turn until there is room, or for outage_timeout
                        self._disk_full(err)
                    continue
                with self.lock:
                    old = [s for s in self.streams if s.buffer and now - s.opened >= age]
                for s in old:
                    self._flush(s)
            except Exception as err:  # noqa: BLE001 - as a stream that dies: the job stops, with the cause
                self._died(f"writing a spool segment of {self.subscription}", err)
                return

    def _spool_pull(self, s: _Stream, data: bytes, raw: Any, ids: list[str], n: int, sent: float) -> bool:
        """``spooled``: append the pull to the stream's open segment durably, acknowledge it, and close the segment
        (the planner may offer it from then on) once it is full or old.

        False if it could not be made durable: the disk is full (the pull is handed back, and the stream waits for
        room: :meth:`_disk_full_wait`), or another writer finished the segment (:attr:`fenced`: it pulls no more).
        Any other failure raises (the job stops with it).  The append runs outside the fetcher's lock: one stream's
        sync never waits for another's."""
        try:
            with self.lock:
                seg = s.open
                if seg is not None:
                    s.inflight += 1  # from here until it is acknowledged, the segment is not closed under it
            if seg is None:
                seg = OpenSegment(self.segdir, self.run, s.index, s.seq)
                with self.lock:
                    s.open, s.open_acked, s.opened, s.seq = seg, True, time.monotonic(), s.seq + 1
                    s.inflight += 1
            try:
                seg.append(data, n, oldest_of(raw))
            except BaseException:
                with self.lock:
                    s.inflight -= 1
                raise
        except AppendFailed as err:
            self._hand_back(s)
            if not err.full:
                raise
            self._disk_full(err)
            return False
        except SegmentFenced as err:
            self._hand_back(s)
            self._was_fenced(s, str(err))
            return False
        if self.stalls.disk_full_since is not None:
            with self.lock:
                self._room_again()
        faults.point("spooled", seg.path.name)  # durable, not yet acknowledged nor offered to Spark
        try:
            ok = acknowledge_in_bulk(self.client, self.subscription, ids, self.requests)
        except BaseException:
            with self.lock:
                # durable and not acknowledged: the stream's death hands them back (:meth:`_stream_loop`), so they
                # come again, and the segment holding this copy is not all acknowledged (the batch that reads it
                # keeps its dedupe keys for the redelivery, as after a failed acknowledgement)
                s.open_acked = False
                s.inflight -= 1
            raise
        in_time = time.monotonic() - sent < self.lease_seconds
        faults.point("spool_acked", seg.path.name)  # acknowledged: the spool is the only copy until its batch commits
        with self.lock:
            s.inflight -= 1  # with the flags below set: the segment is closed knowing whether all was acknowledged
            s.pending = []
            self._count_acked(s, n, sent, ok=ok, in_time=in_time)
            if s.open is seg and (seg.count >= self.settings.segment_messages
                                  or time.monotonic() - s.opened >= self.settings.segment_age):
                self._roll(s)
        if s.unclosed is not None:
            self._disk_full(s.unclosed)
        return True

    def _count_acked(self, s: _Stream, n: int, sent: float, *, ok: bool, in_time: bool) -> None:
        """How the acknowledgement of a pull of ``n`` messages sent at ``sent`` went (with the lock held)."""
        if ok and in_time:
            self.acked += n
        elif not ok:  # they come again once their lease runs out: the batch's dedupe keys wait for them
            self.left_leased = True
            s.open_acked = False
        else:
            # Acknowledged after the lease ran out: on a subscription without exactly-once delivery the service
            # answers OK all the same, and may have delivered them again meanwhile.  Counted as not received: the
            # batch keeps their keys until the redelivery has come (event_etl.task.dedupe).
            self.late_acks += n
            s.open_acked = False
            log.warning("%d messages of %s were acknowledged %.1f s after their pull, past the subscription's "
                        "%d-s lease: they may be delivered again (and dropped as duplicates)", n,
                        self.subscription, time.monotonic() - sent, self.lease_seconds)

    def _room_again(self) -> None:
        """An append or a close found room on the spool's disk (with the lock held): pulling goes on."""
        if self.stalls.room_again():
            log.warning("the spool's disk has room again: pulling %s goes on", self.subscription)

    def _disk_full(self, err: AppendFailed) -> None:
        """The spool's disk had no room for a pull (handed back already): wait for room, as in an outage (the
        watermark does not follow the clock, no hour is marked by the idle rule), and stop the job with the cause
        once it lasts ``outage_timeout``."""
        with self.lock:
            first, too_long = self.stalls.disk_full(time.monotonic(), err.cause.strerror or str(err.cause))
        if first:
            log.warning("the spool's disk is full (%s at %s): pulling %s waits for room; no hour is marked meanwhile",
                        err.cause.strerror, self.segdir, self.subscription)
        if too_long:
            self._fail(SourceError(
                f"the disk of the checkpoint's spool {self.segdir} has had no room for "
                f"{self.settings.outage_timeout:.0f}s ({err.cause.strerror}): {self.subscription} cannot be pulled",
                fix=f"free space on the disk that holds --checkpoint ({self.dir}), or give it a larger volume; "
                    "the job can be restarted on the same checkpoint and loses nothing (what it acknowledged is in "
                    "the spool, what it did not is still in Pub/Sub)"))

    def _disk_full_wait(self) -> float:
        """How long a stream waits before it tries a pull again on a full disk (:func:`waited_since`)."""
        return self.stalls.disk_full_wait(time.monotonic())

    def _was_fenced(self, s: _Stream, why: str) -> None:
        """Another writer finished the stream's open segment (a retried or speculative attempt of a fetch
        partition, a job that restarted on this checkpoint): what this one acknowledged before is in the finished
        segment, and it pulls no more (every stream stops: another writer has taken over)."""
        with self.lock:
            if s.open is not None:
                try:
                    os.close(s.open.fd)
                except OSError:
                    pass
                s.open = None
            first = not self.fenced
            self.fenced = True
        if first:
            log.warning("stopping the pulls of %s: %s (another writer took over this spool)", self.subscription, why)
        self._stop.set()
        with self.room:
            self.room.notify_all()
            self.wake.notify_all()

    def _roll(self, s: _Stream) -> None:
        """Close the stream's open segment (with the lock held): a segment from now on, held until a batch saves it."""
        seg = s.open  # still counted as open while it closes: a look at the backlog never misses it
        if seg is None:
            return
        try:
            name = seg.close()
        except SegmentFenced:
            s.open = None
            self.fenced = True  # finished by another writer, with everything acknowledged in it
            self._stop.set()
            return
        except AppendFailed as err:
            if not err.full:
                s.open = None
                raise
            # no room for its rename: it stays open (and counted), its pulls durable and acknowledged; the disk is
            # full (:meth:`_disk_full`, called by whoever rolled it, outside the lock) until a close or an append
            # finds room
            s.unclosed = err
            return
        except BaseException:
            s.open = None
            raise
        if s.unclosed is not None:
            s.unclosed = None
            self._room_again()
        if name is not None:
            self.held[name.name] = _Held([], name.count, seg.bytes, written=True, acked=s.open_acked)
            self._spool_acked(name.name, s.open_acked)
        s.open = None

    def _flush(self, s: _Stream) -> None:
        """``committed``: write the stream's open segment durably, then extend its messages' deadlines at once."""
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

    def _spool_acked(self, name: str, ok: bool) -> None:
        """A segment's messages were acknowledged once durable (``ok``: all of them); a fetch partition tells the
        driver (:mod:`event_etl.sources.pubsub_partitions`)."""

    def _check_drained(self) -> None:
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
        threading.Thread(target=self._mark_drained, name="pubsub-drained", daemon=True).start()

    def _mark_drained(self) -> None:
        from event_etl.storage.atomic import write_json_atomic

        for t in self._threads:
            if t.name.startswith("pubsub-pull-"):
                t.join()
        closed = self._close_open_segments()
        while not closed and not self._stop.wait(0.5):  # no room to close one: DRAINED once the planner sees all
            closed = self._close_open_segments()
        while any(not h.written for h in list(self.held.values())) and not self._stop.is_set():
            time.sleep(0.01)  # a segment the age timer is still writing
        if self.error is None and closed:
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
        """A batch saved the segments ``names``: acknowledge their messages (``committed``; ``spooled``: they were
        acknowledged when written), and no longer count them against the spool's bound.

        True if every one of them was pulled by this run and acknowledged: otherwise Pub/Sub
        will deliver some of them again (an earlier run's ids have expired, or an acknowledgement failed)."""
        if self.spooled:
            return self._release(names)
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

    def _release(self, names: set[str] | list[str]) -> bool:
        """``spooled``: the segments ``names`` are saved by a batch; True if this run acknowledged all of them."""
        all_acked = True
        with self.room:
            for name in names:
                base = os.path.basename(name)
                h = self.held.pop(base, None)
                if h is None:  # an earlier run's: acknowledged or not, it is no longer held once saved
                    all_acked = False
                    m, b = self.leftover
                    self.leftover = (max(0, m - segment_count(base)), b)
                elif not h.acked:
                    all_acked = False
            self.room.notify_all()
        return all_acked

    # -- what the controller asks ----------------------------------------------------------
    def down(self) -> str | None:
        """Why it cannot deliver what the subscription holds right now (None: it can): an error that stops the job,
        a full disk, an outage, a pull stream that is not running.  Never taken for a quiet subscription."""
        if self.error is not None:
            return f"stopped: {self.error.message}"
        stalled = self.stalls.down(time.monotonic())
        if stalled is not None:
            return stalled
        if self._threads and self._pulling() and not self.fenced:
            dead = [t.name for t in self._threads if t.name.startswith("pubsub-pull-") and not t.is_alive()]
            if dead:
                return f"{', '.join(dead)} not running"
        return None

    def activity(self) -> SourceActivity:
        """Backlog (pulled, not yet saved by a batch), whether it can deliver (an outage, a full disk, a stream
        down: :meth:`down`), last delivery and whether a killed run's leases may still come back (settling), for the
        idle rule and the markers."""
        if self.leftover[0]:
            # an earlier run's segments: a batch of this run saves them (ack()), or, one the killed run's batch had
            # read and Spark had committed, the planner deletes it unoffered: counted again, or it stays backlog
            Fetcher._count_leftovers(self)  # the spool only (a fetch partition's also drops its held segments)
        msgs, _ = self.held_totals()
        down = self.down()
        return SourceActivity(self.clock(), msgs, down is not None, self.delivered_at, settling=self.settling(),
                              down=down)

    def stats(self) -> dict[str, Any]:
        msgs, size = self.held_totals()
        requests = dict(self.requests)
        total = sum(requests.values())
        return {"pulled": self.pulled, "acked": self.acked, "held_messages": msgs, "held_bytes": size,
                "requests": requests, "requests_per_1000": (1000 * total / self.pulled) if self.pulled else None,
                "late_acks": self.late_acks, "down": self.down()}

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

