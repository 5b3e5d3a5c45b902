"""The frames producers put around an Avro (or Protobuf) datum, read in one place.

=====================  =========================================================  ===============================
frame                  bytes                                                      the writer schema it names
=====================  =========================================================  ===============================
single-object (Avro)   ``C3 01`` + 8-byte CRC-64-AVRO fingerprint (little endian)  a registered version of the type
                       + datum
Gilt                   ``81`` + 32-byte SHA-256 of the schema's Parsing            a registered version of the type
                       Canonical Form + datum
Confluent              ``00`` + 4-byte schema id (big endian) + datum; for a       the registry's schema of that id
                       Protobuf schema, the message indexes come first (a
                       zig-zag varint count, then each index; a single ``00``
                       byte means ``[0]``, the file's first message)
=====================  =========================================================  ===============================

A message may also name its writer schema in an attribute (a Pub/Sub attribute or a Kafka header named by the
type's ``schema_attribute``): :func:`named_schema` reads what it says (a version of the type, a fingerprint, or a
registry id).  These functions only read bytes and text: each returns what the frame says or raises
:class:`FrameError` with what is wrong, and the decoder (:mod:`event_etl.task.payload`) turns that into a dead
letter (``invalid_avro``, ``invalid_protobuf``, ``unknown_schema``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["SOE_MAGIC", "GILT_MAGIC", "CONFLUENT_MAGIC", "FrameError", "Frame", "read_frame",
           "confluent_header", "message_indexes", "NamedSchema", "named_schema", "gilt_fingerprint"]

SOE_MAGIC = b"\xc3\x01"
"""Avro single-object encoding's two first bytes."""
GILT_MAGIC = 0x81
"""The first byte of Gilt's frame (its registry's SHA-256 fingerprint follows)."""
CONFLUENT_MAGIC = 0x00
"""The first byte of Confluent's wire format (a 4-byte schema id follows)."""

_SOE_HEADER = 10
_GILT_HEADER = 33
_CONFLUENT_HEADER = 5
_MAX_INDEXES = 64  # nesting of a message in its .proto file: far more than any real file has


class FrameError(ValueError):
    """The bytes are not a whole frame of the kind expected: the message says why (for a dead letter's detail)."""


@dataclass(frozen=True)
class Frame:
    """A self-describing Avro frame: ``kind`` (``soe`` or ``gilt``), the writer's ``fingerprint`` (hex) and where
    the datum begins (``body``)."""

    kind: str
    fingerprint: str
    body: int


def read_frame(payload: bytes) -> Frame:
    """The single-object or Gilt frame of ``payload``; :class:`FrameError` if it is neither, or cut short."""
    if payload[:2] == SOE_MAGIC:
        if len(payload) < _SOE_HEADER:
            raise FrameError(f"an Avro single-object header is 10 bytes (C3 01 + 8-byte fingerprint), got "
                             f"{len(payload)}")
        return Frame("soe", payload[2:_SOE_HEADER].hex(), _SOE_HEADER)
    if payload[:1] == bytes([GILT_MAGIC]):
        if len(payload) < _GILT_HEADER:
            raise FrameError(f"a Gilt frame's header is 33 bytes (81 + 32-byte SHA-256 fingerprint), got "
                             f"{len(payload)}")
        return Frame("gilt", payload[1:_GILT_HEADER].hex(), _GILT_HEADER)
    raise FrameError("not an Avro single-object message (header C3 01 + 8-byte fingerprint) nor a Gilt frame "
                     "(81 + 32-byte SHA-256 fingerprint)")


def confluent_header(payload: bytes) -> tuple[int, int]:
    """``(schema id, offset of what follows)`` of a frame in Confluent's wire format; :class:`FrameError` if the
    magic byte is wrong or the header is cut short."""
    if len(payload) < _CONFLUENT_HEADER:
        raise FrameError(f"Confluent's wire format has a 5-byte header (00 + 4-byte schema id), got "
                         f"{len(payload)} bytes")
    if payload[0] != CONFLUENT_MAGIC:
        raise FrameError(f"magic byte 0x{payload[0]:02x}, Confluent's wire format begins with 0x00 (is the producer "
                         f"using a schema registry's serializer?)")
    return int.from_bytes(payload[1:_CONFLUENT_HEADER], "big"), _CONFLUENT_HEADER


def _varint(payload: bytes, at: int) -> tuple[int, int]:
    """A zig-zag varint at ``at``: ``(value, offset after it)``."""
    shift = result = 0
    for i in range(at, min(at + 10, len(payload))):
        b = payload[i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    raise FrameError("the message indexes are cut short (a varint runs past the payload or over 10 bytes)")


def message_indexes(payload: bytes, at: int) -> tuple[tuple[int, ...], int]:
    """The message indexes of a Confluent Protobuf frame at ``at``: ``(indexes, offset of the message)``.

    A single ``00`` byte means ``(0,)``: the first message of the schema's file."""
    count, at = _varint(payload, at)
    if count == 0:
        return (0,), at
    if count < 0 or count > _MAX_INDEXES:
        raise FrameError(f"{count} message indexes: not a Protobuf frame of Confluent's wire format")
    out = []
    for _ in range(count):
        v, at = _varint(payload, at)
        if v < 0:
            raise FrameError(f"message index {v} is negative")
        out.append(v)
    return tuple(out), at


@dataclass(frozen=True)
class NamedSchema:
    """What a message's schema attribute names: ``kind`` is ``version`` (``v2``), ``crc64`` (a fingerprint in
    hex, as single-object encoding carries it), ``sha256`` (as Gilt's frame carries it) or ``id`` (a registry
    id); ``key`` the version's name, the hex or the id's digits."""

    kind: str
    key: str


_VERSION = re.compile(r"^v[1-9][0-9]{0,5}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def named_schema(value: str) -> NamedSchema:
    """What a schema attribute's value names: ``v2``, ``crc64avro:<16 hex>`` (or the bare 16 hex digits),
    ``sha256:<64 hex>`` (or the bare 64), or a registry id (digits); :class:`FrameError` for anything else."""
    v = value.strip().lower()
    if _VERSION.match(v):
        return NamedSchema("version", v)
    for prefix, kind, pattern in (("crc64avro:", "crc64", _HEX16), ("sha256:", "sha256", _HEX64)):
        rest = v[len(prefix):] if v.startswith(prefix) else v
        if pattern.match(rest):
            return NamedSchema(kind, rest)
    if v.isdigit() and len(v) <= 10 and int(v) < 2**31:
        return NamedSchema("id", str(int(v)))
    raise FrameError(f"schema attribute {value[:80]!r} names no schema: write a version (v2), a fingerprint "
                     f"(crc64avro:<16 hex digits> or sha256:<64 hex digits>) or a registry id")


def gilt_fingerprint(schema: Any) -> str:
    """The SHA-256 of a schema's Parsing Canonical Form, in hex: what Gilt's frame carries after ``81``."""
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    return fingerprint(to_parsing_canonical_form(schema), "SHA-256")
