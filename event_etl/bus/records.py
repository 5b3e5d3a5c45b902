"""The record name of a framed payload, for a bus routed by ``route_field`` (issue 59).

A bus routed by a field routes a JSON payload by that top-level field (:func:`event_etl.rules.routing.field_value`);
a framed Avro or Protobuf payload has no such field to read before it is decoded, and which type decodes it is what
the router decides.  Its frame names its writer schema, and so its record (:mod:`event_etl.payloads.frames`):

- **single-object** (``C3 01`` + CRC-64-AVRO fingerprint) and **Gilt's** frame (``81`` + SHA-256): a schema version
  one of the bus's types registers (``schema.avsc``, ``schemas/v<N>.avsc``), its record's full name;
- **Confluent's wire format** (``00`` + schema id): the registry's schema of that id (the registry of the bus's
  first type with ``payload = "confluent"``): an Avro schema's record, or for a Protobuf schema the message its
  message indexes point at (``shop.events.ProductPageViewed``).

:class:`RecordNamer` is built in the driver from the bus's types (:func:`record_namer`) and travels with the bus's
:class:`~event_etl.rules.routing.Router` to the tasks.  A registry that cannot be reached is waited for as the
decoders wait (the split fails at the bound, with the fix, and is read again: nothing is judged unclaimed because the
registry was down); an id the registry does not hold, an unknown fingerprint or a frame cut short make the message
unclaimed, with why.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from event_etl.eventtypes import EventType, schema_fingerprint
from event_etl.payloads.frames import (
    CONFLUENT_MAGIC,
    GILT_MAGIC,
    SOE_MAGIC,
    FrameError,
    confluent_header,
    gilt_fingerprint,
    message_indexes,
    read_frame,
)
from event_etl.rules.routing import Unclaimed

__all__ = ["RecordNamer", "record_namer", "avro_full_name"]

_FRAME_STARTS = (SOE_MAGIC[:1], bytes([GILT_MAGIC]), bytes([CONFLUENT_MAGIC]))


def avro_full_name(schema: Any) -> str | None:
    """The full name of an Avro record schema (``namespace.name``; a dotted name is full already), or None."""
    if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
        return None
    name = schema["name"]
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def record_namer(types: Iterable[EventType]) -> RecordNamer:
    """The namer of a bus of ``types`` (their schema versions' fingerprints, the first Confluent type's registry)."""
    names: dict[str, str] = {}
    registry_type = None
    for et in sorted(types, key=lambda t: t.name):
        for _version, schema in [("schema.avsc", et.schema), *et.schema_versions]:
            full = avro_full_name(schema)
            if full is not None:
                names.setdefault(schema_fingerprint(schema), full)
                names.setdefault(gilt_fingerprint(schema), full)
        if registry_type is None and et.payload == "confluent" and et.schema_registry:
            registry_type = et
    return RecordNamer(names, registry_type)


class RecordNamer:
    """``namer(payload)``: the record's full name of a framed payload, :class:`Unclaimed` with why it has none, or
    None when the payload is no frame (see the module docstring).  Picklable: what it fetched stays behind."""

    def __init__(self, by_fingerprint: dict[str, str], registry_type: EventType | None) -> None:
        self.by_fingerprint = by_fingerprint
        """A schema's CRC-64-AVRO (16 hex digits) or SHA-256 (64) fingerprint -> its record's full name."""
        self.registry_type = registry_type
        self._fresh()

    def _fresh(self) -> None:
        self._writers: Any = None
        self._by_id: dict[tuple[int, tuple[int, ...] | None], str | Unclaimed] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"by_fingerprint": self.by_fingerprint, "registry_type": self.registry_type}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.by_fingerprint, self.registry_type = state["by_fingerprint"], state["registry_type"]
        self._fresh()

    def __call__(self, payload: bytes) -> str | Unclaimed | None:
        first = payload[:1]
        if first not in _FRAME_STARTS or (first == SOE_MAGIC[:1] and payload[:2] != SOE_MAGIC):
            return None
        if first == bytes([CONFLUENT_MAGIC]):
            return self._confluent(payload)
        try:
            frame = read_frame(payload)
        except FrameError as err:
            return Unclaimed(f"a framed payload cut short: {err}")
        found = self.by_fingerprint.get(frame.fingerprint)
        if found is None:
            what = "crc64avro" if frame.kind == "soe" else "sha256"
            return Unclaimed(f"a {'single-object' if frame.kind == 'soe' else 'Gilt'} frame of schema "
                             f"{what}:{frame.fingerprint}, which no type of the bus registers (schema.avsc or "
                             f"schemas/v<N>.avsc)")
        return found

    def _confluent(self, payload: bytes) -> str | Unclaimed:
        try:
            sid, at = confluent_header(payload)
        except FrameError as err:
            return Unclaimed(f"a framed payload cut short: {err}")
        writers = self._registry()
        if writers is None:
            return Unclaimed(f"Confluent's wire format (schema id {sid}), but no type of the bus has payload = "
                             f'"confluent" and a schema_registry to look the id up in')
        rs = writers.by_id(sid)  # waits out an unreachable registry; SchemaRegistryDown at its bound
        if rs is None:
            return Unclaimed(f"schema id {sid} is not in the registry {self.registry_type.schema_registry}"
                             if self.registry_type else f"schema id {sid} is unknown")
        if rs.schema_type != "PROTOBUF":
            key: tuple[int, tuple[int, ...] | None] = (sid, None)
            if key not in self._by_id:
                self._by_id[key] = self._avro_name(sid, rs)
            return self._by_id[key]
        try:
            indexes, _ = message_indexes(payload, at)
        except FrameError as err:
            return Unclaimed(f"a Protobuf frame of schema id {sid}: {err}")
        key = (sid, indexes)
        if key not in self._by_id:
            self._by_id[key] = self._message_name(sid, indexes, rs)
        return self._by_id[key]

    def _registry(self) -> Any:
        if self.registry_type is None:
            return None
        with self._lock:
            if self._writers is None:
                from fastavro import parse_schema

                from event_etl.task.writers import WriterSchemas

                self._writers = WriterSchemas(self.registry_type, parse_schema(self.registry_type.schema))
            return self._writers

    @staticmethod
    def _avro_name(sid: int, rs: Any) -> str | Unclaimed:
        try:
            name = avro_full_name(json.loads(rs.schema))
        except ValueError:
            name = None
        return name if name is not None else Unclaimed(f"registry id {sid} is not an Avro record schema")

    @staticmethod
    def _message_name(sid: int, indexes: tuple[int, ...], rs: Any) -> str | Unclaimed:
        from event_etl.task.writers import descriptor_files, message_name

        try:
            return message_name(descriptor_files(rs)[-1], indexes)
        except (ValueError, IndexError) as err:
            return Unclaimed(f"registry id {sid} (message indexes {list(indexes)}): {err}"[:300])
