"""A fleet: several event types in one Spark application (the shared engine's rounds; ``--engine queries``: one
streaming query per type).

``event-etl run TYPE1 TYPE2 ...`` (or ``--all``) shares one JVM and one set of executors
between types, instead of one application per type.  Each type keeps everything of its
own: its source (the type's ``source`` setting), checkpoint (``<root>/<type>``),
watermark, markers, dead-letter area, lease and metrics (one Prometheus endpoint serves
all of them, each series labelled with its ``event_type``).

A supervisor loop ticks every type's controller (idle watermarks) and watches the
queries.  A query that fails is restarted on its checkpoint after a backoff (5 s, doubled
up to 5 minutes) without disturbing the others; its state (``running``, ``restarting``,
``stopped``, ``failed``, ``drain failed``) and last error are written to
``<root>/<type>/etl/status.json`` and shown by ``event-etl status``.

Signals follow :mod:`event_etl.job.stopping`, as for one type: SIGINT, SIGTERM and SIGHUP stop
every type at its next batch boundary and mark no hour the watermark has not passed; SIGUSR1
(``event-etl drain``), and SIGTERM or SIGHUP under ``--drain-on-stop``, also drain every type
-- each type on its own, so one that cannot drain (a batch a crash left unfinished, a sink
that fails) is reported in its status and summary and does not keep the others from draining;
a second SIGINT or SIGTERM stops at once.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.errors import EventEtlError, UsageError
from event_etl.eventtypes import EventType
from event_etl.job.setup import (
    RunOptions,
    acquire_lease,
    open_job,
    prepare_job,
    release_lease,
)
from event_etl.job.shared import FleetMember
from event_etl.job.status import STATUS_FILE, read_status  # noqa: F401 - read_status: part of the fleet API
from event_etl.job.stopping import (
    POLL_S,
    Escalated,
    StopSignals,
    cut_short_line,
    exit_now,
    run_finished_line,
    run_watched,
    say,
    signal_name,
    stop_at_boundary,
    stop_at_once,
)
from event_etl.rules.judge import OUTCOMES
from event_etl.storage.atomic import write_json_atomic
from event_etl.timeutil import format_duration, iso, now_millis

__all__ = ["run_fleet", "summary_lines", "report_fleet", "FleetMember", "backoff_seconds", "drain_all", "STATUS_FILE"]

FIRST_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0


def backoff_seconds(failures: int, first: float | None = None) -> float:
    """Wait before the ``failures``-th restart of a query: 5 s, 10 s, 20 s ... at most 5 minutes.

    ``first`` (default: ``$EVENT_ETL_FLEET_BACKOFF`` seconds, else 5) is the first wait."""
    from event_etl.settings import current_settings
    from event_etl.util.retry import exponential_backoff

    if first is None:
        first = current_settings().fleet_backoff
    base = first if first is not None else FIRST_BACKOFF_S
    return exponential_backoff(max(1, failures), first=base, cap=MAX_BACKOFF_S)


def member_checkpoint(options: RunOptions, name: str) -> str:
    """The checkpoint of fleet member ``name``: ``<--checkpoint>/<name>``, else the type's default."""
    from event_etl.storage.locations import default_checkpoint

    return str(Path(options.checkpoint) / name) if options.checkpoint else default_checkpoint(name)


def run_fleet(event_types: list[EventType], options: RunOptions, *, spark=None, clock: Callable[[], int] = now_millis,
              install_signals: bool = True, status_every_s: float = 30.0, stop_event=None,
              stops: StopSignals | None = None) -> dict[str, Any]:
    """Run every type of ``event_types`` in one Spark application; returns a summary per type.

    ``stop_event`` (a ``threading.Event``), when set, stops the fleet like SIGINT does.  A
    session the fleet starts itself (``spark=None``) is stopped, its JVM gone, before it returns."""
    if options.source:
        raise UsageError("--source names one source, but a fleet runs several event types",
                         fix="set each type's `source` in its etl.toml, or run the types one by one")
    names = [et.name for et in event_types]
    if len(set(names)) != len(names):
        raise UsageError(f"an event type is named twice: {names}", fix="name each type once")
    if options.drain:
        options.once = True
    members: list[FleetMember] = []
    stops = stops if stops is not None else StopSignals()
    stops.drain_on_stop = stops.drain_on_stop or options.drain_on_stop
    stops.accept_drain_requests()  # SIGUSR1 (event-etl drain): before the locks name this process as the jobs'
    if install_signals:
        stops.install()  # before the leases: a stop asked for while one is waited for is obeyed once the fleet runs
    try:
        try:
            for et in event_types:  # check and lock everything before Spark starts
                p = prepare_job(et, options, clock=clock, checkpoint=member_checkpoint(options, et.name))
                members.append(FleetMember(et, p))
                acquire_lease(p, stops)
        except Escalated as esc:
            for m in members:
                if m.prepared.lease is not None:
                    release_lease(m.prepared.lease, stops)
            exit_now(128 + esc.signum, "stopped at once while waiting for the leases; nothing was processed")
        except BaseException:
            if install_signals:
                stops.restore()
            raise
        run = _run_shared if options.engine == "shared" else _run
        return run(members, options, spark=spark, clock=clock, install_signals=install_signals,
                   status_every_s=status_every_s, stop_event=stop_event, stops=stops)
    finally:
        for m in members:
            if m.prepared.lease is not None:
                release_lease(m.prepared.lease, stops)


