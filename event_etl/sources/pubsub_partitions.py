"""Pulling Pub/Sub on the cluster's executors: N *fetch partitions* instead of the driver's threads.

With ``EVENT_ETL_PUBSUB_FETCH_PARTITIONS=N`` (N > 0) the job does not pull in its driver
process.  :class:`ExecutorFetcher` (in the driver) runs one long Spark job of N tasks beside
the rounds' jobs, as the Databricks connector's ``numFetchPartitions`` does; each task
is a :class:`PartitionFetcher` on an executor: ``streams`` pull streams writing spool
segments into the checkpoint's spool, which every node reaches at the same path (the
``shared="checkpoint"`` rule of :mod:`event_etl.sources.registry`, checked by preflight and
again by each task).  So the pulling rate grows with executors instead of stopping at one
driver process; each partition takes one core for the whole run.

The contract is the driver fetcher's (:mod:`event_etl.sources.pubsub_fetch`):

- **Durable before offered**: a task writes a segment (synced, renamed) before the planner
  can see it; the planner in the driver logs and offers segments as before.  Whichever
  attempt of a task wrote a segment, it is offered once: the planner logs each name once, and
  a retried attempt numbers its segments apart (:data:`ATTEMPT_SEQ`).
- **Acknowledged** (``EVENT_ETL_PUBSUB_ACK``):
  ``spooled``: by the task, once the segment is durable, before it pulls again; it then
  leaves ``<segment>.acked`` beside it, so the driver knows which segments' messages were
  acknowledged, also those of an attempt that died before it could report.
  ``committed``: by the driver once the batch is saved, in bulk, with the ack ids the segments
  carry (an ack id is valid from any client of the subscription), then ``<segment>.acked``;
  deadlines are extended by the task that pulled them until it sees that mark (or the segment
  gone).  A segment of an attempt no longer running was not extended: its messages come
  again, and the batch that read it says so to the dedupe state.
- **Bounded**: each task holds at most ``max_held_messages / N`` messages
  (``max_held_bytes / N`` bytes) that no batch has saved yet.

Each task reports to ``status/<partition>.json`` twice a second (pulled, requests, last
delivery, outage), from which the driver answers the idle rule's questions.  ``--once``:
a task ends when the subscription stayed empty for ``once_quiet`` and everything it pulled
was acknowledged; when all have, the driver writes ``DRAINED``.  A stop writes ``STOP``
(tasks end at their next look, within half a second) and, if they do not, cancels the job:
what was pulled and not written is delivered again by Pub/Sub.  An error a task meets is
left in the spool (``error.json``) as the driver fetcher leaves it, and stops the job.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from event_etl.errors import SourceError, UsageError
from event_etl.rules.watermark import SourceActivity
from event_etl.sources.pubsub_ack import acknowledge_in_bulk
from event_etl.sources.pubsub_fetch import Fetcher, SharedRun, stats_line, subscriber
from event_etl.sources.pubsub_run import FetchRun
from event_etl.sources.pubsub_settings import FetchSettings, spool_warning
from event_etl.sources.spool import ACKED_SUFFIX, STOP, SegmentName, Spool, segment_count

__all__ = ["ExecutorFetcher", "PartitionFetcher", "FetchJob", "fetch_partition", "acknowledge_segments", "ACKED_SUFFIX",
           "STOP"]

log = logging.getLogger(__name__)

_TAKEN: dict[int, int] = {}
"""Cores taken by the fetch partitions of each SparkContext (by its id), across the event types of a fleet."""
_TAKEN_LOCK = threading.Lock()

ATTEMPT_SEQ = 10_000_000
"""A retried task's segments are numbered from ``attempt * ATTEMPT_SEQ``: never the name of an earlier attempt's."""


@dataclass(frozen=True)
class FetchJob:
    """What every task of one fetch job pulls by, the same for all (sent to the executors with the task): the
    ``subscription``; the spool's folder ``spool_dir`` (on a mount every node shares at the same path); how many
    ``partitions`` pull; the fetcher's ``settings`` (:class:`FetchSettings`' fields, as a dict: each partition takes
    its share of the bounds); the driver's ``run``, which the partitions pull in; ``once`` (end once the
    subscription stayed empty); and ``lease_seconds``, the subscription's ack deadline as the driver learnt it
    (acknowledgements after it count as late; None: not learnt)."""

    subscription: str
    spool_dir: str
    partitions: int
    settings: dict[str, Any]
    run: str
    once: bool = False
    lease_seconds: int | None = None


class PartitionFetcher(Fetcher):
    """One fetch partition's puller, in an executor task (see the module docstring): partition ``partition`` of
    ``job``, in its attempt ``attempt``."""

    def __init__(self, job: FetchJob, partition: int, *, attempt: int = 0,
                 client_factory: Callable[[], Any] | None = None, clock: Callable[[], int] | None = None,
                 settle_seconds: float = 0.0) -> None:
        settings, run = FetchSettings(**job.settings), job.run
        share = max(1, job.partitions)
        mine = replace(settings, max_held_messages=max(1, settings.max_held_messages // share),
                       max_held_bytes=max(1, settings.max_held_bytes // share))
        super().__init__(job.subscription, job.spool_dir, settings=mine, once=job.once, client_factory=client_factory,
                         clock=clock, shared=SharedRun(run, stream_base=partition * max(1, settings.streams)))
        self.partition = partition
        self.attempt = attempt
        if job.lease_seconds:  # the subscription's, as the driver learnt it: acknowledgements after it count as late
            self.acks.lease_seconds = job.lease_seconds
        for s in self.streams:
            s.seq = attempt * ATTEMPT_SEQ
        # an earlier attempt of this task that died left its open segments: acknowledged messages, finished here
        streams = {s.index for s in self.streams}
        self.spool.recover(keep=lambda r, stream, seq: r == run and stream in streams and seq < attempt * ATTEMPT_SEQ)
        self.pulls_done = threading.Event()
        # the spool's mount as this executor's host sees it: the driver's check says nothing of it
        self.warning = spool_warning(f"fetch partition {partition} on {socket.gethostname()}", self.segdir,
                                     self.settings)
        if self.warning:
            log.warning("%s", self.warning)
        if settle_seconds > 0:  # the driver found an unclean stop: ``once`` waits for its leases as the driver does
            self.settle_seconds = settle_seconds
            self.settle_until = time.monotonic() + settle_seconds

    def segment_acked(self, name: str, ok: bool) -> None:
        """``spooled``: tell the driver the segment's messages were acknowledged (they come again otherwise)."""
        if ok:
            self.spool.mark_acked(name)

    def _forget_acked(self) -> None:
        """The driver acknowledged a segment (``.acked`` beside it) or the planner deleted it: no longer held."""
        with self.room:
            self._drop_acked()

    def _drop_acked(self) -> None:
        """:meth:`_forget_acked` with the lock already held."""
        gone = [n for n, h in self.held.items() if (not self.spooled and self.spool.is_acked(n))
                or (h.written and not self.spool.holds(n))]
        for n in gone:
            h = self.held.pop(n)
            if not self.spooled:
                self.acks.acked += h.count
        if gone:
            self.room.notify_all()

    def count_leftovers(self) -> None:  # called with the lock held, while waiting for room
        super().count_leftovers()
        self._drop_acked()

    def _mark_drained(self) -> None:
        for t in self._threads:
            if t.name.startswith("pubsub-pull-"):
                t.join()
        self.pulls_done.set()  # the driver writes DRAINED once every partition has ended

    def status(self) -> dict[str, Any]:
        msgs, size = self.held_totals()
        leased, until = self.acks.leaves_leased(self.streams), self.acks.left_leased_until(self.streams)
        return {"partition": self.partition, "run": self.run, "attempt": self.attempt, "host": socket.gethostname(),
                "pid": os.getpid(), "left_leased": leased, "leased_until": until,
                "fenced": self.fenced, "down": self.down(), "late_acks": self.acks.late_acks, "warning": self.warning,
                "pulled": self.pulled, "acked": self.acked, "held_messages": msgs, "held_bytes": size,
                "requests": dict(self.requests), "delivered_at": self.delivered_at,
                "outage": self.stalls.outage_since is not None, "error": self.error.message if self.error else None,
                "at": self.clock()}

    def write_status(self) -> None:
        self.spool.write_status(self.partition, self.status())


