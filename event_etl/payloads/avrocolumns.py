"""Avro binary datums of a flat record schema, read as columns: no Python object per record.

A chunk of Avro payloads (Confluent's ``0x00`` + id + datum, single-object ``C3 01`` + fingerprint +
datum, Gilt's ``0x81`` + SHA-256 + datum: the frames are :mod:`.frames`' business) is a buffer in
which datum ``i`` is ``buf[starts[i]:ends[i]]``.  :class:`DatumColumns` reads all of them at once,
the rows advancing field by field together:

1. ``pos`` starts as ``starts``; a field of a union ``["null", T]`` first reads each row's branch
   index, and only the rows on ``T``'s branch read a value;
2. a varint (int, long, enum index, branch index, string length) is read with numpy: the first byte
   of every row, then a second byte of the rows whose first one had its continuation bit, and so on
   (at most ten bytes); zig-zag decoded; every byte read must lie before the row's ``end``;
3. a string's (or bytes') values are cut out of the buffer by Arrow: a binary array over the whole
   buffer whose offsets alternate between the values and the bytes between them, of which ``take``
   keeps the values (a numpy gather where the values are not in buffer order); a string is then
   cast to ``string``, which validates its UTF-8;
4. at the end every row must have reached its ``end`` exactly.

The columns have the forms of :class:`event_etl.task.fastpath.FastPlan`'s: string, ``uuid`` and an
enum's symbol as ``string``; int and long (timestamps as their integer) as ``int64``; boolean as
``bool``; nulls where a union took its null branch.  Beyond the fast path's kinds, bytes is read
as ``binary``, float as ``float32`` and double as ``float64`` (the Arrow types of
:mod:`event_etl.storage.parquetio`).

:meth:`DatumColumns.read` never explains a bad datum: if any datum of the chunk is not exactly
one datum of the schema, or holds a value fastavro would not give back as it is written, it
returns ``None`` and the caller reads that chunk record by record with fastavro, which says what
is wrong with which one.  What it refuses, then: a datum cut short, bytes left after it, a varint
of more than ten bytes (or beyond 64 bits), a union branch or an enum index out of range, an int
beyond 32 bits, a boolean byte other than 0 or 1, a negative length, invalid UTF-8 (surrogates
and overlong forms included); and, where fastavro's logical types would fail or change the value,
a timestamp outside years 1..9999 and a ``uuid`` not in its canonical form (36 characters,
lowercase hex and dashes: ``uuid.UUID`` rejects some other forms and rewrites the rest).

The flat schemas are decided by :func:`flat_fields`, the one home of the rules the fast path
applies to JSON too: a record whose every field is one of the kinds above, or a union of exactly
``null`` and one of them.  A field's default does not matter to a datum (the writer wrote every
field), so :class:`DatumColumns` takes fields with defaults; JSON, where a field may be missing,
does not (``defaults=False``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

__all__ = ["DATUM_KINDS", "JSON_KINDS", "DatumColumns", "FlatField", "flat_fields"]

Kind = Literal["string", "bytes", "long", "int", "boolean", "enum", "float", "double"]

JSON_KINDS: frozenset[str] = frozenset({"string", "long", "int", "boolean", "enum"})
"""The kinds the JSON fast path (:mod:`event_etl.task.fastpath`) handles."""

DATUM_KINDS: frozenset[str] = JSON_KINDS | {"bytes", "float", "double"}
"""The kinds :class:`DatumColumns` reads."""

_TIMESTAMPS = {"timestamp-millis": 1000, "timestamp-micros": 1, "local-timestamp-millis": 1000,
               "local-timestamp-micros": 1}
"""The logical types of a long: microseconds per unit."""

_LOGICAL: dict[str, set[str | None]] = {
    "long": {None, *_TIMESTAMPS},
    "string": {None, "uuid"},
}
"""The logical types allowed on a kind (none on the others: an int ``date`` or ``time-millis``, a bytes
``decimal`` take the record path)."""


@dataclass(frozen=True)
class FlatField:
    """One field of a flat record: its kind, and whether it is a union with ``null`` (at index ``null_branch``)."""

    name: str
    kind: Kind
    nullable: bool
    null_branch: int  # union index of "null" (0 or 1) when nullable
    symbols: tuple[str, ...] = ()  # an enum's
    logical: str | None = None  # uuid, timestamp-millis, ...


def _branch(t: Any, enums: dict[str, tuple[str, ...]], kinds: frozenset[str]) -> tuple[Kind, Any, str | None] | None:
    """``(kind, symbols, logical type)`` of a non-union Avro type, if it is one of ``kinds`` (``enums``: the named
    enums seen so far, by the name they were given)."""
    if isinstance(t, str):
        if t in enums:
            return ("enum", enums[t], None) if "enum" in kinds else None
        return (_kind(t), (), None) if t in kinds and t != "enum" else None
    if not isinstance(t, dict):
        return None
    kind = t.get("type")
    if kind == "enum" and "enum" in kinds:
        symbols = tuple(t["symbols"])
        enums[t["name"]] = symbols
        return "enum", symbols, None
    if kind not in kinds or kind == "enum":
        return None
    logical = t.get("logicalType")
    if logical not in _LOGICAL.get(kind, {None}):
        return None
    return _kind(kind), (), logical


def _kind(name: str) -> Kind:
    kinds: dict[str, Kind] = {"string": "string", "bytes": "bytes", "long": "long", "int": "int",
                              "boolean": "boolean", "enum": "enum", "float": "float", "double": "double"}
    return kinds[name]


def _field(f: dict[str, Any], enums: dict[str, tuple[str, ...]], kinds: frozenset[str],
           defaults: bool) -> FlatField | None:
    t = f["type"]
    nullable, null_branch = False, 0
    if isinstance(t, list):
        if len(t) != 2 or "null" not in t:
            return None
        null_branch = t.index("null")
        t = t[1 - null_branch]
        nullable = True
        if not defaults and f.get("default") is not None:
            return None
    elif not defaults and "default" in f:
        return None  # a missing JSON field would take its default; Arrow cannot tell missing from null
    kind = _branch(t, enums, kinds)
    if kind is None:
        return None
    return FlatField(f["name"], kind[0], nullable, null_branch, kind[1], kind[2])


def flat_fields(schema: Any, *, kinds: frozenset[str] = DATUM_KINDS, defaults: bool = True) -> list[FlatField] | None:
    """The fields of a flat record schema (JSON, as parsed), or ``None`` if it is not one.

    Flat: a record whose every field is one of ``kinds`` (string, also ``uuid``; long, also a timestamp
    logical type; int, boolean, enum; for :data:`DATUM_KINDS` also bytes, float, double), or a union of exactly
    ``"null"`` and one of them, either way round.  ``defaults=False`` also refuses a field with a default, but
    ``null`` for a union (JSON: a field left out would take it, which a column of nulls cannot say).  A named
    enum is known by the name it was defined with; a reference by another spelling of its name gives ``None``."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    enums: dict[str, tuple[str, ...]] = {}
    out = []
    for f in schema["fields"]:
        field = _field(f, enums, kinds, defaults)
        if field is None:
            return None
        out.append(field)
    if len({f.name for f in out}) != len(out):
        return None
    return out


