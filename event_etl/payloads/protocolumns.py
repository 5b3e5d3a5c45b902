"""Protobuf messages of a flat type, read as columns from their wire format: no Python object per message.

:meth:`ProtoDecoder.columns <event_etl.payloads.protobuf.ProtoDecoder.columns>` parses every payload with the
C decoder (upb) and reads its attributes one message at a time.  :class:`WireColumns` reads the same chunk the
way :mod:`.avrocolumns` reads Avro datums: message ``i`` is ``buf[starts[i]:ends[i]]`` and all of them advance
together, one *step* at a time:

1. every row still short of its end reads one tag (a varint, read with numpy: the first byte of every row, then
   a second byte of the rows whose first one had its continuation bit, and so on) and splits it into a field
   number and a wire type;
2. the rows read the value their wire type says (a varint, 4 or 8 bytes, or a length and the bytes after it),
   the rows of each field the message knows keep it in that field's arrays (the last value wins, as protobuf's
   does), a ``Timestamp`` or a wrapper is read by a second, inner walk over its bytes and merged into what the row
   holds (protobuf merges a message field that comes twice), a member of a ``oneof`` clears its siblings; the
   rows of a number the message lacks skip the value and count it;
3. a row that reaches its end stops; every read must lie before the row's end.

At the end the fields become the Arrow columns of :meth:`ProtoDecoder.columns`, which uses this reader first
(made once per decoder; the C decoder when :meth:`WireColumns.read` says ``None``): the integers of every kind
sign-extended, zig-zag decoded or truncated to 32 bits as protobuf reads them, an enum's number as its symbol, a
Timestamp as an int64 in the Avro field's unit, rounded down, a string cut out of the buffer by Arrow (the values
of a column in one ``take``) and its UTF-8 checked by a cast, null where a field with presence is unset, the
schema's default for an Avro field the message lacks.

:meth:`WireColumns.read` never explains: when any message of the chunk is not one that the C decoder parses and
:meth:`ProtoDecoder.columns` turns into columns, it returns ``None`` and the caller takes the other path, which says
what is wrong with which payload.  What it refuses, then: a value cut short, a varint of more than ten bytes (the
bits of a tenth byte beyond the 64th are dropped, as the C decoder drops them), a tag or a length of more than five
bytes, a length of 2**31-1 or more, field number 0, a wire type other than varint, 64-bit, length-delimited and
32-bit, a known field of the message with another wire type than its type's (inside a Timestamp or a wrapper it is
an unknown field, as the C decoder counts it), a string that is not UTF-8 (also one that a later value of its field
replaces), an enum number without a symbol, a ``uint64``/``fixed64`` above 2**63-1, a Timestamp outside years
1..9999.  And one thing more than the C decoder: a group, known or unknown (the C decoder counts an unknown one as
one unknown field; they are rare enough to leave to it).

:meth:`WireColumns.of` reads every message :meth:`ProtoDecoder.columns` reads but one with a proto2 ``required``
field, or a field outside its plan (a field of a message type the Avro schema leaves out, ``google.protobuf.Empty``
say): those take the C decoder's path.

A chunk of 100,000 page views (13 fields, ~120 bytes each) takes ~0.55 µs a message, against ~3.4 by the C decoder
and the attributes, ~5.3 by :meth:`ProtoDecoder.decode` one by one, ~1.1 by Arrow's JSON reader for the same events
as JSON lines (~225 bytes each); random page views (every field of random length, optional ones unset at random, a
price of 10 bytes): ~1.5 µs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor

__all__ = ["WireColumns"]

_F = FieldDescriptor
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_WIRE_OF: dict[int, int] = {
    **{t: _VARINT for t in (_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_SINT32,
                            _F.TYPE_SINT64, _F.TYPE_BOOL, _F.TYPE_ENUM)},
    **{t: _I64 for t in (_F.TYPE_FIXED64, _F.TYPE_SFIXED64)},
    **{t: _I32 for t in (_F.TYPE_FIXED32, _F.TYPE_SFIXED32)},
    _F.TYPE_STRING: _LEN, _F.TYPE_MESSAGE: _LEN,
}
"""The wire type of each protobuf type read here (double, float, bytes and groups are not: not flat)."""
_WRAPPED: dict[str, int] = {
    "google.protobuf.Int64Value": _F.TYPE_INT64, "google.protobuf.UInt64Value": _F.TYPE_UINT64,
    "google.protobuf.Int32Value": _F.TYPE_INT32, "google.protobuf.UInt32Value": _F.TYPE_UINT32,
    "google.protobuf.BoolValue": _F.TYPE_BOOL, "google.protobuf.StringValue": _F.TYPE_STRING,
}
"""The wrappers of a flat message: its field 1, ``value``, is the scalar."""
_TIMESTAMP = "google.protobuf.Timestamp"
_SECONDS_MIN, _SECONDS_MAX = -62_135_596_800, 253_402_300_799
"""A Timestamp's valid seconds, 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (as protobuf.py checks them)."""
_LONG_MAX = np.uint64(2**63 - 1)
_LOW32 = np.uint64(0xFFFF_FFFF)
_MAX_LENGTH = 2**31 - 2
"""The C decoder refuses a length of a length-delimited value from 2**31-1 on, or written in more than 5 bytes."""


