"""What a source tells the job about itself: its backlog, its last delivery.

The engine's lane asks its source's planner for offsets at every round and makes of the answer a
:class:`~event_etl.rules.watermark.SourceActivity` (:func:`observe`); the controller reads it before it lets the
watermark follow the clock (:func:`event_etl.rules.watermark.quiet_since`): a source with a backlog, in an outage,
or silent about itself is not quiet.  (Pub/Sub's fetcher reports for itself.)
"""

from __future__ import annotations

from typing import Any

from event_etl.rules.watermark import SourceActivity

__all__ = ["observe"]


def observe(planner: Any, start: dict[str, Any], end: dict[str, Any], *, now: int,
            delivered_at: int | None) -> SourceActivity:
    """What a source planner's answer for offsets (``start`` to ``end``, asked at ``now``) says of it: whether
    input waits beyond ``end``, and when it last delivered (``now`` if it does now, else ``delivered_at``)."""
    if end != start:
        delivered_at = now
    backlog = planner.backlog(end) if hasattr(planner, "backlog") else {}
    waiting = int(next(iter(backlog.values()), 0)) if backlog else 0
    return SourceActivity(now, waiting, False, delivered_at)
