"""Judging one event against the watermark.

An event belongs to the bucket of the UTC hour of its event time.  Its fate depends on
the watermark *as it stood when its micro-batch began* (``wm_start``), so a replayed
batch is judged exactly as the first time:

=============  ========================================================  =====================
outcome        condition                                                  written to
=============  ========================================================  =====================
``future``     event time > arrival + ``max_future_skew``                dead-letter
``timely``     no watermark yet, or the event's hour ends after it        its own hour
``too_late``   watermark − end of the event's hour > allowed lateness    dead-letter
``late``       otherwise (its hour is complete)                          the open hour
=============  ========================================================  =====================

``before_backfill`` (dead-letter) is the outcome of the job's first batches alone, see below.

The open hour is the hour that holds the watermark; it is never complete, since an hour
is complete exactly when the watermark has reached its end.

A job with no watermark yet (its first batches) has no hour to measure "too late" against:
there an event is ``before_backfill`` when it is more than ``max_backfill`` before its arrival
(``0`` or ``None``: no bound; ``too_late`` before release 0.4, a reason of its own since so that a backfill
dead-lettered for this setting is told apart and can be found), or ``too_late`` when, once the batch knows it,
its hour ended more than
``allowed_lateness`` before the batch's ``too_late_reference`` (the watermark its own events
give).  So one stray event stamped 1970 cannot open fifty years of hours, alone in a batch
or not, while a backfill of events weeks old (within ``max_backfill``) opens its first hour
where its events are.  Once a watermark exists, ``max_backfill`` plays no part.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from event_etl.timeutil import HOUR_MS

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Outcome", "OUTCOMES", "Verdict", "judge", "make_judge", "judge_array", "OUTCOME_CODES",
           "too_late_in_first_batch", "beyond_backfill"]


class Outcome(str, enum.Enum):
    """What happens to an event.  Values are the ``outcome`` label of metrics."""

    TIMELY = "timely"
    LATE = "late"
    TOO_LATE = "too_late"
    FUTURE = "future"
    BEFORE_BACKFILL = "before_backfill"
    """No watermark yet, and more than ``max_backfill`` before its arrival (dead-lettered)."""

    def __str__(self) -> str:
        return self.value


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome) + ("invalid", "duplicate")
"""Every way an event is counted (the ``outcome`` label): the judge's outcomes, then ``invalid`` (dead-lettered
before it was judged) and ``duplicate`` (dropped by deduplication).  Defined here only."""


@dataclass(frozen=True)
class Verdict:
    """The outcome and, for timely and late events, the start of the hour to write into."""

    outcome: Outcome
    hour: int | None


def beyond_backfill(event_time: int, arrival: int, max_backfill: int | None) -> bool:
    """Whether an event is more than ``max_backfill`` before its arrival (``0`` or ``None``: no bound).

    Only a job with no watermark yet asks (see :func:`too_late_in_first_batch`)."""
    if not max_backfill:
        return False
    return arrival - event_time > max_backfill


def too_late_in_first_batch(event_time: int, reference: int | None, allowed_lateness: int, *,
                            arrival: int | None = None, max_backfill: int | None = None) -> bool:
    """Whether an event of a job's first batch (no watermark yet) is too late: more than ``max_backfill``
    before its ``arrival`` (checked when both are given; ``0`` or ``None``: no bound), or, against the batch's
    ``reference`` (the watermark its own events give), its hour ended more than ``allowed_lateness`` before it."""
    if arrival is not None and beyond_backfill(event_time, arrival, max_backfill):
        return True
    hour = event_time - event_time % HOUR_MS
    return reference is not None and reference - hour - HOUR_MS > allowed_lateness


def make_judge(
    wm_start: int | None,
    *,
    allowed_lateness: int,
    max_future_skew: int,
    too_late_reference: int | None = None,
    max_backfill: int | None = None,
) -> Callable[[int, int], tuple[Outcome, int | None]]:
    """A judge for one batch: ``f(event_time, arrival) -> (outcome, hour)``.

    The hot path of an executor calls it once per event, so the constants are bound once
    and no object is allocated per call.  :func:`judge` is the same rule, one event at a time.
    When there is no watermark yet (a job's first batches), ``max_backfill`` bounds how far
    before its arrival an event may be (``0`` or ``None``: no bound), and
    ``too_late_reference`` is the watermark to measure "too late" against: without them an
    event from 1970 would open fifty years of hours.  With a watermark neither plays a part.
    """
    timely, late, too_late, future = Outcome.TIMELY, Outcome.LATE, Outcome.TOO_LATE, Outcome.FUTURE
    if wm_start is None:
        ref = too_late_reference
        backfill = max_backfill or None
        before_backfill = Outcome.BEFORE_BACKFILL

        def first_batch(event_time: int, arrival: int) -> tuple[Outcome, int | None]:
            if event_time > arrival + max_future_skew:
                return future, None
            if beyond_backfill(event_time, arrival, backfill):
                return before_backfill, None
            if too_late_in_first_batch(event_time, ref, allowed_lateness):
                return too_late, None
            return timely, event_time - event_time % HOUR_MS

        return first_batch

    open_hour = wm_start - wm_start % HOUR_MS
    timely_from = wm_start - HOUR_MS  # hour + 1h > wm_start  <=>  hour > wm_start - 1h
    too_late_before = wm_start - allowed_lateness - HOUR_MS  # wm - (hour + 1h) > lateness

    def steady(event_time: int, arrival: int) -> tuple[Outcome, int | None]:
        if event_time > arrival + max_future_skew:
            return future, None
        hour = event_time - event_time % HOUR_MS
        if hour > timely_from:
            return timely, hour
        if hour < too_late_before:
            return too_late, None
        return late, open_hour

    return steady


def judge(
    event_time: int,
    arrival: int,
    wm_start: int | None,
    *,
    allowed_lateness: int,
    max_future_skew: int,
    too_late_reference: int | None = None,
    max_backfill: int | None = None,
) -> Verdict:
    """Judge one event (all times in ms since the epoch, UTC); see the module docstring."""
    outcome, hour = make_judge(
        wm_start,
        allowed_lateness=allowed_lateness,
        max_future_skew=max_future_skew,
        too_late_reference=too_late_reference,
        max_backfill=max_backfill,
    )(event_time, arrival)
    return Verdict(outcome, hour)


OUTCOME_CODES: tuple[Outcome, ...] = (Outcome.TIMELY, Outcome.LATE, Outcome.TOO_LATE, Outcome.FUTURE,
                                      Outcome.BEFORE_BACKFILL)
"""The outcome of each code :func:`judge_array` returns (its index in this tuple): 0 and 1 are written, 2 and up
dead-lettered."""


def judge_array(
    times: np.ndarray,
    arrival: int | np.ndarray,
    wm_start: int | None,
    *,
    allowed_lateness: int,
    max_future_skew: int,
    too_late_reference: int | None = None,
    max_backfill: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`make_judge`'s rule over an array of event times.

    ``arrival`` is one arrival for all of them (the lines of a file), or an array of one
    arrival per event (Pub/Sub messages: each its publish time); ``max_backfill`` (no
    watermark yet) is measured from each event's own arrival.  Returns ``(codes, hours)``:
    ``codes[i]`` indexes :data:`OUTCOME_CODES`; ``hours[i]`` is the hour to write into
    (meaningful for timely and late events only).  Pure function.
    """
    import numpy as np

    t = np.asarray(times, dtype=np.int64)
    # a new name: np.isscalar's TypeGuard would narrow `arrival` to "any scalar" (str, bytes...) for mypy
    arrivals: int | np.ndarray = arrival
    if not np.isscalar(arrival):
        arrivals = np.asarray(arrival, dtype=np.int64)
        if arrivals.shape != t.shape:
            raise ValueError(f"{len(arrivals)} arrivals for {len(t)} event times")
    hour = t - t % HOUR_MS
    codes = np.zeros(len(t), dtype=np.int8)
    if wm_start is None:
        if too_late_reference is not None:
            codes[too_late_reference - hour - HOUR_MS > allowed_lateness] = 2
        if max_backfill:
            codes[arrivals - t > max_backfill] = 4
        out_hour = hour
    else:
        open_hour = wm_start - wm_start % HOUR_MS
        timely = hour > wm_start - HOUR_MS
        too_late = hour < wm_start - allowed_lateness - HOUR_MS
        codes[~timely] = 1
        codes[~timely & too_late] = 2
        out_hour = np.where(timely, hour, open_hour)
    codes[t > arrivals + max_future_skew] = 3
    return codes, out_hour