class _Invalid(Exception):
    """A message of the chunk that the C decoder would not parse, or whose columns would be refused."""


# -- what the decoder knows: read through these, not imported (protobuf.py imports this module) -------------------
class _PlanColumn(Protocol):
    """What :class:`event_etl.payloads.protobuf._Column` says of one Avro field of a flat record."""

    @property
    def name(self) -> str: ...
    @property
    def index(self) -> int: ...  # -1: the schema's default
    @property
    def kind(self) -> str: ...  # "scalar", "enum", "timestamp"
    @property
    def arrow(self) -> Any: ...
    @property
    def presence(self) -> str | None: ...
    @property
    def wrapper(self) -> bool: ...
    @property
    def per_second(self) -> int: ...
    @property
    def symbols(self) -> Any: ...  # an enum's (numbers, symbols) as Arrow arrays
    @property
    def default(self) -> Any: ...


class _Schema(Protocol):
    @property
    def descriptor(self) -> Descriptor: ...


class _Decoder(Protocol):
    """What :meth:`WireColumns.of` reads of a :class:`~event_etl.payloads.protobuf.ProtoDecoder`."""

    @property
    def schema(self) -> _Schema: ...
    @property
    def _columns(self) -> Sequence[_PlanColumn] | None: ...
    @property
    def _required(self) -> bool: ...


# -- the layout of a message: its fields by number --------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _Spec:
    """One field of a message as the walk reads it (into the slot of its index in :attr:`_Layout.specs`)."""

    number: int
    wire: int
    kind: str  # "number" (a varint or fixed-width value, kept as its uint64 bits), "string", "message"
    sub: _Layout | None = None  # a message's fields
    siblings: tuple[int, ...] = ()  # the slots of the other members of its oneof: cleared when it is set


_DIRECT = 2048
"""Field numbers below this are looked up in a table; the (rare) larger ones by a binary search."""


@dataclass(frozen=True, eq=False)
class _Layout:
    specs: list[_Spec]
    lut: np.ndarray = field(init=False)  # field number -> slot; -1: unknown; its last entry: a number beyond it
    far: tuple[np.ndarray, np.ndarray] = field(init=False)  # the numbers beyond the table (sorted), their slots
    wires: np.ndarray = field(init=False)  # slot -> its wire type

    def __post_init__(self) -> None:
        size = min(max((s.number for s in self.specs), default=0), _DIRECT) + 1
        lut = np.full(size + 1, -1, dtype=np.int64)
        far = sorted((s.number, i) for i, s in enumerate(self.specs) if s.number >= size)
        for i, s in enumerate(self.specs):
            if s.number < size:
                lut[s.number] = i
        object.__setattr__(self, "lut", lut)
        object.__setattr__(self, "far", (np.array([n for n, _ in far], dtype=np.int64),
                                         np.array([i for _, i in far], dtype=np.int64)))
        object.__setattr__(self, "wires", np.array([s.wire for s in self.specs] + [-1], dtype=np.int64))

    def _slots(self, number: np.ndarray) -> np.ndarray:
        slot: np.ndarray = self.lut[np.minimum(number, len(self.lut) - 1)]
        numbers, slots = self.far
        if len(numbers):
            beyond = np.flatnonzero(number >= len(self.lut) - 1)
            at = np.minimum(np.searchsorted(numbers, number[beyond]), len(numbers) - 1)
            slot[beyond] = np.where(numbers[at] == number[beyond], slots[at], -1)
        return slot

    def slots_of(self, number: np.ndarray, wire: np.ndarray, strict: bool) -> np.ndarray:
        """Each row's slot (-1: an unknown field).  A known number with another wire type: :class:`_Invalid` when
        ``strict`` (the top message: ProtoDecoder refuses it), else an unknown field (inside a Timestamp)."""
        slot = self._slots(number)
        wrong = self.wires[slot] != wire
        wrong &= slot >= 0
        if wrong.any():
            if strict:
                raise _Invalid
            slot = np.where(wrong, -1, slot)
        return slot


