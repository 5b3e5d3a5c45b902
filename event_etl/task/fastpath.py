"""The fast path of an executor task: a chunk of JSON lines decoded, checked and Avro-encoded as columns.

Profiling a task (``bench/profile_task.py``) showed ~11 µs per event, nearly all of it per-record
Python: a dict per event from ``orjson``, the type check, and fastavro encoding one datum at a time
(~4.5 µs alone).  For the common case, a chunk of newline-delimited JSON objects that are all
valid, this module does the same work on whole columns:

1. the chunk is screened with numpy (every line starts with ``{`` and ends with ``}``, no line is
   empty or over ``max_payload_bytes``, the bytes are UTF-8), then parsed by Arrow's JSON reader
   against an Arrow schema derived from the Avro schema (fields not in the schema are ignored, as
   the record path ignores them);
2. the columns are checked as the record path checks one record (required fields present and not
   null, enum symbols, int ranges, the event time present and in years 1..9999);
3. each row's Avro binary encoding is built from the columns: varints (zig-zag longs, union
   branch indexes, string lengths, enum indexes) with numpy, then joined with the string bytes by
   Arrow's ``binary_join_element_wise``.  The bytes are those fastavro writes for the same record
   (Avro's binary encoding has one form per value), so a file written from this path is
   byte-identical to one written record by record: replays stay identical whichever path a chunk
   took, and ``tests/test_fastpath.py`` checks it.

Anything else (a single bad line in the chunk, a type Arrow parses differently from ``orjson``,
a schema with records, arrays, maps, floats, bytes or non-null defaults) makes
:meth:`FastPlan.decode` return ``None``, and the task takes the record path for that chunk, which
explains each bad record with its reason.  The fast path never decides that a record is bad.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import numpy as np

from event_etl.payloads.avrocolumns import JSON_KINDS, FlatField, flat_fields
from event_etl.sources.read import READ_BYTES
from event_etl.task.payload import MAX_EVENT_MS, MIN_EVENT_MS, Decoder

__all__ = ["FastPlan", "FastChunk", "plan_for", "CHUNK_BYTES"]

CHUNK_BYTES = READ_BYTES
"""Bytes of whole lines per chunk, as a split's reader hands them (:data:`event_etl.sources.read.READ_BYTES`,
where the size is explained); a block of Arrow's JSON reader holds one whole."""

_INT32 = (-(2**31), 2**31 - 1)
_STRINGS = {"string"}

@dataclass
class FastChunk:
    """One chunk decoded by the fast path: ``n`` records, all valid, in line order."""

    n: int
    times: np.ndarray  # int64 event times (ms)
    rows: Any  # pyarrow BinaryArray: each record's Avro binary encoding (None: a plan that does not encode)
    id_keys: np.ndarray | None  # dedupe key (uint64) of each record's id (None: no dedupe by id)
    has_id: np.ndarray | None  # whether the record has an id (a nullable id field may be null)
    starts: np.ndarray  # byte offset of each line in the chunk
    ends: np.ndarray  # byte offset of each line's end (its newline) in the chunk
    columns: Any = None  # pyarrow Table: the records' fields as parsed (what a Parquet file is written from)


def _fields_of(decoder: Decoder) -> list[FlatField] | None:
    """The fields of a flat schema the fast path takes, else None (:func:`event_etl.payloads.avrocolumns.flat_fields`,
    of JSON's kinds).  A JSON line may leave a field out (then it takes its default, which Arrow cannot tell from
    null): a JSON type's fields have no default but null.  A binary dialect's payload carries every field: its
    defaults do not matter."""
    return flat_fields(decoder.schema, kinds=JSON_KINDS, defaults=decoder.event_type.payload != "json")


