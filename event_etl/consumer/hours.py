"""Hours as consumers name them: an aware datetime or an ISO-8601 UTC string, and half-open ranges of them.

Inside event_etl an hour is the millisecond of its start (UTC).  At the API's edge an
hour is given as a timezone-aware ``datetime`` at the start of an hour, or as a string
such as ``2026-11-21T13``, ``2026-11-21T13:00Z`` or ``2026-11-21 13:00:00+00:00`` (what
Airflow renders for ``{{ data_interval_start }}``).  Anything else is a
:class:`~event_etl.errors.UsageError` that shows the accepted forms: a naive datetime,
minutes other than zero, an offset other than UTC.

Ranges are half-open, ``[since, until)``, like Luigi's hour ranges: ``since=13, until=16``
is 13:00, 14:00 and 15:00.  The clock is never read here; callers pass ``now``.
"""

from __future__ import annotations

from datetime import datetime

from event_etl.errors import UsageError
from event_etl.timeutil import HOUR_MS, hour_floor, iso, parse_hour, to_millis

__all__ = ["HourLike", "MAX_RANGE_HOURS", "hour_ms", "hour_range", "hour_text", "window"]

HourLike = datetime | str
"""An hour as the public API accepts it: an aware datetime at the start of an hour, or ISO-8601 UTC text."""

MAX_RANGE_HOURS = 24 * 366
"""A range longer than a year is refused: it is a typo (a wrong year), not a question about data."""


def hour_ms(value: HourLike, *, what: str = "hour") -> int:
    """The start of the hour ``value`` names, in ms since the epoch.  ``UsageError`` if it names none."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise UsageError(
                f"{what} {value.isoformat()} is a naive datetime; event_etl hours are UTC",
                fix="pass an aware datetime, e.g. datetime(2026, 11, 21, 13, tzinfo=timezone.utc)",
            )
        ms = to_millis(value)
        if ms % HOUR_MS:
            raise UsageError(
                f"{what} {value.isoformat()} is not the start of an hour",
                fix=f"use the start of the hour, e.g. {iso(hour_floor(ms))}",
            )
        return ms
    if isinstance(value, str):
        try:
            return parse_hour(value)
        except ValueError as err:
            raise UsageError(
                f"{what}: {err}", fix="write the hour in UTC, e.g. 2026-11-21T13 or 2026-11-21T13:00Z"
            ) from err
    raise UsageError(
        f"{what} {value!r} is a {type(value).__name__}, not an hour",
        fix="pass an aware datetime or an ISO-8601 string such as '2026-11-21T13:00Z'",
    )


def hour_range(since: HourLike, until: HourLike) -> list[int]:
    """Starts of the hours in ``[since, until)``, oldest first."""
    start, end = hour_ms(since, what="since"), hour_ms(until, what="until")
    if end <= start:
        raise UsageError(
            f"until {iso(end)} is not after since {iso(start)}",
            fix="ranges are half-open [since, until): until is the first hour NOT included",
        )
    count = (end - start) // HOUR_MS
    if count > MAX_RANGE_HOURS:
        raise UsageError(f"{count} hours from {iso(start)} to {iso(end)} is more than a year",
                         fix="ask for at most a year of hours at a time")
    return list(range(start, end, HOUR_MS))


def window(since: int | None, until: int | None, *, now: int, hours: int = 24,
           include_current: bool = True) -> tuple[int, int]:
    """``(since, until)`` in ms, with defaults for what is not given.

    ``until`` defaults to the end of the hour holding ``now`` (``include_current``) or to its
    start (only hours that have ended); ``since`` to ``hours`` hours before ``until``.
    """
    if until is None:
        until = hour_floor(now) + (HOUR_MS if include_current else 0)
    if since is None:
        since = until - hours * HOUR_MS
    return since, until


def hour_text(hour: datetime | int | None) -> str:
    """``2026-11-21T13:00:00Z`` for an hour given as an aware datetime or ms; ``-`` for ``None``."""
    if hour is None:
        return "-"
    return iso(to_millis(hour) if isinstance(hour, datetime) else hour)