def _scalar_spec(fd: FieldDescriptor, ptype: int) -> _Spec | None:
    wire = _WIRE_OF.get(ptype)
    if wire is None or ptype == _F.TYPE_MESSAGE:
        return None
    return _Spec(fd.number, wire, "string" if ptype == _F.TYPE_STRING else "number")


def _sub_layout(desc: Descriptor) -> _Layout | None:
    """The layout of a Timestamp (seconds, nanos) or a supported wrapper (value), else None."""
    if desc.full_name == _TIMESTAMP:
        seconds, nanos = desc.fields_by_number[1], desc.fields_by_number[2]
        return _Layout([_Spec(1, _VARINT, "number"), _Spec(2, _VARINT, "number")]) if (
            seconds.type == _F.TYPE_INT64 and nanos.type == _F.TYPE_INT32) else None
    ptype = _WRAPPED.get(desc.full_name)
    if ptype is None:
        return None
    spec = _scalar_spec(desc.fields_by_number[1], ptype)
    return None if spec is None else _Layout([spec])


def _layout(desc: Descriptor) -> _Layout | None:
    """The layout of a flat message (every field a scalar of :data:`_WIRE_OF`, a Timestamp or a wrapper), or None."""
    specs: list[_Spec] = []
    for fd in desc.fields:
        if fd.is_repeated:
            return None
        if fd.message_type is not None:
            sub = _sub_layout(fd.message_type)
            spec = None if sub is None else _Spec(fd.number, _LEN, "message", sub)
        else:
            spec = _scalar_spec(fd, fd.type)
        if spec is None:
            return None
        specs.append(spec)
    slot = {fd.number: i for i, fd in enumerate(desc.fields)}
    for i, fd in enumerate(desc.fields):
        oneof = fd.containing_oneof
        if oneof is not None and len(oneof.fields) > 1:
            siblings = tuple(slot[f.number] for f in oneof.fields if f.number != fd.number)
            specs[i] = _Spec(specs[i].number, specs[i].wire, specs[i].kind, specs[i].sub, siblings)
    return _Layout(specs)


