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
        parsed_schema,
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
