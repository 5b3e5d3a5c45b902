"""Running one event type's job: the engine's loop (a round of one type) or a streaming query, signals, drain,
summary.  What a job is made of before it runs (options, checkpoint, lease, controller, source) is
:mod:`event_etl.job.setup`, shared with the fleet.

``event-etl run`` is a thin wrapper over :func:`run_job`.  The main loop watches the
query in short steps and, between batches, lets the controller advance the watermark of
a quiet source.  Signals follow :mod:`event_etl.job.stopping`: SIGINT, SIGTERM and SIGHUP stop
at the next batch boundary and mark no hour the watermark has not passed (the next run
continues); SIGUSR1 (``event-etl drain``), and SIGTERM or SIGHUP under ``--drain-on-stop``,
stop there and drain (every hour up to the last one holding data is marked); a second SIGINT
or SIGTERM stops at once (exit 130 or 143).  The last line of a run says its exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from event_etl.errors import EventEtlError
from event_etl.eventtypes import EventType
from event_etl.job.controller import Controller
from event_etl.job.progress import format_summary
from event_etl.job.setup import (  # noqa: F401 - the setup's names, also importable from here as before
    DEFAULT_MAX_EVENTS_PER_BATCH,
    DEFAULT_MAX_FILES_PER_BATCH,
    DEFAULT_SINK,
    DEFAULT_SPLIT_BYTES,
    DEFAULT_TRIGGER,
    Job,
    Prepared,
    RunOptions,
    acquire_lease,
    close_shared,
    open_job,
    open_parts,
    open_shared,
    prepare_job,
    release_lease,
    start_fetcher,
)
from event_etl.job.stopping import (
    POLL_S,
    Escalated,
    Interrupted,
    StopSignals,
    at_once_line,
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
from event_etl.storage.locations import default_checkpoint, resolve_sink
from event_etl.timeutil import HOUR_MS, iso, now_millis

__all__ = ["RunOptions", "run_job", "default_checkpoint", "resolve_sink"]

def install_stop_signals(stops: StopSignals | None = None) -> StopSignals:
    """The job's record of stop signals (:mod:`event_etl.job.stopping`), its handlers installed (main thread only)."""
    return (stops if stops is not None else StopSignals()).install()


def run_job(
    event_type: EventType,
    options: RunOptions,
    *,
    spark=None,
    clock: Callable[[], int] = now_millis,
    listeners: list[Callable[[str, Any], None]] | None = None,
    install_signals: bool = True,
    stops: StopSignals | None = None,
) -> dict[str, Any]:
    """Run the job until its input ends (``once``/``drain``), a signal, or ``max_seconds``.  Returns the summary.

    ``stops`` is the record of stop signals the job obeys (default: its own, whose handlers
    are installed when ``install_signals``).  A second signal makes it raise
    :class:`~event_etl.job.stopping.Interrupted` (or, while a drain runs, end the process at once).
    A session the job starts itself (``spark=None``) is stopped, its JVM gone, before it returns.
    """
    if options.drain:
        options.once = True  # drain: process what is available, then close every open hour
    name = event_type.name
    stops = stops if stops is not None else StopSignals()
    stops.drain_on_stop = stops.drain_on_stop or options.drain_on_stop
    stops.accept_drain_requests()  # SIGUSR1 (event-etl drain): before the lock names this process as the job's
    if install_signals:
        stops.install()  # before the lease: a stop asked for while it is waited for is obeyed once the job runs
    try:
        p = prepare_job(event_type, options, clock=clock)
        acquire_lease(p, stops)
    except Escalated as esc:
        release_lease(p.lease, stops)
        exit_now(128 + esc.signum, f"[{name}] stopped at once while waiting for the lease; nothing was processed")
    except BaseException:
        if install_signals:
            stops.restore()
        raise
    own_spark = spark is None
    fetcher = None
    try:
        if own_spark:
            from event_etl.job.session import get_session

            try:
                spark = run_watched(lambda: get_session(options.master, options.conf, app_name=f"event_etl:{name}"),
                                    stops, name="event_etl-spark-start")
            except Escalated as esc:
                exit_now(128 + esc.signum, f"[{name}] stopped at once while Spark was starting; nothing was processed")
            if install_signals:
                stops.install()  # once more, now that the SparkContext exists
        # Pub/Sub: pulling starts once the JVM runs, not while it is launched.  The JVM is forked with a
        # preexec_fn; a fork while the puller's threads are inside gRPC calls makes gRPC skip its fork
        # handlers, and the child could die before it ran Java (seen as JAVA_GATEWAY_EXITED at start-up).
        fetcher = start_fetcher(p)
        if options.engine == "shared":
            job, lane = open_shared(p, spark, clock=clock, listeners=listeners, fetcher=fetcher)
        else:
            job, lane = open_job(p, spark, clock=clock, listeners=listeners, fetcher=fetcher), None
        fetcher = None  # the job's now: it stops it
        try:
            if lane is not None:
                return _drive_shared(job, lane, spark, options=options, stops=stops, clock=clock)
            return _drive(job, options=options, stops=stops)
        finally:
            close_shared(job, lane)
    finally:
        if fetcher is not None:  # Spark did not start: what was pulled and not saved comes again
            fetcher.stop()
        try:
            if own_spark and spark is not None:
                from event_etl.job.session import stop_session

                stop_session(spark)  # signals still only recorded meanwhile
        finally:
            if install_signals:
                stops.restore()  # a drain request from now on is ignored (SIGUSR1 would end the process)
            release_lease(p.lease, stops)