# -- the values read so far -----------------------------------------------------------------------------------
class _Slots:
    """The fields of ``n`` messages, as read so far: per slot, which rows have it and their value (a number's
    uint64 bits; a string's start and length in the buffer; a message's own slots); and each row's unknown fields
    (a message field's count as its own: a member of a oneof that another replaces takes its unknown fields with
    it)."""

    def __init__(self, layout: _Layout, n: int) -> None:
        self.layout = layout
        self.unknown = np.zeros(n, dtype=np.int64)
        self.present = [np.zeros(n, dtype=bool) for _ in layout.specs]
        self.raw = [np.zeros(n if s.kind == "number" else 0, dtype=np.uint64) for s in layout.specs]
        self.start = [np.zeros(n if s.kind == "string" else 0, dtype=np.int64) for s in layout.specs]
        self.length = [np.zeros(n if s.kind == "string" else 0, dtype=np.int64) for s in layout.specs]
        self.child = [None if s.sub is None else _Slots(s.sub, n) for s in layout.specs]

    def message(self, slot: int) -> _Slots:
        child = self.child[slot]
        assert child is not None
        return child

    def set_number(self, slot: int, rows: Any, values: np.ndarray) -> None:
        self.raw[slot][rows] = values
        self.present[slot][rows] = True

    def set_string(self, slot: int, rows: Any, starts: np.ndarray, lengths: np.ndarray, log: _Log) -> None:
        log.replaced(self, slot, rows)
        self.start[slot][rows] = starts
        self.length[slot][rows] = lengths
        self.present[slot][rows] = True

    def merge(self, rows: np.ndarray, other: _Slots, log: _Log) -> None:
        """The fields ``other`` (of ``len(rows)`` messages) has, over those of ``rows``: protobuf's merge of a
        message field that comes again (its scalars: the last value wins)."""
        for k, spec in enumerate(self.layout.specs):
            have = other.present[k]
            if not have.any():
                continue
            target = rows[have]
            if spec.kind == "string":
                self.set_string(k, target, other.start[k][have], other.length[k][have], log)
            else:
                self.set_number(k, target, other.raw[k][have])
        self.unknown[rows] += other.unknown

    def unknown_count(self) -> int:
        """The unknown fields of every row, those of its message fields included."""
        inner = sum(c.unknown_count() for c in self.child if c is not None)
        return int(self.unknown.sum()) + inner

    def clear(self, slots: tuple[int, ...], rows: Any, log: _Log) -> None:
        """The fields ``slots`` unset at ``rows`` (another member of their oneof came)."""
        for k in slots:
            spec = self.layout.specs[k]
            if spec.kind == "string":
                log.replaced(self, k, rows)
                self.length[k][rows] = 0
            elif spec.kind == "number":
                self.raw[k][rows] = 0
            else:
                child = self.message(k)
                child.clear(tuple(range(len(child.layout.specs))), rows, log)
                child.unknown[rows] = 0
            self.present[k][rows] = False


class _Log:
    """The strings that a later value replaced: the C decoder checked their UTF-8 too."""

    def __init__(self) -> None:
        self.starts: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def replaced(self, slots: _Slots, slot: int, rows: Any) -> None:
        had = slots.present[slot][rows]
        if had.any():
            self.starts.append(slots.start[slot][rows][had])
            self.lengths.append(slots.length[slot][rows][had])

    def check(self, u8: np.ndarray) -> None:
        if self.starts:
            _text(u8, np.concatenate(self.starts), np.concatenate(self.lengths), None, None)


