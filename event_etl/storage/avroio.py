"""Avro bytes: container files with deterministic content, and single-object encoding.

Container files are written whole into memory and then stored in one piece, so a file
exists under its final name only when complete.  The sync marker is derived from the
file's name instead of drawn at random: a replayed batch produces byte-identical files,
and a manifest's sha256 stays true.

Single-object encoding (Avro spec, "Single object encoding"): ``C3 01``, the 8-byte
CRC-64-AVRO fingerprint of the writer schema (little-endian), then the binary datum.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, cast

import fastavro
from fastavro.types import Schema

__all__ = [
    "SOE_MAGIC",
    "encode_container",
    "read_container",
    "encode_single_object",
    "sync_marker_for",
]

SOE_MAGIC = b"\xc3\x01"


def sync_marker_for(name: str) -> bytes:
    """The 16-byte sync marker of the file called ``name`` (a pure function of the name)."""
    return hashlib.sha256(("event_etl-sync:" + name).encode("utf-8")).digest()[:16]


_FIELD_TAIL = ("aliases", "default", "doc", "name", "type")
"""The order fastavro gives a parsed field's keys after its other ones, under ``PYTHONHASHSEED=0`` (it copies
``doc``, ``aliases`` and ``default`` from a set, whose order follows the hash seed): what Spark's executors, which
run with seed 0, have always written in a file's ``avro.schema`` header."""


def stable_schema(parsed: Any) -> Any:
    """``parsed`` (a parsed schema) with every record field's keys in the order they take under
    ``PYTHONHASHSEED=0`` (:data:`_FIELD_TAIL`): a file's header, and so its bytes, are the same whatever the seed of
    the process that writes it (a replay under another seed writes the same bytes)."""
    if isinstance(parsed, list):
        return [stable_schema(b) for b in parsed]
    if not isinstance(parsed, dict):
        return parsed
    out = {k: stable_schema(v) if k in ("items", "values") else v for k, v in parsed.items()}
    if isinstance(parsed.get("fields"), list):
        out["fields"] = [_stable_field(f) for f in parsed["fields"]]
    return out


def _stable_field(field: dict[str, Any]) -> dict[str, Any]:
    head = {k: v for k, v in field.items() if k not in _FIELD_TAIL}
    tail = {k: (stable_schema(field[k]) if k == "type" else field[k]) for k in _FIELD_TAIL if k in field}
    return {**head, **tail}


_STABLE: dict[int, tuple[Any, Any]] = {}


def _stable(parsed: Any) -> Any:
    """:func:`stable_schema` of a parsed schema, made once per schema object."""
    found = _STABLE.get(id(parsed))
    if found is None or found[0] is not parsed:
        found = _STABLE[id(parsed)] = (parsed, stable_schema(parsed))
    return found[1]


def encode_container(
    parsed_schema: Schema,
    records: Iterable[dict[str, Any]],
    *,
    name: str,
    codec: str = "null",
    metadata: dict[str, str] | None = None,
) -> bytes:
    """An Avro object container file holding ``records``, as bytes (deterministic for a given name)."""
    buf = io.BytesIO()
    fastavro.writer(
        buf,
        _stable(parsed_schema),
        records,
        codec=codec,
        sync_marker=sync_marker_for(name),
        metadata=metadata,
        codec_compression_level=1 if codec == "deflate" else None,
    )
    return buf.getvalue()


def read_container(fo: BinaryIO) -> Iterator[dict[str, Any]]:
    """Records of an Avro container file (datetimes come back timezone-aware in UTC)."""
    # fastavro types a reader's items as any Avro datum; a container file of records holds dicts
    return cast(Iterator[dict[str, Any]], iter(fastavro.reader(fo)))


def encode_single_object(parsed_schema: dict[str, Any], fingerprint_hex: str, record: dict[str, Any]) -> bytes:
    """One record in Avro single-object encoding."""
    buf = io.BytesIO()
    buf.write(SOE_MAGIC)
    buf.write(bytes.fromhex(fingerprint_hex))
    fastavro.schemaless_writer(buf, parsed_schema, record)
    return buf.getvalue()
