"""Why a record was not written to an hourly bucket.

Each value is the ``reason`` stored with the record in the dead-letter area.  They are
part of the contract with operators (metrics, alerts, ``event-etl deadletter``): add new
ones, never rename.
"""

from __future__ import annotations

import enum

__all__ = ["Reason"]


class Reason(str, enum.Enum):
    """A dead-letter reason; its value is the string stored and exported."""

    EMPTY_PAYLOAD = "empty_payload"
    """The payload had no bytes (or only white space)."""
    OVERSIZED = "oversized"
    """The payload was larger than the type's ``max_payload_bytes``."""
    INVALID_UTF8 = "invalid_utf8"
    """Text payload that is not UTF-8."""
    INVALID_JSON = "invalid_json"
    """Not parseable as JSON (and not an Avro single-object message)."""
    NOT_AN_OBJECT = "not_an_object"
    """Valid JSON, but not a JSON object (an array, a string, a number...)."""
    MISSING_FIELD = "missing_field"
    """A field the schema requires (no default, not nullable) is absent."""
    SCHEMA_MISMATCH = "schema_mismatch"
    """A field has a value the schema does not allow (wrong type, bad enum symbol, bad UUID...)."""
    UNKNOWN_SCHEMA = "unknown_schema"
    """Avro single-object message whose fingerprint is not a schema of this type."""
    INVALID_AVRO = "invalid_avro"
    """Avro single-object message that cannot be decoded (truncated, trailing bytes, bad header)."""
    INVALID_PROTOBUF = "invalid_protobuf"
    """A Protobuf payload (``payload = "protobuf"``, or a Confluent frame of a Protobuf schema) that does not parse as
    the message: the detail is the decoder's reason."""
    INCOMPATIBLE_SCHEMA = "incompatible_schema"
    """The writer schema a payload names (a registry id, an attribute) is known, but the type's schema cannot read
    it: the detail names the field and why."""
    MISSING_TIME = "missing_time"
    """The event-time field (or attribute) is absent or null."""
    INVALID_TIME = "invalid_time"
    """The event time cannot be read in the type's ``time_format`` (or has no UTC offset)."""
    FUTURE = "future"
    """The event time is more than ``max_future_skew`` ahead of its arrival."""
    TOO_LATE = "too_late"
    """The watermark was more than ``allowed_lateness`` past the end of the event's hour (in a job's first batches,
    with no watermark yet: past the end of the hour by more than that against the watermark the batch's own events
    give)."""
    BEFORE_BACKFILL = "before_backfill"
    """The job had no watermark yet (its first batches) and the event time was more than the type's
    ``max_backfill`` before its arrival: a backfill older than the bound, or a stray event stamped 1970.  Raise
    ``max_backfill`` (or ``"0"``: no bound) in the type's ``etl.toml`` and replay these (docs/runbook.md)."""

    def __str__(self) -> str:  # so f-strings show "too_late", not "Reason.TOO_LATE"
        return self.value
