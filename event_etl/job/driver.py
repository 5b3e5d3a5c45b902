"""The one driver of a job: ``event-etl run`` (one type or a fleet), the driver of ``event-etl submit``, the tests.

:func:`run` takes 1..N event types and runs them, top to bottom, in one place:

1. **checks and leases**, before Spark starts: each type is prepared (:func:`event_etl.job.setup.prepare_job`) and
   its checkpoint lock and sink lease taken; a stop asked for meanwhile is recorded and obeyed once the job runs;
2. **the session** (unless one is given), watched: a second signal while the JVM starts ends the process at once;
3. **the engine**, :class:`~event_etl.job.engine.Engine`, for one type as for a hundred: a round per trigger
   (:func:`~event_etl.job.engine.run_rounds`), ticks, metrics and supervision between rounds, then, for a drain,
   :func:`~event_etl.job.engine.rounds_before_drain`; a second signal cancels the round (:class:`Escalated`);
4. **the end**: drain if asked, the summary, the last line saying the exit code; every lease released.

One type is a fleet of one, with one difference, which is a decision, not an engine: **a single type is not
quarantined**.  A batch that fails ends its run with the error (exit 1, or the error's own code), as it always did:
a person running one type wants the error now, and a supervisor restarting the process is the backoff.  A fleet
quarantines a failing type and tries it again after a backoff while the others go on
(:func:`event_etl.job.fleet.quarantine`).  What a run says differs the same way: a single type ends with its summary
and ``[TYPE] run finished: exit 0 (...)``; a fleet with a line per type (:func:`event_etl.job.fleet.report_fleet`).

Signals follow :mod:`event_etl.job.stopping`: SIGINT, SIGTERM and SIGHUP stop after the round in flight and mark no
hour the watermark has not passed; SIGUSR1 (``event-etl drain``), and SIGTERM or SIGHUP under ``--drain-on-stop``,
also drain; a second SIGINT or SIGTERM stops at once (exit 130 or 143).  Every line for people goes through
``echo``, which the command line passes in.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from event_etl.errors import UsageError, unwrap_task_error
from event_etl.eventtypes import EventType
from event_etl.job.engine import Engine, round_summary, rounds_before_drain, run_rounds
from event_etl.job.fleet import (
    finish,
    member_checkpoint,
    quarantine,
    status_line,
    write_status,
)
from event_etl.job.member import FleetMember
from event_etl.job.setup import (
    Prepared,
    RunOptions,
    after_lease,
    close_shared,
    open_shared,
    prepare_job,
    release_lease,
    say_source_warning,
    take_lease,
)
from event_etl.job.stopping import (
    Echo,
    Escalated,
    Interrupted,
    StoppedAtOnce,
    StopSignals,
    at_once_line,
    run_watched,
    say,
)
from event_etl.job.summary import end_run
from event_etl.timeutil import now_millis
from event_etl.util.parallel import in_parallel

if TYPE_CHECKING:
    from event_etl.bus.session import BusHub

__all__ = ["run", "run_job", "run_fleet", "Summaries", "Hosting", "HostingArgs"]

Summaries = dict[str, dict[str, Any]]
"""What a run returns: each type's summary, by name."""


@dataclass(frozen=True)
class Hosting:
    """What the caller of a run (the command line, ``submit``'s driver, a test) gives around its types and options:
    the wall ``clock`` (ms); ``listeners`` of every type's events (beside its printer and metrics); ``stops``, the
    record of stop signals the job obeys (a new one by default), its handlers installed when ``install_signals``;
    ``stop_event`` (a ``threading.Event``), which, when set, stops the run as SIGINT does; ``status_every_s``, how
    often a fleet prints its status lines; ``echo``, which says every line for people."""

    clock: Callable[[], int] = now_millis
    listeners: list[Callable[[str, Any], None]] | None = None
    install_signals: bool = True
    stops: StopSignals | None = None
    stop_event: Any = None
    status_every_s: float = 30.0
    echo: Echo = say


