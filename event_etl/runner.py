"""Running one event type's streaming job: Spark query, main loop, signals, drain, summary.

``event-etl run`` is a thin wrapper over :func:`run_job`.  The main loop waits for the
query in short steps and, between batches, lets the controller advance the watermark of
a quiet source.  SIGTERM stops at the next batch boundary and drains (every hour up to
the last one holding data is marked); SIGINT stops at the boundary without draining.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from event_etl.checkpoint import Checkpoint
from event_etl.driver import Controller, StopRequested
from event_etl.errors import EventEtlError, UsageError
from event_etl.eventtypes import EventType
from event_etl.progress import ProgressPrinter, format_summary
from event_etl.sources import SourceSpec, parse_source
from event_etl.storage import Storage
from event_etl.timeutil import iso, now_millis, parse_duration

__all__ = ["RunOptions", "run_job", "default_checkpoint", "resolve_sink"]

DEFAULT_SINK = "./data"
DEFAULT_TRIGGER = "5s"
DEFAULT_MAX_FILES_PER_BATCH = 64
DEFAULT_MAX_EVENTS_PER_BATCH = 500_000
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024


@dataclass
class RunOptions:
    """Everything ``event-etl run`` takes.  ``None`` means: the default."""

    source: str | None = None
    sink: str = DEFAULT_SINK
    checkpoint: str | None = None
    trigger_interval: str = DEFAULT_TRIGGER
    max_files_per_batch: int = DEFAULT_MAX_FILES_PER_BATCH
    max_events_per_batch: int = DEFAULT_MAX_EVENTS_PER_BATCH
    split_bytes: int = DEFAULT_SPLIT_BYTES
    once: bool = False
    drain: bool = False
    master: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    tick_seconds: float = 1.0
    quiet: bool = False
    max_seconds: float | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    otlp_endpoint: str | None = None
    metrics_history: str | None = None


def resolve_sink(sink: str) -> str:
    """Local sinks become absolute paths (executors may run elsewhere); URLs stay as they are."""
    if "://" in sink and not sink.startswith("file://"):
        return sink.rstrip("/")
    path = sink[7:] if sink.startswith("file://") else sink
    return os.path.abspath(path)


def default_checkpoint(event_type: str) -> str:
    """``./checkpoints/<event_type>``: predictable, next to the default sink."""
    return os.path.abspath(os.path.join("checkpoints", event_type))


def _check_checkpoint_location(path: str) -> None:
    if "://" in path and not path.startswith("file://"):
        raise UsageError(
            f"--checkpoint {path}: the checkpoint must be on a local or mounted file system",
            fix="Spark's checkpoint needs a Hadoop-compatible file system and no GCS connector ships with "
            "event_etl; use a local path (or a mounted shared volume on a cluster)",
        )


@dataclass
class Prepared:
    """A job checked and locked, before Spark: what run_job and a fleet share."""

    event_type: EventType
    options: RunOptions
    spec: SourceSpec
    sink: str
    storage: Storage
    ckpt: Checkpoint
    trigger_ms: int
    now: int
    lease: Any = None


def prepare_job(event_type: EventType, options: RunOptions, *, clock: Callable[[], int],
                checkpoint: str | None = None) -> Prepared:
    """Check the options, the source and the sink, and that the checkpoint belongs to this job (no Spark yet)."""
    try:
        trigger_ms = parse_duration(options.trigger_interval)
    except ValueError as err:
        raise UsageError(f"--trigger-interval: {err}", fix="e.g. --trigger-interval 5s") from err
    if trigger_ms <= 0:
        raise UsageError("--trigger-interval must be positive", fix="e.g. --trigger-interval 5s")
    if not options.once and event_type.idle_timeout and event_type.idle_timeout <= trigger_ms:
        raise UsageError(
            f"idle_timeout of {event_type.name} ({event_type.idle_timeout} ms) is not longer than the trigger interval",
            fix="raise idle_timeout in etl.toml or shorten --trigger-interval",
        )
    now = clock()
    spec: SourceSpec = parse_source(options.source or event_type.source, now=now,
                                    default_subscription=event_type.pubsub.get("subscription"))
    sink = resolve_sink(options.sink)
    ckpt_path = checkpoint or options.checkpoint or default_checkpoint(event_type.name)
    _check_checkpoint_location(ckpt_path)
    ckpt = Checkpoint(ckpt_path[7:] if ckpt_path.startswith("file://") else ckpt_path)
    storage = Storage(sink)
    storage.check_writable()
    if spec.kind == "pubsub":
        from event_etl.sources.pubsub import check_subscription

        check_subscription(spec.params["subscription"])
    from event_etl import __version__

    ckpt.open_format(release=f"event_etl {__version__}")  # refuses a newer format; migrates an older one
    old_job = ckpt.job()
    if old_job is not None:  # fail before starting Spark if the checkpoint is someone else's
        ckpt.bind({**old_job, "event_type": event_type.name, "sink": sink, "source": spec.identity()})
    return Prepared(event_type, options, spec, sink, storage, ckpt, trigger_ms, now)


def acquire_lease(p: Prepared) -> None:
    from event_etl.lease import Lease, default_ttl_ms

    p.lease = Lease(p.storage, p.event_type.name, p.ckpt.root, now_millis, ttl_ms=default_ttl_ms()).acquire()


@dataclass
class Job:
    """One event type's streaming job inside a Spark application: controller, metrics and query."""

    prepared: Prepared
    controller: Controller
    metrics: Any
    source_dir: str
    writer: Any  # DataStreamWriter, ready to start

    def start(self):
        return self.writer.start()


