"""Turning one payload (bytes) into a checked record and its event time, or a rejection.

Accepted payloads, by the type's ``payload`` (:mod:`event_etl.payloads`):

- ``json`` (the default): a JSON object whose fields follow the type's schema (plain JSON, as
  producers write it: a nullable field is a value or ``null``, an enum a string, a timestamp a
  number); or a self-describing Avro frame, single-object encoding (``C3 01`` + CRC-64 fingerprint +
  binary datum) or Gilt's (``81`` + SHA-256 fingerprint + datum), of the type's schema or of any of
  its registered versions (``schemas/v<N>.avsc``), resolved to the current schema by Avro's rules (a
  field the writer did not have takes its default);
- ``protobuf``: a message of the type's descriptor set, decoded into the Avro schema derived from it
  (:mod:`event_etl.payloads.protobuf`); fields the descriptor does not know are dropped and counted;
- ``confluent``: Confluent's wire format, an Avro datum or a Protobuf message of the registry schema its
  id names (:mod:`event_etl.task.writers`);
- ``avro``: a bare Avro datum, of the schema the message's ``schema_attribute`` names (or of the current
  schema when it names none).

A message whose ``schema_attribute`` is set carries a bare Avro datum of the schema it names, whatever
the type's payload.  In newline-delimited files (the folder source), a binary payload (a frame, a
Protobuf message, a datum) is written base64-encoded on its own line.

Everything else is rejected with a :class:`~event_etl.rules.reasons.Reason` and a
detail naming the field.  This module runs in executors, once per record: it avoids
work on the good path and explains itself on the bad one.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from fastavro import parse_schema, schemaless_reader
from fastavro.read import SchemaResolutionError
from orjson import JSONDecodeError as _JSONDecodeError
from orjson import loads as _loads

from event_etl.eventtypes import EventType, schema_fingerprint
from event_etl.payloads.b64lines import B64Error, b64decode_line
from event_etl.payloads.frames import (
    GILT_MAGIC,
    FrameError,
    confluent_header,
    message_indexes,
    named_schema,
    read_frame,
)
from event_etl.rules.reasons import Reason
from event_etl.storage.avroio import SOE_MAGIC
from event_etl.task.avrocheck import compile_checker
from event_etl.task.writers import Writer, WriterSchemas, descriptor_files, message_name
from event_etl.timeutil import parse_rfc3339_millis, seconds_to_millis, to_millis

__all__ = ["Decoder", "MIN_EVENT_MS", "MAX_EVENT_MS"]

MIN_EVENT_MS = -62135596800000  # 0001-01-01T00:00:00Z
MAX_EVENT_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
_B64_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=\r")
_FRAMES = (0xC3, GILT_MAGIC)  # first bytes of the self-describing Avro frames a JSON type accepts
Result = tuple[bool, Any, Any]


def _nullable(t: Any) -> bool:
    return t == "null" or (isinstance(t, list) and "null" in t)


class Decoder:
    """Decodes and checks payloads of one event type.  Build once per process; :meth:`decode` per record."""

    def __init__(self, event_type: EventType) -> None:
        self.event_type = event_type
        self.schema = parse_schema(event_type.schema)
        self.time_field = event_type.time_field
        self.max_bytes = event_type.max_payload_bytes
        self.required = tuple(
            f["name"]
            for f in event_type.schema["fields"]
            if "default" not in f and not _nullable(f["type"]) and f["name"] != event_type.time_field
        )
        self.required_set = frozenset(self.required)
        self.defaults = {f["name"]: f["default"] for f in event_type.schema["fields"] if "default" in f}
        self.default_set = frozenset(self.defaults)
        self.writer_schemas = {event_type.fingerprint: self.schema}  # fingerprint (hex) -> parsed writer schema
        for _name, version in event_type.schema_versions:
            fp = schema_fingerprint(version)
            if fp not in self.writer_schemas:
                self.writer_schemas[fp] = parse_schema(version)
        self.check = compile_checker(self.schema)
        self.writers = WriterSchemas(event_type, self.schema)
        self.proto: Any = None  # payload = "protobuf": the message's decoder (ProtoDecoder)
        self._proto_writers: dict[tuple[int, tuple[int, ...]], tuple[Any, Writer | None, str | None]] = {}
        self.unknown_fields = 0  # Protobuf fields dropped (the descriptor does not know them), counted by the task
        self._raw = self._raw_decoder(event_type.payload)
        fmt, div = event_type.time_format, event_type.time_logical_divisor
        self._time = self._logical_time(div) if div else {
            "epoch_millis": self._millis,
            "epoch_seconds": self._seconds,
            "iso8601": self._iso,
        }[fmt]

    def _raw_decoder(self, payload: str) -> Callable[[bytes, int | None, int | None], Result] | None:
        """How a message's bytes are decoded: None for JSON (:meth:`decode`), else the binary dialect's decoder."""
        if payload == "protobuf":
            from event_etl.payloads.protobuf import ProtoSchema

            et = self.event_type
            proto = ProtoSchema.from_bytes(base64.b64decode(et.protobuf_descriptor), str(et.protobuf_message),
                                           origin=et.descriptor_file)
            self.proto = proto.decoder(et.schema)
            return self._decode_protobuf
        if payload == "confluent":
            return self._decode_confluent
        if payload == "avro":
            return self._decode_bare
        return None

    # -- event time ------------------------------------------------------------------------
    @staticmethod
    def _check_range(ms: int) -> int:
        if not MIN_EVENT_MS <= ms <= MAX_EVENT_MS:
            raise ValueError(f"{ms} ms is outside years 1..9999")
        return ms

    def _logical_time(self, divisor: int) -> Callable[[Any], int]:
        def parse(v: Any) -> int:
            if isinstance(v, datetime):
                return to_millis(v)
            if isinstance(v, int) and not isinstance(v, bool):
                return self._check_range(v // divisor)
            raise ValueError(f"expected a timestamp number, got {type(v).__name__} {v!r:.40}")

        return parse

    def _millis(self, v: Any) -> int:
        if isinstance(v, int) and not isinstance(v, bool):
            return self._check_range(v)
        raise ValueError(f"expected epoch milliseconds (an integer), got {type(v).__name__} {v!r:.40}")

    def _seconds(self, v: Any) -> int:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return self._check_range(seconds_to_millis(v))
        raise ValueError(f"expected epoch seconds (a number), got {type(v).__name__} {v!r:.40}")

    def _iso(self, v: Any) -> int:
        if not isinstance(v, str):
            raise ValueError(f"expected an ISO-8601 string, got {type(v).__name__} {v!r:.40}")
        return parse_rfc3339_millis(v)

    def record_time(self, value: Any) -> int:
        """The event time (ms) of a value of the type's time field, as decoded from a payload or an Avro file."""
        return self._time(value)

    # -- payloads --------------------------------------------------------------------------
    def decode(self, payload: bytes, override: int | None = None, fallback: int | None = None) -> tuple[bool, Any, Any]:
        """``(True, record, event_time_ms)`` or ``(False, Reason, detail)``.

        ``override``: the event time, taken from elsewhere (a message attribute); ``fallback``:
        the time to use when the record has none (a message's publish time, if the type says so).
        """
        n = len(payload)
        if self._raw is not None:  # a binary dialect: a line of a file holds one payload, base64-encoded
            return self._decode_line(payload, override, fallback)
        if n == 0 or n > self.max_bytes or payload[0] in _FRAMES or (n < 64 and not payload.strip()):
            return self._decode_unusual(payload, override, fallback)
        try:
            rec = _loads(payload)
        except _JSONDecodeError as err:
            return self._not_json(payload, err, override, fallback)
        if type(rec) is not dict:
            return False, Reason.NOT_AN_OBJECT, f"JSON {type(rec).__name__}, expected an object"
        return self._check(rec, override, fallback)

    def decode_message(
        self, payload: bytes, attributes: dict[str, str] | None, publish_time: int
    ) -> tuple[bool, Any, Any]:
        """Decode a Pub/Sub message: the event time may come from an attribute or the publish time (per the type)."""
        fallback = publish_time if self.event_type.publish_time_fallback else None
        name = self.event_type.time_attribute
        if name is None:
            return self._message(payload, attributes, None, fallback)
        raw = (attributes or {}).get(name)
        if raw is None:
            if fallback is None:
                return False, Reason.MISSING_TIME, f"attribute {name!r} is missing"
            return self._message(payload, attributes, fallback, None)
        try:
            t = self._attribute_time(raw)
        except (ValueError, OverflowError, TypeError) as err:
            return False, Reason.INVALID_TIME, f"attribute {name!r}: {err}"
        return self._message(payload, attributes, t, None)

    def _message(self, payload: bytes, attributes: dict[str, str] | None, override: int | None,
                 fallback: int | None) -> Result:
        """A message's bytes, as its schema attribute or the type's payload says."""
        named = self.event_type.schema_attribute
        if named is not None and attributes and named in attributes:
            return self._decode_named(payload, attributes[named], override, fallback)
        if self._raw is None:
            return self.decode(payload, override, fallback)
        n = len(payload)
        if n == 0:
            return False, Reason.EMPTY_PAYLOAD, "payload has no content"
        if n > self.max_bytes:
            return False, Reason.OVERSIZED, f"{n} bytes > max_payload_bytes {self.max_bytes}"
        return self._raw(payload, override, fallback)

    # -- binary dialects ---------------------------------------------------------------------
    def _decode_line(self, line: bytes, override: int | None, fallback: int | None) -> Result:
        """A line of a file: one binary payload, base64-encoded."""
        stripped = line.strip()
        if not stripped:
            return False, Reason.EMPTY_PAYLOAD, "payload has no content"
        try:
            raw = b64decode_line(stripped)
        except B64Error as err:
            why = Reason.INVALID_PROTOBUF if self.event_type.payload == "protobuf" else Reason.INVALID_AVRO
            return False, why, (f"a line of a folder source holds one {self.event_type.payload} payload, "
                                f"base64-encoded: {err}")
        assert self._raw is not None  # only binary dialects read lines as base64
        if len(raw) > self.max_bytes:
            return False, Reason.OVERSIZED, f"{len(raw)} bytes > max_payload_bytes {self.max_bytes}"
        if not raw:
            return False, Reason.EMPTY_PAYLOAD, "payload has no content"
        return self._raw(raw, override, fallback)

    def _decode_protobuf(self, payload: bytes, override: int | None, fallback: int | None) -> Result:
        from event_etl.payloads.protobuf import ProtoDecodeError, ProtoValueError

        try:
            rec, unknown = self.proto.decode(payload)
        except ProtoDecodeError as err:
            return False, Reason.INVALID_PROTOBUF, str(err)[:300]
        except ProtoValueError as err:
            return False, Reason.SCHEMA_MISMATCH, str(err)[:300]
        self.unknown_fields += unknown
        return self._timed(rec, override, fallback)

    def _decode_confluent(self, payload: bytes, override: int | None, fallback: int | None) -> Result:
        try:
            sid, at = confluent_header(payload)
        except FrameError as err:
            return False, Reason.INVALID_AVRO, str(err)
        rs = self.writers.by_id(sid)
        if rs is None:
            return False, Reason.UNKNOWN_SCHEMA, (f"schema id {sid} is not in the registry "
                                                  f"{self.event_type.schema_registry}")
        if rs.schema_type == "PROTOBUF":
            return self._confluent_protobuf(payload, sid, at, rs, override, fallback)
        w = self.writers.avro_by_id(sid)
        assert w is not None  # the registry holds it (by_id above)
        return self._datum(payload, at, w, override, fallback)

    def _confluent_protobuf(self, payload: bytes, sid: int, at: int, rs: Any, override: int | None,
                            fallback: int | None) -> Result:
        """A Protobuf message of Confluent's wire format: its message indexes, then the message, read into the
        type's schema through the Avro schema derived from the registry's descriptor."""
        from event_etl.payloads.protobuf import ProtoDecodeError, ProtoValueError

        try:
            indexes, at = message_indexes(payload, at)
        except FrameError as err:
            return False, Reason.INVALID_PROTOBUF, str(err)
        decoder, writer, problem = self._proto_writer(sid, indexes, rs)
        if problem is not None:
            return False, Reason.INCOMPATIBLE_SCHEMA, problem
        try:
            rec, unknown = decoder.decode(payload[at:])
        except ProtoDecodeError as err:
            return False, Reason.INVALID_PROTOBUF, str(err)[:300]
        except ProtoValueError as err:
            return False, Reason.SCHEMA_MISMATCH, str(err)[:300]
        self.unknown_fields += unknown
        if writer is not None and not writer.same:  # another shape: Avro's resolution into the type's schema
            rec = self._resolved(rec, writer)
        return self._timed(rec, override, fallback)

    def _proto_writer(self, sid: int, indexes: tuple[int, ...], rs: Any) -> tuple[Any, Writer | None, str | None]:
        """``(decoder, writer, problem)`` of the message that ``indexes`` point at in registry schema ``sid``."""
        key = (sid, indexes)
        found = self._proto_writers.get(key)
        if found is None:
            found = self._proto_writers[key] = self._build_proto_writer(sid, indexes, rs)
        return found

    def _build_proto_writer(self, sid: int, indexes: tuple[int, ...], rs: Any
                            ) -> tuple[Any, Writer | None, str | None]:
        from fastavro import parse_schema as parse

        from event_etl.errors import ConfigError
        from event_etl.payloads.protobuf import ProtoSchema

        label = f"registry id {sid}"
        try:
            files = descriptor_files(rs)
            name = message_name(files[-1], indexes)
            proto = ProtoSchema.from_file_protos(files, name, origin=label)
            derived = proto.avro_schema(timestamp=_timestamp_unit(self.event_type, name))
        except (ConfigError, ValueError, IndexError) as err:
            return None, None, f"{label} (message indexes {list(indexes)}): {err}"[:300]
        writer = self.writers._judged(derived, parse(derived), f"{label} ({name})")
        if writer.problem is not None:
            return None, None, writer.problem
        return proto.decoder(derived), writer, None

    def _resolved(self, rec: dict[str, Any], writer: Writer) -> dict[str, Any]:
        """A record of another writer schema read into the type's, by Avro's resolution rules."""
        from fastavro import schemaless_writer

        bio = io.BytesIO()
        schemaless_writer(bio, writer.parsed, rec)
        bio.seek(0)
        return cast(dict[str, Any], schemaless_reader(bio, writer.parsed, self.schema))

    def _decode_bare(self, payload: bytes, override: int | None, fallback: int | None) -> Result:
        """``payload = "avro"`` with no schema named: a datum of the current schema."""
        return self._datum(payload, 0, self.writers.by_crc[self.event_type.fingerprint], override, fallback)

    def _decode_named(self, payload: bytes, value: str, override: int | None, fallback: int | None) -> Result:
        """A bare datum of the writer schema a message's attribute names."""
        try:
            what = named_schema(value)
        except FrameError as err:
            return False, Reason.UNKNOWN_SCHEMA, f"attribute {self.event_type.schema_attribute!r}: {err}"
        if what.kind == "id" and not self.event_type.schema_registry:
            return False, Reason.UNKNOWN_SCHEMA, (f"attribute {self.event_type.schema_attribute!r} names registry id "
                                                  f"{what.key}, and the type has no schema_registry")
        w = self.writers.named(what)
        if w is None:
            return False, Reason.UNKNOWN_SCHEMA, (f"attribute {self.event_type.schema_attribute!r} = {value[:80]!r} "
                                                  f"names no schema of {self.event_type.name}")
        return self._datum(payload, 0, w, override, fallback)

    def _datum(self, payload: bytes, at: int, w: Writer, override: int | None, fallback: int | None) -> Result:
        """The Avro datum at ``at`` of writer ``w``, read into the type's schema; the whole payload must be it."""
        if w.problem is not None:
            return False, Reason.INCOMPATIBLE_SCHEMA, w.problem
        bio = io.BytesIO(payload)
        bio.seek(at)
        try:
            rec = cast(dict[str, Any], schemaless_reader(bio, w.parsed, None if w.same else self.schema))
        except SchemaResolutionError as err:
            return False, Reason.INCOMPATIBLE_SCHEMA, f"{w.label} cannot be read as the current schema: {err}"[:300]
        except (EOFError, StopIteration, ValueError, IndexError, UnicodeDecodeError, TypeError, OverflowError) as err:
            return False, Reason.INVALID_AVRO, f"cannot decode datum: {type(err).__name__}: {err}"[:300]
        if bio.tell() != len(payload):
            return False, Reason.INVALID_AVRO, f"{len(payload) - bio.tell()} trailing bytes after the datum"
        return self._timed(rec, override, fallback)

    def _timed(self, rec: dict[str, Any], override: int | None, fallback: int | None) -> Result:
        ok, why, ms = self._event_time(rec, override, fallback)
        if not ok:
            return False, why, ms
        if (override is not None or fallback is not None) and rec.get(self.time_field) is None:
            rec[self.time_field] = self._as_field(ms)  # the time came from the message: the record carries it too
        return True, rec, ms

    def _as_field(self, ms: int) -> Any:
        """An event time in the representation of the type's time field."""
        div, fmt = self.event_type.time_logical_divisor, self.event_type.time_format
        if div:
            return ms * div
        if fmt == "epoch_seconds":
            return ms / 1000.0
        if fmt == "iso8601":
            from event_etl.timeutil import iso

            return iso(ms)
        return ms

    def _attribute_time(self, raw: str) -> int:
        div, fmt = self.event_type.time_logical_divisor, self.event_type.time_format
        if fmt == "iso8601" and not div:
            return self._iso(raw)
        if fmt == "epoch_seconds" and not div:
            return self._check_range(seconds_to_millis(raw))
        return self._check_range(int(raw) // (div or 1))

    def _decode_unusual(self, payload: bytes, override: int | None, fallback: int | None) -> tuple[bool, Any, Any]:
        n = len(payload)
        if n == 0 or (n < 64 and not payload.strip()):
            return False, Reason.EMPTY_PAYLOAD, "payload has no content"
        if n > self.max_bytes:
            return False, Reason.OVERSIZED, f"{n} bytes > max_payload_bytes {self.max_bytes}"
        return self._decode_avro(payload, override, fallback)

    def _not_json(
        self, payload: bytes, err: Exception, override: int | None, fallback: int | None
    ) -> tuple[bool, Any, Any]:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as uerr:
            return False, Reason.INVALID_UTF8, f"byte 0x{payload[uerr.start]:02x} at offset {uerr.start} is not UTF-8"
        stripped = payload.strip()
        if stripped and stripped[0] not in b"{[\"" and set(stripped) <= _B64_CHARS:
            try:
                raw = base64.b64decode(stripped, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if raw.startswith(SOE_MAGIC) or raw[:1] == bytes([GILT_MAGIC]):
                return self._decode_avro(raw, override, fallback)
        del text
        return False, Reason.INVALID_JSON, str(err)

    def _event_time(self, rec: dict[str, Any], override: int | None, fallback: int | None) -> tuple[bool, Any, Any]:
        if override is not None:
            return True, None, override
        v = rec.get(self.time_field)
        if v is None:
            if fallback is not None:
                return True, None, fallback
            return False, Reason.MISSING_TIME, f"field {self.time_field!r} is missing or null"
        try:
            return True, None, self._time(v)
        except (ValueError, OverflowError, TypeError) as err:
            return False, Reason.INVALID_TIME, f"field {self.time_field!r}: {err}"

    def _check(
        self, rec: dict[str, Any], override: int | None = None, fallback: int | None = None
    ) -> tuple[bool, Any, Any]:
        if override is None and fallback is None:  # the common case, inline
            v = rec.get(self.time_field)
            if v is None:
                return False, Reason.MISSING_TIME, f"field {self.time_field!r} is missing or null"
            try:
                ms = self._time(v)
            except (ValueError, OverflowError, TypeError) as err:
                return False, Reason.INVALID_TIME, f"field {self.time_field!r}: {err}"
        else:
            ok, why, ms = self._event_time(rec, override, fallback)
            if not ok:
                return False, why, ms
            if rec.get(self.time_field) is None:  # the time came from the message: the record carries it too
                rec[self.time_field] = self._as_field(ms)
        keys = rec.keys()
        if not self.required_set <= keys:
            name = next(n for n in self.required if n not in rec)
            return False, Reason.MISSING_FIELD, f"field {name!r} is required"
        absent = self.default_set - keys
        if absent:
            for name in absent:
                rec[name] = self.defaults[name]
        why = self.check(rec)
        if why is not None:
            return False, Reason.SCHEMA_MISMATCH, f"field {why}"
        return True, rec, ms

    def _decode_avro(
        self, payload: bytes, override: int | None = None, fallback: int | None = None
    ) -> tuple[bool, Any, Any]:
        if payload[:1] == bytes([GILT_MAGIC]):
            return self._decode_gilt(payload, override, fallback)
        if len(payload) < 10 or payload[:2] != SOE_MAGIC:
            return False, Reason.INVALID_AVRO, "not an Avro single-object message (header C3 01 + 8-byte fingerprint)"
        fp = payload[2:10].hex()
        writer = self.writer_schemas.get(fp)
        if writer is None:
            return False, Reason.UNKNOWN_SCHEMA, f"schema fingerprint {fp} is not known for {self.event_type.name}"
        bio = io.BytesIO(payload[10:])
        try:
            # an event type's schema is a record: its datum is a dict (fastavro types it as any Avro datum)
            rec = cast(dict[str, Any], schemaless_reader(bio, writer, self.schema))
        except SchemaResolutionError as err:  # a registered version the current schema cannot read (checked at start)
            return False, Reason.SCHEMA_MISMATCH, f"schema {fp} cannot be read as the current one: {err}"[:300]
        except (EOFError, StopIteration, ValueError, IndexError, UnicodeDecodeError, TypeError, OverflowError) as err:
            return False, Reason.INVALID_AVRO, f"cannot decode datum: {type(err).__name__}: {err}"[:300]
        if bio.tell() != len(payload) - 10:
            return False, Reason.INVALID_AVRO, f"{len(payload) - 10 - bio.tell()} trailing bytes after the datum"
        ok, why, ms = self._event_time(rec, override, fallback)
        if not ok:
            return False, why, ms
        return True, rec, ms

    def _decode_gilt(self, payload: bytes, override: int | None, fallback: int | None) -> Result:
        """Gilt's frame: ``81`` + SHA-256 of the writer schema's canonical form + datum, of a registered version."""
        try:
            frame = read_frame(payload)
        except FrameError as err:
            return False, Reason.INVALID_AVRO, str(err)
        w = self.writers.by_sha.get(frame.fingerprint)
        if w is None:
            return False, Reason.UNKNOWN_SCHEMA, (f"schema fingerprint sha256:{frame.fingerprint} is not known for "
                                                  f"{self.event_type.name}")
        return self._datum(payload, frame.body, w, override, fallback)


def _timestamp_unit(et: EventType, message: str) -> str:
    """The Avro unit of a Timestamp in the schema derived from a registry's Protobuf message: the type's own
    ``protobuf_timestamps`` is not known here, so the unit is taken from the type's time field (millis or micros)."""
    return "millis" if et.time_logical_divisor == 1 else "micros"