class FastPlan:
    """How one event type's JSON lines are decoded and encoded as columns."""

    binary = False
    def __init__(self, decoder: Decoder, fields: list[FlatField], *, encode: bool = True) -> None:
        """``encode``: build each record's Avro encoding (``FastChunk.rows``); a Parquet type's plan does not
        (``rows`` is None: its files are written from the columns), and checks the columns alike."""
        import pyarrow as pa
        import pyarrow.json as pj

        self.encode = encode
        et = decoder.event_type
        self.fields = fields
        self.time_field = decoder.time_field
        self.divisor = et.time_logical_divisor or 1
        self.max_bytes = decoder.max_bytes
        self.id_field = et.id_field if et.dedupe_window > 0 else None
        arrow_type = {"string": pa.string(), "enum": pa.string(), "long": pa.int64(), "int": pa.int64(),
                      "boolean": pa.bool_()}
        self.arrow_schema = pa.schema([(f.name, arrow_type[f.kind]) for f in fields])
        self.read_options = pj.ReadOptions(use_threads=False, block_size=CHUNK_BYTES + 4096)
        self.parse_options = pj.ParseOptions(explicit_schema=self.arrow_schema, unexpected_field_behavior="ignore",
                                             newlines_in_values=False)
        self.symbols = {f.name: string_array(f.symbols) for f in fields if f.kind == "enum"}
        self._id_prefix = None  # the scalar b"i:", made at first use

    # -- screening and parsing ---------------------------------------------------------------
    def _lines(self, data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        buf = np.frombuffer(data, dtype=np.uint8)
        nl = np.flatnonzero(buf == 10)
        n_total = len(data)
        if n_total and buf[-1] != 10:
            ends = np.append(nl, n_total)
        else:
            ends = nl
        if len(ends) == 0:
            return None
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts
        if lengths.min() < 2 or lengths.max() > self.max_bytes:
            return None  # empty lines, one-byte lines, oversized payloads: the record path explains them
        if not (np.all(buf[starts] == 0x7B) and np.all(buf[ends - 1] == 0x7D)):
            return None  # not '{' ... '}' (also: '\r' line ends, leading blanks, Avro payloads)
        return starts, ends

    def decode(self, data: bytes) -> FastChunk | None:
        """The chunk's records, if every line is a valid record; else ``None`` (take the record path)."""
        import pyarrow as pa
        import pyarrow.json as pj

        if not data.isascii():
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                return None
        lines = self._lines(data)
        if lines is None:
            return None
        starts, ends = lines
        if b"\\u" in data and (b"\\ud" in data or b"\\uD" in data):
            return None  # surrogate escapes: orjson and Arrow differ on lone ones
        try:
            table = pj.read_json(pa.py_buffer(data), read_options=self.read_options, parse_options=self.parse_options)
        except Exception:  # noqa: BLE001 - any parse problem: the record path finds and explains it
            return None
        n = table.num_rows
        if n != len(starts):
            return None  # a line held two objects
        cols = self._columns(table)
        if cols is None:
            return None
        return self.from_columns(cols, n, starts, ends)

    def from_columns(self, cols: dict[str, Any], n: int, starts: np.ndarray, ends: np.ndarray) -> FastChunk | None:
        """The chunk of ``n`` records given as columns (the JSON reader's, or a binary dialect's: a field's
        Arrow array, as :meth:`_columns` gives them), checked and encoded; ``None`` if a check fails.  ``starts``
        and ``ends``: where each record's payload lies in the piece's data (for its dead letter)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for f in self.fields:
            if not f.nullable and cols[f.name].null_count:
                return None
        tcol = cols.get(self.time_field)
        if tcol is None or tcol.null_count or tcol.type != pa.int64():
            return None
        raw_t = numpy_of(tcol)
        times = raw_t // self.divisor if self.divisor != 1 else raw_t
        if n and (times.min() < MIN_EVENT_MS or times.max() > MAX_EVENT_MS):
            return None
        ok, rows = self._rows(cols, n, pa, pc)
        if not ok:
            return None
        id_keys = has_id = None
        if self.id_field is not None and self.id_field in cols:
            ids = cols[self.id_field]
            has_id = _valid_mask(ids, n)
            id_keys = np.zeros(n, dtype=np.uint64)
            id_keys[has_id] = self._id_hashes(ids.drop_null(), pa, pc)
        columns = pa.Table.from_arrays([cols[f.name] for f in self.fields], names=[f.name for f in self.fields])
        return FastChunk(n, np.ascontiguousarray(times, dtype=np.int64), rows, id_keys, has_id, starts, ends, columns)

    def decode_payloads(self, payloads: Sequence[bytes], starts: np.ndarray, ends: np.ndarray) -> FastChunk | None:
        """A JSON plan reads lines (:meth:`decode`), not a binary dialect's payloads."""
        return None

    def _columns(self, table: Any) -> dict[str, Any] | None:
        """The parsed table's columns as single arrays, by field; ``None`` if a required one holds a null."""
        cols = {}
        for f in self.fields:
            c = table.column(f.name)
            c = c.combine_chunks() if c.num_chunks != 1 else c.chunk(0)
            if not f.nullable and c.null_count:
                return None
            cols[f.name] = c
        return cols

    def _id_hashes(self, ids: Any, pa: ModuleType, pc: ModuleType) -> np.ndarray:
        """:func:`event_etl.task.dedupe.key_hash` ``("i", id)`` of each id of an array without nulls: for
        strings, xxh3-64 of ``b"i:" + id`` (UTF-8), hashed from the ``bytes`` of a binary array's ``to_pylist``
        (no Python string per id; half the time of slicing one buffer, which made a slice object per id)."""
        import xxhash

        if not pa.types.is_string(ids.type):  # an integer id: hashed as its decimal text, as the record path does
            from event_etl.task.dedupe import id_key_hashes

            return id_key_hashes(ids.to_pylist())
        if self._id_prefix is None:
            self._id_prefix = _bytes_array(pa.binary(), [b"i:"])[0]
        joined = pc.binary_join_element_wise(self._id_prefix, pc.cast(ids, pa.binary()), zero_scalar(pa.binary()))
        return np.fromiter(map(xxhash.xxh3_64_intdigest, joined.to_pylist()), dtype=np.uint64, count=len(ids))

    def _rows(self, cols: dict[str, Any], n: int, pa: ModuleType, pc: ModuleType) -> tuple[bool, Any]:
        """``(columns pass their checks, each record's Avro encoding)``; the encoding is None for a plan that does
        not encode (it checks the columns alike)."""
        if not self.encode:
            return self._valid(cols, pc), None
        pieces = self._encode(cols, n, pa, pc)
        if pieces is None:
            return False, None
        return True, pc.binary_join_element_wise(*pieces, zero_scalar(pa.binary())) if len(pieces) > 1 else pieces[0]

    def _valid(self, cols: dict[str, Any], pc: ModuleType) -> bool:
        """What :meth:`_encode` checks, without encoding: every enum value a symbol, every int within 32 bits."""
        for f in self.fields:
            c = cols[f.name]
            if f.kind == "enum" and pc.index_in(c, value_set=self.symbols[f.name]).null_count != c.null_count:
                return False
            if f.kind == "int" and len(c) - c.null_count:
                lo, hi = pc.min_max(c).values()
                if lo.as_py() < _INT32[0] or hi.as_py() > _INT32[1]:
                    return False
        return True

    # -- encoding ----------------------------------------------------------------------------
    def _encode(self, cols: dict[str, Any], n: int, pa: ModuleType, pc: ModuleType) -> list[Any] | None:
        """Pieces whose row-wise concatenation is each record's Avro encoding."""
        pieces: list[Any] = []  # pyarrow arrays
        pending: list[tuple[np.ndarray, np.ndarray | None]] = []  # varints to emit before the next string
        for f in self.fields:
            c = cols[f.name]
            valid = None
            if f.nullable:
                valid = _valid_mask(c, n)
                branch = np.where(valid, 2 * (1 - f.null_branch), 2 * f.null_branch).astype(np.uint64)
                pending.append((branch, None))
            if f.kind == "string":
                lengths = numpy_of(filled(pc.binary_length(c))).astype(np.uint64)
                pending.append((lengths << np.uint64(1), valid))
                pieces.append(_varints(pending, n, pa))
                pending = []
                pieces.append(pc.cast(filled(c), pa.binary()))
            elif f.kind == "enum":
                idx = pc.index_in(c, value_set=self.symbols[f.name])
                if idx.null_count != c.null_count:
                    return None  # a symbol the enum does not have
                pending.append((numpy_of(filled(idx)).astype(np.uint64) << np.uint64(1),
                                valid))
            elif f.kind in ("long", "int"):
                v = numpy_of(filled(c))
                if f.kind == "int" and len(v) and (v.min() < _INT32[0] or v.max() > _INT32[1]):
                    return None
                pending.append((_zigzag(v), valid))
            elif f.kind == "boolean":
                v = numpy_of(filled(c))
                pending.append((v.astype(np.uint64), valid))
        if pending:
            pieces.append(_varints(pending, n, pa))
        return pieces


def string_array(values: Iterable[str]) -> Any:
    """A pyarrow string array of ``values``, built from its buffers.

    ``pa.array`` would do, but its first call imports pandas (~0.25 s in every fresh Python
    worker, whatever the values: pyarrow checks whether they are pandas objects)."""
    import pyarrow as pa

    return _bytes_array(pa.string(), [v.encode("utf-8") for v in values])


def _bytes_array(arrow_type: Any, data: list[bytes]) -> Any:
    """A string or binary array of ``data`` (each value's bytes), from its offsets and data buffers."""
    import pyarrow as pa

    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def int64_array(values: np.ndarray) -> Any:
    """A pyarrow int64 array over a numpy array's values (no pandas import; see :func:`string_array`)."""
    import pyarrow as pa

    v = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(v), [None, pa.py_buffer(v)])


