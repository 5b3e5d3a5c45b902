"""Where an hour's late records went: the hours whose manifests count records of it.

A record whose hour was already complete when it arrived is written into the hour that was open then
(a ``late-`` file there), and that hour's manifest (version 3) counts it under its own event hour in
``late_event_hours``.  A consumer that processed hour 11 asks :func:`late_records_of` (``event-etl late
page_view 2026-11-21T11``) which later hours hold records of 11, to revisit them, as Gobblin's late-data
recompaction does.  Late records can land in the hours from the one after ``hour`` up to the one that held
the watermark when ``allowed_lateness`` ran out (later ones are dead-lettered as ``too_late``), so the answer
is final once every hour of that window is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from event_etl.consumer.audit import lateness_horizon
from event_etl.consumer.hours import HourLike, hour_ms, hour_text
from event_etl.consumer.sink import EventTypeLike, SinkLike, type_name
from event_etl.consumer.status import HourState, hour_statuses
from event_etl.eventtypes import DEFAULT_ALLOWED_LATENESS_MS
from event_etl.timeutil import HOUR_MS, to_datetime, to_millis

__all__ = ["DEFAULT_ALLOWED_LATENESS_MS", "LateLanding", "LateReport", "late_records_of", "late_window", "describe"]



@dataclass(frozen=True)
class LateLanding:
    """Records of the asked hour found in a later hour's late files."""

    hour: int
    """The hour they were written into (the open hour when they arrived)."""
    records: int


@dataclass(frozen=True)
class LateReport:
    """Where the late records of ``hour`` landed, as far as the hours of ``[since, until)`` say."""

    event_type: str
    hour: int
    since: int
    until: int
    landed: tuple[LateLanding, ...]
    not_complete: tuple[int, ...]
    """Hours of the window without a marker yet: more late records of ``hour`` may land there."""
    unknown: tuple[tuple[int, int], ...]
    """``(hour, records)``: late records whose own hour that hour's manifest does not say (written before
    manifest version 3); some may be records of ``hour``."""

    @property
    def records(self) -> int:
        return sum(x.records for x in self.landed)

    @property
    def final(self) -> bool:
        """Every hour where late records of ``hour`` could land is complete and says where its late records came
        from: no more will come, and none is unaccounted for."""
        return not self.not_complete and not self.unknown

    def to_json(self) -> dict[str, Any]:
        return {
            "event_type": self.event_type, "hour": hour_text(self.hour), "late_records": self.records,
            "landed": [{"hour": hour_text(x.hour), "records": x.records} for x in self.landed],
            "searched": {"since": hour_text(self.since), "until": hour_text(self.until)},
            "not_complete": [hour_text(h) for h in self.not_complete],
            "unknown": [{"hour": hour_text(h), "late_records": n} for h, n in self.unknown],
            "final": self.final,
        }


def late_window(hour: int, allowed_lateness_ms: int) -> tuple[int, int]:
    """The hours ``[since, until)`` a late record of ``hour`` can be written into (pure).

    A record is too late once the watermark is more than ``allowed_lateness`` past its hour's end; until then the
    open hour (the one holding the watermark) is at most the hour of ``hour end + allowed_lateness``."""
    return hour + HOUR_MS, lateness_horizon(hour, allowed_lateness_ms) + HOUR_MS


def late_records_of(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, *,
                    allowed_lateness_ms: int | None = None) -> LateReport:
    """Where the late records of ``hour`` landed: the later hours whose manifests count records of it.

    ``allowed_lateness_ms`` bounds the search (default: the event type's when it is loaded, else 24 h)."""
    h = hour_ms(hour)
    if allowed_lateness_ms is None:
        allowed_lateness_ms = getattr(event_type, "allowed_lateness", DEFAULT_ALLOWED_LATENESS_MS)
    since, until = late_window(h, allowed_lateness_ms)
    landed: list[LateLanding] = []
    not_complete: list[int] = []
    unknown: list[tuple[int, int]] = []
    for status in hour_statuses(sink, event_type, to_datetime(since), to_datetime(until)):
        at = to_millis(status.hour)
        m = status.manifest
        if m is None:
            if status.state is not HourState.NEVER:  # before the job's first hour: nothing will ever land there
                not_complete.append(at)
            continue
        by_hour = m.late_event_hours
        if by_hour is None:  # a manifest of version 1 or 2
            if m.late_records:
                unknown.append((at, m.late_records))
            continue
        if by_hour.get(h):
            landed.append(LateLanding(at, by_hour[h]))
        rest = m.late_records - sum(by_hour.values())
        if rest > 0:  # late files written before version 3, marked by a later release
            unknown.append((at, rest))
    return LateReport(type_name(event_type), h, since, until, tuple(landed), tuple(not_complete), tuple(unknown))


def describe(report: LateReport) -> list[str]:
    """The report in lines of text, as ``event-etl late`` prints it."""
    name, at = report.event_type, hour_text(report.hour)
    lines = [f"{name} {at}: {report.records:,} late records in {len(report.landed)} later hours"
             + (":" if report.landed else "")]
    for x in report.landed:
        lines.append(f"  {hour_text(x.hour)}  {x.records:>10,}")
    span = f"{hour_text(report.since)} to {hour_text(report.until - HOUR_MS)}"
    if report.not_complete:
        lines.append(f"not final: {len(report.not_complete)} hours from {hour_text(report.not_complete[0])} are not "
                     f"complete yet and may still receive late records of {at}")
    for h, n in report.unknown:
        lines.append(f"unknown: {hour_text(h)} holds {n:,} late records whose own hours its manifest does not say "
                     "(written before manifest version 3)")
    if report.final:
        lines.append(f"final: every hour from {span} is complete")
    return lines
