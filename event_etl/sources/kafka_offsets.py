"""What a Kafka source's offsets tell the job beyond the records a batch reads: records retention deleted
before the job read them (``lost``), each partition's lag, and the consumer group's commit at a batch's end.

The planner runs in the driver (``--engine shared``) or in Spark's Python data source process
(``--engine queries``); the channel from it to the controller and the metrics is what both engines already
keep in the driver: the batch's offsets in the checkpoint's Spark offset log (``spark/offsets/<batch>``, written
before the batch runs), and the source's end and latest offsets of the query's progress (``query.lastProgress``,
or :meth:`event_etl.job.shared.Lane.progress`).  Every function here is a function of those offsets alone.

An offset's ``lost`` (see :mod:`event_etl.sources.kafka`) accumulates over the checkpoint's life, so the records
lost before a batch are its end's ``lost`` minus its start's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["as_offset", "lost_between", "logged_offset", "batch_lost", "lag_by_partition", "GroupCommitter"]

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
    :class:`event_etl.job.shared.SparkLog`, Spark's own), or None if there is none."""
    try:
        lines = (Path(spark_dir) / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    return as_offset(lines[-1]) if len(lines) >= 3 and lines[-1].startswith("{") else None


def batch_lost(spark_dir: str | Path, batch_id: int) -> dict[int, int]:
    """:func:`lost_between` the start and end offsets of batch ``batch_id``, read from the checkpoint's Spark
    offset log (both engines write a batch's end there before it runs; its start is the batch before's end).

    A batch whose offset cannot be read says nothing ({}): the counting is for people, never a batch's failure.
    Spark keeps the last 100 batches' offsets, so the batch before is there whenever the batch is."""
    try:
        end = logged_offset(spark_dir, batch_id)
        start = logged_offset(spark_dir, batch_id - 1) if batch_id > 0 else None
        return lost_between(start, end)
    except Exception:  # noqa: BLE001 - a log edited by hand, a source of another shape: nothing to report
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
    ends, highs = end_o.get("partitions"), latest_o.get("partitions")
    if not isinstance(ends, dict) or not isinstance(highs, dict) or "topic_id" not in latest_o:
        return None
    topic = str(latest_o.get("topic", end_o.get("topic", "")))
    try:
        return {(topic, int(p)): max(0, int(h) - int(ends.get(p, 0))) for p, h in sorted(highs.items(),
                                                                                      key=lambda kv: int(kv[0]))}
    except (TypeError, ValueError):
        return None


class GroupCommitter:
    """``--engine queries``: commits a batch's end offsets to the job's consumer group from the driver once the
    batch's state is saved (a controller listener on ``batch`` events), as the shared engine does.

    Spark itself tells the source a batch is done only when it plans the next one (or at the next start), so
    without this the group would lag a batch behind the job, a whole run behind after ``--once``.  Best effort,
    like :meth:`event_etl.sources.kafka.KafkaPlanner.commit`: the checkpoint is what counts."""

    def __init__(self, topic: str, event_type: str | None, spark_dir: str | Path) -> None:
        self.topic = topic
        self.event_type = event_type
        self.spark_dir = Path(spark_dir)
        self._planner: Any = None

    def __call__(self, kind: str, payload: Any) -> None:
        if kind != "batch":
            return
        try:
            end = logged_offset(self.spark_dir, payload.batch_id)
            if end is None or end.get("topic") != self.topic:
                return
            if self._planner is None:
                from event_etl.sources.kafka import KafkaPlanner

                self._planner = KafkaPlanner(self.topic, event_type=self.event_type, on_loss="skip")
            self._planner.commit(end)  # logs, never raises
        except Exception as err:  # noqa: BLE001 - monitoring only: never fails the batch
            log.warning("could not commit the offsets of Kafka topic %s after batch %s: %s", self.topic,
                        getattr(payload, "batch_id", "?"), err)

    def close(self) -> None:
        planner, self._planner = self._planner, None
        if planner is not None:
            planner.stop()
