"""What a source tells the job about itself: its backlog, an outage, its last delivery.

The source runs in a process of its own (Spark's Python data source machinery), the
job's controller in the driver.  The source leaves :class:`~event_etl.rules.watermark.SourceActivity`
in ``etl/source/<kind>.activity.json`` of the checkpoint (beside its own folder, whose
files release 0.1.0 reads) whenever Spark asks it for offsets,
and when it starts retrying an unreachable input; the controller reads it before it lets
the watermark follow the clock (:func:`event_etl.rules.watermark.quiet_since`): a source
with a backlog, in an outage, or silent about itself is not quiet.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from event_etl.rules.watermark import SourceActivity

__all__ = ["activity_path", "observe", "report_activity", "read_activity"]


def activity_path(log_dir: str | os.PathLike[str]) -> Path:
    """Where the source whose folder is ``log_dir`` reports: ``<log_dir>.activity.json``."""
    d = Path(log_dir)
    return d.with_name(f"{d.name}.activity.json")


def observe(planner: Any, start: dict[str, Any], end: dict[str, Any], *, now: int,
            delivered_at: int | None) -> SourceActivity:
    """What a source planner's answer for offsets (``start`` to ``end``, asked at ``now``) says of it: whether
    input waits beyond ``end``, and when it last delivered (``now`` if it does now, else ``delivered_at``)."""
    if end != start:
        delivered_at = now
    backlog = planner.backlog(end) if hasattr(planner, "backlog") else {}
    waiting = int(next(iter(backlog.values()), 0)) if backlog else 0
    return SourceActivity(now, waiting, False, delivered_at)


def report_activity(log_dir: str | os.PathLike[str], activity: SourceActivity) -> None:
    """Leave the source's report for the controller (replaced whole; losing one to a crash is harmless)."""
    from event_etl.storage.atomic import write_json_atomic

    write_json_atomic(activity_path(log_dir), activity.to_json(), durable=False)


def read_activity(log_dir: str | os.PathLike[str]) -> SourceActivity | None:
    """The source's last report, or ``None`` if it has made none."""
    try:
        return SourceActivity.from_json(json.loads(activity_path(log_dir).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # half-written by a source killed mid-write: as if absent