def _drive_shared(job: Job, lane, spark, *, options: RunOptions, stops: StopSignals,
                  clock: Callable[[], int]) -> dict[str, Any]:
    """One type through the shared engine's loop (:func:`event_etl.job.shared.run_rounds`): a Spark job per
    trigger over the splits the driver planned, no streaming query and no Python source process.

    The same contract as :func:`_drive`: Spark-format offsets and commits (a query of the type's own,
    ``--engine queries``, takes them over, and back), the same signals (a stop after the batch in
    flight, a drain when asked for; a second one cancels the batch, which is replayed on the next
    run), the same summary.  A batch that fails ends the run with its error (a fleet would
    quarantine the type instead)."""
    from event_etl.errors import unwrap_task_error
    from event_etl.job.shared import FleetMember, SharedEngine, rounds_before_drain, run_rounds

    p, controller = job.prepared, job.controller
    member = FleetMember(p.event_type, p, job=job, lane=lane, state="running")
    engine = SharedEngine(spark, [member], {member.name: lane}, clock=clock)
    started = time.monotonic()
    deadline = None if options.max_seconds is None else started + options.max_seconds

    def failed(_m, err: BaseException) -> None:
        raise unwrap_task_error(err)

    def done(m) -> None:
        m.state = "stopped"  # --once: its input ended

    def supervise() -> None:
        if not options.once:
            run_watched(controller.tick, stops, name="event_etl-tick")
        job.metrics.observe_progress(lane.progress())  # the backlog metric

    try:
        try:
            stopped_by = run_rounds(engine, [member], options, stops, trigger_ms=p.trigger_ms, on_failure=failed,
                                    on_done=done, supervise=supervise, deadline=deadline)
            drain = stops.drain if stops.requested else options.drain
            if drain:  # a drain first finishes what a crash left unfinished, and reads what its spool holds
                rounds_before_drain(engine, [member], stops, on_failure=failed, quiet=options.quiet)
        except Escalated as esc:
            engine.cancel()
            cut = [(member.name, lane.pending[0])] if lane.pending is not None else []
            raise Interrupted(esc.signum, at_once_line(member.name, esc.signum, cut)) from None
    finally:
        engine.close()
    return _end_run(job, options, stops, started=started, stopped_by=stopped_by, drain=drain)


def _drive(job: Job, *, options: RunOptions, stops: StopSignals) -> dict[str, Any]:
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
        try:
            if query is not None:
                stopped_by = _watch(query, job, options, stops, deadline)
                drain = stops.drain if stops.requested else options.drain
                if stopped_by is None:
                    _raise_query_failure(query, controller, job.source_dir)
                else:
                    if drain and job.fetcher is not None:  # the spool read before the drain marks hours
                        _read_spool_before_drain(job, query, stops, options)
                    stop_at_boundary([(job, query)], stops, drain=drain)
                    _raise_query_failure(query, controller, job.source_dir)  # a batch that failed meanwhile
        except Escalated as esc:
            stop_at_once([(job, query)], stops, esc.signum)
    finally:
        if query is not None and query.isActive:
            query.stop()
    return _end_run(job, options, stops, started=started, stopped_by=stopped_by, drain=drain)


