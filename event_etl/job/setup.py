"""Setting a job up, for one type and a fleet alike (:mod:`event_etl.job.driver` runs both): its options, its
checkpoint and lease, its controller, its source's fetcher and lane, its metrics.

:func:`prepare_job` checks everything that needs no Spark (event type, source, sink, checkpoint) and takes the
checkpoint's lease; :func:`open_shared` makes the :class:`Job` (controller, metrics, progress printer, the source's
fetcher) and its source's lane once Spark is up; :func:`release_lease` ends it.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from event_etl import faults
from event_etl.errors import UsageError
from event_etl.eventtypes import EventType
from event_etl.job.checkpoint import Checkpoint
from event_etl.job.context import Writer
from event_etl.job.controller import Controller
from event_etl.job.idle import IdleSettings
from event_etl.job.progress import GeneratorClock, ProgressPrinter

if TYPE_CHECKING:
    from event_etl.bus.session import BusHub
    from event_etl.job.lane import Lane
from event_etl.job.stopping import (
    Echo,
    StopSignals,
    say,
    wait_for,
)
from event_etl.sources import SourceSpec
from event_etl.sources.face import OpenRequest, SourceSession
from event_etl.sources.registry import job_source, open_source, source_kind
from event_etl.storage import Storage
from event_etl.storage.locations import default_checkpoint, is_remote, resolve_sink
from event_etl.timeutil import iso, now_millis, parse_duration

__all__ = ["DEFAULT_SINK", "DEFAULT_TRIGGER", "DEFAULT_MAX_FILES_PER_BATCH", "DEFAULT_MAX_EVENTS_PER_BATCH",
           "DEFAULT_SPLIT_BYTES", "RunOptions", "Prepared", "prepare_job", "release_lease", "acquire_lease",
           "take_lease", "after_lease", "Job", "say_source_warning", "open_parts", "open_shared", "close_shared"]

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
    drain_on_stop: bool = False  # SIGTERM and SIGHUP also drain (a plain stop does not: event_etl.job.stopping)
    master: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    tick_seconds: float = 1.0
    quiet: bool = False
    max_seconds: float | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    otlp_endpoint: str | None = None
    metrics_history: str | None = None


def _check_checkpoint_location(path: str) -> None:
    if is_remote(path):
        raise UsageError(
            f"--checkpoint {path}: the checkpoint must be on a local or mounted file system",
            fix="Spark's checkpoint needs a Hadoop-compatible file system and no GCS connector ships with "
            "event_etl; use a local path (or a mounted shared volume on a cluster)",
        )
    local = path[7:] if path.startswith("file://") else path
    if os.path.exists(local) and not os.path.isdir(local):
        raise UsageError(f"--checkpoint {path}: a file is there, not a folder",
                         fix="give the folder a job keeps its checkpoint in (made if missing), e.g. "
                             "--checkpoint ./checkpoints/TYPE; move the file away if it is in the way")


@dataclass
class Prepared:
    """A job checked and locked, before Spark (one per type of a run)."""

    event_type: EventType
    options: RunOptions
    spec: SourceSpec
    sink: str
    storage: Storage
    ckpt: Checkpoint
    trigger_ms: int
    now: int
    lease: Any = None
    leased_at: float | None = None  # monotonic: when the lease was taken (a Pub/Sub restart settles from then)


def prepare_job(event_type: EventType, options: RunOptions, *, clock: Callable[[], int],
                checkpoint: str | None = None) -> Prepared:
    """Check the options, the source and the sink, and that the checkpoint belongs to this job (no Spark yet)."""
    event_type.check_versions()  # the current schema reads every registered version (event_etl.eventtypes)
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
    spec: SourceSpec = job_source(event_type, options.source, now=now)
    sink = resolve_sink(options.sink)
    ckpt_path = checkpoint or options.checkpoint or default_checkpoint(event_type.name)
    _check_checkpoint_location(ckpt_path)
    ckpt = Checkpoint(ckpt_path[7:] if ckpt_path.startswith("file://") else ckpt_path)
    storage = Storage(sink)
    storage.check_writable()
    source_kind(spec.kind).check(spec)
    from event_etl import __version__

    ckpt.open_format(release=f"event_etl {__version__}")  # refuses a newer format; migrates an older one
    old_job = ckpt.job()
    if old_job is not None:  # fail before starting Spark if the checkpoint is someone else's
        ckpt.bind({**old_job, "event_type": event_type.name, "sink": sink, "source": spec.identity()})
    return Prepared(event_type, options, spec, sink, storage, ckpt, trigger_ms, now)


def release_lease(lease: Any, stops: StopSignals | None = None) -> None:
    """Release a job's lease and checkpoint lock once nothing of the job can write any more.

    After a stop at once, a batch or a drain may go on in the thread :func:`run_watched` left it in.  Its writes
    are fenced first (each checks the lease: the next one is refused), and it is given a few seconds to end; if it
    has not, the locks are kept: the process ends now, and the kernel releases the checkpoint lock only then (a
    restart on this host takes the sink lease over once it holds that lock)."""
    from event_etl.job.stopping import LATE_STEP_WAIT_S, abandoned_steps

    late = abandoned_steps(stops)
    if late:
        lease.fence_off("this job was stopped at once")
        deadline = time.monotonic() + LATE_STEP_WAIT_S
        for th in late:
            th.join(max(0.0, deadline - time.monotonic()))
        if any(th.is_alive() for th in late):
            lease.abandon()
            return
    lease.release()


def acquire_lease(p: Prepared, stops: StopSignals | None = None, *, echo: Echo = say) -> None:
    """Take the type's checkpoint lock and sink lease; after a dead predecessor, wait until its tasks are fenced off
    (:func:`take_lease`, then what a killed predecessor left made durable, then :func:`after_lease`).

    The wait watches ``stops``: a first stop signal is recorded and obeyed once the job runs (a drain still drains),
    a repeated one raises :class:`~event_etl.job.stopping.Escalated` with the lease held (``p.lease``).  The wait's
    line goes through ``echo``."""
    take_lease(p)
    # A SIGKILLed predecessor may have renamed files it had not synced yet, which this job relies on from now on
    # (a data file a replay finds in place, a marker it adopts): made durable before anything builds on them.  A
    # fleet takes every type's lease first, then syncs once (one os.sync, not one per type).
    os.sync()
    after_lease(p, stops, echo=echo)


def take_lease(p: Prepared) -> None:
    """Take the type's checkpoint lock and sink lease (``p.lease``)."""
    from event_etl.storage.lease import Lease, default_ttl_ms

    p.lease = Lease(p.storage, p.event_type.name, p.ckpt.root, now_millis, ttl_ms=default_ttl_ms()).acquire()
    p.leased_at = time.monotonic()


