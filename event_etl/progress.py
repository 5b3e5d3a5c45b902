"""Progress lines for people watching a job, and the summary of a run."""

from __future__ import annotations

import sys
from typing import Any, Callable, TextIO

from event_etl.driver import BatchEvent
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import format_duration, iso

__all__ = ["ProgressPrinter", "format_summary"]


def _n(x: int) -> str:
    return f"{x:,}"


def _size(b: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b} B"


class ProgressPrinter:
    """A listener for :class:`event_etl.driver.Controller` that prints a line per batch and per marker."""

    def __init__(self, event_type: str, clock: Callable[[], int], out: TextIO | None = None, quiet: bool = False) -> None:
        self.et = event_type
        self.clock = clock
        self.out = out or sys.stdout
        self.quiet = quiet

    def __call__(self, kind: str, payload: Any) -> None:
        if self.quiet:
            return
        if kind == "batch":
            self.out.write(self.batch_line(payload) + "\n")
        elif kind == "marker":
            m: Manifest = payload
            self.out.write(
                f"[{self.et}] COMPLETE {iso(m.hour)}  records {_n(m.records)} (late {_n(m.late_records)})  "
                f"files {len(m.files)}  marker delay {format_duration(m.marker_delay_ms)}\n"
            )
        elif kind in ("idle", "drain"):
            wm = payload.watermark
            self.out.write(f"[{self.et}] {kind}: watermark {iso(wm)}\n")
        self.out.flush()

    def batch_line(self, ev: BatchEvent) -> str:
        r = ev.result
        c = r.counts
        wm = ev.state.watermark
        secs = max(ev.finished_at - (ev.attempt_started_at or ev.started_at), 1) / 1000.0
        lag = format_duration(self.clock() - wm) if wm is not None else "-"
        return (
            f"[{self.et}] batch {ev.batch_id}{' (replay)' if ev.replayed else ''}: in {_n(r.events_in)}  "
            f"timely {_n(c.get('timely', 0))}  late {_n(c.get('late', 0))}  dead-letter {_n(r.deadlettered)}  "
            + (f"duplicates {_n(c['duplicate'])}  " if c.get("duplicate") else "") +
            f"files {r.files_written} ({_size(r.bytes_written)})  watermark {iso(wm) or '-'} lag {lag}  "
            f"marked {len(ev.marked)}  {secs:.2f}s  {r.events_in / secs:,.0f} ev/s"
        )


def format_summary(summary: dict[str, Any]) -> str:
    t = summary["totals"]
    lines = [
        f"[{summary['event_type']}] run finished: {summary['batches']} batches in {summary['seconds']:.1f}s",
        f"  events in      {_n(summary['events_in'])}  ({summary['events_per_second']:,.0f} ev/s)",
        f"  timely         {_n(t.get('timely', 0))}",
        f"  late           {_n(t.get('late', 0))}",
        f"  too late       {_n(t.get('too_late', 0))}",
        f"  future         {_n(t.get('future', 0))}",
        f"  invalid        {_n(t.get('invalid', 0))}",
        f"  duplicates     {_n(t.get('duplicate', 0))} (dropped)",
        f"  dead-lettered  {_n(t.get('deadlettered', 0))}",
        f"  files written  {_n(t.get('files', 0))} ({_size(t.get('bytes', 0))})",
        f"  watermark      {summary['watermark'] or '-'}",
        f"  hours marked   {len(summary['hours_marked'])}"
        + (f" ({summary['hours_marked'][0]} .. {summary['hours_marked'][-1]})" if summary["hours_marked"] else ""),
    ]
    return "\n".join(lines)