_NUMPY_TYPES = {"int64": np.int64, "int32": np.int32, "uint64": np.uint64, "uint32": np.uint32}


def numpy_of(c: Any) -> np.ndarray:
    """The values of a pyarrow array without nulls (integers or booleans), as numpy (read-only for integers).

    Read from its buffers: ``Array.to_numpy`` imports pandas on its first call, whatever the
    array (~0.25 s in every fresh Python worker)."""
    if c.null_count:
        raise ValueError("numpy_of: the array has nulls")
    bufs = c.buffers()
    name = str(c.type)
    if name == "bool":
        bits = np.frombuffer(bufs[1], dtype=np.uint8)
        return np.unpackbits(bits, count=c.offset + len(c), bitorder="little")[c.offset:].astype(bool)
    dtype = np.dtype(_NUMPY_TYPES[name])
    return np.frombuffer(bufs[1], dtype=dtype, count=len(c), offset=c.offset * dtype.itemsize)


_ZEROS: dict[str, Any] = {}


def zero_scalar(arrow_type: Any) -> Any:
    """The zero of an Arrow type (0, False, "" or b"") as a pyarrow scalar, taken from an array built from
    buffers: ``pa.scalar``, which pyarrow calls for a Python value given where a scalar is
    expected (``fill_null(0)``, a separator ``b""``), imports pandas on its first call."""
    name = str(arrow_type)
    if name not in _ZEROS:
        import pyarrow as pa

        if name in ("string", "binary"):
            zero = _bytes_array(arrow_type, [b""])
        elif name == "bool":
            zero = pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(b"\x00")])
        else:
            zero = pa.Array.from_buffers(arrow_type, 1, [None, pa.py_buffer(np.zeros(1, dtype=_NUMPY_TYPES[name]))])
        _ZEROS[name] = zero[0]
    return _ZEROS[name]


