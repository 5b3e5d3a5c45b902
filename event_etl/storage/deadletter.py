"""The dead-letter area: every record that did not go to a bucket, with its reason and original bytes.

``<sink>/<event_type>/_deadletter/dt=YYYY-MM-DD/dl-b<batch>-s<shard>.avro``: Avro
container files of :data:`DEADLETTER_SCHEMA` records, one per shard of a micro-batch that
rejected anything, named like data files so a replayed batch rewrites the same file.
``dt`` is the day the batch started.  ``event-etl deadletter TYPE`` lists them.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import fastavro

from event_etl.rules.buckets import DEADLETTER_DIR, validate_event_type_name
from event_etl.storage import Storage
from event_etl.storage.avroio import read_container

__all__ = ["DEADLETTER_SCHEMA", "DeadLetter", "Rejected", "iter_deadletters"]

DEADLETTER_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "DeadLetter",
        "namespace": "event_etl",
        "doc": "A record event_etl did not write to an hourly bucket.",
        "fields": [
            {"name": "event_type", "type": "string"},
            {"name": "reason", "type": "string", "doc": "see event_etl.rules.reasons.Reason"},
            {"name": "detail", "type": "string"},
            {"name": "arrived_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {
                "name": "event_time",
                "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
                "default": None,
            },
            {
                "name": "source",
                "type": "string",
                "doc": "where the payload came from (file@offset, gen:index, message id)",
            },
            {"name": "batch_id", "type": "long"},
            {"name": "payload", "type": "bytes", "doc": "the original bytes, unchanged"},
        ],
    }
)


class Rejected(NamedTuple):
    """A payload an executor task did not write to a bucket, on its way to the dead-letter file of its split.

    A tuple in this order (a plain 6-tuple compares and pickles the same), named so no one reads ``r[3]``.
    """

    reason: str
    """The :class:`~event_etl.rules.reasons.Reason` value."""
    detail: str
    payload: bytes
    """The original bytes, unchanged."""
    position: str
    """Where the payload came from: ``file@offset``, ``gen:index`` or ``msg:message id``."""
    arrival: int
    """When it arrived (ms since the epoch; a Pub/Sub message's publish time)."""
    event_time: int | None
    """Its event time, when it had a valid one (``future``, ``too_late``, ``schema_mismatch``)."""

    def record(self, event_type: str, batch_id: int) -> dict[str, Any]:
        """Its :data:`DEADLETTER_SCHEMA` record."""
        return {"event_type": event_type, "reason": self.reason, "detail": self.detail, "arrived_at": self.arrival,
                "event_time": self.event_time, "source": self.position, "batch_id": batch_id,
                "payload": self.payload}


@dataclass(frozen=True)
class DeadLetter:
    event_type: str
    reason: str
    detail: str
    arrived_at: int
    event_time: int | None
    source: str
    batch_id: int
    payload: bytes
    file: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "event_type": self.event_type,
            "reason": self.reason,
            "detail": self.detail,
            "arrived_at": self.arrived_at,
            "event_time": self.event_time,
            "source": self.source,
            "batch_id": self.batch_id,
            "payload": self.payload,
        }


def iter_deadletters(storage: Storage, event_type: str, *, reason: str | None = None) -> Iterator[DeadLetter]:
    """Every dead-letter record of ``event_type`` in ``storage``, oldest day and batch first."""

    validate_event_type_name(event_type)
    yield from _letters(storage, f"{event_type}/{DEADLETTER_DIR}", reason)


def iter_unclaimed(storage: Storage, bus: str, *, reason: str | None = None) -> Iterator[DeadLetter]:
    """Every message a bus kept because no type claimed it (``<sink>/_unclaimed/<bus id>/``, reason ``unclaimed``:
    :mod:`event_etl.bus.task`), oldest day and file first."""
    from event_etl.rules.routing import UNCLAIMED_DIR

    if "/" in bus or bus.startswith("."):
        raise ValueError(f"{bus!r} is not a bus id")
    yield from _letters(storage, f"{UNCLAIMED_DIR}/{bus}", reason)


def count_unclaimed(storage: Storage, bus: str) -> int:
    """How many messages bus ``bus`` kept unclaimed (the records of its files, counted from their blocks' headers:
    nothing decoded)."""
    import fastavro

    from event_etl.rules.routing import UNCLAIMED_DIR

    base, n = f"{UNCLAIMED_DIR}/{bus}", 0
    for day in storage.list_dirs(base):
        if day.startswith("dt="):
            for name in storage.list_files(f"{base}/{day}"):
                if name.endswith(".avro"):
                    n += sum(b.num_records for b in fastavro.block_reader(io.BytesIO(storage.read(f"{base}/{day}/"
                                                                                                    f"{name}"))))
    return n


def _letters(storage: Storage, base: str, reason: str | None) -> Iterator[DeadLetter]:
    from event_etl.timeutil import to_millis

    for day in storage.list_dirs(base):
        if not day.startswith("dt="):
            continue
        for name in sorted(n for n in storage.list_files(f"{base}/{day}") if n.endswith(".avro")):
            rel = f"{base}/{day}/{name}"
            for rec in read_container(io.BytesIO(storage.read(rel))):
                if reason and rec["reason"] != reason:
                    continue
                et = rec["event_time"]
                yield DeadLetter(
                    event_type=rec["event_type"],
                    reason=rec["reason"],
                    detail=rec["detail"],
                    arrived_at=to_millis(rec["arrived_at"]),
                    event_time=None if et is None else to_millis(et),
                    source=rec["source"],
                    batch_id=rec["batch_id"],
                    payload=rec["payload"],
                    file=posixpath.join(day, name),
                )