# -- reading the wire format -----------------------------------------------------------------------------------
def _varints(u8: np.ndarray, pos: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varint at each ``pos`` (each before its ``end``): ``(values as uint64, sizes)``."""
    if np.any(pos >= ends):
        raise _Invalid
    b = u8[pos]
    values = (b & 0x7F).astype(np.uint64)
    sizes = np.ones(len(pos), dtype=np.int64)
    more = b >= 0x80
    if more.any():
        _varint_rest(u8, pos, ends, values, sizes, None if more.all() else np.flatnonzero(more))
    return values, sizes


def _varint_rest(u8: np.ndarray, pos: np.ndarray, ends: np.ndarray, values: np.ndarray, sizes: np.ndarray,
                 sel: np.ndarray | None) -> None:
    """The second to tenth bytes of the varints of rows ``sel`` (None: all of them, while all go on: a column of
    timestamps), into ``values`` and ``sizes``.  The bits of a tenth byte beyond the 64th are dropped, as the C
    decoder drops them."""
    for k in range(1, 10):
        p = pos + k if sel is None else pos[sel] + k
        if np.any(p >= (ends if sel is None else ends[sel])):
            raise _Invalid  # cut short
        b = u8[p]
        part = (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        go = b >= 0x80
        if sel is None:
            values |= part
            sizes += 1
            sel = None if go.all() else np.flatnonzero(go)
        else:
            values[sel] |= part
            sizes[sel] += 1
            sel = sel[go]
        if sel is not None and len(sel) == 0:
            return
    raise _Invalid  # an eleventh byte


def _fixed(u8: np.ndarray, pos: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """The little-endian ``width`` bytes at each ``pos``, as uint64."""
    if np.any(pos + width > ends):
        raise _Invalid
    raw = np.ascontiguousarray(u8[pos[:, None] + np.arange(width)])
    return raw.view("<u4" if width == 4 else "<u8")[:, 0].astype(np.uint64)


def _rows(mask: np.ndarray) -> slice | np.ndarray | None:
    """The rows of ``mask``: None if none, every row as a slice (no copy), else their indexes."""
    count = int(np.count_nonzero(mask))
    if count == 0:
        return None
    return slice(None) if count == len(mask) else np.flatnonzero(mask)


@dataclass
class _Values:
    """One step's values, a row each: the value (a length-delimited one's length), where the bytes of a
    length-delimited one begin, and where the next tag is."""

    value: np.ndarray
    start: np.ndarray
    after: np.ndarray


def _read_values(u8: np.ndarray, wire: np.ndarray, pos: np.ndarray, ends: np.ndarray) -> _Values:
    """The value after each row's tag, as its wire type says."""
    if np.any((wire != _VARINT) & (wire != _I64) & (wire != _LEN) & (wire != _I32)):
        raise _Invalid  # a group (start or end) or a wire type that does not exist
    out = _Values(np.empty(len(pos), dtype=np.uint64), pos, np.empty(len(pos), dtype=np.int64))  # every row set
    for w in (_VARINT, _LEN, _I64, _I32):
        rows = _rows(wire == w)
        if rows is None:
            continue
        p, e = pos[rows], ends[rows]
        if w == _VARINT:
            out.value[rows], size = _varints(u8, p, e)
            out.after[rows] = p + size
        elif w == _LEN:
            out.value[rows], size = _varints(u8, p, e)
            if size.max() > 5:
                raise _Invalid
            _delimited(out, rows, p + size, e)
        else:
            width = 8 if w == _I64 else 4
            out.value[rows] = _fixed(u8, p, e, width)
            out.after[rows] = p + width
    return out