def _run(members: list[FleetMember], options: RunOptions, *, spark, clock, install_signals, status_every_s, stop_event,
         stops: StopSignals):
    from event_etl.metrics import FleetEndpoint

    if install_signals:
        stops.install()
    own_spark = spark is None
    endpoint = FleetEndpoint(host=options.metrics_host, port=options.metrics_port) \
        if options.metrics_port is not None else None
    try:
        if own_spark:
            spark = _start_session(len(members), options, stops, install_signals)
        for m in members:
            m.job = open_job(m.prepared, spark, clock=clock, serve_metrics=False)
            if endpoint:
                endpoint.add(m.job.metrics)
        if endpoint:
            endpoint.serve()
            print(f"[fleet] Prometheus metrics {endpoint.url}", flush=True)
        started = time.monotonic()
        if not stops.requested:
            for m in members:
                _start(m, clock)
        last_status = time.monotonic()
        next_tick = time.monotonic() + options.tick_seconds
        deadline = None if options.max_seconds is None else started + options.max_seconds
        while not stops.requested:
            if stop_event is not None and stop_event.is_set():
                stops.request(signal.SIGINT)
                break
            active = [m for m in members if m.state in ("running", "restarting")]
            if not active or (deadline is not None and time.monotonic() >= deadline):
                break
            stops.sleep(POLL_S)
            if time.monotonic() < next_tick:
                continue
            next_tick = time.monotonic() + options.tick_seconds
            for m in members:
                _supervise(m, options, clock, spark, endpoint, stops)
            if time.monotonic() - last_status >= status_every_s:
                last_status = time.monotonic()
                for m in members:
                    say(_status_line(m.status(clock)))
        drain = stops.drain if stops.first is not None else options.drain
        running = [(m.job, m.query) for m in members if m.query is not None and m.query.isActive]
        try:
            if drain:  # each spool read by its query before the drain marks hours (see rounds_before_drain)
                _read_spools_before_drain([m for m in members if m.query is not None and m.query.isActive
                                           and m.job.fetcher is not None], stops, options)
            stop_at_boundary(running, stops, drain=drain)
        except Escalated as esc:
            stop_at_once(running, stops, esc.signum)  # raises Interrupted
        return _finish(members, stops, clock, drain, started)
    finally:
        _release(members, lambda m: m.job.close(), endpoint, spark if own_spark else None, stops, install_signals)


def _read_spools_before_drain(members: list[FleetMember], stops: StopSignals, options: RunOptions,
                              timeout: float = 300.0) -> None:
    """``--engine queries``: settle, stop pulling, and let each query commit what its spool holds (at most
    ``timeout``) before the drain marks hours."""
    from event_etl.job.shared import spool_read, stop_pulling_for_drain

    if not members:
        return
    stop_pulling_for_drain([(m.name, m.job.fetcher) for m in members], stops, quiet=options.quiet)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(not spool_read(m.job.fetcher, m.prepared.ckpt.spark_dir)
                                              and m.query.isActive for m in members):
        if stops.escalation is not None:
            raise Escalated(stops.escalation)
        stops.sleep(POLL_S)


