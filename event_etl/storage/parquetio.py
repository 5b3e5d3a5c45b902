"""Parquet data files: the Avro schema's Arrow columns, written by pyarrow with pinned settings.

A type of ``format = "parquet"`` (etl.toml) writes its hours as Parquet files instead of Avro
container files: the same buckets, names (``.parquet``), roll-over points, late files, merges
and manifests.  The Avro schema stays the type's contract (payloads are checked and encoded
against it, and the manifest's ``schema_fingerprint`` is its CRC-64-AVRO); a Parquet file holds
its records in the Arrow columns :class:`AvroArrow` maps it to:

======================================  ===============================================  ======================
Avro                                    Arrow                                            Parquet
======================================  ===============================================  ======================
boolean, int, long, float, double       bool, int32, int64, float32, float64             BOOLEAN, INT32, INT64,
                                                                                         FLOAT, DOUBLE
string, ``uuid``, enum                  string (an enum's symbol)                        BYTE_ARRAY (String)
bytes / fixed                           binary / fixed_size_binary                       BYTE_ARRAY /
                                                                                         FIXED_LEN_BYTE_ARRAY
``timestamp-millis`` / ``-micros``      timestamp[ms, UTC] / timestamp[us, UTC]          INT64 TIMESTAMP(MILLIS
                                                                                         / MICROS, UTC)
``local-timestamp-millis`` / ``-micros``  timestamp[ms] / timestamp[us]                  INT64 TIMESTAMP (local)
``date``, ``time-millis``, ``-micros``  date32, time32[ms], time64[us]                   DATE, TIME
``decimal``                             decimal128 (decimal256 above 38 digits)          DECIMAL
record / array / map                    struct / list / map<string, …>                   group / LIST / MAP
``["null", T]``                         T, nullable                                      OPTIONAL
other fields                            not nullable                                     REQUIRED
======================================  ===============================================  ======================

A union of several non-null types has no Parquet column: such a schema is refused when the
type is loaded (:func:`parquet_problems`), as is a recursive record.  No field ids are written
(an Iceberg table adds the files by name mapping: pyiceberg's ``add_files`` takes only files
without field ids).  Each file carries the Avro schema it was written in, as an Avro file does,
in its footer's key-value metadata under ``avro.schema`` (:data:`AVRO_SCHEMA_KEY`; beside
``ARROW:schema``): a consumer reads a Parquet file back into the same Avro records
(:func:`parquet_as_container`) and resolves them into a reader schema as it does an Avro file's.

Deterministic bytes: a file holds the same records, rolled over at the same points, as an Avro
file would; the fast path hands over its Arrow columns and the record path its Avro-encoded
records (decoded once when the file closes), which make the same table, written by
:func:`encode_parquet` with every setting pinned (compression from the type's ``codec``: ``null``
none, ``snappy`` snappy, ``deflate`` gzip level 6; one row group per :data:`ROW_GROUP_ROWS`
rows; dictionary encoding, statistics, format version 2.6, data page version 1, the Arrow schema
kept in the footer).  The footer's ``created_by`` names the pyarrow version: the same batch gives
the same bytes under the same pyarrow, and a replay under another pyarrow writes other bytes
(the job compares a replay's files with those written: keep the version of a job's
executors while it has batches to replay).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

from event_etl.storage.avroio import sync_marker_for

__all__ = ["AvroArrow", "UnsupportedSchema", "ROW_GROUP_ROWS", "PARQUET_MAGIC", "PARQUET_COMPRESSION",
           "encode_parquet", "parquet_problems", "merge_parquet", "plain_schema",
           "parquet_rows", "parquet_as_container", "parquet_table", "AVRO_SCHEMA_KEY"]

AVRO_SCHEMA_KEY = b"avro.schema"
"""The footer key of the Avro schema a Parquet file was written in (its JSON)."""
PARQUET_MAGIC = b"PAR1"
"""The first (and last) four bytes of a Parquet file."""
ROW_GROUP_ROWS = 1_048_576
"""Rows of a row group (pyarrow's own default, pinned)."""
PARQUET_COMPRESSION = {"null": "none", "snappy": "snappy", "deflate": "gzip"}
"""The Parquet compression of each ``codec`` of a type."""
_GZIP_LEVEL = 6

Convert = Callable[[Any], Any] | None  # None: the value is already what Arrow takes

_PRIMITIVES = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
    "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}
_LOGICAL = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"), "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"), "local-timestamp-micros": pa.timestamp("us"),
    "date": pa.date32(), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"),
}


class UnsupportedSchema(ValueError):
    """An Avro type that has no Arrow (and Parquet) column: a union of several non-null types, an unknown name."""


