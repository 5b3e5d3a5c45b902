"""Is everything complete?  The hours of several event types at once, as a grid and as one verdict.

A consumer's first question each morning is whether yesterday is complete for every type it reads.
:func:`completeness` answers it for a list of types (or every type of a sink) over a range of hours;
:func:`grid_lines` draws the answer as a grid a person reads at a glance, one row per type and day, one
character per hour::

    2026-11-27 (UTC)   00    06    12    18      complete
    page_view          ###### ###### ###### ######  24/24
    payment            ###### ###### ###### ###oo.  20/24  not yet: 21:00 open, ... 23:00 not started

The verdict is ``wait``'s: complete when every hour of every type is final, that is complete (audited or not,
a mismatch too: its marker is there and the hour will not change).  An ``open`` or ``not started`` hour is not
yet.  A ``never`` hour (before the type's first hour: no marker will ever come) holds no data of the type: on a
type created today, yesterday is 24 such hours, and a consumer that took them as final would go on with nothing.
So they are not final unless the caller says so (``never_final``, ``complete --never-final``); without it they
are what :func:`never_error` says (exit code 2, as ``wait`` on such an hour).

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
from event_etl.errors import UsageError
from event_etl.timeutil import DAY_MS, HOUR_MS, iso, to_datetime, to_millis

__all__ = ["SYMBOLS", "TypeHours", "completeness", "grid_lines", "summarise", "is_final", "never_error"]

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


def is_final(state: HourState, *, never_final: bool = False) -> bool:
    """True when nothing more will happen to the hour and it can be read: marked; with ``never_final``, also an
    hour before the type's first hour (``never``: no marker will come, and no data of the type is there)."""
    return state.is_complete or (never_final and state is HourState.NEVER)


@dataclass(frozen=True)
class TypeHours:
    """One type's hours in the range, oldest first: ``(hour start in ms, state)``; ``never_final`` says whether
    its ``never`` hours (before the type's first hour, ``first_hour``) count as final."""

    event_type: str
    hours: tuple[tuple[int, HourState], ...]
    never_final: bool = False
    first_hour: int | None = None

    @property
    def complete(self) -> int:
        return sum(s.is_complete for _, s in self.hours)

    @property
    def never(self) -> int:
        return sum(s is HourState.NEVER for _, s in self.hours)

    @property
    def waiting(self) -> list[tuple[int, HourState]]:
        """The hours that may still be marked (open or not started), oldest first."""
        return [(h, s) for h, s in self.hours if not s.is_complete and s is not HourState.NEVER]

    @property
    def before_first(self) -> list[int]:
        """The ``never`` hours that count against the verdict: none with ``never_final``."""
        return [] if self.never_final else [h for h, s in self.hours if s is HourState.NEVER]

    @property
    def is_complete(self) -> bool:
        return not self.waiting and not self.before_first


def completeness(sink: SinkLike, event_types: Sequence[str], since: int, until: int, *,
                 never_final: bool = False) -> list[TypeHours]:
    """The state of every hour in ``[since, until)`` for each of ``event_types`` (every type the sink holds when
    empty), in the order given (by name for a whole sink).  A type the sink does not hold at all raises
    :class:`~event_etl.errors.NoDataError` (exit code 6), as ``hours`` does: a misspelled name is no "not yet".
    ``never_final``: hours before a type's first hour count as final (see :func:`never_error`)."""
    storage = open_sink(sink)
    names = list(event_types) or event_types_in(storage)
    lo, hi = to_datetime(since), to_datetime(until)
    hour_range(lo, hi)  # a usage error for an empty or reversed range, before any listing
    rows = []
    for name in names:
        statuses = hour_statuses(storage, name, lo, hi)
        first = next((s.first_complete for s in statuses if s.state is HourState.NEVER and s.first_complete), None)
        rows.append(TypeHours(name, tuple((to_millis(s.hour), s.state) for s in statuses), never_final,
                              None if first is None else to_millis(first)))
    return rows


