"""Which hours are complete.

An hour ``[start, start + 1h)`` is complete when the watermark has reached its end.
Every hour from the earliest hour that received data up to the watermark gets exactly
one ``_COMPLETE`` marker, in order, including hours that received no events.  Hours
before the first one are not marked: the job never owned them.
"""

from __future__ import annotations

from event_etl.timeutil import HOUR_MS

__all__ = ["hours_to_mark", "is_complete", "open_hour", "MAX_HOURS_PER_STEP"]

MAX_HOURS_PER_STEP = 24 * 366
"""Refuse to mark more hours than a year's in one step: a sign of a wrong clock, not of data."""


def is_complete(hour_start: int, watermark: int | None) -> bool:
    """True when the watermark has reached the end of the hour."""
    return watermark is not None and hour_start + HOUR_MS <= watermark


def open_hour(watermark: int) -> int:
    """The hour that holds the watermark: where late events are written."""
    return watermark - watermark % HOUR_MS


def hours_to_mark(first_hour: int | None, marked_through: int | None, watermark: int | None) -> list[int]:
    """Starts of the hours that are complete but not yet marked, oldest first."""
    if first_hour is None or watermark is None:
        return []
    start = first_hour if marked_through is None else max(first_hour, marked_through + HOUR_MS)
    end = open_hour(watermark)  # first hour that is not complete
    if end <= start:
        return []
    count = (end - start) // HOUR_MS
    if count > MAX_HOURS_PER_STEP:
        raise ValueError(
            f"the watermark would complete {count} hours at once (from {start} to {end}); "
            "this points to a wrong event-time clock rather than real data"
        )
    return list(range(start, end, HOUR_MS))