def after_lease(p: Prepared, stops: StopSignals | None = None, *, echo: Echo = say) -> None:
    """Once the lease is held and what a predecessor left is durable (``os.sync``): sweep the checkpoint's
    temporaries, and wait for a dead predecessor's tasks when a batch is to be replayed (see :func:`acquire_lease`)."""
    p.ckpt.sweep_temporaries()  # the checkpoint is this job's now; its source starts writing there only later
    if p.lease is not None:
        p.lease.say = lambda line: echo(line, err=True)  # a renewal that comes late says so, as the job's lines do
    latest = p.ckpt.latest_intent_id()
    if latest is not None and latest > p.ckpt.load_state().last_batch_id:  # a batch to replay: its tasks may live on
        if p.lease is None:
            raise AssertionError("after_lease before take_lease")
        p.lease.wait_for_old_tasks(None if p.options.quiet else echo,
                                   sleep=None if stops is None else lambda s: wait_for(lambda: False, stops, timeout=s))
    faults.point("leased")


@dataclass
class Job:
    """One event type's streaming job inside a Spark application: controller, metrics, progress printer, and its
    source's session (:class:`~event_etl.sources.face.SourceSession`)."""

    prepared: Prepared
    controller: Controller
    metrics: Any
    source_dir: str
    printer: ProgressPrinter | None = None
    source: SourceSession | None = None
    policies: Any = None  # the type's commit policies (event_etl.job.policies.PolicyChain), if it has some
    echo: Echo = say  # where its lines for people go (what the command line passed the driver)

    def close(self) -> None:
        """After the last round: stop the source (what was pulled and not saved comes again; its summary line), the
        commit policies, the metrics."""
        try:
            if self.source is not None:
                self.source.stop()
                line = self.source.summary_line(self.prepared.event_type.name)
                if line and not self.prepared.options.quiet:
                    self.echo(line)
        finally:
            try:
                if self.policies is not None:  # after the drain's markers: a short, bounded time to notify them
                    self.policies.stop()
            finally:
                self.metrics.shutdown()