# -- reading ---------------------------------------------------------------------------------------
class _Invalid(Exception):
    """A datum of the chunk is not one datum of the schema (or holds what fastavro would not give back)."""


_INT32 = (-(2**31), 2**31 - 1)
_US_RANGE = (-62_135_596_800 * 10**6, 253_402_300_800 * 10**6 - 1)
"""Microseconds from the epoch of ``datetime.min`` and ``datetime.max``: fastavro gives a timestamp as
``epoch + timedelta(...)``, which fails outside them."""
_UUID_DASHES = np.array([8, 13, 18, 23])
"""Where ``str(uuid.UUID(...))`` puts a dash; lowercase hex digits elsewhere."""


class _Cursor:
    """The rows' positions in the buffer, advanced as fields are read; each read checks that it stays within the
    row's datum (``rows``: the indexes of the rows that read, ``None`` for all)."""

    def __init__(self, u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.u8 = u8
        self.pos = starts.copy()
        self.ends = ends
        self.n = len(starts)

    def at(self, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The positions and ends of ``rows``."""
        if rows is None:
            return self.pos, self.ends
        return self.pos[rows], self.ends[rows]

    def advance(self, rows: np.ndarray | None, sizes: np.ndarray | int) -> None:
        if rows is None:
            self.pos += sizes
        else:
            self.pos[rows] += sizes

    def varints(self, rows: np.ndarray | None) -> np.ndarray:
        """The next varint of ``rows``, zig-zag decoded (int64)."""
        pos, ends = self.at(rows)
        if np.any(pos >= ends):
            raise _Invalid
        b = self.u8[pos]
        z = (b & 0x7F).astype(np.uint64)
        size = np.ones(len(pos), dtype=np.int64)
        more = b >= 0x80
        if more.any():
            self._rest(pos, ends, z, size, more)
        self.advance(rows, size)
        values: np.ndarray = ((z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))).view(np.int64)
        return values

    def _rest(self, pos: np.ndarray, ends: np.ndarray, z: np.ndarray, size: np.ndarray, more: np.ndarray) -> None:
        """The second to tenth bytes of the varints whose first byte says ``more``, into ``z`` and ``size``.  While
        all of them go on (a column of timestamps), the arrays are taken whole, not through an index."""
        sel = None if more.all() else np.flatnonzero(more)
        for k in range(1, 10):
            p = pos + k if sel is None else pos[sel] + k
            if np.any(p >= (ends if sel is None else ends[sel])):
                raise _Invalid  # cut short
            b = self.u8[p]
            if k == 9 and np.any(b > 1):
                raise _Invalid  # beyond 64 bits, or an eleventh byte
            part = (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            go = b >= 0x80
            if sel is None:
                z |= part
                size += 1
                sel = None if go.all() else np.flatnonzero(go)
            else:
                z[sel] |= part
                size[sel] += 1
                sel = sel[go]
            if sel is not None and len(sel) == 0:
                return

    def fixed(self, rows: np.ndarray | None, width: int) -> np.ndarray:
        """The next ``width`` bytes of ``rows``, as a ``(rows, width)`` matrix."""
        pos, ends = self.at(rows)
        if np.any(pos + width > ends):
            raise _Invalid
        out = self.u8[pos[:, None] + np.arange(width)]
        self.advance(rows, width)
        return out

    def spans(self, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Where the next length-prefixed value (string, bytes) of every row begins, and its length (0 where a row
        is not in ``rows``)."""
        lengths = self.varints(rows)
        pos, ends = self.at(rows)
        if np.any(lengths < 0) or np.any(pos + lengths > ends):
            raise _Invalid
        if rows is None:
            pos = pos.copy()  # self.pos itself, which advances
        self.advance(rows, lengths)
        if rows is None:
            return pos, lengths
        full = np.zeros(self.n, dtype=np.int64)
        full[rows] = lengths
        return self.pos - full, full


class DatumColumns:
    """Reads the Avro binary datums of a flat record schema as columns."""

    def __init__(self, fields: Sequence[FlatField]) -> None:
        self.fields = list(fields)
        self._symbols = {f.name: _bytes_array(pa.string(), [s.encode("utf-8") for s in f.symbols])
                         for f in self.fields if f.kind == "enum"}

    @classmethod
    def of(cls, schema: dict[str, Any]) -> DatumColumns | None:
        """The reader of a record schema's datums (JSON, as parsed), or ``None`` unless it is flat
        (:func:`flat_fields`)."""
        fields = flat_fields(schema)
        return None if fields is None else cls(fields)

    def read(self, buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> dict[str, Any] | None:
        """The columns (``{field name: pyarrow array}``) of the datums ``buf[starts[i]:ends[i]]``, or ``None`` if
        any of them is not exactly one valid datum of the schema (read them record by record to know why).

        Raises ``ValueError`` if a datum's bounds do not lie within the buffer."""
        u8 = np.frombuffer(buf, dtype=np.uint8)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        _check_bounds(starts, ends, len(u8))
        if len(starts) == 0:
            return {f.name: _empty(f) for f in self.fields}
        cursor = _Cursor(u8, starts, ends)
        try:
            cols = {f.name: self._column(cursor, f) for f in self.fields}
        except _Invalid:
            return None
        if not np.array_equal(cursor.pos, ends):
            return None  # bytes left after a datum
        return cols

    def read_records(self, datas: Sequence[bytes]) -> dict[str, Any] | None:
        """:meth:`read` of datums given one by one (a bus's messages, frames already taken off)."""
        lengths = np.fromiter(map(len, datas), dtype=np.int64, count=len(datas))
        ends = np.cumsum(lengths)
        return self.read(b"".join(datas), ends - lengths, ends)

    def _column(self, cursor: _Cursor, f: FlatField) -> Any:
        present = None
        rows = None
        if f.nullable:
            branch = cursor.varints(None)
            if np.any((branch != 0) & (branch != 1)):
                raise _Invalid
            present = branch != f.null_branch
            if not present.all():
                rows = np.flatnonzero(present)
            else:
                present = None
        if f.kind in ("string", "bytes"):
            return self._bytes_column(cursor, f, rows, present)
        if f.kind == "enum":
            return self._enum_column(cursor, f, rows, present)
        return _numbers(cursor, f, rows, present)

    def _bytes_column(self, cursor: _Cursor, f: FlatField, rows: np.ndarray | None,
                      present: np.ndarray | None) -> Any:
        starts, lengths = cursor.spans(rows)
        if f.logical == "uuid":
            picked = slice(None) if rows is None else rows
            _check_uuids(cursor.u8, starts[picked], lengths[picked])
        values = _values(cursor.u8, starts, lengths, present)
        if f.kind == "bytes":
            return values.cast(pa.binary())
        try:
            return values.cast(pa.string())  # validates the UTF-8
        except pa.ArrowInvalid as err:
            raise _Invalid from err

    def _enum_column(self, cursor: _Cursor, f: FlatField, rows: np.ndarray | None, present: np.ndarray | None) -> Any:
        idx = cursor.varints(rows)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(f.symbols)):
            raise _Invalid
        full = _spread(idx.astype(np.int32), rows, cursor.n)
        indexes = pa.Array.from_buffers(pa.int32(), cursor.n, [_validity(present), pa.py_buffer(full)])
        return self._symbols[f.name].take(indexes)


def _numbers(cursor: _Cursor, f: FlatField, rows: np.ndarray | None, present: np.ndarray | None) -> Any:
    """An int, long, boolean, float or double column."""
    validity = _validity(present)
    if f.kind == "boolean":
        b = cursor.fixed(rows, 1)[:, 0]
        if np.any(b > 1):
            raise _Invalid
        bits = np.packbits(_spread(b.astype(bool), rows, cursor.n), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), cursor.n, [validity, pa.py_buffer(bits)])
    if f.kind in ("float", "double"):
        dtype, arrow_type = (np.dtype("<f4"), pa.float32()) if f.kind == "float" else (np.dtype("<f8"), pa.float64())
        v = np.ascontiguousarray(cursor.fixed(rows, dtype.itemsize)).view(dtype)[:, 0]
        return pa.Array.from_buffers(arrow_type, cursor.n, [validity, pa.py_buffer(_spread(v, rows, cursor.n))])
    v = cursor.varints(rows)
    if len(v):
        _check_range(f, v)
    return pa.Array.from_buffers(pa.int64(), cursor.n, [validity, pa.py_buffer(_spread(v, rows, cursor.n))])


def _check_range(f: FlatField, v: np.ndarray) -> None:
    """An int within 32 bits; a timestamp within the years fastavro can give as a datetime."""
    lo, hi = int(v.min()), int(v.max())
    if f.kind == "int" and (lo < _INT32[0] or hi > _INT32[1]):
        raise _Invalid
    unit = _TIMESTAMPS.get(f.logical or "")
    if unit is not None and (lo * unit < _US_RANGE[0] or hi * unit > _US_RANGE[1]):
        raise _Invalid


def _check_uuids(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Every value is a uuid in canonical form (what ``str(uuid.UUID(value))`` gives back unchanged)."""
    if np.any(lengths != 36):
        raise _Invalid
    if len(starts) == 0:
        return
    text = np.lib.stride_tricks.sliding_window_view(u8, 36)[starts]  # the 36 bytes at each start
    hexes = ((text - np.uint8(0x30)) < 10) | ((text - np.uint8(0x61)) < 6)  # 0-9, a-f (uint8 wraps below them)
    hexes[:, _UUID_DASHES] = text[:, _UUID_DASHES] == 0x2D
    if not hexes.all():
        raise _Invalid


def _values(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray, present: np.ndarray | None) -> Any:
    """A binary array of the ``lengths`` bytes at ``starts`` (null where not ``present``).

    In buffer order (each value ends before the next begins, as in a chunk of messages), the values are taken by
    Arrow from an array over the whole buffer that alternates values and the bytes between them; else gathered."""
    n = len(starts)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + lengths
    if np.all(bounds[1:] >= bounds[:-1]):
        spans = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(u8)])
        picks = np.arange(0, 2 * n, 2, dtype=np.int64)
        return spans.take(pa.Array.from_buffers(pa.int64(), n, [_validity(present), pa.py_buffer(picks)]))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    return pa.Array.from_buffers(pa.large_binary(), n, [_validity(present), pa.py_buffer(offsets),
                                                        pa.py_buffer(u8[index])])


def _spread(values: np.ndarray, rows: np.ndarray | None, n: int) -> np.ndarray:
    """``values`` of ``rows`` placed in an array of all ``n`` rows (zero elsewhere)."""
    if rows is None:
        return np.ascontiguousarray(values)
    full = np.zeros(n, dtype=values.dtype)
    full[rows] = values
    return full


def _validity(present: np.ndarray | None) -> Any:
    """An Arrow validity bitmap of ``present`` (``None``: all valid)."""
    return None if present is None else pa.py_buffer(np.packbits(present, bitorder="little"))


def _check_bounds(starts: np.ndarray, ends: np.ndarray, size: int) -> None:
    if starts.shape != ends.shape or starts.ndim != 1:
        raise ValueError(f"starts and ends must be two 1-d arrays of one length, not {starts.shape} and {ends.shape}")
    if len(starts) and (starts.min() < 0 or ends.max() > size or np.any(ends < starts)):
        raise ValueError(f"a datum's bounds lie outside the buffer of {size} bytes (or end before they start)")


_EMPTY_TYPES: dict[str, Any] = {"string": pa.string(), "enum": pa.string(), "bytes": pa.binary(), "long": pa.int64(),
                                "int": pa.int64(), "boolean": pa.bool_(), "float": pa.float32(),
                                "double": pa.float64()}


def _empty(f: FlatField) -> Any:
    """The column of no rows of a field."""
    arrow_type = _EMPTY_TYPES[f.kind]
    if f.kind in ("string", "enum", "bytes"):
        return _bytes_array(arrow_type, [])
    return pa.Array.from_buffers(arrow_type, 0, [None, pa.py_buffer(b"")])


def _bytes_array(arrow_type: Any, data: Iterable[bytes]) -> Any:
    """A string or binary array of ``data`` (each value's bytes), from its offsets and data buffers: ``pa.array``
    imports pandas at its first call (~0.25 s in a fresh worker)."""
    values = list(data)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(d) for d in values], out=offsets[1:])
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])
