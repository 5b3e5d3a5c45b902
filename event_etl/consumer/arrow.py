"""Avro records as Arrow tables: one Arrow type per Avro type, decided by the schema, not by the data.

A table built from the schema has the same columns and types for every hour, also an hour
without records, so hours can be concatenated.  The mapping:

======================================  ===============================================
Avro                                    Arrow
======================================  ===============================================
boolean, int, long, float, double       bool, int32, int64, float32, float64
string (also ``uuid``), enum            string
bytes, fixed                            binary, fixed_size_binary
``timestamp-millis`` / ``-micros``      timestamp[ms, UTC] / timestamp[us, UTC]
``local-timestamp-millis`` / ``-micros``  timestamp[ms] / timestamp[us]
``date``, ``time-millis``, ``time-micros``  date32, time32[ms], time64[us]
``decimal``                             decimal128 (decimal256 above 38 digits)
record, array, map                      struct, list, map<string, …>
``["null", T]``                         T, nullable
======================================  ===============================================

A union of several non-null types has no faithful Arrow column here: it is refused with
:class:`~event_etl.consumer.errors.UnsupportedSchemaError` (read such hours as records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from event_etl.consumer.errors import UnsupportedSchemaError

__all__ = ["ArrowConverter"]

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


class ArrowConverter:
    """Turns records of one Avro record schema (as fastavro reads them) into Arrow tables."""

    def __init__(self, avro_schema: dict[str, Any]) -> None:
        self._named: dict[str, Any] = {}
        if not isinstance(avro_schema, dict) or avro_schema.get("type") != "record":
            raise UnsupportedSchemaError("an hour's schema must be an Avro record schema",
                                         fix="read the hour with read_records instead")
        struct, self._convert = self._type(avro_schema, avro_schema.get("namespace", ""))
        self.schema = pa.schema(list(struct))

    def table(self, records: Iterable[dict[str, Any]]) -> pa.Table:
        """An Arrow table of ``records`` with this converter's schema."""
        rows = records if self._convert is None else (self._convert(r) for r in records)
        return pa.Table.from_pylist(list(rows), schema=self.schema)

    # -- the mapping -----------------------------------------------------------------------
    def _type(self, t: Any, ns: str) -> tuple[pa.DataType, Convert]:
        if isinstance(t, str):
            if t in _PRIMITIVES:
                return _PRIMITIVES[t], None
            full = t if "." in t or not ns else f"{ns}.{t}"
            if full in self._named or t in self._named:
                return self._named.get(full) or self._named[t]
            raise UnsupportedSchemaError(f"the Avro schema refers to an unknown type {t!r}",
                                         fix="read the hour with read_records instead")
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
            return pa.list_(item), None if conv is None else (lambda v: [conv(x) for x in v])
        if kind == "map":
            value, conv = self._type(t["values"], ns)
            return pa.map_(pa.string(), value), None if conv is None else (lambda v: {k: conv(x) for k, x in v.items()})
        return self._type(kind, ns)  # {"type": "long"} and the like

    def _remember(self, t: dict, ns: str, mapped: tuple[pa.DataType, Convert]) -> tuple[pa.DataType, Convert]:
        name = t["name"]
        space = t.get("namespace", ns)
        self._named[name if "." in name or not space else f"{space}.{name}"] = mapped
        self._named.setdefault(name.rsplit(".", 1)[-1], mapped)
        return mapped

    def _record(self, t: dict, ns: str) -> tuple[pa.DataType, Convert]:
        space = t.get("namespace", ns)
        fields, converters = [], {}
        for f in t["fields"]:
            ftype, conv = self._type(f["type"], space)
            nullable = f["type"] == "null" or (isinstance(f["type"], list) and "null" in f["type"])
            fields.append(pa.field(f["name"], ftype, nullable=nullable))
            if conv is not None:
                converters[f["name"]] = conv

        def convert(rec: dict[str, Any]) -> dict[str, Any]:
            out = dict(rec)
            for k, c in converters.items():
                out[k] = c(out[k])
            return out

        return self._remember(t, ns, (pa.struct(fields), convert if converters else None))

    def _union(self, branches: list, ns: str) -> tuple[pa.DataType, Convert]:
        others = [b for b in branches if b != "null"]
        if len(others) != 1:
            raise UnsupportedSchemaError(
                f"the Avro union {branches!r} has no Arrow column type here",
                fix="read the hour with read_records (or cat --format jsonl) instead",
            )
        inner, conv = self._type(others[0], ns)
        return inner, None if conv is None else (lambda v: None if v is None else conv(v))