def say_source_warning(p: Prepared, *, echo: Echo = say) -> None:
    """What the source says of itself when the job starts (Pub/Sub: a volatile spool; Kafka: read_uncommitted),
    through ``echo``, on stderr."""
    warning = source_kind(p.spec.kind).warning(p.event_type.name, p.spec, str(p.ckpt.source_dir(p.spec.kind)))
    if warning:
        echo(warning, err=True)


Listener = Callable[[str, Any], None]


def open_parts(p: Prepared, spark: Any, *, clock: Callable[[], int], listeners: list[Listener] | None = None,
               serve_metrics: bool = True, echo: Echo = say, fleet: bool = False,
               hub: BusHub | None = None) -> tuple[Job, dict[str, Any]]:
    """Bind the checkpoint; open the type's source session; build the controller (given the session's hooks),
    metrics and progress printer of a prepared job, and the spec of its source, for the lane :func:`open_shared`
    opens on it."""
    from event_etl.sources.registry import SPLIT_PLAN

    et, options, ckpt = p.event_type, p.options, p.ckpt
    plan = hub.plan_of(et.name) if hub is not None else None
    bus = {"id": plan.id, "folder": hub.folder(plan, p.spec.kind)} if hub is not None and plan is not None else None
    # How input is cut into tasks is fixed when the checkpoint is created: a replayed batch
    # must get the same tasks, hence the same file names, whatever the cluster is now.
    job = ckpt.bind({"event_type": et.name, "sink": p.sink, "source": p.spec.identity(), "created_at": iso(p.now),
                     "split_bytes": options.split_bytes, "writer": secrets.token_hex(3),
                     "tasks_per_batch": max(1, int(spark.sparkContext.defaultParallelism)), "bus": bus,
                     **({"split_plan": SPLIT_PLAN} if ckpt.format >= 3 else {})})  # see event_etl.job.checkpoint
    _same_place(p, job.get("bus"), bus)
    source_spec: dict[str, Any] = {
        "kind": p.spec.kind,
        "params": p.spec.params,
        "log_dir": str(ckpt.source_dir(p.spec.kind)),
        "split_bytes": int(job.get("split_bytes", options.split_bytes)),
        "tasks_per_batch": int(job.get("tasks_per_batch", 2)),
        "split_plan": int(job.get("split_plan", 1)),  # 1: as event_etl 0.2.0 and before cut batches
        "max_files_per_batch": options.max_files_per_batch,
        "max_events_per_batch": options.max_events_per_batch,
        "event_type": et.name,  # Kafka: the consumer group it commits to
    }
    # Pub/Sub: its fetcher pulls from now on, into the spool the session offers; it acknowledges what batches saved
    request = OpenRequest(
        et.name, source_spec, clock, once=options.once, spark_dir=str(ckpt.spark_dir), spark=spark,
        leased_at=p.leased_at, fence=p.lease.fence() if p.lease is not None else None, sink=p.storage.url,
        fleet=fleet)
    session: SourceSession
    if hub is None or plan is None:
        session = open_source(request)
    else:  # a bus: the types' one session, opened in the bus's folder by the first of them to open
        bus_spec = {**source_spec, "log_dir": hub.folder(plan, p.spec.kind), "event_type": f"bus_{plan.id}"}
        session = hub.view(et.name, lambda: open_source(replace(request, spec=bus_spec)))
    try:
        opened = _open_controller(p, session, writer=str(job.get("writer", "")), log_dir=str(source_spec["log_dir"]),
                                  clock=clock, listeners=listeners, serve_metrics=serve_metrics, echo=echo)
    except BaseException:
        session.stop()
        raise
    routing = session.routing
    if routing is not None and plan is not None and et.name == plan.names[0]:  # the bus's count, on its first type
        routing.listen(lambda n: opened.metrics.count_unclaimed(plan.id, n))
    return opened, source_spec


