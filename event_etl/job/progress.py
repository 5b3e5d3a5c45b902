"""Progress lines for people watching a job, and the summary of a run.

Watermark lag is measured against "now".  For most sources that is the wall clock.  The
built-in generator runs a clock of its own (event time goes ``speedup`` times faster than the
wall clock, from a ``start`` in the past): measured against the wall clock its lag would be
hours, then negative.  For a ``generate:`` source "now" is the generator's clock -- the arrival
time of the newest event it has made available -- and the lines say so.

Marker delay has one definition for every command, the manifest's, on the wall clock
(:mod:`event_etl.rules.delays`): the ``COMPLETE`` line says what `event-etl hours` and `wait`
say of the same hour.  Neither figure is ever printed as a negative duration.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from event_etl.job.controller import BatchEvent
from event_etl.rules.delays import MARKER_DELAY_NAME, lag_text, marker_delay_text
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import format_duration, iso

__all__ = ["ProgressPrinter", "GeneratorClock", "format_summary", "lost_text", "backfill_text", "BACKFILL_RUNBOOK"]

BACKFILL_RUNBOOK = "docs/runbook.md#a-backfill-went-to-the-dead-letters"
"""Where a user reads how to get a backfill dead-lettered for ``max_backfill`` back in."""


def _n(x: int) -> str:
    return f"{x:,}"


def _size(n: int) -> str:
    b = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if b < 1024 or unit == "GB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b} B"


class GeneratorClock:
    """The ``generate:`` source's clock: ``start + (wall - t0) * speedup``, or the last event's arrival with ``count``.

    ``t0`` (the job's first start) and the generator's parameters are frozen in the source's
    offsets when the checkpoint is created; they are read from Spark's offset log
    (``<checkpoint>/spark/offsets/<batch>``, whose last line is the source's offset) once a
    batch has been planned.  Before that the clock is unknown (``None``).
    """

    def __init__(self, spark_dir: str | Path, wall: Callable[[], int]) -> None:
        self.offsets = Path(spark_dir) / "offsets"
        self.wall = wall
        self._frozen: tuple[int, dict[str, Any]] | None = None

    def _load(self) -> tuple[int, dict[str, Any]] | None:
        if self._frozen is None:
            try:
                batches = sorted((int(f.name) for f in self.offsets.iterdir() if f.name.isdigit()), reverse=True)
                for b in batches[:1]:
                    for line in (self.offsets / str(b)).read_text(encoding="utf-8").splitlines():
                        doc = json.loads(line) if line.startswith("{") else None
                        if isinstance(doc, dict) and "t0" in doc and isinstance(doc.get("p"), dict):
                            self._frozen = (int(doc["t0"]), doc["p"])
            except (OSError, ValueError):
                return None
        return self._frozen

    def __call__(self) -> int | None:
        frozen = self._load()
        if frozen is None:
            return None
        t0, p = frozen
        rate, speedup, start = float(p["rate"]), float(p["speedup"]), int(p["start"])
        if p.get("count"):
            return start + int(int(p["count"]) * 1000.0 * speedup / rate)
        return start + int((self.wall() - t0) * speedup)


class ProgressPrinter:
    """A listener for :class:`event_etl.job.controller.Controller` that prints a line per batch and per marker.

    ``event_clock`` (e.g. a :class:`GeneratorClock`) replaces the wall clock ``clock`` as
    "now" for the watermark lag; the lines then add ``(generator clock)``.  The marker delay is the manifest's, on
    the wall clock ``clock``."""

    def __init__(self, event_type: str, clock: Callable[[], int], out: TextIO | None = None, quiet: bool = False,
                 event_clock: Callable[[], int | None] | None = None, clock_name: str = "generator clock",
                 settings_file: str | None = None) -> None:
        self.et = event_type
        self.settings_file = settings_file
        """The type's etl.toml, named in the line about a backfill dead-lettered for ``max_backfill``."""
        self.backfill_said = False
        """Whether this run said that a batch dead-lettered events for ``max_backfill`` (it says so once)."""
        self.clock = clock
        self.out = out
        self.quiet = quiet
        self.event_clock = event_clock
        self.clock_name = clock_name

    def now(self) -> int | None:
        """"Now" for lag and delays: the source's own clock if it has one, else the wall clock."""
        return self.event_clock() if self.event_clock is not None else self.clock()

    def _against(self) -> str:
        return f" ({self.clock_name})" if self.event_clock is not None else ""

    def __call__(self, kind: str, payload: Any) -> None:
        if self.quiet:
            return
        if kind == "batch":
            line = self.batch_line(payload)
            said = self.backfill_line(payload)
            if said is not None:
                line += "\n" + said
        elif kind == "marker":
            line = self.marker_line(payload)
        elif kind in ("idle", "drain"):
            line = f"[{self.et}] {kind}: watermark {iso(payload.watermark)}"
        elif kind == "swept":
            line = (f"[{self.et}] removed {len(payload)} temporary file{'s' if len(payload) != 1 else ''} a killed run "
                    f"left (e.g. {payload[0]})")
        elif kind == "source_down":
            line = (f"[{self.et}] source DOWN: {payload}; no hour is marked by the idle rule until it is back"
                    if payload else f"[{self.et}] source back: it delivers again")
        elif kind == "clock_step":
            sign = "+" if payload > 0 else ""
            line = (f"[{self.et}] clock step: the wall clock jumped {sign}{format_duration(payload)}; quiet time is "
                    "measured on the monotonic clock, so nothing moved")
        else:
            return
        out = self.out or sys.stdout
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):  # the terminal is gone (SIGHUP): the job goes on, and drains
            pass

    def marker_line(self, m: Manifest) -> str:
        """The ``COMPLETE`` line of a marker.  Its marker delay is the manifest's, on the wall clock, as `event-etl
        hours` and `wait` show it (:mod:`event_etl.rules.delays`): ``drained`` or ``ahead`` for an hour marked before
        it ended by the wall clock, never a negative duration; the generator's clock is not used for it."""
        delay = marker_delay_text(m.marker_delay_ms, m.extra.get("closed_by"))
        return (f"[{self.et}] COMPLETE {iso(m.hour)}  records {_n(m.records)} (late {_n(m.late_records)})  "
                f"files {len(m.files)}  {MARKER_DELAY_NAME} {delay}")

    def lag_text(self, watermark: int | None) -> str:
        """Now (the source's clock if it has one) minus the watermark; ``ahead`` for a watermark ahead of now (after
        a drain): never a negative duration."""
        now = self.now()
        if watermark is None or now is None:
            return "-"
        return lag_text(now - watermark) + self._against()

    def backfill_line(self, ev: BatchEvent) -> str | None:
        """The line saying that this batch dead-lettered events for ``max_backfill``, the first time in this run one
        does (None otherwise: the summary counts them all)."""
        b = ev.result.backfill
        if self.backfill_said or not b:
            return None
        self.backfill_said = True
        return f"[{self.et}] " + backfill_text(self.et, int(b["events"]), max_backfill=int(b["max_backfill"]),
                                               oldest=b.get("oldest"), newest=b.get("newest"),
                                               settings_file=self.settings_file)

    def batch_line(self, ev: BatchEvent) -> str:
        r = ev.result
        c = r.counts
        wm = ev.state.watermark
        secs = max(ev.finished_at - (ev.attempt_started_at or ev.started_at), 1) / 1000.0
        lag = self.lag_text(wm)
        return (
            f"[{self.et}] batch {ev.batch_id}{' (replay)' if ev.replayed else ''}: in {_n(r.events_in)}  "
            f"timely {_n(c.get('timely', 0))}  late {_n(c.get('late', 0))}  dead-letter {_n(r.deadlettered)}  "
            + (f"duplicates {_n(c['duplicate'])}  " if c.get("duplicate") else "") +
            f"files {r.files_written} ({_size(r.bytes_written)})  watermark {iso(wm) or '-'} lag {lag}  "
            f"marked {len(ev.marked)}  {secs:.2f}s  {r.events_in / secs:,.0f} ev/s"
            + (f"  {lost_text(ev.lost)}" if ev.lost else "")
            + (f"  dropped fields {_n(r.dropped_fields)}" if r.dropped_fields else "")
        )


def backfill_text(event_type: str, events: int, *, max_backfill: int | None = None, oldest: int | None = None,
                  newest: int | None = None, settings_file: str | None = None, what: str = "dead-lettered") -> str:
    """One line: ``events`` of ``event_type`` went to the dead letters as ``before_backfill`` (the job had no
    watermark yet and they were more than ``max_backfill`` before their arrival), and how to take them."""
    times = f" (event times {iso(oldest)} .. {iso(newest)})" if oldest is not None and newest is not None else ""
    bound = f" ({format_duration(max_backfill)})" if max_backfill else ""
    where = settings_file or f"{event_type}'s etl.toml"
    return (f"{_n(events)} event{'s' if events != 1 else ''} {what} as before_backfill{times}: more than "
            f"max_backfill{bound} before their arrival, with no watermark yet. To take them, set "
            f'max_backfill = "0" (no bound) or a longer bound in {where}, then replay them from the dead '
            f"letters: {BACKFILL_RUNBOOK}")


def lost_text(lost: dict[int, int]) -> str:
    """``LOST n (partition p: n, ...)``: input records the source lost before they could be read."""
    parts = ", ".join(f"{p}: {_n(n)}" for p, n in sorted(lost.items()))
    return f"LOST {_n(sum(lost.values()))} (deleted by retention before read; partition {parts})"


def format_summary(summary: dict[str, Any]) -> str:
    """The run's summary: a title, then one row a count, their values in one column (as wide as the longest label
    shown: ``before backfill`` widens it by one, for every row)."""
    t = summary["totals"]
    rows: list[tuple[str, str]] = [
        ("events in", f"{_n(summary['events_in'])}  ({summary['events_per_second']:,.0f} ev/s)"),
        ("timely", _n(t.get("timely", 0))),
        ("late", _n(t.get("late", 0))),
        ("too late", _n(t.get("too_late", 0))),
        ("future", _n(t.get("future", 0))),
        *([("before backfill", f"{_n(t['before_backfill'])} (more than max_backfill before their arrival, with no "
            'watermark yet: dead-lettered; set max_backfill = "0" or a longer bound in the type\'s etl.toml, then '
            f"replay them: {BACKFILL_RUNBOOK})")] if t.get("before_backfill") else []),
        ("invalid", _n(t.get("invalid", 0))),
        ("duplicates", f"{_n(t.get('duplicate', 0))} (dropped)"),
        ("dead-lettered", _n(t.get("deadlettered", 0))),
        ("files written", f"{_n(t.get('files', 0))} ({_size(t.get('bytes', 0))})"),
        ("watermark", str(summary["watermark"] or "-")),
        ("hours marked", f"{len(summary['hours_marked'])}"
         + (f" ({summary['hours_marked'][0]} .. {summary['hours_marked'][-1]})" if summary["hours_marked"] else "")),
    ]
    if t.get("dropped_fields"):
        rows.append(("dropped fields", f"{_n(t['dropped_fields'])} (Protobuf fields the type's schema.desc does not "
                     "know, a newer producer's: the records were written without them; compile the producer's .proto "
                     "into schema.desc to keep them)"))
    if t.get("lost"):
        rows.append(("LOST", f"{_n(t['lost'])} (deleted by the source's retention before they were read; "
                     "skipped: EVENT_ETL_KAFKA_ON_DATA_LOSS=skip)"))
    if summary.get("stopped_by"):
        rows.append(("stopped by", f"{summary['stopped_by']}" + ("; drained: every hour holding data is complete"
                                                                 if summary.get("drained") else "")))
    width = max(15, *(len(label) + 1 for label, _ in rows))
    lines = [f"[{summary['event_type']}] run finished: {summary['batches']} batches in {summary['seconds']:.1f}s",
             *(f"  {label:<{width}}{value}" for label, value in rows)]
    return "\n".join(lines)
