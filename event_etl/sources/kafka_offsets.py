"""What a Kafka source's offsets tell the job beyond the records a batch reads: records retention deleted
before the job read them (``lost``) and each partition's lag.

The planner runs in the driver, beside what the controller and the metrics read: the batch's offsets in the
checkpoint's Spark offset log (``spark/offsets/<batch>``, written before the batch runs), and the source's end and
latest offsets (:meth:`event_etl.job.engine.Lane.progress`, shaped as Spark's ``query.lastProgress``).  Every
function here is a function of those offsets alone.

An offset's ``lost`` (see :mod:`event_etl.sources.kafka`) accumulates over the checkpoint's life, so the records
lost before a batch are its end's ``lost`` minus its start's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["as_offset", "lost_between", "logged_offset", "batch_lost", "lag_by_partition"]

log = logging.getLogger("event_etl.sources.kafka")


def as_offset(value: Any) -> dict[str, Any] | None:
    """A source's offset as Spark's progress or offset log gives it (JSON text or already a dict); None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _lost(offset: dict[str, Any] | None) -> dict[int, int]:
    if not offset:
        return {}
    return {int(p): int(n) for p, n in (offset.get("lost") or {}).items()}


def lost_between(start: dict[str, Any] | None, end: dict[str, Any] | None) -> dict[int, int]:
    """Records retention deleted unread that the batch from ``start`` to ``end`` skipped, by partition (only
    partitions that lost any).  A start offset of another shape (another source) counts as none lost."""
    before, after = _lost(start), _lost(end)
    return {p: n - before.get(p, 0) for p, n in sorted(after.items()) if n > before.get(p, 0)}


def logged_offset(spark_dir: str | Path, batch_id: int) -> dict[str, Any] | None:
    """The end offset of batch ``batch_id`` in a checkpoint's Spark offset log (its last line; the format of
    :class:`event_etl.job.engine.SparkLog`, Spark's own), or None if there is none."""
    try:
        lines = (Path(spark_dir) / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    return as_offset(lines[-1]) if len(lines) >= 3 and lines[-1].startswith("{") else None


def batch_lost(spark_dir: str | Path, batch_id: int) -> dict[int, int]:
    """:func:`lost_between` the start and end offsets of batch ``batch_id``, read from the checkpoint's Spark
    offset log (the engine writes a batch's end there before it runs; its start is the batch before's end).

    A batch whose offset cannot be read says nothing ({}): the counting is for people, never a batch's failure.
    Spark keeps the last 100 batches' offsets, so the batch before is there whenever the batch is."""
    try:
        end = logged_offset(spark_dir, batch_id)
        start = logged_offset(spark_dir, batch_id - 1) if batch_id > 0 else None
        return lost_between(start, end)
    except Exception:  # a log edited by hand, a source of another shape: nothing to report
        log.debug("cannot read the offsets of batch %s in %s", batch_id, spark_dir, exc_info=True)
        return {}


def lag_by_partition(end: Any, latest: Any) -> dict[tuple[str, int], int] | None:
    """Each partition's lag, ``{(topic, partition): high watermark - committed end offset}``, from a Kafka
    source's end offset (what the job committed) and latest offset (the high watermarks it last saw); None when
    the offsets are not a Kafka source's.  A partition the end offset does not know yet lags by its whole high
    watermark (it is read from its low watermark, which may be above 0: an upper bound)."""
    end_o, latest_o = as_offset(end), as_offset(latest)
    if end_o is None or latest_o is None:
        return None
    if isinstance(end_o.get("topics"), dict) and isinstance(latest_o.get("topics"), dict):  # kafka:re:PATTERN
        out: dict[tuple[str, int], int] = {}
        for topic, high in latest_o["topics"].items():
            lag = lag_by_partition(end_o["topics"].get(topic, {"topic": topic, "partitions": {}}), high)
            out.update(lag or {})
        return out
    ends, highs = end_o.get("partitions"), latest_o.get("partitions")
    if not isinstance(ends, dict) or not isinstance(highs, dict) or "topic_id" not in latest_o:
        return None
    topic = str(latest_o.get("topic", end_o.get("topic", "")))
    try:
        return {(topic, int(p)): max(0, int(h) - int(ends.get(p, 0))) for p, h in sorted(highs.items(),
                                                                                      key=lambda kv: int(kv[0]))}
    except (TypeError, ValueError):
        return None