class HostingArgs(TypedDict, total=False):
    """:class:`Hosting`'s fields, as keyword arguments of :func:`run` (each optional, its default Hosting's)."""

    clock: Callable[[], int]
    listeners: list[Callable[[str, Any], None]] | None
    install_signals: bool
    stops: StopSignals | None
    stop_event: Any
    status_every_s: float
    echo: Echo


def run(event_types: list[EventType], options: RunOptions, *, fleet: bool | None = None, spark: Any = None,
        **hosting: Unpack[HostingArgs]) -> Summaries:
    """Run ``event_types`` in one Spark application until their input ends (``once``/``drain``), a signal, or
    ``max_seconds``; returns each type's summary.

    ``fleet`` (default: more than one type) makes it a fleet: each type's checkpoint is ``<checkpoint>/<type>``,
    a failing type is quarantined, and the end is a line per type (printed by the caller).  The keyword arguments
    ``hosting`` are :class:`Hosting`'s (the clock, listeners, stop signals, the lines' ``echo``).  A session the
    driver starts itself (``spark=None``) is stopped, its JVM gone, before it returns."""
    d = _Driver(event_types, options, fleet=len(event_types) > 1 if fleet is None else fleet,
                hosting=Hosting(**hosting))
    try:
        d.lease_all()
        return d.run(spark)
    finally:
        d.release_leases()


def run_job(event_type: EventType, options: RunOptions, **kwargs: Any) -> dict[str, Any]:
    """One type's run (:func:`run` of one): its summary."""
    return run([event_type], options, fleet=False, **kwargs)[event_type.name]


def run_fleet(event_types: list[EventType], options: RunOptions, **kwargs: Any) -> Summaries:
    """A fleet's run (:func:`run`, even of one type: ``run --all``): each type's summary."""
    return run(event_types, options, fleet=True, **kwargs)


def _check(event_types: list[EventType], options: RunOptions, fleet: bool) -> None:
    if not event_types:
        raise UsageError("no event type to run", fix="name one, or give --all with a folder holding some")
    if not fleet and len(event_types) > 1:
        raise UsageError(f"{len(event_types)} event types to run as one", fix="run them as a fleet (fleet=True)")
    if fleet and options.source:
        raise UsageError("--source names one source, but a fleet runs several event types",
                         fix="set each type's `source` in its etl.toml, or run the types one by one")
    names = [et.name for et in event_types]
    if len(set(names)) != len(names):
        raise UsageError(f"an event type is named twice: {names}", fix="name each type once")


def _buses(event_types: list[EventType], prepared: dict[str, Prepared], options: RunOptions, *,
           fleet: bool) -> BusHub | None:
    """The buses among the types (types that read one source, each claiming its messages: :mod:`event_etl.bus`),
    checked before Spark starts; None when no type routes.  A bus keeps its source's state beside the types'
    checkpoints (``<checkpoint root>/_bus/<bus id>``; one type's run: in its checkpoint)."""
    from event_etl.bus.records import record_namer
    from event_etl.bus.session import BusHub as Hub
    from event_etl.rules.routing import plan_buses, route_of

    routes = {et.name: route_of(et.name, attribute=et.route_attribute, field=et.route_field, values=et.route_value,
                                settings_file=et.settings_file, source=prepared[et.name].spec.identity(),
                                payload=et.payload)
              for et in event_types}
    if not any(r is not None for r in routes.values()):
        return None
    plans = plan_buses([(et.name, prepared[et.name].spec.identity(), routes[et.name]) for et in event_types],
                       files={et.name: et.settings_file for et in event_types})
    first = event_types[0].name
    root = (os.path.dirname(member_checkpoint(options, first).rstrip("/")) if fleet
            else str(prepared[first].ckpt.root))
    by_name = {et.name: et for et in event_types}  # a bus by field: framed payloads routed by their record's name
    namers = {plan.id: record_namer([by_name[n] for n in plan.names]) for plan in plans
              if plan.routes[0][1].by == "field"}
    return Hub(plans, root, namers)