def never_error(rows: Sequence[TypeHours]) -> UsageError | None:
    """The error for the hours before a type's first hour when they do not count as final (exit code 2, as ``wait``
    on such an hour): no marker will ever come for them, so "not yet" would be a lie and "complete" an empty read."""
    before = [r for r in rows if r.before_first]
    if not before:
        return None
    parts = []
    for r in before:
        hours = r.before_first
        n = f"{len(hours)} hour{'s' if len(hours) != 1 else ''}"
        parts.append(f"{r.event_type} {n} from {iso(hours[0])}"
                     + (f" (its first hour is {iso(r.first_hour)})" if r.first_hour is not None else ""))
    return UsageError(
        "no data for hours before a type's first hour, which no marker will ever close: " + "; ".join(parts),
        fix="ask for the hours from the type's first on (--since), or pass --never-final if hours before a type's "
            "first hour are final for you (nothing to read there)")


def summarise(rows: Sequence[TypeHours], since: int, until: int) -> dict[str, Any]:
    """The answer as one JSON-ready document: the range, the verdict and each type's hours by state."""
    return {
        "since": iso(since), "until": iso(until), "complete": all(r.is_complete for r in rows),
        "never_final": any(r.never_final for r in rows),
        "types": {r.event_type: {
            "complete": r.is_complete, "hours": len(r.hours), "complete_hours": r.complete, "never_hours": r.never,
            "not_complete": [{"hour": iso(h), "state": str(s)} for h, s in r.waiting],
            "no_data_before_first_hour": [iso(h) for h in r.before_first],
            "states": {iso(h): str(s) for h, s in r.hours},
        } for r in rows},
    }


def _hh(ms: int) -> str:
    return iso(ms)[11:13]


def grid_lines(rows: Sequence[TypeHours], since: int, until: int, *, most_listed: int = 4) -> list[str]:
    """The grid: per day of the range, a header of hours and one row per type (a character per hour, a space
    every 6 hours), the count of complete hours, which hours are not final yet (the first ``most_listed``) and
    the hours before the type's first; then the legend and the verdict."""
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
            out.append(f"{r.event_type:<{name_w}}  {line}  {_row_note(r, states, most_listed)}".rstrip())
        day += DAY_MS
    out.append(LEGEND)
    out.append(_verdict(rows, since, until))
    return out


def _row_note(r: TypeHours, states: dict[int, HourState], most_listed: int) -> str:
    """A row's count (``15/24``, ``+6 never`` when those count as final) and what is not final in it."""
    done = sum(s.is_complete for s in states.values())
    never = sorted(h for h, s in states.items() if s is HourState.NEVER)
    count = f"{done}/{len(states)}" + (f" (+{len(never)} never)" if never and r.never_final else "")
    waiting = [(h, s) for h, s in sorted(states.items()) if not s.is_complete and s is not HourState.NEVER]
    notes = []
    if never and not r.never_final:
        span = f"{_hh(never[0])}:00" + (f" to {_hh(never[-1])}:00" if len(never) > 1 else "")
        notes.append(f"no data: {span} before its first hour")
    if waiting:
        listed = ", ".join(f"{_hh(h)}:00 {s}" for h, s in waiting[:most_listed])
        more = f" and {len(waiting) - most_listed} more" if len(waiting) > most_listed else ""
        notes.append(f"not yet: {listed}{more}")
    return "  ".join([count, *notes])


def _verdict(rows: Sequence[TypeHours], since: int, until: int) -> str:
    types = f"type{'s' if len(rows) != 1 else ''}"
    waiting_types = [r for r in rows if r.waiting]
    if waiting_types:
        hours = sum(len(r.waiting) for r in waiting_types)
        names = ", ".join(r.event_type for r in waiting_types)
        return (f"not yet: {hours} hour{'s' if hours != 1 else ''} of {len(waiting_types)} of {len(rows)} "
                f"{types} not complete ({names})")
    before = [r for r in rows if r.before_first]
    if before:
        hours = sum(len(r.before_first) for r in before)
        names = ", ".join(r.event_type for r in before)
        return (f"not complete: {hours} hour{'s' if hours != 1 else ''} of {len(before)} of {len(rows)} {types} "
                f"before the type's first hour, with no data ({names})")
    return f"complete: every hour of {len(rows)} {types} from {iso(since)} to {iso(until)} is final"


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