def _release(members: list[FleetMember], close: Callable[[FleetMember], None], endpoint, own_spark, stops: StopSignals,
             install_signals: bool) -> None:
    """After a fleet: close every member's job, the metrics endpoint, the session the fleet started; the signals."""
    try:
        for m in members:
            if m.job is not None:
                close(m)
        if endpoint:
            endpoint.close()
        if own_spark is not None:
            from event_etl.job.session import stop_session

            stop_session(own_spark)
    finally:
        if install_signals:
            stops.restore()


def _start_session(n: int, options: RunOptions, stops: StopSignals, install_signals: bool):
    from event_etl.job.session import get_session

    try:
        spark = run_watched(lambda: get_session(options.master, options.conf, app_name=f"event_etl fleet ({n} types)"),
                            stops, name="event_etl-spark-start")
    except Escalated as esc:
        exit_now(128 + esc.signum, "[fleet] stopped at once while Spark was starting; nothing was processed")
    if install_signals:
        stops.install()  # once more, now that the SparkContext exists
    return spark


def _finish(members: list[FleetMember], stops: StopSignals, clock, drain: bool, started: float) -> dict[str, Any]:
    """After the loop: drain (if asked), write every status, and the summary per type."""
    for m in members:
        if m.state in ("running", "restarting"):
            m.state = "stopped"
    if drain:
        drain_all(members, stops, clock)
    for m in members:
        _write_status(m, clock)
    seconds = time.monotonic() - started
    summary = {m.name: _member_summary(m, seconds, clock) for m in members}
    for m in members:
        summary[m.name]["stopped_by"] = signal_name(stops.first) if stops.first is not None else None
        summary[m.name]["drained"] = drain and m.drain_error is None
    return summary


def _run_shared(members: list[FleetMember], options: RunOptions, *, spark, clock, install_signals, status_every_s,
                stop_event, stops: StopSignals):
    """The fleet through one shared micro-batch loop (:mod:`event_etl.job.shared`)."""
    from event_etl.job.shared import SharedEngine, interrupted_line, round_summary, rounds_before_drain, run_rounds
    from event_etl.job.stopping import Interrupted
    from event_etl.metrics import FleetEndpoint

    if install_signals:
        stops.install()
    own_spark = spark is None
    endpoint = FleetEndpoint(host=options.metrics_host, port=options.metrics_port) \
        if options.metrics_port is not None else None
    engine = None
    try:
        if own_spark:
            spark = _start_session(len(members), options, stops, install_signals)
        for m in members:
            _open_shared(m, spark, options, clock, endpoint)
        engine = SharedEngine(spark, members, {m.name: m.lane for m in members}, clock=clock)
        if endpoint:
            endpoint.serve()
            print(f"[fleet] Prometheus metrics {endpoint.url}", flush=True)
        started = time.monotonic()
        for m in members:
            m.state = "running"
            _write_status(m, clock)
        last_status = [time.monotonic()]

        def supervise() -> None:
            for m in members:
                _supervise_shared(m, options, clock, spark, endpoint, stops)
            if not options.once:
                _tick_shared([m for m in members if m.state == "running"], engine.pool, clock, stops)
            if time.monotonic() - last_status[0] >= status_every_s:
                last_status[0] = time.monotonic()
                for m in members:
                    say(_status_line(m.status(clock)))

        def done(m: FleetMember) -> None:
            m.state = "stopped"  # --once: its input ended
            _write_status(m, clock)

        deadline = None if options.max_seconds is None else started + options.max_seconds
        trigger_ms = min(m.prepared.trigger_ms for m in members)
        try:
            run_rounds(engine, members, options, stops, trigger_ms=trigger_ms,
                       on_failure=lambda m, err: _quarantine(m, err, clock), on_done=done, supervise=supervise,
                       deadline=deadline, stop_event=stop_event)
            line = round_summary(engine.history)
            if line and not options.quiet:
                say(line)
            drain = stops.drain if stops.first is not None else options.drain
            if drain:  # a drain first finishes what a crash left unfinished, and reads what each spool holds
                rounds_before_drain(engine, members, stops, on_failure=lambda m, err: _quarantine(m, err, clock),
                                    quiet=options.quiet)
        except Escalated as esc:
            engine.cancel()
            raise Interrupted(esc.signum, interrupted_line(members, esc.signum)) from None
        return _finish(members, stops, clock, drain, started)
    finally:
        if engine is not None:
            engine.close()
        _release(members, _close_shared, endpoint, spark if own_spark else None, stops, install_signals)