class AvroArrow:
    """The Arrow schema of an Avro record schema, and tables of its records (as fastavro reads them).

    ``schema``: the Arrow schema (decided by the Avro schema, not by the data: every hour's table
    has the same columns and types, also an hour without records)."""

    def __init__(self, avro_schema: dict[str, Any], *, with_avro_schema: bool = False) -> None:
        """``with_avro_schema``: the Arrow schema's metadata carries the Avro schema (:data:`AVRO_SCHEMA_KEY`), as a
        data file's footer does."""
        self._named: dict[str, tuple[pa.DataType, Convert]] = {}
        self._open: set[str] = set()
        if not isinstance(avro_schema, dict) or avro_schema.get("type") != "record":
            raise UnsupportedSchema("an hour's schema must be an Avro record schema")
        struct, self._convert = self._type(avro_schema, avro_schema.get("namespace", ""))
        # keys sorted: a replay's type comes back from its batch intent (JSON) with its keys in another order, and
        # must write the same bytes
        meta = ({AVRO_SCHEMA_KEY: json.dumps(avro_schema, separators=(",", ":"), sort_keys=True).encode()}
                if with_avro_schema else None)
        self.schema = pa.schema(list(struct), metadata=meta)

    def table(self, records: Iterable[dict[str, Any]]) -> pa.Table:
        """An Arrow table of ``records`` with this converter's schema."""
        rows = records if self._convert is None else (self._convert(r) for r in records)
        return pa.Table.from_pylist(list(rows), schema=self.schema)

    # -- the mapping -----------------------------------------------------------------------
    def _type(self, t: Any, ns: str) -> tuple[pa.DataType, Convert]:
        if isinstance(t, str):
            return self._named_type(t, ns)
        if isinstance(t, list):
            return self._union(t, ns)
        logical = t.get("logicalType")
        if logical in _LOGICAL and t["type"] in ("int", "long"):
            return _LOGICAL[logical], None
        if logical == "uuid" and t["type"] == "string":
            return pa.string(), str
        if logical == "decimal" and t["type"] in ("bytes", "fixed"):
            precision, scale = int(t["precision"]), int(t.get("scale", 0))
            return (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, scale), None
        kind = t["type"]
        if kind == "record":
            return self._record(t, ns)
        if kind == "enum":
            return self._remember(t, ns, (pa.string(), None))
        if kind == "fixed":
            return self._remember(t, ns, (pa.binary(int(t["size"])), None))
        if kind == "array":
            item, conv = self._type(t["items"], ns)
            return pa.list_(item), None if conv is None else _each(conv)
        if kind == "map":
            value, conv = self._type(t["values"], ns)
            return pa.map_(pa.string(), value), None if conv is None else _each_value(conv)
        return self._type(kind, ns)  # {"type": "long"} and the like

    def _named_type(self, t: str, ns: str) -> tuple[pa.DataType, Convert]:
        if t in _PRIMITIVES:
            return _PRIMITIVES[t], None
        full = t if "." in t or not ns else f"{ns}.{t}"
        if full in self._open or t in self._open:
            raise UnsupportedSchema(f"the record {t!r} contains itself: a recursive type has no Arrow column")
        if full in self._named:
            return self._named[full]
        if t in self._named:
            return self._named[t]
        raise UnsupportedSchema(f"the Avro schema refers to an unknown type {t!r}")

    def _remember(self, t: dict[str, Any], ns: str, mapped: tuple[pa.DataType, Convert]
                  ) -> tuple[pa.DataType, Convert]:
        name = t["name"]
        space = t.get("namespace", ns)
        self._named[name if "." in name or not space else f"{space}.{name}"] = mapped
        self._named.setdefault(name.rsplit(".", 1)[-1], mapped)
        return mapped

    def _record(self, t: dict[str, Any], ns: str) -> tuple[pa.DataType, Convert]:
        space = t.get("namespace", ns)
        name = t["name"]
        full = name if "." in name or not space else f"{space}.{name}"
        self._open.add(full)
        fields, converters = [], {}
        for f in t["fields"]:
            ftype, conv = self._type(f["type"], space)
            nullable = f["type"] == "null" or (isinstance(f["type"], list) and "null" in f["type"])
            fields.append(pa.field(f["name"], ftype, nullable=nullable))
            if conv is not None:
                converters[f["name"]] = conv
        self._open.discard(full)

        def convert(rec: dict[str, Any]) -> dict[str, Any]:
            out = dict(rec)
            for k, c in converters.items():
                out[k] = c(out[k])
            return out

        return self._remember(t, ns, (pa.struct(fields), convert if converters else None))

    def _union(self, branches: list[Any], ns: str) -> tuple[pa.DataType, Convert]:
        others = [b for b in branches if b != "null"]
        if len(others) != 1:
            raise UnsupportedSchema(f"the Avro union {branches!r} has no Arrow column type")
        inner, conv = self._type(others[0], ns)
        return inner, None if conv is None else _unless_none(conv)