def open_job(p: Prepared, spark, *, clock: Callable[[], int], listeners=None, serve_metrics: bool = True) -> Job:
    """Bind the checkpoint, build the controller, metrics and the (not yet started) query of a prepared job."""
    from event_etl.metrics import job_metrics
    from event_etl.sources.spark import EtlSource

    spark.dataSource.register(EtlSource)
    et, options, ckpt = p.event_type, p.options, p.ckpt
    # How input is cut into tasks is fixed when the checkpoint is created: a replayed batch
    # must get the same tasks, hence the same file names, whatever the cluster is now.
    job = ckpt.bind({"event_type": et.name, "sink": p.sink, "source": p.spec.identity(), "created_at": iso(p.now),
                     "split_bytes": options.split_bytes, "writer": secrets.token_hex(3),
                     "tasks_per_batch": max(1, int(spark.sparkContext.defaultParallelism))})
    source_spec = {
        "kind": p.spec.kind,
        "params": p.spec.params,
        "log_dir": str(ckpt.source_dir(p.spec.kind)),
        "split_bytes": int(job.get("split_bytes", options.split_bytes)),
        "tasks_per_batch": int(job.get("tasks_per_batch", 2)),
        "max_files_per_batch": options.max_files_per_batch,
        "max_events_per_batch": options.max_events_per_batch,
        # how long Pub/Sub may be unreachable before the job gives up (with a clear message)
        "outage_timeout": float(os.environ.get("EVENT_ETL_PUBSUB_OUTAGE_SECONDS", "120")),
        # the ack deadline the source keeps extending (a redelivery after a crash waits this long)
        "ack_deadline": int(os.environ.get("EVENT_ETL_PUBSUB_ACK_DEADLINE", "60")),
    }
    printer = ProgressPrinter(et.name, clock, quiet=options.quiet)
    from event_etl.sources.activity import read_activity

    log_dir = source_spec["log_dir"]
    controller = Controller(
        event_type=et, storage=p.storage, checkpoint=ckpt, clock=clock, listeners=[printer, *(listeners or [])],
        writer=str(job.get("writer", "")), guard=p.lease.guard if p.lease is not None else None,
        fence=p.lease.fence() if p.lease is not None else None,
        source_activity=lambda: read_activity(log_dir),
        # the source reports at every trigger; a report older than this cannot tell what waits
        activity_stale_ms=max(3 * p.trigger_ms, 30_000),
    )
    metrics = job_metrics(et, options, clock=clock, controller_state=lambda: controller.state, serve=serve_metrics)
    controller.listeners.extend(metrics.listeners)
    writer = (
        spark.readStream.format("event_etl")
        .option("spec", json.dumps(source_spec))
        .load()
        .writeStream.foreachBatch(controller.handle_batch)
        .option("checkpointLocation", str(ckpt.spark_dir))
        .queryName(f"event_etl_{et.name}")
    )
    writer = (writer.trigger(availableNow=True) if options.once
              else writer.trigger(processingTime=f"{p.trigger_ms} milliseconds"))
    return Job(p, controller, metrics, source_spec["log_dir"], writer)


def install_stop_signals(stop: dict[str, Any], on_stop: Callable[[], None]) -> list[tuple[int, Any]]:
    """SIGTERM: stop at a batch boundary and drain; SIGINT: stop at a batch boundary.  Returns what to restore."""
    restore: list[tuple[int, Any]] = []

    def on_signal(signum, _frame):
        stop["requested"] = True
        stop["drain"] = stop["drain"] or signum == signal.SIGTERM
        on_stop()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            restore.append((sig, signal.signal(sig, on_signal)))
    return restore