def _same_place(p: Prepared, then: dict[str, Any] | None, now: dict[str, Any] | None) -> None:
    """A type's offsets are positions in the place its source keeps what it read (its own spool, or its bus's): a
    checkpoint that has offsets goes on only where they were made (a type joining or leaving a bus, or a bus's
    folder moved between a run of its own and a fleet, would read another spool from those positions)."""
    from event_etl.errors import CheckpointMismatchError

    offsets = p.ckpt.spark_dir / "offsets"
    if (then or None) == (now or None) or not offsets.is_dir() or not any(f.name.isdigit() for f in offsets.iterdir()):
        return  # the same place, or nothing read yet
    name = p.event_type.name

    def where(bus: dict[str, Any] | None) -> str:
        return f"bus {bus['id']} (its state in {bus['folder']})" if bus else "its source on its own"

    raise CheckpointMismatchError(
        f"[{name}] checkpoint {p.ckpt.root} read {where(then)}, and would now read {where(now)}: its offsets are "
        "positions in the first",
        fix=f"run {name} as before (the same types together, the same --checkpoint-root), drain it there "
            "(--drain), then start it the new way with a new --checkpoint; or undo the change to its route_* "
            "settings")


def _open_controller(p: Prepared, session: SourceSession, *, writer: str, log_dir: str, clock: Callable[[], int],
                     listeners: list[Listener] | None, serve_metrics: bool, echo: Echo) -> Job:
    """The controller, metrics, printer and commit policies of a prepared job whose source ``session`` is open."""
    from event_etl.metrics import job_metrics

    et, options, ckpt = p.event_type, p.options, p.ckpt
    # the generator's clock runs ahead of the wall clock: the lag is read on it, in the progress lines and in the
    # metrics history alike (marker delays are on the wall clock everywhere: event_etl.rules.delays)
    event_clock = GeneratorClock(ckpt.spark_dir, clock) if source_kind(p.spec.kind).event_clock else None
    printer = ProgressPrinter(et.name, clock, quiet=options.quiet, event_clock=event_clock,
                              settings_file=et.settings_file)  # named when a backfill goes to the dead letters
    controller = Controller(
        event_type=et, storage=p.storage, checkpoint=ckpt, clock=clock, listeners=[printer, *(listeners or [])],
        writer=Writer(writer, guard=p.lease.guard if p.lease is not None else None,
                      fence=p.lease.fence() if p.lease is not None else None),
        # the source reports at every trigger; a report older than this cannot tell what waits
        idle=IdleSettings(monotonic=time.monotonic, activity_stale_ms=max(3 * p.trigger_ms, 30_000)), source=session,
    )
    if not options.quiet:
        say_backfill_held(controller, p.storage, echo=echo)
    if p.lease is not None and session.spooled:  # how far back a seek must go, in the sink (it outlives a lost
        p.lease.extra = _lease_fields(controller, session)  # checkpoint)
    metrics = job_metrics(et, options, clock=clock, controller_state=lambda: controller.state, serve=serve_metrics,
                          checkpoint=str(ckpt.root), event_clock=event_clock)
    controller.listeners.extend(metrics.listeners)
    job = Job(p, controller, metrics, log_dir, printer, session, echo=echo)
    if et.commit_policies:
        job.policies = start_policies(controller, listeners=metrics.listeners)
        metrics.policy_pending = job.policies.pending
    return job


