"""How the watermark moves.

The watermark is the event time up to which the job believes it has seen everything:
the maximum event time seen minus the type's out-of-orderness bound.  Three things
move it, and it never goes back:

1. **Events** (:func:`watermark_after_batch`): after a micro-batch, to the batch's
   maximum accepted event time minus the bound.  Future-skewed events are rejected
   before they can count, so a producer with a wrong clock cannot push it ahead.
2. **Idleness** (:func:`idle_watermark`): once the source has been quiet for the idle
   timeout, it advances by the wall-clock time that passes after that, starting from
   where it stood when the source went quiet.  A quiet live source still closes its
   hours; a finished backfill advances at the pace of the clock, it does not jump to
   today.
3. **Drain** (:func:`drain_watermark`): the end of input is the end of time, so it goes
   to the end of the hour of the latest event seen.

:class:`WatermarkState` is what the driver persists after every batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from event_etl.timeutil import HOUR_MS

__all__ = ["WatermarkState", "drain_watermark", "idle_watermark", "watermark_after_batch"]


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def watermark_after_batch(
    wm_start: int | None, batch_max_event_time: int | None, *, out_of_orderness: int
) -> int | None:
    """Watermark after a batch whose accepted events reached ``batch_max_event_time``."""
    if batch_max_event_time is None:
        return wm_start
    return _max(wm_start, batch_max_event_time - out_of_orderness)


def idle_watermark(
    watermark: int | None,
    *,
    quiet_since: int,
    watermark_when_quiet: int | None,
    now: int,
    idle_timeout: int,
) -> int | None:
    """Watermark of a source quiet since ``quiet_since`` (wall clock, ms), at wall time ``now``.

    Before the idle timeout has passed nothing changes; after it, the watermark is
    ``watermark_when_quiet`` plus the wall time elapsed beyond the timeout.  A job that
    has never seen an event has no watermark to advance.
    """
    if watermark_when_quiet is None:
        return watermark
    elapsed = now - quiet_since - idle_timeout
    if elapsed <= 0:
        return watermark
    return _max(watermark, watermark_when_quiet + elapsed)


def drain_watermark(watermark: int | None, max_event_time: int | None) -> int | None:
    """Watermark at the end of input: the end of the hour of the latest event seen."""
    if max_event_time is None:
        return watermark
    hour = max_event_time - max_event_time % HOUR_MS
    return _max(watermark, hour + HOUR_MS)


@dataclass(frozen=True)
class WatermarkState:
    """What a job knows of event time, persisted after every micro-batch.

    - ``watermark``: ms, or ``None`` before the first event.
    - ``max_event_time``: the largest accepted event time seen.
    - ``first_hour``: the earliest hour that received data (timely records, or late records
      written into the open hour); markers start there.
    - ``marked_through``: start of the last hour that has its marker (every hour from
      ``first_hour`` to it has one), or ``None``.
    - ``last_batch_id``: the last micro-batch fully processed (-1: none).
    """

    watermark: int | None = None
    max_event_time: int | None = None
    first_hour: int | None = None
    marked_through: int | None = None
    last_batch_id: int = -1

    def after_batch(
        self,
        *,
        batch_id: int,
        wm_start: int | None,
        batch_max_event_time: int | None,
        batch_min_hour: int | None,
        out_of_orderness: int,
    ) -> "WatermarkState":
        """State after batch ``batch_id`` (judged against ``wm_start``) was written."""
        wm = watermark_after_batch(
            _max(wm_start, self.watermark), batch_max_event_time, out_of_orderness=out_of_orderness
        )
        first = self.first_hour
        if batch_min_hour is not None and (first is None or batch_min_hour < first):
            first = batch_min_hour
        return replace(
            self,
            watermark=wm,
            max_event_time=_max(self.max_event_time, batch_max_event_time),
            first_hour=first,
            last_batch_id=max(self.last_batch_id, batch_id),
        )

    def with_watermark(self, watermark: int | None) -> "WatermarkState":
        """The same state with the watermark moved forward (never back)."""
        return replace(self, watermark=_max(self.watermark, watermark))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "WatermarkState":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)
