"""The report of one split: what an executor task did, sent back to the driver.

A task returns one row per split, ``report string, keys binary`` (:data:`REPORT_SCHEMA`):
``report`` is :meth:`SplitReport.to_json` as JSON text, ``keys`` the deduplication keys of
what it wrote.  The driver's controller adds up the reports of a batch (and its metrics
record them once the batch is durable).  The JSON shape is the wire format: a driver may
read reports of executors of another release (a key an older one did not write is absent),
so it is kept as it is, and :meth:`SplitReport.from_json` keeps "absent" apart from ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["REPORT_SCHEMA", "DELAY_BUCKETS_S", "SplitReport"]

REPORT_SCHEMA = "report string, keys binary"

DELAY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
"""Upper bounds of the event-delay buckets a task counts in (``delay_buckets`` has one more: the overflow)."""

_ABSENT: Any = object()


@dataclass
class SplitReport:
    """What a task did with one split (see the module docstring for the wire format)."""

    shard: int
    counts: dict[str, int] = field(default_factory=dict)
    """Events by outcome (``timely``, ``late``, ..., ``invalid``, ``duplicate``), zeros left out."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Dead-lettered records by reason."""
    files: list[Any] = field(default_factory=list)
    """The data files written (the manifest's entries, as JSON)."""
    deadletter: dict[str, Any] | None = None
    """The dead-letter file written, if any (``path``...)."""
    max_event_time: int | None = None
    max_counted_time: Any = _ABSENT
    """The largest event time counted (at most its arrival); absent in reports of executors of format 1."""
    min_hour: int | None = None
    max_hour: int | None = None
    delay_buckets: list[int] = field(default_factory=list)
    delay_sum_ms: int = 0
    inputs: list[str] | None = None
    """The inputs to acknowledge once the batch is saved (Pub/Sub segments, 0.1.0 spool files); absent otherwise."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shard": self.shard, "counts": self.counts, "reasons": self.reasons, "files": self.files,
            "deadletter": self.deadletter, "max_event_time": self.max_event_time,
        }
        if self.max_counted_time is not _ABSENT:
            out["max_counted_time"] = self.max_counted_time
        out.update({"min_hour": self.min_hour, "max_hour": self.max_hour, "delay_buckets": self.delay_buckets,
                    "delay_sum_ms": self.delay_sum_ms})
        if self.inputs is not None:
            out["inputs"] = self.inputs
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "SplitReport":
        return cls(
            shard=doc.get("shard", 0),
            counts=dict(doc.get("counts") or {}),
            reasons=dict(doc.get("reasons") or {}),
            files=list(doc.get("files") or []),
            deadletter=doc.get("deadletter"),
            max_event_time=doc.get("max_event_time"),
            max_counted_time=doc.get("max_counted_time", _ABSENT),
            min_hour=doc.get("min_hour"),
            max_hour=doc.get("max_hour"),
            delay_buckets=list(doc.get("delay_buckets") or []),
            delay_sum_ms=int(doc.get("delay_sum_ms") or 0),
            inputs=doc.get("inputs"),
        )