def filled(c: Any) -> Any:
    """``c`` with its nulls replaced by the zero of its type (:func:`zero_scalar`); ``c`` itself if it has none."""
    return c if c.null_count == 0 else c.fill_null(zero_scalar(c.type))


def _valid_mask(c: Any, n: int) -> np.ndarray:
    if c.null_count == 0:
        return np.ones(n, dtype=bool)
    return numpy_of(c.is_valid())


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64, copy=False)
    return (v.view(np.uint64) << np.uint64(1)) ^ (v >> np.int64(63)).view(np.uint64)


_LIMITS = [np.uint64(1) << np.uint64(7 * k) for k in range(1, 10)]


def _varint_sizes(z: np.ndarray) -> np.ndarray:
    size = np.ones(len(z), dtype=np.int64)
    if len(z) == 0:
        return size
    top = int(z.max())
    for lim in _LIMITS:
        if top < int(lim):
            break
        size += z >= lim
    return size


def _varints(cols: list[tuple[np.ndarray, np.ndarray | None]], n: int, pa: ModuleType) -> Any:
    """A binary array whose row ``i`` is the varints of ``z[i]`` of every column (``present`` rows only)."""
    sizes = []
    row_len = np.zeros(n, dtype=np.int64)
    for z, present in cols:
        s = _varint_sizes(z)
        if present is not None:
            s = np.where(present, s, 0)
        sizes.append(s)
        row_len += s
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(row_len, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    pos = offsets[:-1].copy()
    for (z, _), s in zip(cols, sizes):
        top = int(s.max()) if n else 0
        for k in range(top):
            if k == 0 and s.min() == 1 and top == 1:
                out[pos] = z.astype(np.uint8)  # one byte each, the common case (< 128)
                break
            m = s > k
            zk = (z[m] >> np.uint64(7 * k)) & np.uint64(0x7F)
            more = (s[m] > k + 1).astype(np.uint64) << np.uint64(7)
            out[pos[m] + k] = (zk | more).astype(np.uint8)
        pos += s
    if offsets[-1] >= 2**31:
        return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out)])
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                        pa.py_buffer(out)])


