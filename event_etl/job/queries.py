"""``--engine queries``, deprecated: one Spark Structured Streaming query per type, as every job ran before 0.2.

Removed in event_etl 0.4 (docs/upgrading.md).  Kept until then as it was, behind :func:`run`, which
:mod:`event_etl.job.driver` calls once the leases are taken and Spark runs: each type's query runs its
``foreachBatch`` through the type's controller (the same phases and checkpoint as the shared engine, so a job moves
to the default engine on restart with nothing to migrate), a supervisor loop ticks the controllers and watches the
queries, and a stop closes each query's gate at a batch boundary (:func:`event_etl.job.stopping.stop_at_boundary`).
A fleet's query that fails is restarted after a backoff (state ``restarting``); one type's ends the run.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from event_etl.errors import EventEtlError
from event_etl.job.controller import Controller
from event_etl.job.fleet import finish, hold, status_line, write_status
from event_etl.job.setup import Job, RunOptions, open_job, start_fetcher
from event_etl.job.shared import FleetMember, spool_read, stop_pulling_for_drain
from event_etl.job.stopping import (
    POLL_S,
    Echo,
    Escalated,
    StopSignals,
    run_watched,
    signal_name,
    stop_at_boundary,
    stop_at_once,
)
from event_etl.job.summary import end_run

__all__ = ["run"]

Clock = Callable[[], int]
SPOOL_TIMEOUT_S = 300.0


def run(members: list[FleetMember], options: RunOptions, *, spark: Any, fleet: bool, clock: Clock,
        listeners: list[Callable[[str, Any], None]] | None, stops: StopSignals, stop_event: Any,
        status_every_s: float, echo: Echo) -> dict[str, dict[str, Any]]:
    """Run ``members`` as streaming queries on ``spark`` (leased, signals installed); each type's summary."""
    if fleet:
        return _Fleet(members, options, spark=spark, clock=clock, stops=stops, echo=echo).run(stop_event,
                                                                                             status_every_s)
    (m,) = members
    fetcher = start_fetcher(m.prepared)  # once the JVM runs (see event_etl.job.driver)
    try:
        job = open_job(m.prepared, spark, clock=clock, listeners=listeners, fetcher=fetcher)
    except BaseException:
        if fetcher is not None:  # what was pulled and not saved comes again
            fetcher.stop()
        raise
    try:
        return {m.name: _drive(job, options=options, stops=stops, echo=echo)}
    finally:
        job.close()


def _drive(job: Job, *, options: RunOptions, stops: StopSignals, echo: Echo) -> dict[str, Any]:
    """Start the query, watch it (idle ticks, metrics, signals), stop it at a batch boundary, drain if asked."""
    controller = job.controller
    started = time.monotonic()
    deadline = None if options.max_seconds is None else started + options.max_seconds
    query = None
    stopped_by = signal_name(stops.first) if stops.first is not None else None
    drain = stops.drain if stops.requested else options.drain  # decided once the job stops reading
    # A signal while Spark was starting: no query needed -- unless a drain must first see Spark
    # replay a batch that a crash left unfinished.
    if not stops.requested or (drain and controller.pending_batch is not None):
        query = job.start()
    try:
        if query is not None:
            stopped_by, drain = _watch_and_stop(query, job, options, stops, deadline, echo)
    finally:
        if query is not None and query.isActive:
            query.stop()
    return end_run(job, options, stops, started=started, stopped_by=stopped_by, drain=drain, echo=echo)


def _watch_and_stop(query: Any, job: Job, options: RunOptions, stops: StopSignals, deadline: float | None,
                    echo: Echo) -> tuple[str | None, bool]:
    try:
        stopped_by = _watch(query, job, options, stops, deadline)
        drain = stops.drain if stops.requested else options.drain
        if stopped_by is None:
            _raise_query_failure(query, job.controller, job.source_dir)
        else:
            if drain and job.fetcher is not None:  # the spool read before the drain marks hours
                _read_spools_before_drain([(job, query)], stops, options, echo=echo)
            stop_at_boundary([(job, query)], stops, drain=drain)
            _raise_query_failure(query, job.controller, job.source_dir)  # a batch that failed meanwhile
    except Escalated as esc:
        stop_at_once([(job, query)], stops, esc.signum)
    return stopped_by, drain


def _watch(query: Any, job: Job, options: RunOptions, stops: StopSignals, deadline: float | None) -> str | None:
    """Watch the running query until a signal (returns what stopped it), the time limit, or its own end (None)."""
    next_tick = time.monotonic() + options.tick_seconds
    while True:
        if stops.first is not None:
            return signal_name(stops.first)
        if deadline is not None and time.monotonic() >= deadline:
            return "time limit"
        if not query.isActive:
            return None
        if time.monotonic() >= next_tick:
            next_tick = time.monotonic() + options.tick_seconds
            _tick(job, query, options, stops)
        stops.sleep(POLL_S)


def _tick(job: Job, query: Any, options: RunOptions, stops: StopSignals | None) -> None:
    if not options.once and not (job.gate is not None and job.gate.busy):
        run_watched(job.controller.tick, stops, name="event_etl-tick")  # the lock waits out a batch
    job.metrics.observe_progress(query.lastProgress)