def _open_shared(m: FleetMember, spark, options: RunOptions, clock, endpoint) -> None:
    """Open a member for the shared engine: controller, metrics and printer (no query), and its source's lane."""
    from event_etl.job.setup import open_shared, start_fetcher

    m.job, m.lane = open_shared(m.prepared, spark, clock=clock, serve_metrics=False, fetcher=start_fetcher(m.prepared))
    if endpoint:
        endpoint.add(m.job.metrics)


def _close_shared(m: FleetMember) -> None:
    from event_etl.job.setup import close_shared

    close_shared(m.job, m.lane)


def _supervise_shared(m: FleetMember, options: RunOptions, clock, spark, endpoint, stops: StopSignals | None) -> None:
    """Between rounds: try a quarantined member again after its backoff; a running one reports its backlog."""
    if m.state == "quarantined":
        if time.monotonic() >= (m.restart_at or 0):
            try:
                _close_shared(m)
                _open_shared(m, spark, options, clock, endpoint)
                m.state = "running"
                m.restart_at = None
                _write_status(m, clock)
            except Exception as err:  # noqa: BLE001 - another failure, tried again later
                _quarantine(m, err, clock)
        return
    if m.state != "running":
        return
    m.job.metrics.observe_progress(m.lane.progress())  # the backlog metric


def _tick_shared(running: list[FleetMember], pool, clock, stops: StopSignals | None) -> None:
    """Tick the running members (idle watermark, markers it completes), several at a time: one after the
    other, a hundred types' ticks would hold the next round back."""

    def tick(m: FleetMember) -> BaseException | None:
        try:
            m.job.controller.tick()
        except Exception as err:  # noqa: BLE001 - e.g. a marker the sink refuses: this type only
            return err
        return None

    errors = run_watched(lambda: list(pool.map(tick, running)), stops, name="event_etl-tick")
    for m, err in zip(running, errors):
        if err is not None:
            _quarantine(m, err, clock)


def _quarantine(m: FleetMember, err: BaseException, clock) -> None:
    """A member's source or batch failed: it waits out a backoff while the others go on (its batch stays pending)."""
    from event_etl.errors import unwrap_task_error

    err = unwrap_task_error(err)
    wait = _hold(m, err, clock, "quarantined")
    fix = f" (fix: {err.fix})" if isinstance(err, EventEtlError) and err.fix else ""
    print(f"[{m.name}] quarantined ({m.failures} so far): {m.last_error}{fix}; the others go on; tried again in "
          f"{wait:.0f}s", file=sys.stderr, flush=True)
    _write_status(m, clock)


def drain_all(members: list[FleetMember], stops: StopSignals | None, clock) -> None:
    """Drain every member, one after the other; one that cannot drain does not keep the others from it."""
    for m in members:
        try:
            run_watched(lambda m=m: _drain(m, clock), stops, name="event_etl-drain")
        except Escalated as esc:
            exit_now(128 + esc.signum, cut_short_line(m.name, esc.signum))


def _drain(m: FleetMember, clock) -> None:
    """Drain one member; a member that cannot is reported (status, summary, stderr), the others go on."""
    if m.job is None:
        return
    try:
        m.job.controller.drain()
    except Exception as err:  # noqa: BLE001 - recorded: the other types still drain
        m.drain_error = f"not drained: {_one_line(err)}"[:500]
        m.state = "drain failed"
        fix = f"  fix: {err.fix}" if isinstance(err, EventEtlError) and err.fix else ""
        say(f"[{m.name}] {m.drain_error}" + (f"\n{fix}" if fix else ""), err=True)


def _start(m: FleetMember, clock) -> None:
    m.query = m.job.start()
    m.state = "running"
    m.restart_at = None
    _write_status(m, clock)


def _supervise(m: FleetMember, options: RunOptions, clock, spark, endpoint, stops: StopSignals | None = None) -> None:
    """Tick a running member; restart a failed one after its backoff; notice one that finished."""
    if m.state == "restarting":
        if time.monotonic() >= (m.restart_at or 0):
            try:
                m.job.close()
                m.job = open_job(m.prepared, spark, clock=clock, serve_metrics=False)
                if endpoint:
                    endpoint.add(m.job.metrics)
                _start(m, clock)
            except Exception as err:  # noqa: BLE001 - counted as another failure, retried later
                _failed(m, err, clock)
        return
    if m.state != "running":
        return
    q = m.query
    if q.isActive:
        if not options.once and not (m.job.gate is not None and m.job.gate.busy):
            run_watched(m.job.controller.tick, stops, name="event_etl-tick")  # the lock waits out a batch
        m.job.metrics.observe_progress(q.lastProgress)
        return
    err = m.job.controller.failure or q.exception()
    if err is None:
        m.state = "stopped"  # --once: its input ended
        _write_status(m, clock)
        return
    _failed(m, err, clock)