def _delimited(out: _Values, rows: slice | np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    lengths = out.value[rows]
    if np.any(lengths > np.uint64(_MAX_LENGTH)):
        raise _Invalid
    after = starts + lengths.astype(np.int64)
    if np.any(after > ends):
        raise _Invalid
    if isinstance(rows, slice):
        out.start = starts
    else:
        out.start = out.start.copy()
        out.start[rows] = starts
    out.after[rows] = after


class _Walk:
    """The steps over the messages of one buffer (and, inside them, their Timestamps and wrappers)."""

    def __init__(self, u8: np.ndarray) -> None:
        self.u8 = u8
        self.log = _Log()

    def run(self, layout: _Layout, starts: np.ndarray, ends: np.ndarray, *, strict: bool) -> _Slots:
        """The fields of the messages ``u8[starts[i]:ends[i]]``."""
        slots = _Slots(layout, len(starts))
        pos = starts.copy()
        active = np.flatnonzero(pos < ends)
        while len(active):
            if len(active) == len(pos):
                pos = self.step(layout, slots, pos, ends, None, strict)
                active = np.flatnonzero(pos < ends)
            else:
                pos[active] = self.step(layout, slots, pos[active], ends[active], active, strict)
                active = active[pos[active] < ends[active]]
        return slots

    def step(self, layout: _Layout, slots: _Slots, pos: np.ndarray, ends: np.ndarray, active: np.ndarray | None,
             strict: bool) -> np.ndarray:
        """One tag and its value of each row of ``active`` (None: every row); the rows' positions after them."""
        tags, size = _varints(self.u8, pos, ends)
        if size.max() > 5 or tags.max() > _LOW32 or tags.min() < 8:
            raise _Invalid  # a tag of more than 5 bytes or 32 bits (the C decoder's limits), or field number 0
        wire = (tags & np.uint64(7)).astype(np.int64)
        slot = layout.slots_of((tags >> np.uint64(3)).astype(np.int64), wire, strict)
        values = _read_values(self.u8, wire, pos + size, ends)
        counts = np.bincount(slot + 1, minlength=len(layout.specs) + 1)
        if counts[0]:
            unknown = np.flatnonzero(slot < 0)
            slots.unknown[unknown if active is None else active[unknown]] += 1  # a row once a step
        for k in np.flatnonzero(counts[1:]):
            rows = slice(None) if counts[k + 1] == len(slot) else np.flatnonzero(slot == k)
            self.store(slots, int(k), rows, active, values)
        return values.after

    def store(self, slots: _Slots, k: int, rows: slice | np.ndarray, active: np.ndarray | None,
              values: _Values) -> None:
        """The values of field ``k`` at ``rows`` (of the step's) into ``slots`` (of every row)."""
        spec = slots.layout.specs[k]
        target: Any = rows if active is None else active[rows]
        if spec.siblings:
            slots.clear(spec.siblings, target, self.log)
        if spec.kind == "number":
            slots.set_number(k, target, values.value[rows])
        elif spec.kind == "string":
            slots.set_string(k, target, values.start[rows], values.value[rows].astype(np.int64), self.log)
        else:
            assert spec.sub is not None
            starts = values.start[rows]
            inner = self.run(spec.sub, starts, values.after[rows], strict=False)
            if isinstance(target, slice):
                target = np.arange(len(slots.present[k]))
            slots.message(k).merge(target, inner, self.log)
            slots.present[k][target] = True


# -- the columns ------------------------------------------------------------------------------------------------
def _validity(present: np.ndarray | None) -> Any:
    return None if present is None else pa.py_buffer(np.packbits(present, bitorder="little"))


def _int32(raw: np.ndarray) -> np.ndarray:
    return (raw & _LOW32).astype(np.uint32).view(np.int32).astype(np.int64)


def _zigzag32(raw: np.ndarray) -> np.ndarray:
    n = (raw & _LOW32).astype(np.uint32)
    return ((n >> np.uint32(1)) ^ (np.uint32(0) - (n & np.uint32(1)))).view(np.int32).astype(np.int64)


def _zigzag64(raw: np.ndarray) -> np.ndarray:
    return ((raw >> np.uint64(1)) ^ (np.uint64(0) - (raw & np.uint64(1)))).view(np.int64)


def _unsigned64(raw: np.ndarray) -> np.ndarray:
    if len(raw) and raw.max() > _LONG_MAX:
        raise _Invalid  # above the largest Avro long
    return raw.view(np.int64)


_INTEGERS: dict[int, Any] = {
    _F.TYPE_INT32: _int32, _F.TYPE_SFIXED32: _int32, _F.TYPE_ENUM: _int32,
    _F.TYPE_UINT32: lambda raw: (raw & _LOW32).astype(np.int64), _F.TYPE_FIXED32: lambda raw: raw.astype(np.int64),
    _F.TYPE_INT64: lambda raw: raw.view(np.int64), _F.TYPE_SFIXED64: lambda raw: raw.view(np.int64),
    _F.TYPE_UINT64: _unsigned64, _F.TYPE_FIXED64: _unsigned64,
    _F.TYPE_SINT32: _zigzag32, _F.TYPE_SINT64: _zigzag64,
}
"""A protobuf integer type -> its value (int64) from the bits of its varint or fixed-width value, as protobuf
reads them: a 32-bit type keeps the low 32 bits (an int32's negative comes sign-extended to 10 bytes)."""


def _int64_array(values: np.ndarray, present: np.ndarray | None) -> Any:
    return pa.Array.from_buffers(pa.int64(), len(values), [_validity(present), pa.py_buffer(values)])


def _bool_array(values: np.ndarray, present: np.ndarray | None) -> Any:
    bits = np.packbits(values, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [_validity(present), pa.py_buffer(bits)])


def _text(u8: np.ndarray, starts: np.ndarray, lengths: np.ndarray, present: np.ndarray | None,
          ref: np.ndarray | None) -> Any:
    """A string array of the ``lengths`` bytes at ``starts`` (null where not ``present``; a row without its value
    reads from ``ref``, its message's start, so that the values stay in buffer order); :class:`_Invalid` if one
    is not UTF-8.  In buffer order the values are taken by Arrow out of an array over the whole buffer that
    alternates values and the bytes between them (as :mod:`.avrocolumns` does); else gathered by numpy."""
    n = len(starts)
    if ref is not None:
        starts = np.where(lengths > 0, starts, ref)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + lengths
    if n and np.all(bounds[1:] >= bounds[:-1]):
        spans = pa.Array.from_buffers(pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(u8)])
        picks = np.arange(0, 2 * n, 2, dtype=np.int64)
        values = spans.take(pa.Array.from_buffers(pa.int64(), n, [_validity(present), pa.py_buffer(picks)]))
    else:
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
        values = pa.Array.from_buffers(pa.large_binary(), n, [_validity(present), pa.py_buffer(offsets),
                                                              pa.py_buffer(u8[index])])
    try:
        return values.cast(pa.string())  # checks the UTF-8
    except pa.ArrowInvalid as err:
        raise _Invalid from err