def fetch_partition(job: FetchJob, partition: int, attempt: int = 0, *,
                    client_factory: Callable[[], Any] | None = None, report_every: float = 0.5,
                    settle_seconds: float = 0.0, still_ours: Callable[[], None] | None = None) -> dict[str, Any]:
    """The body of fetch partition ``partition`` of ``job`` (an executor task, in its attempt ``attempt``): pull
    until ``STOP``, an error, or (``job.once``) the subscription stayed empty (after ``settle_seconds``: see
    :class:`PartitionFetcher`) and everything pulled was acknowledged.  Returns its last status.

    ``still_ours()`` raises once the job this task pulls for no longer holds its lease (a task of a driver that
    died, still running when the restarted driver starts): the task stops pulling at its next look, within
    ``report_every``, and ends with that error.  A task whose open segment another attempt finished (a retry, a
    speculative copy) stops pulling and ends quietly: that attempt has taken over.  An error raises, so that the
    driver learns it from the task's failure even when no file could be written (a full disk)."""
    spool = Spool.at(job.spool_dir)
    if spool is None:
        raise SourceError(f"fetch partition {partition} on {socket.gethostname()} cannot reach the spool "
                          f"{job.spool_dir}",
                          fix="with EVENT_ETL_PUBSUB_FETCH_PARTITIONS the checkpoint must be on a mount every node "
                              "shares at the same path (NFS, Filestore), or set it to 0 to pull in the driver")
    spool.begin_statuses(clear=False)
    f = PartitionFetcher(job, partition, attempt=attempt, client_factory=client_factory,
                         settle_seconds=settle_seconds)
    f.start()
    try:
        while not spool.stop_requested() and f.error is None and not f.fenced:
            if still_ours is not None:
                try:
                    still_ours()
                except Exception as err:  # noqa: BLE001 - LeaseHeldError, or the lease cannot be read: stop pulling
                    f.fail(SourceError(f"fetch partition {partition} stops: {err}",
                                        fix=getattr(err, "fix", None) or "the job that owns this spool runs "
                                        "elsewhere; this task's job stops"))
                    break
            _write_status(f)
            if job.once and f.pulls_done.is_set():
                f._forget_acked()
                if f.spooled or not f.held:  # spooled: every message was acknowledged when its segment was written
                    break
            time.sleep(report_every)
    finally:
        f.stop()
        _write_status(f)
    if f.error is not None:
        raise f.error
    return f.status()


