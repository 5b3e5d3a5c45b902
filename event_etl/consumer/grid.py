"""Is everything complete?  The hours of several event types at once, as a grid and as one verdict.

A consumer's first question each morning is whether yesterday is complete for every type it reads.
:func:`completeness` answers it for a list of types (or every type of a sink) over a range of hours;
:func:`grid_lines` draws the answer as a grid a person reads at a glance, one row per type and day, one
character per hour::

    2026-11-27 (UTC)   00    06    12    18      complete
    page_view          ###### ###### ###### ######  24/24
    payment            ###### ###### ###### ###oo.  20/24  not yet: 21:00 open, ... 23:00 not started

The verdict is ``wait``'s: complete when every hour of every type is final, that is complete (audited or not,
a mismatch too: its marker is there and the hour will not change) or ``never`` (before the type's first hour,
where no marker will ever come: nothing there to wait for).  An ``open`` or ``not started`` hour is not yet.

:func:`summarise` and :func:`grid_lines` are plain functions over plain values (hours in ms, states);
:func:`completeness` reads the sink through :func:`~event_etl.consumer.status.hour_statuses`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from event_etl.consumer.hours import hour_range
from event_etl.consumer.sink import SinkLike, event_types_in, open_sink
from event_etl.consumer.status import HourState, hour_statuses
from event_etl.timeutil import DAY_MS, HOUR_MS, iso, to_datetime, to_millis

__all__ = ["SYMBOLS", "TypeHours", "completeness", "grid_lines", "summarise", "is_final"]

SYMBOLS: dict[HourState, str] = {
    HourState.COMPLETE: "#",
    HourState.AUDITED: "A",
    HourState.MISMATCH: "!",
    HourState.OPEN: "o",
    HourState.NOT_STARTED: ".",
    HourState.NEVER: "-",
}
"""One character per hour state, in the grid (its legend is printed with it)."""

LEGEND = "# complete  A audited  ! audit mismatch  o open  . not started  - never (before the type's first hour)"


def is_final(state: HourState) -> bool:
    """True when nothing more will happen to the hour: marked, or before the type's first hour."""
    return state.is_complete or state is HourState.NEVER


@dataclass(frozen=True)
class TypeHours:
    """One type's hours in the range, oldest first: ``(hour start in ms, state)``."""

    event_type: str
    hours: tuple[tuple[int, HourState], ...]

    @property
    def complete(self) -> int:
        return sum(s.is_complete for _, s in self.hours)

    @property
    def never(self) -> int:
        return sum(s is HourState.NEVER for _, s in self.hours)

    @property
    def waiting(self) -> list[tuple[int, HourState]]:
        """The hours that are not final yet (open or not started), oldest first."""
        return [(h, s) for h, s in self.hours if not is_final(s)]

    @property
    def is_complete(self) -> bool:
        return not self.waiting


def completeness(sink: SinkLike, event_types: Sequence[str], since: int, until: int) -> list[TypeHours]:
    """The state of every hour in ``[since, until)`` for each of ``event_types`` (every type the sink holds when
    empty), in the order given (by name for a whole sink).  A type the sink does not hold at all raises
    :class:`~event_etl.errors.NoDataError` (exit code 6), as ``hours`` does: a misspelled name is no "not yet"."""
    storage = open_sink(sink)
    names = list(event_types) or event_types_in(storage)
    lo, hi = to_datetime(since), to_datetime(until)
    hour_range(lo, hi)  # a usage error for an empty or reversed range, before any listing
    return [TypeHours(n, tuple((to_millis(s.hour), s.state) for s in hour_statuses(storage, n, lo, hi)))
            for n in names]


def summarise(rows: Sequence[TypeHours], since: int, until: int) -> dict[str, Any]:
    """The answer as one JSON-ready document: the range, the verdict and each type's hours by state."""
    return {
        "since": iso(since), "until": iso(until), "complete": all(r.is_complete for r in rows),
        "types": {r.event_type: {
            "complete": r.is_complete, "hours": len(r.hours), "complete_hours": r.complete, "never_hours": r.never,
            "not_complete": [{"hour": iso(h), "state": str(s)} for h, s in r.waiting],
            "states": {iso(h): str(s) for h, s in r.hours},
        } for r in rows},
    }


def _hh(ms: int) -> str:
    return iso(ms)[11:13]


def grid_lines(rows: Sequence[TypeHours], since: int, until: int, *, most_listed: int = 4) -> list[str]:
    """The grid: per day of the range, a header of hours and one row per type (a character per hour, a space
    every 6 hours), the count of complete hours, and which hours are not final yet (the first ``most_listed``);
    then the legend and the verdict."""
    if not rows:
        return ["no event type in this sink yet", "not yet: nothing to read"]
    name_w = max(len("YYYY-MM-DD (UTC)"), *(len(r.event_type) for r in rows))
    out: list[str] = []
    day = since - since % DAY_MS
    while day < until:
        lo, hi = max(day, since), min(day + DAY_MS, until)
        span = range((lo - day) // HOUR_MS, (hi - day) // HOUR_MS)
        head = _columns(span, lambda i, first=span.start: f"{i:02d}" if i % 6 == 0 or i == first else None)
        out.append(f"{iso(day)[:10] + ' (UTC)':<{name_w}}  {head}  complete".rstrip())
        for r in rows:
            states = {h: s for h, s in r.hours if lo <= h < hi}
            line = _columns(span, lambda i, states=states, day=day: SYMBOLS[states[day + i * HOUR_MS]])
            done = sum(s.is_complete for s in states.values())
            final = sum(is_final(s) for s in states.values())
            waiting = [(h, s) for h, s in sorted(states.items()) if not is_final(s)]
            note = ""
            if waiting:
                listed = ", ".join(f"{_hh(h)}:00 {s}" for h, s in waiting[:most_listed])
                more = f" and {len(waiting) - most_listed} more" if len(waiting) > most_listed else ""
                note = f"  not yet: {listed}{more}"
            count = f"{done}/{len(states)}" + (f" (+{final - done} never)" if final > done else "")
            out.append(f"{r.event_type:<{name_w}}  {line}  {count}{note}".rstrip())
        day += DAY_MS
    out.append(LEGEND)
    waiting_types = [r for r in rows if not r.is_complete]
    if not waiting_types:
        out.append(f"complete: every hour of {len(rows)} type{'s' if len(rows) != 1 else ''} from {iso(since)} to "
                   f"{iso(until)} is final")
    else:
        hours = sum(len(r.waiting) for r in waiting_types)
        names = ", ".join(r.event_type for r in waiting_types)
        out.append(f"not yet: {hours} hour{'s' if hours != 1 else ''} of {len(waiting_types)} of {len(rows)} "
                   f"type{'s' if len(rows) != 1 else ''} not complete ({names})")
    return out


def _columns(span: range, cell: Any) -> str:
    """One character per hour of ``span`` (hours of the day), a space before hours 6, 12 and 18; ``cell(i)`` gives
    the hour's text (a label of two characters overflows into the next hour's column, as a ruler's numbers do)."""
    out: list[str] = []
    skip = 0
    for i in span:
        if i % 6 == 0 and i != span.start:
            out.append(" ")
        if skip:
            skip -= 1
            continue
        text = cell(i)
        if text is None:
            out.append(" ")
            continue
        out.append(text)
        skip = len(text) - 1
    return "".join(out)
