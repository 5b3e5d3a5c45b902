"""The report of one split: what an executor task did, sent back to the driver.

A task returns a row per split (:func:`event_etl.task.executor.make_shared_task`) with its report,
:meth:`SplitReport.to_json` as JSON text, and the deduplication keys of what it wrote.  The driver's
controller adds up the reports of a batch (and its metrics record them once the batch is durable).  The
JSON shape is the wire format: a driver may read reports of executors of another release (a key an older
one did not write is absent), so it is kept as it is, and :meth:`SplitReport.from_json` keeps "absent"
apart from ``None``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from event_etl.rules.manifest import FileEntry, event_hours_of
from event_etl.rules.watermark import BatchTimes

__all__ = ["DELAY_BUCKETS_S", "SplitReport", "BatchResult", "summarize", "merge_backfill"]

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
    part: str | None = None
    """The partition the split read, for a source read in partitions (Kafka: the partition number); absent
    otherwise.  The driver keeps each part's largest counted time for the watermark per partition."""
    backfill: dict[str, int] | None = None
    """Events dead-lettered as ``before_backfill`` (no watermark yet, more than ``max_backfill`` before their
    arrival): ``{"events": n, "max_backfill": ms, "oldest": t, "newest": t}`` (their event times); absent when
    none."""
    schemas: dict[str, Any] | None = None
    """The schema registry's schemas the task fetched that its context did not hold (id -> schema), for the driver
    to keep in the checkpoint (:mod:`event_etl.task.writers`); absent when none."""
    dropped_fields: int = 0
    """Fields of Protobuf payloads the descriptor does not know, dropped (counted, not dead-lettered); absent
    when none."""

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
        if self.part is not None:
            out["part"] = self.part
        if self.backfill is not None:
            out["backfill"] = self.backfill
        if self.schemas:
            out["schemas"] = self.schemas
        if self.dropped_fields:
            out["dropped_fields"] = self.dropped_fields
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SplitReport:
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
            part=doc.get("part"),
            backfill=doc.get("backfill"),
            schemas=doc.get("schemas"),
            dropped_fields=int(doc.get("dropped_fields") or 0),
        )


@dataclass
class BatchResult:
    """What a micro-batch did, summed over its splits (see :func:`summarize`)."""

    counts: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    files: dict[int, list[FileEntry]] = field(default_factory=dict)
    files_written: int = 0
    bytes_written: int = 0
    deadletter_files: int = 0
    max_event_time: int | None = None
    max_counted_time: int | None = None
    min_hour: int | None = None
    max_hour: int | None = None
    delay_buckets: list[int] = field(default_factory=list)
    delay_sum_ms: int = 0
    inputs: set[str] = field(default_factory=set)
    """What the batch read that its source must be told about once it is saved (Pub/Sub spool segments)."""
    parts: dict[str, int | None] = field(default_factory=dict)
    """The parts (partitions) the batch read, each with its largest counted time (``None``: nothing of it counted);
    empty for a source without parts."""
    backfill: dict[str, int] | None = None
    """The events dead-lettered for ``max_backfill`` (``before_backfill``), over the batch's splits: ``events``,
    ``max_backfill`` (ms, the bound the batch was judged with), ``oldest`` and ``newest`` (their event times); None
    when there were none."""
    dropped_fields: int = 0
    """Fields of Protobuf payloads dropped, over the batch's splits (the descriptor does not know them)."""

    @property
    def events_in(self) -> int:
        """Every payload the batch read: timely, late, too late, future, invalid and duplicate."""
        return sum(self.counts.values())

    @property
    def deadlettered(self) -> int:
        return sum(self.reasons.values())

    @property
    def times(self) -> BatchTimes:
        """What the batch tells of event time, for :meth:`WatermarkState.after_batch`."""
        return BatchTimes(max_event_time=self.max_event_time, max_counted=self.max_counted_time,
                          min_hour=self.min_hour, max_hour=self.max_hour, parts=self.parts)


def summarize(reports: list[dict[str, Any]]) -> BatchResult:
    """Add up the reports of a batch's splits (pure)."""
    r = BatchResult()
    for rep in reports:
        r.counts.update(rep["counts"])
        r.reasons.update(rep["reasons"])
        for f in rep["files"]:
            r.files.setdefault(int(f["hour"]), []).append(
                FileEntry(f["name"], int(f["records"]), int(f["bytes"]), f["sha256"], bool(f["late"]),
                          f.get("schema_fingerprint", ""), event_hours_of(f.get("event_hours")))
            )
            r.files_written += 1
            r.bytes_written += int(f["bytes"])
        if rep.get("deadletter"):
            r.deadletter_files += 1
        t = rep.get("max_event_time")
        if t is not None and (r.max_event_time is None or t > r.max_event_time):
            r.max_event_time = t
        # an executor of format 1 did not report counted times: its events count as before
        c = rep.get("max_counted_time", t)
        if c is not None and (r.max_counted_time is None or c > r.max_counted_time):
            r.max_counted_time = c
        h = rep.get("min_hour")
        if h is not None and (r.min_hour is None or h < r.min_hour):
            r.min_hour = h
        h = rep.get("max_hour")
        if h is not None and (r.max_hour is None or h > r.max_hour):
            r.max_hour = h
        b = rep.get("delay_buckets") or []
        if len(r.delay_buckets) < len(b):
            r.delay_buckets.extend([0] * (len(b) - len(r.delay_buckets)))
        for i, n in enumerate(b):
            r.delay_buckets[i] += n
        r.delay_sum_ms += int(rep.get("delay_sum_ms") or 0)
        r.inputs.update(rep.get("inputs") or ())
        r.backfill = merge_backfill(r.backfill, rep.get("backfill"))
        r.dropped_fields += int(rep.get("dropped_fields") or 0)
        part = rep.get("part")
        if part is not None:
            had = r.parts.get(str(part))
            r.parts[str(part)] = c if had is None or (c is not None and c > had) else had
    r.counts = Counter({k: v for k, v in r.counts.items() if v})
    return r


def merge_backfill(a: dict[str, int] | None, b: dict[str, int] | None) -> dict[str, int] | None:
    """Two ``backfill`` figures (:attr:`SplitReport.backfill`) as one: events added, the widest event-time range,
    the larger bound (one batch is judged with one)."""
    if not b:
        return a
    if not a:
        return dict(b)
    return {"events": int(a["events"]) + int(b["events"]), "max_backfill": max(int(a["max_backfill"]),
                                                                             int(b["max_backfill"])),
            "oldest": min(int(a["oldest"]), int(b["oldest"])), "newest": max(int(a["newest"]), int(b["newest"]))}