def _write_status(f: PartitionFetcher) -> None:
    """Report to the driver; a report that cannot be written (a full disk) is skipped: the next one replaces it."""
    try:
        f.write_status()
    except OSError as err:
        log.warning("fetch partition %d could not report its status: %s", f.partition, err)


def acknowledge_segments(client: Any, subscription: str, spool: Spool | str | os.PathLike[str],
                         names: Iterable[str], requests: Counter[str]) -> tuple[int, bool]:
    """Acknowledge, in bulk, the messages of the spool segments ``names`` with the ack ids they carry, then
    mark each acknowledged in the spool (``<segment>.acked``), so the partition that pulled them stops extending
    them.  ``spool``: the spool, or its segments' folder.

    Returns the messages acknowledged and whether every request succeeded.  A segment already marked,
    or gone, is skipped."""
    if not isinstance(spool, Spool):
        spool = Spool.of_segments(spool)
    ids: list[str] = []
    done: list[str] = []
    for name in names:
        base = os.path.basename(name)
        if SegmentName.parse(base) is None or spool.is_acked(base):
            continue
        try:
            ids.extend(spool.ack_ids(base))
        except FileNotFoundError:
            continue
        done.append(base)
    if not acknowledge_in_bulk(client, subscription, ids, requests):
        return 0, False
    for base in done:
        spool.mark_acked(base)
    return sum(segment_count(b) for b in done), True


