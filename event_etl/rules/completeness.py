"""Which hours are complete.

An hour ``[start, start + 1h)`` is complete when the watermark has reached its end.
Every hour from the earliest hour that received data up to the watermark gets exactly
one ``_COMPLETE`` marker, in order, including hours that received no events.  Hours
before the first one are not marked: the job never owned them.

A jump of event time (an archive of last year's events, then live data) can complete
thousands of hours at once.  They are marked oldest first, at most
:data:`MAX_HOURS_PER_STEP` per step (a batch, an idle tick, a round of a drain); the rest
follow in the next steps.  Nothing waits on them meanwhile: an hour the watermark has
passed is complete, marked or not, and late events for it go to the open hour.
"""

from __future__ import annotations

from event_etl.timeutil import HOUR_MS

__all__ = ["hours_to_mark", "is_complete", "open_hour", "MAX_HOURS_PER_STEP"]

MAX_HOURS_PER_STEP = 24 * 7
"""At most a week of hours is marked in one step, so that a jump of event time never holds up a batch for long."""


def is_complete(hour_start: int, watermark: int | None) -> bool:
    """True when the watermark has reached the end of the hour."""
    return watermark is not None and hour_start + HOUR_MS <= watermark


def open_hour(watermark: int) -> int:
    """The hour that holds the watermark: where late events are written."""
    return watermark - watermark % HOUR_MS


def hours_to_mark(first_hour: int | None, marked_through: int | None, watermark: int | None,
                  *, limit: int = MAX_HOURS_PER_STEP) -> list[int]:
    """Starts of the hours that are complete but not yet marked, oldest first, at most ``limit`` of them."""
    if first_hour is None or watermark is None:
        return []
    start = first_hour if marked_through is None else max(first_hour, marked_through + HOUR_MS)
    end = min(open_hour(watermark), start + limit * HOUR_MS)  # open_hour: the first hour that is not complete
    if end <= start:
        return []
    return list(range(start, end, HOUR_MS))