@dataclass(frozen=True, eq=False)
class _Out:
    """How one Avro field's column is made of the slots read."""

    name: str
    source: str  # "default", "field" (a scalar or an enum), "wrapper", "timestamp"
    slot: int = -1
    ptype: int = 0  # the protobuf type of the value (a wrapper's: its value's)
    nullable: bool = False
    arrow: Any = None  # a default's
    default: Any = None
    per_second: int = 0
    numbers: np.ndarray | None = None  # an enum's, sorted
    symbols: Any = None  # an enum's, in the order of ``numbers``


class _Build:
    """The columns of the messages read (``ref``: each message's start)."""

    def __init__(self, u8: np.ndarray, slots: _Slots, ref: np.ndarray) -> None:
        self.u8 = u8
        self.slots = slots
        self.ref = ref
        self.n = len(ref)

    def column(self, out: _Out) -> Any:
        if out.source == "default":
            return _constant(out.arrow, out.default, self.n)
        present = self.slots.present[out.slot]
        validity = present if out.nullable else None
        if out.source == "timestamp":
            return self.timestamp(out, validity)
        if out.source == "wrapper":
            return self.value(self.slots.message(out.slot), 0, out, validity)
        return self.value(self.slots, out.slot, out, validity)

    def value(self, slots: _Slots, k: int, out: _Out, validity: np.ndarray | None) -> Any:
        """The column of the scalar in slot ``k`` of ``slots`` (unset: its zero value)."""
        if out.ptype == _F.TYPE_STRING:
            return _text(self.u8, slots.start[k], slots.length[k], validity, self.ref)
        raw = slots.raw[k]
        if out.ptype == _F.TYPE_BOOL:
            return _bool_array(raw != 0, validity)
        values = _INTEGERS[out.ptype](raw)
        if out.numbers is not None:
            return self.enum(values, out, validity)
        return _int64_array(np.ascontiguousarray(values), validity)

    def enum(self, numbers: np.ndarray, out: _Out, validity: np.ndarray | None) -> Any:
        assert out.numbers is not None
        at = np.minimum(np.searchsorted(out.numbers, numbers), len(out.numbers) - 1)
        found = out.numbers[at] == numbers
        if not (found.all() if validity is None else found[validity].all()):
            raise _Invalid  # a number without a symbol
        index = at.astype(np.int32)
        return out.symbols.take(pa.Array.from_buffers(pa.int32(), self.n, [_validity(validity), pa.py_buffer(index)]))

    def timestamp(self, out: _Out, validity: np.ndarray | None) -> Any:
        inner = self.slots.message(out.slot)
        seconds = inner.raw[0].view(np.int64)
        nanos = _int32(inner.raw[1])
        if self.n and (seconds.min() < _SECONDS_MIN or seconds.max() > _SECONDS_MAX or nanos.min() < 0
                       or nanos.max() >= 1_000_000_000):
            raise _Invalid  # outside years 1..9999
        values = seconds * out.per_second + nanos // (1_000_000_000 // out.per_second)
        return _int64_array(values, validity)


def _constant(arrow: Any, value: Any, n: int) -> Any:
    """The column of ``n`` times a schema's default."""
    if value is None:
        return pa.nulls(n, arrow)
    if arrow == pa.bool_():
        return _bool_array(np.full(n, bool(value)), None)
    if arrow == pa.int64():
        return _int64_array(np.full(n, int(value), dtype=np.int64), None)
    data = str(value).encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