def _task(job: FetchJob, *, settle_until_ms: int = 0, fence: dict[str, Any] | None = None,
          sink: str | None = None) -> Callable[[int, Iterator[Any]], Iterator[str]]:
    """What Spark runs for each fetch partition of ``job`` (a partition of ``range(N)``).  ``settle_until_ms``:
    until when (wall clock) a killed run's leases may still come back.  ``fence`` and ``sink``: the job's lease,
    which the task checks as it pulls (:func:`fetch_partition`'s ``still_ours``)."""

    def run_partition(index: int, _rows: Iterator[Any]) -> Iterator[str]:
        from pyspark import TaskContext

        from event_etl.timeutil import now_millis

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        settle = max(0.0, (settle_until_ms - now_millis()) / 1000)
        still_ours = None
        if fence and sink:
            from event_etl.storage import open_storage
            from event_etl.storage.lease import Fence

            lease = Fence.of(fence, open_storage(sink))
            still_ours = lease.check if lease is not None else None
        yield json.dumps(fetch_partition(job, index, attempt, settle_seconds=settle, still_ours=still_ours))

    return run_partition


class ExecutorFetcher:
    """The driver's side of fetch partitions: runs the tasks, acknowledges saved batches, reports activity.

    It answers the job as :class:`~event_etl.sources.pubsub_fetch.Fetcher` does (``start``, ``stop``,
    ``ack``, ``activity``, ``stats``, ``summary_line``, ``describe``)."""

    def __init__(self, subscription: str, spool_dir: str | os.PathLike[str], *, spark: Any, settings: FetchSettings,
                 once: bool = False, client_factory: Callable[[], Any] | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        from event_etl.timeutil import now_millis

        self.subscription = subscription
        self.spool = Spool(spool_dir)
        self.dir, self.segdir = self.spool.dir, self.spool.segdir  # where it lies (the job reads segdir, for now)
        self.settings = settings
        self.partitions = settings.fetch_partitions
        self.once = once
        self.spark = spark
        self.clock = clock or now_millis
        self._client_factory = client_factory
        self._client: Any = None
        self.run = secrets.token_hex(4)
        self.group = f"event_etl-pubsub-fetch-{self.run}"
        self.requests: Counter[str] = Counter()
        self.acked = 0
        self.error: SourceError | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self.this_run = FetchRun(self.spool, subscription, clock=self.clock)
        self.settle_until = 0.0  # monotonic (see event_etl.sources.pubsub_run: settling)
        self.settle_until_ms = 0  # the same on the wall clock, for the tasks on other hosts
        self.leased_at: float | None = None  # monotonic: when the job took its checkpoint (see Fetcher.leased_at)
        self.cancelled = False
        self.fence: dict[str, Any] | None = None  # the job's lease, checked by the tasks (set by the job)
        self.lease_seconds: int | None = None  # the subscription's ack deadline, learnt at start
        self.sink: str | None = None  # where that lease lies
        self._warned: set[str] = set()
        if str(spark.conf.get("spark.speculation", "false")).strip().lower() == "true":
            raise UsageError(
                f"EVENT_ETL_PUBSUB_FETCH_PARTITIONS={self.partitions} cannot run with spark.speculation=true: a "
                "speculative copy of a fetch partition would pull and acknowledge beside the first, and the one Spark "
                "kills may leave acknowledged messages in a segment no running task finishes",
                fix="set spark.speculation=false for this application (it is off by default), or set "
                    "EVENT_ETL_PUBSUB_FETCH_PARTITIONS=0 to pull in the driver")
        cores = int(spark.sparkContext.defaultParallelism)
        with _TAKEN_LOCK:  # a fleet's Pub/Sub types share the application's cores: count them all
            others = _TAKEN.get(id(spark.sparkContext), 0)
            if others + self.partitions >= cores:
                also = f" (and other event types of this application take {others} more)" if others else ""
                raise UsageError(
                    f"EVENT_ETL_PUBSUB_FETCH_PARTITIONS={self.partitions} takes {self.partitions} of the "
                    f"application's {cores} cores for good{also}, leaving none for the batches",
                    fix=(f"set it below {cores - others}" if cores - others > 1 else "set it to 0 (pull in the driver)")
                    + ", or give the application more executor cores")
            _TAKEN[id(spark.sparkContext)] = others + self.partitions
        self._released = False

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = subscriber(self._client_factory)
        return self._client

    # -- the fetch job -------------------------------------------------------------------------
    def start(self) -> ExecutorFetcher:
        if self._thread is not None:
            return self
        self.spool.clear_drained()
        self.spool.clear_stop()
        self.spool.clear_error()
        self.spool.begin_statuses(clear=True)
        self.spool.forget_stale_marks()  # marks of segments the planner deleted since
        # a killed run's open segments (acknowledged messages, offered now), its leases, and this run's record
        self.lease_seconds, _, self.settle_until = self.this_run.begin(  # the tasks judge acknowledgements by it
            self.run, self.settings.ack, self.client, self.requests, leased_at=self.leased_at,
            extensions=0 if self.settings.spooled else self.settings.ack_deadline)
        if self.settling():
            left = max(0.0, self.settle_until - time.monotonic())
            self.settle_until_ms = self.clock() + int(left * 1000)
        self._thread = threading.Thread(target=self._run_job, name="pubsub-fetch-job", daemon=True)
        self._thread.start()
        return self

    def _run_job(self) -> None:
        sc = self.spark.sparkContext
        settings = asdict(self.settings)
        try:
            sc.setJobGroup(self.group, f"event_etl: pulling {self.subscription} ({self.partitions} fetch partitions)",
                           interruptOnCancel=True)
            job = FetchJob(self.subscription, str(self.dir), self.partitions, settings, self.run, once=self.once,
                           lease_seconds=self.lease_seconds)
            body = _task(job, settle_until_ms=self.settle_until_ms, fence=self.fence, sink=self.sink)
            sc.parallelize(range(self.partitions), self.partitions).mapPartitionsWithIndex(body).collect()
            while self.once and self.settling():  # a killed run's leases: the tasks waited too, this is their rest
                time.sleep(0.1)
            if self.once and not self.spool.stop_requested() and not self.spool.error_left():
                self.spool.mark_drained({"run": self.run, "at": self.clock(), "pulled": self.stats()["pulled"]})
        except Exception as err:  # noqa: BLE001 - the fetch job failed: the job stops with the cause
            if not self.spool.stop_requested() and not self.spool.error_left():
                text = str(err).strip().splitlines()
                cause = next((ln for ln in reversed(text) if "Error" in ln), text[-1] if text else repr(err))
                self.error = SourceError(f"pulling {self.subscription} on the executors failed: {cause}",
                                         fix="see the executors' log for the cause; the job can be restarted on "
                                             "the same checkpoint and loses nothing")
                self.spool.leave_error(self.error)
        finally:
            self._done.set()

    def _release_cores(self) -> None:
        with _TAKEN_LOCK:
            if not self._released:
                self._released = True
                key = id(self.spark.sparkContext)
                _TAKEN[key] = max(0, _TAKEN.get(key, 0) - self.partitions)

    def request_stop(self) -> None:
        """Ask the fetch partitions to stop, without waiting (:meth:`stop` waits)."""
        if self._thread is not None:
            self.spool.request_stop()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the fetch partitions; messages pulled and not written are delivered again."""
        self._release_cores()
        if self._thread is None:
            return
        self.spool.request_stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.cancelled = True
            try:
                self.spark.sparkContext.cancelJobGroup(self.group)
            except Exception as err:  # noqa: BLE001 - the session may be going already
                log.warning("cancelling the fetch job failed: %s", err)
            self._thread.join(5.0)
        statuses = self._statuses()
        until = max((int(d.get("leased_until") or 0) for d in statuses), default=0)
        self.this_run.end(self.run, clean=not self.cancelled and not self._leaves_leased(),
                          leased_until=None if self.cancelled or len(statuses) < self.partitions else until)

    def _leaves_leased(self) -> bool:
        """Whether messages this run's tasks pulled may still be leased (they come back when their lease runs out)."""
        statuses = self._statuses()
        if len(statuses) < self.partitions or any(d.get("left_leased", True) for d in statuses):
            return True
        return not self.settings.spooled and self.held_totals()[0] > 0

    def settling(self) -> bool:
        return time.monotonic() < self.settle_until

    # -- acknowledgements --------------------------------------------------------------------
    def ack(self, names: set[str] | list[str]) -> bool:
        """A batch saved the segments ``names``.  ``committed``: acknowledge their messages.  True if every one of
        them is acknowledged in time: ``spooled``, its task left the ``.acked`` mark; ``committed``, it is this
        run's and the attempt that wrote it still runs (its lease was extended).  Otherwise they come again."""
        if self.settings.spooled:
            return all(self.spool.is_acked(os.path.basename(x)) for x in names)
        acked, ok = acknowledge_segments(self.client, self.subscription, self.spool, names, self.requests)
        self.acked += acked
        running = {int(d["partition"]): int(d.get("attempt", 0)) for d in self._statuses()}
        streams = max(1, self.settings.streams)

        def extended(name: str) -> bool:
            n = SegmentName.parse(os.path.basename(name))
            return (n is not None and n.run == self.run
                    and running.get(n.stream // streams) == n.seq // ATTEMPT_SEQ)

        return all(extended(x) for x in names) and ok

    # -- what the controller asks ----------------------------------------------------------
    def _statuses(self) -> list[dict[str, Any]]:
        return self.spool.statuses(self.run)

    def held_totals(self) -> tuple[int, int]:
        """Messages and bytes in segments no batch has saved yet (``committed``: not yet acknowledged), the
        partitions' open and fenced segments included (:meth:`Spool.unsaved`)."""
        return self.spool.unsaved(skip_acked=not self.settings.spooled)

    def activity(self) -> SourceActivity:
        st = self._statuses()
        msgs, _ = self.held_totals()
        delivered = [d["delivered_at"] for d in st if d.get("delivered_at") is not None]
        for d in st:  # each executor's own mount: said once per host and partition
            w = d.get("warning")
            if w and w not in self._warned:
                self._warned.add(w)
                log.warning("%s", w)
        down = "; ".join(f"fetch partition {d.get('partition')}: {d['down']}" for d in st if d.get("down"))
        if self.error is not None:
            down = f"stopped: {self.error.message}"
        elif self._thread is not None and self._done.is_set() and not self.once:
            down = down or "the fetch job ended"
        return SourceActivity(self.clock(), msgs, bool(down) or any(d.get("outage") for d in st),
                              max(delivered) if delivered else None, settling=self.settling(), down=down or None)

    def stats(self) -> dict[str, Any]:
        st = self._statuses()
        requests = Counter(self.requests)
        for d in st:
            requests.update({k: v for k, v in d.get("requests", {}).items() if k != "acknowledge"})
        pulled = sum(d.get("pulled", 0) for d in st)
        msgs, size = self.held_totals()
        total = sum(requests.values())
        if self.settings.spooled:  # the tasks acknowledged what they spooled
            requests["acknowledge"] += sum(d.get("requests", {}).get("acknowledge", 0) for d in st)
            total = sum(requests.values())
        acked = sum(d.get("acked", 0) for d in st) if self.settings.spooled else self.acked
        return {"pulled": pulled, "acked": acked, "held_messages": msgs, "held_bytes": size,
                "requests": dict(requests), "requests_per_1000": (1000 * total / pulled) if pulled else None,
                "partitions": len(st)}

    def summary_line(self, name: str) -> str:
        return f"{stats_line(name, self.stats())}; {self.partitions} fetch partitions on executors"

    def describe(self) -> str:
        s = self.settings
        return (f"{self.partitions} fetch partitions on executors, {s.streams} pull streams each, at most "
                f"{s.max_held_messages:,} messages / {s.max_held_bytes >> 20} MiB held")