def _each(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: [conv(x) for x in v]


def _each_value(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: {k: conv(x) for k, x in v.items()}


def _unless_none(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else conv(v)


def parquet_problems(avro_schema: dict[str, Any]) -> list[str]:
    """Why records of ``avro_schema`` cannot be written as Parquet (empty: they can)."""
    try:
        AvroArrow(avro_schema)
    except UnsupportedSchema as err:
        return [str(err)]
    return []


_TIME_LOGICAL = frozenset(_LOGICAL)


def plain_schema(t: Any) -> Any:
    """The Avro schema ``t`` without its timestamp, date, time and ``uuid`` logical types (the same binary encoding):
    read with it, fastavro gives those fields as the integers Arrow takes, not as datetimes made only to be taken
    apart, and a uuid as the text that was written (``uuid.UUID`` would give it another form: dashes added)."""
    if isinstance(t, list):
        return [plain_schema(b) for b in t]
    if not isinstance(t, dict):
        return t
    if t.get("logicalType") in _TIME_LOGICAL and t.get("type") in ("int", "long"):
        return t["type"]
    if t.get("logicalType") == "uuid" and t.get("type") == "string":
        return "string"
    out = dict(t)
    if "fields" in t:
        out["fields"] = [{**f, "type": plain_schema(f["type"])} for f in t["fields"]]
    for key in ("items", "values"):
        if key in t:
            out[key] = plain_schema(t[key])
    return out


def encode_parquet(table: pa.Table, codec: str) -> bytes:
    """``table`` as the bytes of a Parquet file, every setting pinned (see the module docstring)."""
    compression = PARQUET_COMPRESSION[codec]
    buf = io.BytesIO()
    pq.write_table(
        table, buf, row_group_size=ROW_GROUP_ROWS, compression=compression,
        compression_level=_GZIP_LEVEL if compression == "gzip" else None, use_dictionary=True,
        write_statistics=True, version="2.6", data_page_version="1.0", store_schema=True,
        write_page_index=False, write_page_checksum=False,
    )
    return buf.getvalue()


def parquet_as_container(data: bytes) -> bytes:
    """A Parquet data file's records as an Avro container file in the Avro schema it was written in (its footer's
    :data:`AVRO_SCHEMA_KEY`): what a consumer reads an Avro file's records from, so both formats read alike.
    ``ValueError`` for a file without that schema or not Parquet at all."""
    f = pq.ParquetFile(io.BytesIO(data))
    meta = f.schema_arrow.metadata or {}
    if AVRO_SCHEMA_KEY not in meta:
        raise ValueError("a Parquet file without the Avro schema it was written in (footer key avro.schema)")
    schema = json.loads(meta[AVRO_SCHEMA_KEY])
    rows = f.read().to_pylist(maps_as_pydicts="strict")
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(schema), rows, codec="null", sync_marker=sync_marker_for("parquet"))
    return buf.getvalue()


def parquet_table(data: bytes) -> tuple[pa.Table, dict[str, Any]]:
    """A Parquet data file's columns as an Arrow table, read by pyarrow as they are (no record is made), and the Avro
    schema it was written in (its footer's :data:`AVRO_SCHEMA_KEY`).  ``ValueError`` as :func:`parquet_as_container`."""
    f = pq.ParquetFile(io.BytesIO(data))
    meta = f.schema_arrow.metadata or {}
    if AVRO_SCHEMA_KEY not in meta:
        raise ValueError("a Parquet file without the Avro schema it was written in (footer key avro.schema)")
    schema: dict[str, Any] = json.loads(meta[AVRO_SCHEMA_KEY])
    return f.read(), schema


def parquet_rows(data: bytes) -> int:
    """The rows of a Parquet file, from its footer."""
    return int(pq.ParquetFile(io.BytesIO(data)).metadata.num_rows)


def _codec_of(meta: Any) -> str:
    """The type's ``codec`` a Parquet file was written with (by its first column's compression)."""
    if meta.num_row_groups == 0 or meta.num_columns == 0:
        return "null"
    found = str(meta.row_group(0).column(0).compression).lower()
    for codec, compression in PARQUET_COMPRESSION.items():
        if compression == found or (compression == "none" and found == "uncompressed"):
            return codec
    raise ValueError(f"compression {found} is not one event_etl writes")


def merge_parquet(members: Sequence[tuple[str, bytes]], max_events: int, name_of: Callable[[int], str],
                  error: Callable[[str], Exception]) -> list[tuple[str, bytes, int]]:
    """Merge the Parquet files ``members`` (``(name, bytes)``, in order) into files of ``max_events`` rows.

    The rows are read (not the records decoded as Python values) and written again, in order, by
    :func:`encode_parquet` with the members' compression: the output is a pure function of the
    members' bytes.  ``error(message)`` is raised when they do not share one schema and compression."""
    tables = []
    first: tuple[pa.Schema, str] | None = None
    for name, data in members:
        try:
            f = pq.ParquetFile(io.BytesIO(data))
            kind = (f.schema_arrow, _codec_of(f.metadata))
            table = f.read()
        except Exception as err:  # named with the file
            raise error(f"{name}: not a readable Parquet file ({err})") from err
        if first is None:
            first = kind
        elif not (kind[0].equals(first[0], check_metadata=True) and kind[1] == first[1]):
            raise error(f"{name} has another schema or codec than {members[0][0]}")
        tables.append(table)
    if first is None:
        return []
    whole = pa.concat_tables(tables)
    out = []
    for seq, start in enumerate(range(0, whole.num_rows, max_events)):
        part = whole.slice(start, max_events)
        out.append((name_of(seq), encode_parquet(part, first[1]), part.num_rows))
    return out