class BinaryPlan:
    """The fast path of a binary dialect (:mod:`event_etl.payloads`): a chunk of payloads read as columns by the
    dialect (a Protobuf message's fields, an Avro datum's), then checked and encoded as a chunk of JSON lines is
    (:meth:`FastPlan.from_columns`), so that both paths write the same bytes.  Any payload the columns cannot take
    (another writer schema, a frame cut short, a message that does not parse) sends the chunk to the record path,
    which explains each bad one."""

    binary = True

    def __init__(self, plan: FastPlan, read: Callable[[Sequence[bytes]], tuple[dict[str, Any], int] | None],
                 dropped: Callable[[int], None] | None = None) -> None:
        """``read``: the payloads as columns and the fields it dropped (the descriptor did not know them), or None;
        ``dropped``: told that count once the chunk is taken (a chunk the record path takes counts them there)."""
        self.plan, self.read, self.dropped = plan, read, dropped

    def decode(self, data: bytes) -> FastChunk | None:
        """A binary plan reads payloads, not lines of JSON (:meth:`decode_payloads`)."""
        return None

    def decode_payloads(self, payloads: Sequence[bytes], starts: np.ndarray, ends: np.ndarray) -> FastChunk | None:
        """The chunk's records, if every payload is a valid record; else ``None``.  ``starts``/``ends``: where each
        payload lies in the piece's data (a message's bytes, or a file's base64 line)."""
        if not payloads:
            return None
        sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        if sizes.min() == 0 or sizes.max() > self.plan.max_bytes:
            return None  # an empty or oversized payload: the record path says so
        got = self.read(payloads)
        if got is None:
            return None
        cols, unknown = got
        fc = self.plan.from_columns(cols, len(payloads), starts, ends)
        if fc is not None and unknown and self.dropped is not None:
            self.dropped(unknown)
        return fc


def _protobuf_columns(decoder: Decoder) -> Callable[[Sequence[bytes]], tuple[dict[str, Any], int] | None]:
    """A Protobuf type's messages as columns (:meth:`event_etl.payloads.protobuf.ProtoDecoder.columns`), with the
    fields it dropped."""

    def read(payloads: Sequence[bytes]) -> tuple[dict[str, Any], int] | None:
        return cast("tuple[dict[str, Any], int] | None", decoder.proto.columns(payloads))

    return read


def _count_dropped(decoder: Decoder) -> Callable[[int], None]:
    """The fields a taken chunk dropped, counted by the decoder as the record path counts them."""

    def dropped(n: int) -> None:
        decoder.unknown_fields += n

    return dropped


