"""A fleet: several event types in one Spark application, run by :mod:`event_etl.job.driver` through the shared
engine (one micro-batch round per trigger for every type: :mod:`event_etl.job.engine`).  This module is what a fleet
has that one type has not: quarantine with backoff, a status file per type, a drain per type, a line per type.

``event-etl run TYPE1 TYPE2 ...`` (or ``--all``) shares one JVM and one set of executors
between types, instead of one application per type.  Each type keeps everything of its
own: its source (the type's ``source`` setting), checkpoint (``<root>/<type>``),
watermark, markers, dead-letter area, lease and metrics (one Prometheus endpoint serves
all of them, each series labelled with its ``event_type``).

A type whose source, batch or tick fails is quarantined (:func:`quarantine`): it waits out a backoff (5 s, doubled
up to 5 minutes) and is opened again on its checkpoint, its pending batch replayed first, without disturbing the
others; its state (``running``, ``quarantined``, ``stopped``, ``drain failed``) and last error are written to
``<root>/<type>/etl/status.json`` and shown by ``event-etl status``.

Signals follow :mod:`event_etl.job.stopping`, as for one type: SIGINT, SIGTERM and SIGHUP stop
every type at its next batch boundary and mark no hour the watermark has not passed; SIGUSR1
(``event-etl drain``), and SIGTERM or SIGHUP under ``--drain-on-stop``, also drain every type
-- each type on its own (:func:`drain_all`), so one that cannot drain (a batch a crash left unfinished, a sink
that fails) is reported in its status and summary and does not keep the others from draining;
a second SIGINT or SIGTERM stops at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.errors import EventEtlError, unwrap_task_error
from event_etl.job.member import FleetMember
from event_etl.job.progress import BACKFILL_RUNBOOK
from event_etl.job.setup import RunOptions
from event_etl.job.status import STATUS_FILE
from event_etl.job.stopping import (
    Echo,
    Escalated,
    StoppedAtOnce,
    StopSignals,
    cut_short_line,
    run_finished_line,
    run_watched,
    say,
    signal_name,
)
from event_etl.rules.judge import OUTCOMES
from event_etl.storage.atomic import write_json_atomic
from event_etl.timeutil import format_duration, iso

__all__ = ["summary_lines", "report_fleet", "fleet_finished_line", "backoff_seconds", "member_checkpoint",
           "quarantine", "hold", "drain_all", "finish", "write_status", "status_line", "member_summary"]

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


Clock = Callable[[], int]


def quarantine(m: FleetMember, err: BaseException, clock: Clock, *, echo: Echo = say) -> None:
    """A member's source, batch or tick failed: it waits out a backoff while the others go on (its batch stays
    pending, replayed first when it is opened again)."""
    err = unwrap_task_error(err)
    wait = hold(m, err, clock, "quarantined")
    fix = f" (fix: {err.fix})" if isinstance(err, EventEtlError) and err.fix else ""
    echo(f"[{m.name}] quarantined ({m.failures} so far): {m.last_error}{fix}; the others go on; tried again in "
         f"{wait:.0f}s", err=True)
    write_status(m, clock)


def drain_all(members: list[FleetMember], stops: StopSignals | None, clock: Clock, *, echo: Echo = say) -> None:
    """Drain every member, one after the other; one that cannot drain does not keep the others from it."""
    for m in members:
        try:
            run_watched(_drainer(m, echo), stops, name="event_etl-drain")
        except Escalated as esc:
            raise StoppedAtOnce(esc.signum, cut_short_line(m.name, esc.signum)) from None


def _drainer(m: FleetMember, echo: Echo) -> Callable[[], None]:
    return lambda: _drain(m, echo)


def _drain(m: FleetMember, echo: Echo) -> None:
    """Drain one member; a member that cannot is reported (status, summary, stderr), the others go on."""
    if m.job is None:
        return
    try:
        m.job.controller.drain()
    except Exception as err:  # noqa: BLE001 - recorded: the other types still drain
        m.drain_error = f"not drained: {one_line(err)}"[:500]
        m.state = "drain failed"
        fix = f"  fix: {err.fix}" if isinstance(err, EventEtlError) and err.fix else ""
        echo(f"[{m.name}] {m.drain_error}" + (f"\n{fix}" if fix else ""), err=True)


def hold(m: FleetMember, err: BaseException, clock: Clock, state: str) -> float:
    """Count a member's failure, note its error and backoff, put it in ``state``; returns the wait in seconds."""
    err = unwrap_task_error(err)
    m.failures += 1
    m.last_error = one_line(err)[:500]
    wait = backoff_seconds(m.failures)
    m.restart_at = time.monotonic() + wait
    m.state = state
    return wait


def one_line(err: BaseException) -> str:
    """An error as one line: event_etl's message, else the first line of what it says."""
    if isinstance(err, EventEtlError):
        return err.message
    return str(err).splitlines()[0] if str(err) else repr(err)


def write_status(m: FleetMember, clock: Clock) -> None:
    write_json_atomic(m.prepared.ckpt.etl / STATUS_FILE, m.status(clock))


def status_line(st: dict[str, Any]) -> str:
    """A member's line every ``status_every_s``: state, watermark, lag, last marker, restarts."""
    lag = format_duration(st["lag_ms"]) if st["lag_ms"] is not None else "-"
    return (f"[{st['event_type']}] {st['state']}: watermark {st['watermark'] or '-'} lag {lag}  "
            f"last marker {st['last_marker'] or '-'}  restarts {st['restarts']}")


def member_summary(m: FleetMember, seconds: float, clock: Clock) -> dict[str, Any]:
    """A member's summary: its status, batches, totals and the hours it marked."""
    c = m.job.controller if m.job else None
    totals = dict(c.totals) if c else {}
    return {**m.status(clock), "batches": c.batches if c else 0, "totals": totals, "seconds": seconds,
            "hours_marked": [iso(h) for h in (c.hours_marked if c else [])]}

def finish(members: list[FleetMember], stops: StopSignals, clock: Clock, *, drain: bool, started: float,
           echo: Echo = say) -> dict[str, dict[str, Any]]:
    """After a fleet's last batch: drain (if asked, each type on its own), every status written, the summary per
    type (``stopped_by``: the first signal's name, or None)."""
    for m in members:
        if m.state == "running":
            m.state = "stopped"
    if drain:
        drain_all(members, stops, clock, echo=echo)
    for m in members:
        write_status(m, clock)
    seconds = time.monotonic() - started
    first = stops.first
    stopped_by = signal_name(first) if first is not None else None
    return {m.name: {**member_summary(m, seconds, clock), "stopped_by": stopped_by,
                     "drained": drain and m.drain_error is None} for m in members}


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
        if totals.get("before_backfill"):  # as the single-type summary says it (job/progress.format_summary)
            line += (f", before backfill {totals['before_backfill']:,} (more than max_backfill before their arrival, "
                     'with no watermark yet: dead-lettered; set max_backfill = "0" or a longer bound in the type\'s '
                     f"etl.toml, then replay them: {BACKFILL_RUNBOOK})")
        if s.get("stopped_by"):
            line += f"; stopped by {s['stopped_by']}" + (", drained" if s.get("drained") else
                                                         f", {s['last_error']}" if s.get("state") == "drain failed"
                                                         else ", not drained")
        lines.append(line)
    return lines