def _default_fits(arrow: Any, value: Any) -> bool:
    """Whether a default is of the Python type of its column (else the C decoder's path shall say so)."""
    if value is None:
        return True
    if arrow == pa.bool_():
        return isinstance(value, bool)
    if arrow == pa.int64():
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    return arrow == pa.string() and isinstance(value, str)


def _out(col: _PlanColumn, desc: Descriptor) -> _Out | None:
    """How the column ``col`` of the plan is made, or None if it is not one :class:`WireColumns` reads."""
    if col.index < 0:
        return _Out(col.name, "default", arrow=col.arrow, default=col.default) if _default_fits(
            col.arrow, col.default) else None
    fd = desc.fields_by_name.get(col.name)
    if fd is None:
        return None
    slot = list(desc.fields).index(fd)
    nullable = col.presence is not None
    if col.kind == "timestamp":
        return _Out(col.name, "timestamp", slot, nullable=nullable, per_second=col.per_second)
    if col.wrapper and fd.message_type is not None:
        return _Out(col.name, "wrapper", slot, _WRAPPED.get(fd.message_type.full_name, 0), nullable)
    if col.kind == "enum":
        numbers = np.array(col.symbols[0].to_pylist(), dtype=np.int64)  # to_numpy imports pandas
        order = np.argsort(numbers, kind="stable")
        symbols = col.symbols[1].take(pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order)]))
        return _Out(col.name, "field", slot, fd.type, nullable, numbers=numbers[order], symbols=symbols)
    return _Out(col.name, "field", slot, fd.type, nullable)


class WireColumns:
    """Reads the Protobuf messages of a flat type as the columns :meth:`ProtoDecoder.columns` gives."""

    def __init__(self, layout: _Layout, outs: list[_Out]) -> None:
        """Use :meth:`of`."""
        self._layout = layout
        self._outs = outs

    @classmethod
    def of(cls, decoder: _Decoder) -> WireColumns | None:
        """The reader of a :class:`~event_etl.payloads.protobuf.ProtoDecoder`'s messages, or None unless its
        message is flat (``decoder.flat``), has no proto2 ``required`` field, and every field of it has a column."""
        plan = decoder._columns
        desc = decoder.schema.descriptor
        if plan is None or decoder._required:
            return None
        layout = _layout(desc)
        outs = [_out(c, desc) for c in plan]
        read = {c.name for c in plan if c.index >= 0}
        if layout is None or any(o is None for o in outs) or read != {fd.name for fd in desc.fields}:
            return None
        return cls(layout, [o for o in outs if o is not None])

    def read(self, buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> tuple[dict[str, Any], int] | None:
        """``({Avro field: Arrow array}, unknown fields)`` of the messages ``buf[starts[i]:ends[i]]``: what
        :meth:`ProtoDecoder.columns` gives for them, or None where it gives None, or where this reader is not
        sure to give the same (the other path then says).

        Raises ``ValueError`` if a message's bounds do not lie within the buffer."""
        u8 = np.frombuffer(buf, dtype=np.uint8)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        _check_bounds(starts, ends, len(u8))
        walk = _Walk(u8)
        try:
            slots = walk.run(self._layout, starts, ends, strict=True)
            walk.log.check(u8)
            build = _Build(u8, slots, starts)
            columns = {o.name: build.column(o) for o in self._outs}
        except _Invalid:
            return None
        return columns, slots.unknown_count()

    def read_messages(self, datas: Sequence[bytes]) -> tuple[dict[str, Any], int] | None:
        """:meth:`read` of messages given one by one."""
        lengths = np.fromiter(map(len, datas), dtype=np.int64, count=len(datas))
        ends = np.cumsum(lengths)
        return self.read(b"".join(datas), ends - lengths, ends)


def _check_bounds(starts: np.ndarray, ends: np.ndarray, size: int) -> None:
    if starts.shape != ends.shape or starts.ndim != 1:
        raise ValueError(f"starts and ends must be two 1-d arrays of one length, not {starts.shape} and {ends.shape}")
    if len(starts) and (starts.min() < 0 or ends.max() > size or np.any(ends < starts)):
        raise ValueError(f"a message's bounds lie outside the buffer of {size} bytes (or end before they start)")