def _confluent_columns(decoder: Decoder) -> Callable[[Sequence[bytes]], tuple[dict[str, Any], int] | None] | None:
    """Confluent frames of the type's own schema (one registry id, whose schema is the type's) as columns
    (:class:`event_etl.payloads.avrocolumns.DatumColumns`); None when the schema is not flat."""
    from event_etl.payloads.avrocolumns import DatumColumns

    columns = DatumColumns.of(decoder.event_type.schema)
    if columns is None:
        return None

    def read(payloads: Sequence[bytes]) -> tuple[dict[str, Any], int] | None:
        head = payloads[0][:5]
        if len(head) < 5 or head[0] != 0 or any(p[:5] != head for p in payloads):
            return None  # not one registry id for the whole chunk (or not a frame): the record path
        w = decoder.writers.avro_by_id(int.from_bytes(head[1:5], "big"))
        if w is None or not w.same:
            return None
        sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
        ends = np.cumsum(sizes)
        cols = columns.read(b"".join(payloads), ends - sizes + 5, ends)
        return None if cols is None else (cols, 0)

    return read


_PLANS: dict[tuple[int, bool], FastPlan | BinaryPlan | None] = {}


def plan_for(decoder: Decoder, *, encode: bool = True) -> FastPlan | BinaryPlan | None:
    """The fast plan of a decoder's event type, or ``None`` if its schema needs the record path (``encode``: see
    :class:`FastPlan`): a :class:`FastPlan` for JSON lines, a :class:`BinaryPlan` for a binary dialect's payloads."""
    key = (id(decoder), encode)
    if key not in _PLANS:
        fields = _fields_of(decoder)
        tf = decoder.event_type.time_field
        et = decoder.event_type
        ok = fields is not None and any(f.name == tf and f.kind == "long" for f in fields) and (
            et.time_logical_divisor or et.time_format == "epoch_millis")
        plan = FastPlan(decoder, fields, encode=encode) if ok and fields is not None else None
        _PLANS[key] = _binary_plan(decoder, plan) if et.payload != "json" else plan
    return _PLANS[key]


def _binary_plan(decoder: Decoder, plan: FastPlan | None) -> BinaryPlan | None:
    if plan is None:
        return None
    payload = decoder.event_type.payload
    if payload == "protobuf":
        return BinaryPlan(plan, _protobuf_columns(decoder), _count_dropped(decoder))
    if payload == "confluent":
        read = _confluent_columns(decoder)
        return BinaryPlan(plan, read) if read is not None else None
    return None


def rows_buffer(rows: Any) -> tuple[np.ndarray, memoryview]:
    """The offsets (int64) and data bytes of a binary array."""
    import pyarrow as pa

    bufs = rows.buffers()
    width = 8 if pa.types.is_large_binary(rows.type) else 4
    offs = np.frombuffer(bufs[1], dtype=np.int64 if width == 8 else np.int32, count=len(rows) + 1,
                         offset=rows.offset * width).astype(np.int64)
    data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
    return offs, data


def offset_message_keys(prefix: str, offsets: Sequence[int], which: np.ndarray, arrivals: np.ndarray) -> np.ndarray:
    """:func:`event_etl.task.dedupe.key_hash` ``("m", f"{prefix}{offset}@{arrival}")`` of records ``which`` (message
    ids made of a prefix and an offset, as Kafka's ``topic/partition/offset``), their text made by Arrow rather than
    a Python string per record (``uint64``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import xxhash

    offs = pc.cast(pc.cast(int64_array(np.asarray(offsets, dtype=np.int64)[which]), pa.string()), pa.binary())
    at = pc.cast(pc.cast(int64_array(arrivals), pa.string()), pa.binary())
    head, sep = _bytes_array(pa.binary(), [f"m:{prefix}".encode("utf-8", "surrogatepass"), b"@"])
    joined = pc.binary_join_element_wise(head, offs, sep, at, zero_scalar(pa.binary()))
    return np.fromiter(map(xxhash.xxh3_64_intdigest, joined.to_pylist()), dtype=np.uint64, count=len(which))