def _read_spool_before_drain(job: Job, query, stops: StopSignals, options: RunOptions,
                             timeout: float = 300.0) -> None:
    """``--engine queries``: what :func:`event_etl.job.shared.rounds_before_drain` does for the shared engine, with
    the query's own triggers reading the spool: settle, stop pulling, then let the query run until it has
    committed every segment (at most ``timeout``; then the drain goes on and says what it left)."""
    from event_etl.job.shared import spool_read, stop_pulling_for_drain

    stop_pulling_for_drain([(job.prepared.event_type.name, job.fetcher)], stops, quiet=options.quiet)
    deadline = time.monotonic() + timeout
    spark_dir = job.prepared.ckpt.spark_dir
    while not spool_read(job.fetcher, spark_dir) and query.isActive and time.monotonic() < deadline:
        if stops.escalation is not None:
            raise Escalated(stops.escalation)
        stops.sleep(POLL_S)
    if not spool_read(job.fetcher, spark_dir):
        say(f"[{job.prepared.event_type.name}] warning: the spool still holds messages after {timeout:.0f} s; "
            "the drain marks hours without them (they are read, late, by the next run)", err=True)


def _end_run(job: Job, options: RunOptions, stops: StopSignals, *, started: float, stopped_by: str | None,
             drain: bool) -> dict[str, Any]:
    """After the last batch, whichever engine ran it: drain (if asked), the summary, Ctrl-C's one line."""
    if drain:
        try:
            run_watched(job.controller.drain, stops, name="event_etl-drain")
        except Escalated as esc:
            exit_now(128 + esc.signum, cut_short_line(job.prepared.event_type.name, esc.signum))
    summary = _summary(job, time.monotonic() - started, options, stopped_by, drained=drain)
    plain_stop = stops.requested and stopped_by not in (None, "time limit") and not drain
    if plain_stop and not options.quiet:
        say(_stopped_line(job, stopped_by or "?"))
    if not options.quiet:
        say(run_finished_line(job.prepared.event_type.name, summary["stopped_by"], bool(summary["drained"])))
    return summary


def _watch(query, job: Job, options: RunOptions, stops: StopSignals, deadline: float | None) -> str | None:
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
            if not options.once and not (job.gate is not None and job.gate.busy):
                run_watched(job.controller.tick, stops, name="event_etl-tick")  # the lock waits out a batch
            job.metrics.observe_progress(query.lastProgress)
        stops.sleep(POLL_S)


def _stopped_line(job: Job, stopped_by: str) -> str:
    name, c = job.prepared.event_type.name, job.controller
    last = c.state.last_batch_id
    where = f"after batch {last}" if last is not None and last >= 0 else "before its first batch"
    held = job.gate.abandoned if job.gate is not None else []
    later = f" (batch {held[0]} was planned, not begun: it runs first)" if held else ""
    how = "Ctrl-C" if stopped_by == "SIGINT" else stopped_by
    wm = c.state.watermark
    first, through = c.state.first_hour, c.state.marked_through
    open_from = first if through is None or first is None else max(first, through + HOUR_MS)
    keep = (f" (the hours from {iso(open_from)} stay open: the watermark, {iso(wm)}, has not passed them)"
            if wm is not None and open_from is not None else "")
    return f"[{name}] stopped {where} ({how}), not drained{keep}{later}; run the same command to continue"


def _summary(job: Job, seconds: float, options: RunOptions, stopped_by: str | None, *, drained: bool) -> dict[str, Any]:
    controller, p = job.controller, job.prepared
    totals = dict(controller.totals)
    events_in = sum(totals.get(k, 0) for k in OUTCOMES)
    summary = {
        "event_type": p.event_type.name,
        "sink": p.sink,
        "checkpoint": str(p.ckpt.root),
        "batches": controller.batches,
        "seconds": seconds,
        "events_in": events_in,
        "events_per_second": events_in / seconds if seconds > 0 else 0.0,
        "totals": totals,
        "watermark": iso(controller.state.watermark),
        "hours_marked": [iso(h) for h in controller.hours_marked],
        "stopped_by": stopped_by or ("end of input" if options.once else "query end"),
        "drained": drained,
        "last_batch": controller.state.last_batch_id,
    }
    signal_stop_only = stopped_by is not None and stopped_by != "time limit" and not drained
    if not options.quiet and not signal_stop_only:
        say(format_summary(summary))
    return summary


def _raise_query_failure(query, controller: Controller, source_dir: str) -> None:
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
