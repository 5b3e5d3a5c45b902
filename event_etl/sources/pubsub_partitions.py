"""Pulling Pub/Sub on the cluster's executors: N *fetch partitions* instead of the driver's threads.

With ``EVENT_ETL_PUBSUB_FETCH_PARTITIONS=N`` (N > 0) the job does not pull in its driver
process.  :class:`ExecutorFetcher` (in the driver) runs one long Spark job of N tasks beside
the streaming query, as the Databricks connector's ``numFetchPartitions`` does; each task
is a :class:`PartitionFetcher` on an executor: ``streams`` pull streams writing spool
segments into the checkpoint's spool, which every node reaches at the same path (the
``shared="checkpoint"`` rule of :mod:`event_etl.sources.registry`, checked by preflight and
again by each task).  So the pulling rate grows with executors instead of stopping at one
driver process; each partition takes one core for the whole run.

The contract is the driver fetcher's (:mod:`event_etl.sources.pubsub_fetch`):

- **Durable before offered**: a task writes a segment (synced, renamed) before the planner
  can see it; the planner in the driver logs and offers segments as before.
- **Acknowledged after the batch is saved**: the driver acknowledges a saved batch's
  messages itself, in bulk, with the ack ids the segments carry (an ack id is valid from any
  client of the subscription), then leaves ``<segment>.acked`` beside each segment.
- **Deadlines extended** by the task that pulled them, until it sees that mark (or the
  segment gone).
- **Bounded**: each task holds at most ``max_held_messages / N`` messages
  (``max_held_bytes / N`` bytes) not yet acknowledged.

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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

from event_etl.errors import SourceError, UsageError
from event_etl.rules.watermark import SourceActivity
from event_etl.sources.pubsub_fetch import DRAINED, Fetcher, FetchSettings, acknowledge_in_bulk, stats_line, subscriber
from event_etl.sources.spool import SegmentName, ack_ids, segment_count

__all__ = ["ExecutorFetcher", "PartitionFetcher", "fetch_partition", "acknowledge_segments", "ACKED_SUFFIX", "STOP"]

log = logging.getLogger(__name__)

ACKED_SUFFIX = ".acked"
STOP = "STOP"
STATUS_DIR = "status"
_TAKEN: dict[int, int] = {}
"""Cores taken by the fetch partitions of each SparkContext (by its id), across the event types of a fleet."""
_TAKEN_LOCK = threading.Lock()

ATTEMPT_SEQ = 10_000_000
"""A retried task's segments are numbered from ``attempt * ATTEMPT_SEQ``: never the name of an earlier attempt's."""


class PartitionFetcher(Fetcher):
    """One fetch partition's puller, in an executor task (see the module docstring)."""

    def __init__(self, subscription: str, spool_dir: str | os.PathLike[str], *, partition: int, partitions: int,
                 settings: FetchSettings, run: str, attempt: int = 0, once: bool = False,
                 client_factory: Callable[[], Any] | None = None, clock: Callable[[], int] | None = None) -> None:
        share = max(1, partitions)
        mine = replace(settings, max_held_messages=max(1, settings.max_held_messages // share),
                       max_held_bytes=max(1, settings.max_held_bytes // share))
        super().__init__(subscription, spool_dir, settings=mine, once=once, client_factory=client_factory,
                         clock=clock, run=run, stream_base=partition * max(1, settings.streams), fresh=False)
        self.partition = partition
        for s in self.streams:
            s.seq = attempt * ATTEMPT_SEQ
        self.pulls_done = threading.Event()

    def _forget_acked(self) -> None:
        """The driver acknowledged a segment (``.acked`` beside it) or the planner deleted it: no longer held."""
        with self.room:
            self._drop_acked()

    def _drop_acked(self) -> None:
        """:meth:`_forget_acked` with the lock already held."""
        gone = [n for n, h in self.held.items()
                if (self.segdir / (n + ACKED_SUFFIX)).exists() or (h.written and not (self.segdir / n).exists())]
        for n in gone:
            self.acked += self.held.pop(n).count
        if gone:
            self.room.notify_all()

    def _count_leftovers(self) -> None:  # called with the lock held, while waiting for room
        super()._count_leftovers()
        self._drop_acked()

    def _mark_drained(self) -> None:
        for t in self._threads:
            if t.name.startswith("pubsub-pull-"):
                t.join()
        self.pulls_done.set()  # the driver writes DRAINED once every partition has ended

    def status(self) -> dict[str, Any]:
        msgs, size = self.held_totals()
        return {"partition": self.partition, "run": self.run, "host": socket.gethostname(), "pid": os.getpid(),
                "pulled": self.pulled, "acked": self.acked, "held_messages": msgs, "held_bytes": size,
                "requests": dict(self.requests), "delivered_at": self.delivered_at,
                "outage": self.outage_since is not None, "error": self.error.message if self.error else None,
                "at": self.clock()}

    def write_status(self) -> None:
        from event_etl.storage.atomic import write_json_atomic

        write_json_atomic(self.dir / STATUS_DIR / f"{self.partition:04d}.json", self.status(), durable=False)


def fetch_partition(subscription: str, spool_dir: str, partition: int, partitions: int, settings: dict[str, Any],
                    run: str, once: bool, attempt: int = 0, *, client_factory: Callable[[], Any] | None = None,
                    report_every: float = 0.5) -> dict[str, Any]:
    """The body of fetch partition ``partition`` (an executor task): pull until ``STOP``, an error, or (``once``)
    the subscription stayed empty and everything pulled was acknowledged.  Returns its last status."""
    d = Path(spool_dir)
    if not (d / "segments").is_dir():
        raise SourceError(f"fetch partition {partition} on {socket.gethostname()} cannot reach the spool {d}",
                          fix="with EVENT_ETL_PUBSUB_FETCH_PARTITIONS the checkpoint must be on a mount every node "
                              "shares at the same path (NFS, Filestore), or set it to 0 to pull in the driver")
    (d / STATUS_DIR).mkdir(exist_ok=True)
    f = PartitionFetcher(subscription, d, partition=partition, partitions=partitions,
                         settings=FetchSettings(**settings), run=run, attempt=attempt, once=once,
                         client_factory=client_factory)
    f.start()
    stop = d / "segments" / STOP
    try:
        while not stop.exists() and f.error is None:
            f.write_status()
            if once and f.pulls_done.is_set():
                f._forget_acked()
                if not f.held:
                    break
            time.sleep(report_every)
    finally:
        f.stop()
        f.write_status()
    return f.status()


def acknowledge_segments(client, subscription: str, segdir: Path, names, requests: Counter) -> tuple[int, bool]:
    """Acknowledge, in bulk, the messages of the spool segments ``names`` with the ack ids they carry, then
    leave ``<segment>.acked`` beside each, so the partition that pulled them stops extending them.

    Returns the messages acknowledged and whether every request succeeded.  A segment already marked,
    or gone, is skipped."""
    ids: list[str] = []
    done: list[str] = []
    for name in names:
        base = os.path.basename(name)
        if SegmentName.parse(base) is None or (segdir / (base + ACKED_SUFFIX)).exists():
            continue
        try:
            ids.extend(ack_ids(segdir / base))
        except FileNotFoundError:
            continue
        done.append(base)
    if not acknowledge_in_bulk(client, subscription, ids, requests):
        return 0, False
    for base in done:
        (segdir / (base + ACKED_SUFFIX)).touch()
    return sum(segment_count(b) for b in done), True


def _task(subscription: str, spool_dir: str, partitions: int, settings: dict[str, Any], run: str, once: bool):
    """What Spark runs for each fetch partition (a partition of ``range(N)``)."""

    def run_partition(index, _rows):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        yield json.dumps(fetch_partition(subscription, spool_dir, index, partitions, settings, run, once, attempt))

    return run_partition


class ExecutorFetcher:
    """The driver's side of fetch partitions: runs the tasks, acknowledges saved batches, reports activity.

    It answers the job as :class:`~event_etl.sources.pubsub_fetch.Fetcher` does (``start``, ``stop``,
    ``ack``, ``activity``, ``stats``, ``summary_line``, ``describe``)."""

    def __init__(self, subscription: str, spool_dir: str | os.PathLike[str], *, spark, settings: FetchSettings,
                 once: bool = False, client_factory: Callable[[], Any] | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        from event_etl.timeutil import now_millis

        self.subscription = subscription
        self.dir = Path(spool_dir)
        self.segdir = self.dir / "segments"
        self.segdir.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.partitions = settings.fetch_partitions
        self.once = once
        self.spark = spark
        self.clock = clock or now_millis
        self._client_factory = client_factory
        self._client = None
        self.run = secrets.token_hex(4)
        self.group = f"event_etl-pubsub-fetch-{self.run}"
        self.requests: Counter = Counter()
        self.acked = 0
        self.error: SourceError | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
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
    def client(self):
        if self._client is None:
            self._client = subscriber(self._client_factory)
        return self._client

    # -- the fetch job -------------------------------------------------------------------------
    def start(self) -> "ExecutorFetcher":
        if self._thread is not None:
            return self
        from event_etl.sources.pubsub import ERROR_FILE

        for p in (self.segdir / DRAINED, self.segdir / STOP, self.dir / ERROR_FILE):
            p.unlink(missing_ok=True)
        status = self.dir / STATUS_DIR
        status.mkdir(exist_ok=True)
        for p in status.glob("*.json"):
            p.unlink(missing_ok=True)
        for p in self.segdir.glob("*" + ACKED_SUFFIX):  # marks of segments the planner deleted since
            if not (self.segdir / p.name[:-len(ACKED_SUFFIX)]).exists():
                p.unlink(missing_ok=True)
        self._thread = threading.Thread(target=self._run_job, name="pubsub-fetch-job", daemon=True)
        self._thread.start()
        return self

    def _run_job(self) -> None:
        from event_etl.sources.pubsub import ERROR_FILE
        from event_etl.storage.atomic import write_json_atomic

        sc = self.spark.sparkContext
        settings = asdict(self.settings)
        try:
            sc.setJobGroup(self.group, f"event_etl: pulling {self.subscription} ({self.partitions} fetch partitions)",
                           interruptOnCancel=True)
            body = _task(self.subscription, str(self.dir), self.partitions, settings, self.run, self.once)
            sc.parallelize(range(self.partitions), self.partitions).mapPartitionsWithIndex(body).collect()
            if self.once and not (self.segdir / STOP).exists() and not (self.dir / ERROR_FILE).exists():
                write_json_atomic(self.segdir / DRAINED, {"run": self.run, "at": self.clock(),
                                                          "pulled": self.stats()["pulled"]})
        except Exception as err:  # noqa: BLE001 - the fetch job failed: the job stops with the cause
            if not (self.segdir / STOP).exists() and not (self.dir / ERROR_FILE).exists():
                text = str(err).strip().splitlines()
                cause = next((ln for ln in reversed(text) if "Error" in ln), text[-1] if text else repr(err))
                self.error = SourceError(f"pulling {self.subscription} on the executors failed: {cause}",
                                         fix="see the executors' log for the cause; the job can be restarted on "
                                             "the same checkpoint and loses nothing")
                write_json_atomic(self.dir / ERROR_FILE, {"message": self.error.message, "fix": self.error.fix})
        finally:
            self._done.set()

    def _release_cores(self) -> None:
        with _TAKEN_LOCK:
            if not self._released:
                self._released = True
                key = id(self.spark.sparkContext)
                _TAKEN[key] = max(0, _TAKEN.get(key, 0) - self.partitions)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the fetch partitions; messages pulled and not written are delivered again."""
        self._release_cores()
        if self._thread is None:
            return
        (self.segdir / STOP).write_text("stop\n")
        self._thread.join(timeout)
        if self._thread.is_alive():
            try:
                self.spark.sparkContext.cancelJobGroup(self.group)
            except Exception as err:  # noqa: BLE001 - the session may be going already
                log.warning("cancelling the fetch job failed: %s", err)
            self._thread.join(5.0)

    # -- acknowledgements --------------------------------------------------------------------
    def ack(self, names: set[str] | list[str]) -> bool:
        """Acknowledge the messages of the segments ``names`` (a batch saved them); True if all were this
        run's (an earlier run's messages come again: their ack ids have expired)."""
        acked, ok = acknowledge_segments(self.client, self.subscription, self.segdir, names, self.requests)
        self.acked += acked
        fresh = all((n := SegmentName.parse(os.path.basename(x))) is not None and n.run == self.run for x in names)
        return fresh and ok

    # -- what the controller asks ----------------------------------------------------------
    def _statuses(self) -> list[dict[str, Any]]:
        out = []
        for p in sorted((self.dir / STATUS_DIR).glob("*.json")):
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if d.get("run") == self.run:
                out.append(d)
        return out

    def held_totals(self) -> tuple[int, int]:
        """Messages and bytes in segments not yet acknowledged, plus what the partitions hold unwritten."""
        msgs = size = 0
        for p in self.segdir.glob("*.seg"):
            if (self.segdir / (p.name + ACKED_SUFFIX)).exists():
                continue
            msgs += segment_count(p.name)
            try:
                size += p.stat().st_size
            except FileNotFoundError:
                continue
        return msgs, size

    def activity(self) -> SourceActivity:
        st = self._statuses()
        msgs, _ = self.held_totals()
        delivered = [d["delivered_at"] for d in st if d.get("delivered_at") is not None]
        return SourceActivity(self.clock(), msgs, any(d.get("outage") for d in st),
                              max(delivered) if delivered else None)

    def stats(self) -> dict[str, Any]:
        st = self._statuses()
        requests = Counter(self.requests)
        for d in st:
            requests.update({k: v for k, v in d.get("requests", {}).items() if k != "acknowledge"})
        pulled = sum(d.get("pulled", 0) for d in st)
        msgs, size = self.held_totals()
        total = sum(requests.values())
        return {"pulled": pulled, "acked": self.acked, "held_messages": msgs, "held_bytes": size,
                "requests": dict(requests), "requests_per_1000": (1000 * total / pulled) if pulled else None,
                "partitions": len(st)}

    def summary_line(self, name: str) -> str:
        return f"{stats_line(name, self.stats())}; {self.partitions} fetch partitions on executors"

    def describe(self) -> str:
        s = self.settings
        return (f"{self.partitions} fetch partitions on executors, {s.streams} pull streams each, at most "
                f"{s.max_held_messages:,} messages / {s.max_held_bytes >> 20} MiB held")
