"""How a run of one type ends: the drain (if asked), its summary, its lines.

The lines, in order: the summary (:func:`event_etl.job.progress.format_summary`; left out after a plain stop by a
signal), for a plain stop where it stopped and which hours stay open, and last ``[TYPE] run finished: exit 0
(...)``.  A fleet ends with a line per type instead (:func:`event_etl.job.fleet.report_fleet`).
"""

from __future__ import annotations

import time
from typing import Any

from event_etl.job.progress import format_summary
from event_etl.job.setup import Job, RunOptions
from event_etl.job.stopping import (
    Echo,
    Escalated,
    StoppedAtOnce,
    StopSignals,
    cut_short_line,
    run_finished_line,
    run_watched,
)
from event_etl.rules.judge import OUTCOMES
from event_etl.timeutil import HOUR_MS, iso

__all__ = ["end_run", "run_summary", "stopped_line"]


def end_run(job: Job, options: RunOptions, stops: StopSignals, *, started: float, stopped_by: str | None,
            drain: bool, echo: Echo) -> dict[str, Any]:
    """After the last batch: drain (if asked; a second signal cuts it short and ends the process), the summary and
    its lines.  A drain that fails raises: a single type's run ends with the error."""
    if drain:
        try:
            run_watched(job.controller.drain, stops, name="event_etl-drain")
        except Escalated as esc:
            raise StoppedAtOnce(esc.signum, cut_short_line(job.prepared.event_type.name, esc.signum)) from None
    summary = run_summary(job, time.monotonic() - started, options, stopped_by, drained=drain)
    signal_stop_only = stopped_by is not None and stopped_by != "time limit" and not drain
    if not options.quiet and not signal_stop_only:
        echo(format_summary(summary))
    if stops.requested and signal_stop_only and not options.quiet:
        echo(stopped_line(job, stopped_by or "?"))
    if not options.quiet:
        echo(run_finished_line(job.prepared.event_type.name, summary["stopped_by"], bool(summary["drained"])))
    return summary


def stopped_line(job: Job, stopped_by: str) -> str:
    """Where a plain stop left the job: after which batch, and which hours stay open."""
    name, c = job.prepared.event_type.name, job.controller
    last = c.state.last_batch_id
    where = f"after batch {last}" if last is not None and last >= 0 else "before its first batch"
    how = "Ctrl-C" if stopped_by == "SIGINT" else stopped_by
    wm = c.state.watermark
    first, through = c.state.first_hour, c.state.marked_through
    open_from = first if through is None or first is None else max(first, through + HOUR_MS)
    keep = (f" (the hours from {iso(open_from)} stay open: the watermark, {iso(wm)}, has not passed them)"
            if wm is not None and open_from is not None else "")
    return f"[{name}] stopped {where} ({how}), not drained{keep}; run the same command to continue"


def run_summary(job: Job, seconds: float, options: RunOptions, stopped_by: str | None, *,
                drained: bool) -> dict[str, Any]:
    """What a run of one type returns: its counts, watermark, the hours it marked and how it ended."""
    controller, p = job.controller, job.prepared
    totals = dict(controller.totals)
    events_in = sum(totals.get(k, 0) for k in OUTCOMES)
    return {
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