def _lease_fields(controller: Controller, session: SourceSession) -> Callable[[], dict[str, Any]]:
    """What a spooling source's job writes into its lease at every renewal, for people: how far back a seek must go
    (it outlives a lost checkpoint), and why the source cannot deliver, while it cannot."""
    from event_etl.job.status import seek_fields_at

    ooo = controller.et.out_of_orderness

    def for_people() -> dict[str, Any]:
        activity = session.activity()
        down = activity.down if activity is not None else None
        return {**seek_fields_at(controller.state, ooo, session.oldest_spooled()),
                **({"source_down": down} if down else {})}

    return for_people


def say_backfill_held(controller: Controller, storage: Storage, *, echo: Echo = say) -> None:
    """At the start of a run on a checkpoint that has read batches but has no watermark (everything it read went to
    the dead letters): say how many of the type's dead letters are there for ``max_backfill`` and how to take them.
    Its source consumed them, so this run does not read them again (a ``dir:`` job reads ``0 batches``), even with
    ``max_backfill`` raised.  The line goes through ``echo``, on stdout."""
    from event_etl.job.status import backfill_deadletters

    state, et = controller.state, controller.et
    if state.watermark is not None or state.last_batch_id < 0:
        return
    held = backfill_deadletters(storage, et.name, state, max_backfill=et.max_backfill, settings_file=et.settings_file)
    if held is not None:
        echo(f"[{et.name}] {held['line']}; this checkpoint does not read them again")


def start_policies(controller: Controller, *, listeners: list[Any] | None = None) -> Any:
    """The type's commit policies (:mod:`event_etl.job.policies`), fed by the controller's saved markers, started."""
    from event_etl.job.policies import PolicyChain

    et = controller.et
    chain = PolicyChain([make_policy(c, et, controller.storage) for c in et.commit_policies], controller.ctx,
                        marked=lambda: (controller.state.first_hour, controller.state.marked_through),
                        listeners=listeners)
    controller.listeners.append(chain.on_event)
    return chain.start()


def make_policy(config: dict[str, Any], event_type: EventType, storage: Storage) -> Any:
    """The commit policy of one checked ``[[commit_policy]]`` table (its module imported on use)."""
    if config["kind"] == "pubsub":
        from event_etl.job.policy_pubsub import PubSubPolicy

        return PubSubPolicy(config)
    if config["kind"] == "openlineage":
        from event_etl.job.policy_openlineage import OpenLineagePolicy

        return OpenLineagePolicy(config, event_type, storage)
    if config["kind"] == "iceberg":
        from event_etl.job.policy_iceberg import IcebergPolicy

        return IcebergPolicy(config, event_type, storage)
    raise ValueError(f"unknown commit policy kind {config['kind']!r}")  # eventtypes checked it


def open_shared(p: Prepared, spark: Any, *, clock: Callable[[], int], listeners: list[Listener] | None = None,
                serve_metrics: bool = True, echo: Echo = say, fleet: bool = False,
                hub: BusHub | None = None) -> tuple[Job, Lane]:
    """A prepared job opened for the engine (:mod:`event_etl.job.engine`): its source's session, its controller,
    metrics and printer, and its lane over the session.  Returns ``(job, lane)``."""
    from event_etl.job.lane import Lane, SparkLog
    from event_etl.sources.registry import batch_cap

    job, spec = open_parts(p, spark, clock=clock, listeners=listeners, serve_metrics=serve_metrics, echo=echo,
                           fleet=fleet, hub=hub)
    session = job.source
    if session is None:
        raise AssertionError("open_parts opens the source")
    try:
        lane = Lane.open(session, SparkLog(p.ckpt.spark_dir), cap=batch_cap(spec), once=p.options.once)
        session.start()  # pulling on the executors starts now, with the lane (a driver's puller runs already)
    except BaseException:
        job.close()
        raise
    return job, lane


def close_shared(job: Job, lane: Lane | None = None) -> None:
    """Close a job: its source's session (no more pulls), its policies and metrics."""
    job.close()