def run_job(
    event_type: EventType,
    options: RunOptions,
    *,
    spark=None,
    clock: Callable[[], int] = now_millis,
    listeners: list[Callable[[str, Any], None]] | None = None,
    install_signals: bool = True,
) -> dict[str, Any]:
    """Run the job until its input ends (``once``/``drain``), a signal, or ``max_seconds``.  Returns the summary."""
    if options.drain:
        options.once = True  # drain: process what is available, then close every open hour
    p = prepare_job(event_type, options, clock=clock)
    acquire_lease(p)
    stop: dict[str, Any] = {"requested": False, "drain": options.drain, "controller": None}

    def on_stop() -> None:
        if stop["controller"] is not None:
            stop["controller"].request_stop()

    restore = install_stop_signals(stop, on_stop) if install_signals else []
    try:
        if spark is None:
            from event_etl.sparkutil import get_session

            spark = get_session(options.master, options.conf, app_name=f"event_etl:{event_type.name}")
        job = open_job(p, spark, clock=clock, listeners=listeners)
        controller = stop["controller"] = job.controller
        summary = lambda secs: _summary(event_type, p.sink, p.ckpt, controller, secs, options, stop)  # noqa: E731
        try:
            if stop["requested"]:  # a signal arrived while Spark was starting
                controller.request_stop()
                if stop["drain"]:
                    controller.drain()
                return summary(0.0)
            return _drive(query_writer=job.writer, controller=controller, metrics=job.metrics, options=options,
                          stop=stop, source_dir=job.source_dir, summary=summary)
        finally:
            job.metrics.shutdown()
    finally:
        for sig, old in restore:
            signal.signal(sig, old)
        p.lease.release()


def _drive(*, query_writer, controller: Controller, metrics, options: RunOptions, stop, source_dir: str, summary):
    """Start the query, wait for it between idle ticks, stop it at a batch boundary, drain if asked."""
    started = time.monotonic()
    query = query_writer.start()
    try:
        deadline = None if options.max_seconds is None else started + options.max_seconds
        from pyspark.errors import StreamingQueryException

        while query.isActive:
            try:
                query.awaitTermination(options.tick_seconds)
            except StreamingQueryException:
                break  # the cause is reported below, from the controller, the source, or Spark
            if stop["requested"]:
                break
            if deadline is not None and time.monotonic() >= deadline:
                stop["requested"] = True
                controller.request_stop()
                break
            if not options.once:
                controller.tick()
            metrics.observe_progress(query.lastProgress)
        if stop["requested"]:
            _stop_at_boundary(query, controller)
        else:
            _raise_query_failure(query, controller, source_dir)
    finally:
        if query.isActive:
            query.stop()
    if stop["drain"]:
        controller.drain()
    return summary(time.monotonic() - started)


def _summary(event_type, sink, ckpt, controller, seconds, options, stop) -> dict[str, Any]:
    totals = dict(controller.totals)
    events_in = sum(totals.get(k, 0) for k in ("timely", "late", "too_late", "future", "invalid", "duplicate"))
    summary = {
        "event_type": event_type.name,
        "sink": sink,
        "checkpoint": str(ckpt.root),
        "batches": controller.batches,
        "seconds": seconds,
        "events_in": events_in,
        "events_per_second": events_in / seconds if seconds > 0 else 0.0,
        "totals": totals,
        "watermark": iso(controller.state.watermark),
        "hours_marked": [iso(h) for h in controller.hours_marked],
        "stopped_by": "signal" if stop["requested"] else "end of input" if options.once else "query end",
    }
    if not options.quiet:
        print(format_summary(summary), flush=True)
    return summary


def _stop_at_boundary(query, controller: Controller) -> None:
    controller.request_stop()  # takes the lock: the running batch, if any, finishes first
    query.stop()
    if controller.failure is not None and not isinstance(controller.failure, StopRequested):
        raise controller.failure


def _raise_query_failure(query, controller: Controller, source_dir: str) -> None:
    if controller.failure is not None:
        raise controller.failure
    exc = query.exception()
    if exc is not None:
        msg = str(exc)
        if "StopRequested" in msg:
            return
        from event_etl.sources.pubsub import read_error

        source_error = read_error(source_dir)  # the source runs in another process: it leaves its error here
        if source_error is not None:
            raise source_error
        raise EventEtlError(f"the streaming query failed: {msg.splitlines()[0] if msg else exc!r}",
                            fix="see the log above for the cause; the job can be restarted on the same checkpoint")