def _failed(m: FleetMember, err: BaseException, clock) -> None:
    from event_etl.sources.pubsub import read_error

    wait = _hold(m, read_error(m.job.source_dir) or err, clock, "restarting")  # the cause, not Spark's wrapper
    print(f"[{m.name}] query failed ({m.failures} so far): {m.last_error}; restarting in {wait:.0f}s",
          file=sys.stderr, flush=True)
    _write_status(m, clock)


def _hold(m: FleetMember, err: BaseException, clock, state: str) -> float:
    """Count a member's failure, note its error and backoff, put it in ``state``; returns the wait in seconds."""
    from event_etl.errors import unwrap_task_error

    err = unwrap_task_error(err)
    m.failures += 1
    m.last_error = _one_line(err)[:500]
    wait = backoff_seconds(m.failures)
    m.restart_at = time.monotonic() + wait
    m.state = state
    return wait


def _one_line(err: BaseException) -> str:
    """An error as one line: event_etl's message, else the first line of what it says."""
    return err.message if isinstance(err, EventEtlError) else str(err).splitlines()[0] if str(err) else repr(err)


def _write_status(m: FleetMember, clock) -> None:
    write_json_atomic(m.prepared.ckpt.etl / STATUS_FILE, m.status(clock))


def _status_line(st: dict[str, Any]) -> str:
    lag = format_duration(st["lag_ms"]) if st["lag_ms"] is not None else "-"
    return (f"[{st['event_type']}] {st['state']}: watermark {st['watermark'] or '-'} lag {lag}  "
            f"last marker {st['last_marker'] or '-'}  restarts {st['restarts']}")


def _member_summary(m: FleetMember, seconds: float, clock) -> dict[str, Any]:
    c = m.job.controller if m.job else None
    totals = dict(c.totals) if c else {}
    return {**m.status(clock), "batches": c.batches if c else 0, "totals": totals, "seconds": seconds,
            "hours_marked": [iso(h) for h in (c.hours_marked if c else [])]}


def report_fleet(summary: dict[str, dict[str, Any]], *, again: str, echo: Callable[[str], None]) -> None:
    """A fleet's end-of-run lines, the last saying the exit code; raise (exit 1) if a type could not be drained.
    ``again``: how to run it again."""
    for line in summary_lines(summary or {}):
        echo(line)
    undrained = sorted(name for name, s in (summary or {}).items() if s.get("state") == "drain failed")
    if undrained:
        raise EventEtlError(f"{', '.join(undrained)} could not be drained (the other types were)",
                            fix=f"{again} so it replays what was left unfinished, then drain it (`event-etl drain "
                                "TYPE`, or `--once --drain`); `event-etl status` shows each type's last error")
    echo(fleet_finished_line(summary or {}))


def fleet_finished_line(summary: dict[str, dict[str, Any]]) -> str:
    """``[fleet] run finished: exit 0 (how it ended)``: the last line of a fleet that ends by itself or as asked."""
    stopped_by = next((s.get("stopped_by") for s in summary.values() if s.get("stopped_by")), None)
    return run_finished_line("fleet", stopped_by, any(s.get("drained") for s in summary.values()))


def summary_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The end-of-run lines of a fleet: one per event type."""
    lines = []
    for name, s in sorted(summary.items()):
        totals = s.get("totals") or {}
        marked = s.get("hours_marked") or []
        span = f" ({marked[0]} .. {marked[-1]})" if marked else ""
        events = sum(v for k, v in totals.items() if k in OUTCOMES)
        line = (f"[{name}] run finished ({s.get('state', '?')}): {s.get('batches', 0)} batches, {events:,} events in, "
                f"{len(marked)} hours marked{span}, restarts {s.get('restarts', 0)}")
        if totals.get("lost"):
            line += f", {totals['lost']:,} records LOST (deleted by retention before read)"
        if s.get("stopped_by"):
            line += f"; stopped by {s['stopped_by']}" + (", drained" if s.get("drained") else
                                                         f", {s['last_error']}" if s.get("state") == "drain failed"
                                                         else ", not drained")
        lines.append(line)
    return lines