class _Driver:
    """One run's parts and steps (see the module docstring); :func:`run` calls them in order."""

    def __init__(self, event_types: list[EventType], options: RunOptions, *, fleet: bool, hosting: Hosting) -> None:
        _check(event_types, options, fleet)
        if options.drain:
            options.once = True  # drain: process what is available, then close every open hour
        self.event_types, self.options, self.fleet, self.clock = event_types, options, fleet, hosting.clock
        self.listeners, self.install_signals, self.echo = hosting.listeners, hosting.install_signals, hosting.echo
        self.stop_event, self.status_every_s = hosting.stop_event, hosting.status_every_s
        self.who = "fleet" if fleet else event_types[0].name
        self.members: list[FleetMember] = []
        self.hub: BusHub | None = None  # the buses among the types (event_etl.bus), if any
        self.spark: Any = None
        self.endpoint: Any = None
        self._endpoint_lock = threading.Lock()  # members opened at once add their metrics one at a time
        self.last_status = time.monotonic()
        self.stops = hosting.stops if hosting.stops is not None else StopSignals()
        self.stops.drain_on_stop = self.stops.drain_on_stop or options.drain_on_stop
        self.stops.accept_drain_requests()  # SIGUSR1 (event-etl drain): before the locks name this process the job's
        if hosting.install_signals:
            self.stops.install()  # before the leases: a stop asked for while one is waited for is obeyed later

    # -- 1. checks and leases ---------------------------------------------------------------------
    def lease_all(self) -> None:
        """Check and lock every type before Spark starts."""
        try:
            # checks and leases wait on the source, the sink and the disk: many types at a time
            prepared: dict[str, Prepared] = {}

            def prepare(et: EventType) -> None:
                ckpt = member_checkpoint(self.options, et.name) if self.fleet else None
                prepared[et.name] = prepare_job(et, self.options, clock=self.clock, checkpoint=ckpt)

            in_parallel(prepare, self.event_types, name="event_etl-prepare")
            self.hub = _buses(self.event_types, prepared, self.options, fleet=self.fleet)
            self.members = [FleetMember(et, prepared[et.name]) for et in self.event_types]
            in_parallel(lambda m: take_lease(m.prepared), self.members, name="event_etl-lease")
            os.sync()  # once for every type: what killed predecessors renamed is durable (setup.acquire_lease)
            for m in self.members:
                after_lease(m.prepared, self.stops, echo=self.echo)
        except Escalated as esc:
            self.release_leases()
            what = ("stopped at once while waiting for the leases" if self.fleet
                    else f"[{self.who}] stopped at once while waiting for the lease")
            raise StoppedAtOnce(esc.signum, f"{what}; nothing was processed") from None
        except BaseException:
            self._restore_signals()
            raise

    def release_leases(self) -> None:
        """Release every type's lease, many at a time (each is a read and a delete in the sink)."""
        def release(m: FleetMember) -> None:
            if m.prepared.lease is not None:
                release_lease(m.prepared.lease, self.stops)
                m.prepared.lease = None

        in_parallel(release, self.members, name="event_etl-release")

    def _restore_signals(self) -> None:
        if self.install_signals:
            self.stops.restore()  # a drain request from now on is ignored (SIGUSR1 would end the process)

    # -- 2. the session ---------------------------------------------------------------------------
    def run(self, spark: Any) -> Summaries:
        own_spark = spark is None
        try:
            self.spark = self._start_session() if own_spark else spark
            return self._run_shared()
        except StoppedAtOnce:
            own_spark = False  # not stopped: the JVM ends with the process (event_etl.job.stopping.end_at_once)
            raise
        finally:
            try:
                if own_spark and self.spark is not None:
                    from event_etl.job.session import stop_session

                    stop_session(self.spark)  # signals still only recorded meanwhile
            finally:
                self._restore_signals()

    def _start_session(self) -> Any:
        from event_etl.job.session import get_session

        app = f"event_etl fleet ({len(self.members)} types)" if self.fleet else f"event_etl:{self.who}"
        try:
            spark = run_watched(lambda: get_session(self.options.master, self.options.conf, app_name=app),
                                self.stops, name="event_etl-spark-start")
        except Escalated as esc:
            raise StoppedAtOnce(esc.signum, f"[{self.who}] stopped at once while Spark was starting; nothing was "
                                "processed") from None
        if self.install_signals:
            self.stops.install()  # once more, now that the SparkContext exists
        return spark

    # -- 3. the engine ----------------------------------------------------------------------------
    def _run_shared(self) -> Summaries:
        if self.fleet and self.options.metrics_port is not None:
            from event_etl.metrics import FleetEndpoint

            self.endpoint = FleetEndpoint(host=self.options.metrics_host, port=self.options.metrics_port)
        try:
            self.open_members(self.members)
            engine = Engine(self.spark, self.members, {m.name: m.source for m in self.members}, clock=self.clock)
            if self.endpoint is not None:
                self.endpoint.serve()
                self.echo(f"[fleet] Prometheus metrics {self.endpoint.url}")
            started = self.last_status = time.monotonic()
            for m in self.members:
                m.state = "running"
                self._status(m)
            try:
                stopped_by, drain = self._rounds(engine, started)
            finally:
                engine.close()
            return self._end(stopped_by, drain, started)
        finally:
            self._close_all()

    def open_members(self, members: list[FleetMember]) -> None:
        """Open every member, many at a time (each waits on its checkpoint, its sink and its source), their lines for
        people said in the members' order; the first failure is raised once every member was tried."""
        if len(members) <= 1:
            for m in members:
                self.open_member(m)
            return
        said: dict[str, list[tuple[str, bool]]] = {m.name: [] for m in members}

        def open_one(m: FleetMember) -> None:
            lines = said[m.name]
            self.open_member(m, echo=lambda line, /, *, err=False: lines.append((line, err)))

        try:
            in_parallel(open_one, members, name="event_etl-open")
        finally:
            for m in members:
                for line, err in said[m.name]:
                    self.echo(line, err=err)

    def open_member(self, m: FleetMember, *, echo: Echo | None = None) -> None:
        """Open a member for the engine: controller, metrics and printer, its source's lane (and fetcher)."""
        # Pub/Sub: pulling starts once the JVM runs, not while it is launched.  The JVM is forked with a
        # preexec_fn; a fork while the puller's threads are inside gRPC calls makes gRPC skip its fork
        # handlers, and the child could die before it ran Java (seen as JAVA_GATEWAY_EXITED at start-up).
        echo = echo or self.echo
        say_source_warning(m.prepared, echo=echo)
        m.job, m.lane = open_shared(m.prepared, self.spark, clock=self.clock, listeners=self.listeners,
                                    serve_metrics=not self.fleet, echo=echo, fleet=self.fleet, hub=self.hub)
        m.job.echo = self.echo  # its later lines (the end's) go out as they come
        if self.endpoint is not None:
            with self._endpoint_lock:
                self.endpoint.add(m.job.metrics)

    def _close_all(self) -> None:
        """Close every member: their sources asked to stop all at once, then stopped many at a time (a thousand
        types stop in seconds), then each job closed in order (its lines in the members' order)."""
        opened = [m.job for m in self.members if m.job is not None]
        try:
            for job in opened:
                if job.source is not None:
                    job.source.stop_soon()
            in_parallel(lambda job: job.source.stop() if job.source is not None else None, opened,
                        name="event_etl-stop")
        finally:
            try:
                for job in opened:
                    close_shared(job)
            finally:
                self._close_endpoint()

    def _close_endpoint(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()

    def _rounds(self, engine: Engine, started: float) -> tuple[str | None, bool]:
        """The rounds, then (for a drain) what a drain needs run first; returns what stopped them, and whether the
        job drains.  A second signal cancels the round's Spark jobs and raises :class:`Interrupted`."""
        deadline = None if self.options.max_seconds is None else started + self.options.max_seconds
        trigger_ms = min(m.prepared.trigger_ms for m in self.members)
        try:
            stopped_by = run_rounds(engine, self.members, self.options, self.stops, trigger_ms=trigger_ms,
                                    supervisor=self, deadline=deadline, stop_event=self.stop_event)
            line = round_summary(engine.history) if self.fleet else None
            if line and not self.options.quiet:
                self.echo(line)
            drain = self.stops.drain if self.stops.requested else self.options.drain  # decided once it stops reading
            if drain:  # a drain first finishes what a crash left unfinished, and reads what each spool holds
                rounds_before_drain(engine, self.members, self.stops, on_failure=self.on_failure,
                                    quiet=self.options.quiet, echo=self.echo)
        except Escalated as esc:
            engine.cancel()
            cut = [(m.name, m.lane.pending[0]) for m in self.members
                   if m.lane is not None and m.lane.pending is not None]
            raise Interrupted(esc.signum, at_once_line(self.who, esc.signum, cut)) from None
        return stopped_by, drain

    def on_failure(self, m: FleetMember, err: BaseException) -> None:
        """A type's source, batch or tick failed: a fleet quarantines it; a single type's run ends with the error."""
        if not self.fleet:
            raise unwrap_task_error(err)
        quarantine(m, err, self.clock, echo=self.echo)

    def on_done(self, m: FleetMember) -> None:
        m.state = "stopped"  # --once: its input ended
        self._status(m)

    def _status(self, m: FleetMember) -> None:
        if self.fleet:  # a single type has no status file: `event-etl status` reads its lease and checkpoint
            write_status(m, self.clock)

    def supervise(self, engine: Engine) -> None:
        """Between rounds: a quarantined type tried again after its backoff, the backlog metrics, the ticks (idle
        watermarks), a fleet's status lines."""
        for m in self.members:
            if m.state == "quarantined" and time.monotonic() >= (m.restart_at or 0):
                self._reopen(m)
            elif m.state == "running":
                m.opened.metrics.observe_progress(m.source.progress())  # the backlog metric
        if not self.options.once:
            self._tick([m for m in self.members if m.state == "running"], engine)
        if self.fleet and time.monotonic() - self.last_status >= self.status_every_s:
            self.last_status = time.monotonic()
            for m in self.members:
                self.echo(status_line(m.status(self.clock)))

    def _reopen(self, m: FleetMember) -> None:
        try:
            if m.job is not None:
                close_shared(m.job)
            self.open_member(m)
            m.state, m.restart_at = "running", None
            self._status(m)
        except Exception as err:  # noqa: BLE001 - another failure, tried again later
            self.on_failure(m, err)

    def _tick(self, running: list[FleetMember], engine: Engine) -> None:
        """Tick the running members (idle watermark, markers it completes), several at a time: one after the
        other, a hundred types' ticks would hold the next round back."""

        def tick(m: FleetMember) -> BaseException | None:
            try:
                m.opened.controller.tick()
            except Exception as err:  # noqa: BLE001 - e.g. a marker the sink refuses: this type only
                return err
            return None

        errors = run_watched(lambda: list(engine.pool.map(tick, running)), self.stops, name="event_etl-tick")
        for m, err in zip(running, errors, strict=True):
            if err is not None:
                self.on_failure(m, err)

    # -- 4. the end -------------------------------------------------------------------------------
    def _end(self, stopped_by: str | None, drain: bool, started: float) -> Summaries:
        if not self.fleet:
            (m,) = self.members
            return {m.name: end_run(m.opened, self.options, self.stops, started=started, stopped_by=stopped_by,
                                    drain=drain, echo=self.echo)}
        return finish(self.members, self.stops, self.clock, drain=drain, started=started, echo=self.echo)