def _read_spools_before_drain(running: list[tuple[Job, Any]], stops: StopSignals, options: RunOptions, *,
                              echo: Echo, timeout: float = SPOOL_TIMEOUT_S) -> None:
    """What :func:`event_etl.job.shared.rounds_before_drain` does for the shared engine, with the queries' own
    triggers reading the spools: settle, stop pulling, then let each query run until it has committed every segment
    (at most ``timeout``; then the drain goes on and says what it left)."""
    running = [(job, q) for job, q in running if job.fetcher is not None and q.isActive]
    if not running:
        return
    stop_pulling_for_drain([(job.prepared.event_type.name, job.fetcher) for job, _ in running], stops,
                           quiet=options.quiet, echo=echo)
    deadline = time.monotonic() + timeout

    def unread() -> list[Job]:
        return [job for job, q in running if not spool_read(job.fetcher, job.prepared.ckpt.spark_dir)]

    while time.monotonic() < deadline and any(q.isActive for job, q in running if job in unread()):
        if stops.escalation is not None:
            raise Escalated(stops.escalation)
        stops.sleep(POLL_S)
    for job in unread():
        echo(f"[{job.prepared.event_type.name}] warning: the spool still holds messages after {timeout:.0f} s; "
             "the drain marks hours without them (they are read, late, by the next run)", err=True)


def _raise_query_failure(query: Any, controller: Controller, source_dir: str) -> None:
    if controller.failure is not None:
        raise controller.failure
    exc = query.exception()
    if exc is not None:
        msg = str(exc)
        from event_etl.sources.pubsub import read_error

        source_error = read_error(source_dir)  # the source runs in another process: it leaves its error here
        if source_error is not None:
            raise source_error
        raise EventEtlError(f"the streaming query failed: {msg.splitlines()[0] if msg else exc!r}",
                            fix="see the log above for the cause; the job can be restarted on the same checkpoint")


class _Fleet:
    """A fleet of queries: started together, supervised (ticks, restarts after a backoff), stopped together."""

    def __init__(self, members: list[FleetMember], options: RunOptions, *, spark: Any, clock: Clock,
                 stops: StopSignals, echo: Echo) -> None:
        self.members, self.options, self.spark, self.clock = members, options, spark, clock
        self.stops, self.echo = stops, echo
        self.endpoint: Any = None

    def run(self, stop_event: Any, status_every_s: float) -> dict[str, dict[str, Any]]:
        if self.options.metrics_port is not None:
            from event_etl.metrics import FleetEndpoint

            self.endpoint = FleetEndpoint(host=self.options.metrics_host, port=self.options.metrics_port)
        try:
            for m in self.members:
                self._open(m)
            if self.endpoint is not None:
                self.endpoint.serve()
                self.echo(f"[fleet] Prometheus metrics {self.endpoint.url}")
            started = time.monotonic()
            if not self.stops.requested:
                for m in self.members:
                    self._start(m)
            self._loop(started, stop_event, status_every_s)
            drain = self.stops.drain if self.stops.first is not None else self.options.drain
            self._stop(drain)
            return finish(self.members, self.stops, self.clock, drain=drain, started=started, echo=self.echo)
        finally:
            for m in self.members:
                if m.job is not None:
                    m.job.close()
            if self.endpoint is not None:
                self.endpoint.close()

    def _open(self, m: FleetMember) -> None:
        m.job = open_job(m.prepared, self.spark, clock=self.clock, serve_metrics=False)
        if self.endpoint is not None:
            self.endpoint.add(m.job.metrics)

    def _start(self, m: FleetMember) -> None:
        m.query = m.job.start()
        m.state = "running"
        m.restart_at = None
        write_status(m, self.clock)

    def _loop(self, started: float, stop_event: Any, status_every_s: float) -> None:
        last_status = time.monotonic()
        next_tick = time.monotonic() + self.options.tick_seconds
        deadline = None if self.options.max_seconds is None else started + self.options.max_seconds
        while not self.stops.requested:
            if stop_event is not None and stop_event.is_set():
                self.stops.request(signal.SIGINT)
                break
            active = [m for m in self.members if m.state in ("running", "restarting")]
            if not active or (deadline is not None and time.monotonic() >= deadline):
                break
            self.stops.sleep(POLL_S)
            if time.monotonic() < next_tick:
                continue
            next_tick = time.monotonic() + self.options.tick_seconds
            for m in self.members:
                self._supervise(m)
            if time.monotonic() - last_status >= status_every_s:
                last_status = time.monotonic()
                for m in self.members:
                    self.echo(status_line(m.status(self.clock)))

    def _supervise(self, m: FleetMember) -> None:
        """Tick a running member; restart a failed one after its backoff; notice one that finished."""
        if m.state == "restarting":
            if time.monotonic() >= (m.restart_at or 0):
                try:
                    m.job.close()
                    self._open(m)
                    self._start(m)
                except Exception as err:  # noqa: BLE001 - counted as another failure, retried later
                    self._failed(m, err)
            return
        if m.state != "running":
            return
        if m.query.isActive:
            _tick(m.job, m.query, self.options, self.stops)
            return
        failure: BaseException | None = m.job.controller.failure or m.query.exception()
        if failure is None:
            m.state = "stopped"  # --once: its input ended
            write_status(m, self.clock)
            return
        self._failed(m, failure)

    def _failed(self, m: FleetMember, err: BaseException) -> None:
        from event_etl.sources.pubsub import read_error

        wait = hold(m, read_error(m.job.source_dir) or err, self.clock, "restarting")  # the cause, not Spark's
        self.echo(f"[{m.name}] query failed ({m.failures} so far): {m.last_error}; restarting in {wait:.0f}s",
                  err=True)
        write_status(m, self.clock)

    def _stop(self, drain: bool) -> None:
        running = [(m.job, m.query) for m in self.members if m.query is not None and m.query.isActive]
        try:
            if drain:  # each spool read by its query before the drain marks hours
                _read_spools_before_drain(running, self.stops, self.options, echo=self.echo)
            stop_at_boundary(running, self.stops, drain=drain)
        except Escalated as esc:
            stop_at_once(running, self.stops, esc.signum)  # raises Interrupted
