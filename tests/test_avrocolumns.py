"""Avro datums read as columns give what fastavro gives datum by datum, and ``None`` for any chunk fastavro would
not read as it is written (event_etl.payloads.avrocolumns)."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from event_etl.payloads.avrocolumns import DatumColumns, flat_fields
from event_etl.task.fastpath import _fields_of

ROOT = Path(__file__).resolve().parents[1]
MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)  # datetime.min .. datetime.max, in ms from the epoch
US_RANGE = (-62_135_596_800_000_000, 253_402_300_799_999_999)

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)

# kind -> (Avro type, values, Arrow type of its column)
KINDS = {
    "string": ("string", texts, pa.string()),
    "uuid": ({"type": "string", "logicalType": "uuid"}, st.uuids().map(str), pa.string()),
    "bytes": ("bytes", st.binary(max_size=40), pa.binary()),
    "long": ("long", longs, pa.int64()),
    "ts_millis": ({"type": "long", "logicalType": "timestamp-millis"}, st.integers(*MS_RANGE), pa.int64()),
    "ts_micros": ({"type": "long", "logicalType": "timestamp-micros"}, st.integers(*US_RANGE), pa.int64()),
    "local_ms": ({"type": "long", "logicalType": "local-timestamp-millis"}, st.integers(*MS_RANGE), pa.int64()),
    "int": ("int", ints, pa.int64()),
    "boolean": ("boolean", st.booleans(), pa.bool_()),
    "float": ("float", st.floats(width=32), pa.float32()),
    "double": ("double", st.floats(), pa.float64()),
    "enum": (None, None, pa.string()),  # a new named enum, or a reference to one defined before
}


def plain(t):
    """An Avro type without its logical types: fastavro then reads the integers and the text that were written."""
    if isinstance(t, list):
        return [plain(b) for b in t]
    if isinstance(t, dict) and t.get("type") in ("long", "string") and "logicalType" in t:
        return t["type"]
    return t


def write(schema, records):
    parsed = fastavro.parse_schema(schema)
    out = []
    for rec in records:
        bio = io.BytesIO()
        fastavro.schemaless_writer(bio, parsed, rec)
        out.append(bio.getvalue())
    return out


def reference(schema, datum):
    """fastavro's reading of one datum (raw values), and that it read the datum whole."""
    plain_schema = {**schema, "fields": [{**f, "type": plain(f["type"])} for f in schema["fields"]]}
    bio = io.BytesIO(datum)
    rec = fastavro.schemaless_reader(bio, fastavro.parse_schema(plain_schema), None)
    assert bio.tell() == len(datum)
    return rec


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@st.composite
def flat_schemas(draw):
    """A flat record schema and a strategy of its records."""
    fields, values, types, enums = [], {}, {}, {}
    for i in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(sorted(KINDS)))
        avro, strategy, arrow_type = KINDS[kind]
        if kind == "enum":
            if enums and draw(st.booleans()):
                avro = draw(st.sampled_from(sorted(enums)))  # a reference by name
                symbols = enums[avro]
            else:
                symbols = draw(st.lists(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True), min_size=1,
                                        max_size=5, unique=True))
                avro = {"type": "enum", "name": f"E{i}", "symbols": symbols}
                enums[f"E{i}"] = symbols
            strategy = st.sampled_from(symbols)
        name = f"f{i}_{kind}"
        if draw(st.booleans()):
            avro = ["null", avro] if draw(st.booleans()) else [avro, "null"]
            strategy = st.none() | strategy
        field = {"name": name, "type": avro}
        if draw(st.booleans()) and isinstance(avro, list) and avro[0] == "null":
            field["default"] = None
        fields.append(field)
        values[name], types[name] = strategy, arrow_type
    schema = {"type": "record", "name": "Flat", "namespace": "t", "fields": fields}
    return schema, st.fixed_dictionaries(values), types


def layout(datas, junk, order):
    """The datums in a buffer, in ``order``, each after a junk header (a frame): the buffer, starts, ends."""
    buf = bytearray()
    starts = np.zeros(len(datas), dtype=np.int64)
    ends = np.zeros(len(datas), dtype=np.int64)
    for k, i in enumerate(order):
        buf += junk[k % len(junk)]
        starts[i] = len(buf)
        buf += datas[i]
        ends[i] = len(buf)
    buf += junk[-1]
    return bytes(buf), starts, ends


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_columns_are_what_fastavro_reads_datum_by_datum(data):
    schema, records_of, types = data.draw(flat_schemas())
    records = data.draw(st.lists(records_of, max_size=20))
    datas = write(schema, records)
    junk = data.draw(st.lists(st.binary(max_size=12), min_size=1, max_size=4))
    in_order = data.draw(st.booleans())
    order = list(range(len(datas))) if in_order else data.draw(st.permutations(range(len(datas))))
    buf, starts, ends = layout(datas, junk, order)
    reader = DatumColumns.of(schema)
    assert reader is not None
    view = memoryview(buf) if data.draw(st.booleans()) else buf
    cols = reader.read(view, starts, ends)
    assert cols is not None
    expected = [reference(schema, d) for d in datas]
    assert list(cols) == [f["name"] for f in schema["fields"]]
    for name, col in cols.items():
        assert col.type == types[name], name
        assert len(col) == len(records)
        col.validate(full=True)
        got = col.to_pylist()
        assert all(same(e[name], g) for e, g in zip(expected, got)), (name, got, [e[name] for e in expected])
    joined = reader.read_records(datas)
    assert joined is not None
    assert all(all(map(same, joined[k].to_pylist(), cols[k].to_pylist())) for k in cols)  # NaN != NaN in equals()


# -- each bad datum gives None ----------------------------------------------------------------------
BAD_SCHEMA = {
    "type": "record", "name": "Bad", "namespace": "t",
    "fields": [
        {"name": "s", "type": "string"},
        {"name": "n", "type": ["null", "long"], "default": None},
        {"name": "i", "type": "int"},
        {"name": "b", "type": "boolean"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "d", "type": ["double", "null"]},
    ],
}
GOOD = {"s": "é", "n": 7, "i": -3, "b": True, "e": "B", "t": 1_795_225_200_000,
        "u": "123e4567-e89b-12d3-a456-426614174000", "d": 1.5}


def with_field(name, avro_type):
    """BAD_SCHEMA with one field's type replaced: a writer whose datums BAD_SCHEMA's reader must refuse."""
    return {**BAD_SCHEMA, "fields": [{"name": name, "type": avro_type} if f["name"] == name else f
                                     for f in BAD_SCHEMA["fields"]]}


LIARS = {  # what a liar writes -> (the field, its type in the writer's schema, the value)
    "an enum index too large": ("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}, "C"),
    "an int over 32 bits": ("i", "long", 2**31),
    "an int under 32 bits": ("i", "long", -(2**31) - 1),
    "a boolean byte 2": ("b", "int", 1),  # zig-zag 1 is the byte 2
    "bad UTF-8": ("s", "bytes", b"ok\xff"),
    "a surrogate in UTF-8": ("s", "bytes", b"\xed\xa0\x80"),
    "an overlong UTF-8 form": ("s", "bytes", b"\xc0\x80"),
    "a union branch index 2": ("n", ["null", "long", "string"], "x"),
    "a union branch index -1": ("n", "long", -1),
    "a negative string length": ("s", "long", -1),
    "a timestamp past year 9999": ("t", "long", MS_RANGE[1] + 1),
    "a timestamp before year 1": ("t", "long", MS_RANGE[0] - 1),
    "an uppercase uuid": ("u", "string", "123E4567-E89B-12D3-A456-426614174000"),
    "a uuid without dashes": ("u", "string", "123e4567e89b12d3a456426614174000"),
    "a double cut short": ("d", ["float", "null"], 1.5),  # 4 bytes where 8 are read
}


@pytest.mark.parametrize("case", sorted(LIARS))
def test_a_bad_datum_among_good_ones_gives_none(case):
    name, avro_type, value = LIARS[case]
    good = write(BAD_SCHEMA, [GOOD, GOOD])
    bad = write(with_field(name, avro_type), [{**GOOD, name: value}])[0]
    reader = DatumColumns.of(BAD_SCHEMA)
    assert reader.read_records(good) is not None
    assert reader.read_records([good[0], bad, good[1]]) is None
    with pytest.raises((ValueError, IndexError, EOFError, UnicodeDecodeError, OverflowError, AssertionError)):
        reference_logical(bad)


def reference_logical(datum):
    """fastavro's reading with the logical types, as the record path reads (which the caller falls back to): it
    refuses most of the liars' datums, and reads the others as no valid datum is read (a boolean byte 2 as True, an
    int beyond 32 bits, a uuid rewritten in its canonical form), which the asserts here catch."""
    bio = io.BytesIO(datum)
    rec = fastavro.schemaless_reader(bio, fastavro.parse_schema(BAD_SCHEMA), None)
    assert bio.tell() == len(datum)
    assert rec["b"] in (True, False) and rec["u"] == GOOD["u"] and -(2**31) <= rec["i"] < 2**31
    return rec


def test_a_datum_cut_short_or_with_a_byte_left_over_gives_none():
    good = write(BAD_SCHEMA, [GOOD, GOOD, GOOD])
    reader = DatumColumns.of(BAD_SCHEMA)
    buf, starts, ends = layout(good, [b"\x00" * 12], [0, 1, 2])
    assert reader.read(buf, starts, ends) is not None
    for i in range(3):
        short = ends.copy()
        short[i] -= 1  # the rest of it, and the zero bytes after, lie beyond its end
        assert reader.read(buf, starts, short) is None
        long = ends.copy()
        long[i] += 1  # a zero byte left over after the datum
        assert reader.read(buf, starts, long) is None
    assert reader.read_records([*good[:2], good[2][:-1]]) is None  # the chunk's last datum truncated
    assert reader.read_records([*good[:2], good[2] + b"\x00"]) is None
    assert reader.read_records([*good[:2], b""]) is None


@pytest.mark.parametrize(("datum", "ok"), [
    (b"\xff" * 9 + b"\x01", True),  # ten bytes: -2**63
    (b"\xfe" + b"\xff" * 8 + b"\x01", True),  # ten bytes: 2**63 - 1
    (b"\xff" * 10 + b"\x01", False),  # eleven bytes
    (b"\xff" * 9 + b"\x02", False),  # ten bytes, beyond 64 bits
    (b"\x80" * 9, False),  # cut short
])
def test_long_varints(datum, ok):
    schema = {"type": "record", "name": "L", "fields": [{"name": "v", "type": "long"}]}
    cols = DatumColumns.of(schema).read_records([b"\x02", datum])
    assert (cols is not None) == ok
    if ok:
        assert cols["v"].to_pylist() == [1, reference(schema, datum)["v"]]


@pytest.mark.parametrize("logical", ["timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                                     "local-timestamp-micros"])
def test_timestamps_are_read_as_far_as_fastavro_reads_them(logical):
    schema = record({"type": "long", "logicalType": logical})
    lo, hi = MS_RANGE if logical.endswith("millis") else US_RANGE
    reader = DatumColumns.of(schema)
    for v in (lo - 1, lo, hi, hi + 1):
        datum = write(record("long"), [{"f0": v}])[0]
        try:
            fastavro.schemaless_reader(io.BytesIO(datum), fastavro.parse_schema(schema), None)
            fastavro_reads = True
        except OverflowError:
            fastavro_reads = False
        cols = reader.read_records([datum])
        assert (cols is not None) == fastavro_reads == (lo <= v <= hi)
        assert cols is None or cols["f0"].to_pylist() == [v]


# -- which schemas are flat --------------------------------------------------------------------------
def record(*types, **field):
    return {"type": "record", "name": "R", "fields": [{"name": f"f{i}", "type": t, **field}
                                                      for i, t in enumerate(types)]}


NOT_FLAT = {
    "a nested record": record({"type": "record", "name": "In", "fields": [{"name": "x", "type": "long"}]}),
    "an array": record({"type": "array", "items": "long"}),
    "a map": record({"type": "map", "values": "string"}),
    "a union of two non-null types": record(["long", "string"]),
    "a union of three types": record(["null", "long", "string"]),
    "a union of null alone": record(["null"]),
    "a union of two nulls": record(["null", "null"]),
    "a union in a union": record(["null", ["null", "long"]]),
    "a nullable record": record(["null", {"type": "record", "name": "In", "fields": []}]),
    "a fixed": record({"type": "fixed", "name": "F", "size": 4}),
    "an int date": record({"type": "int", "logicalType": "date"}),
    "a long time-micros": record({"type": "long", "logicalType": "time-micros"}),
    "a bytes decimal": record({"type": "bytes", "logicalType": "decimal", "precision": 4}),
    "a string of an unknown logical type": record({"type": "string", "logicalType": "ip"}),
    "a null field": record("null"),
    "an unknown name": record("Nowhere"),
    "not a record": {"type": "enum", "name": "E", "symbols": ["A"]},
    "a bare type": "long",
    "two fields of one name": {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
                                                                        {"name": "a", "type": "int"}]},
}


@pytest.mark.parametrize("case", sorted(NOT_FLAT))
def test_a_schema_that_is_not_flat_gives_no_reader(case):
    assert DatumColumns.of(NOT_FLAT[case]) is None


def test_defaults_do_not_matter_to_a_datum():
    """The writer wrote every field, so a default is never read: a schema with defaults is read; JSON, where a
    field may be missing, refuses them (defaults=False: the fast path's rule)."""
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "string", "default": "x"},
        {"name": "b", "type": ["long", "null"], "default": 5},
        {"name": "c", "type": ["null", "long"], "default": None},
    ]}
    reader = DatumColumns.of(schema)
    assert reader is not None
    cols = reader.read_records(write(schema, [{"a": "y", "b": None, "c": 2}]))
    assert {k: v.to_pylist() for k, v in cols.items()} == {"a": ["y"], "b": [None], "c": [2]}
    assert flat_fields(schema, defaults=False) is None
    assert flat_fields({**schema, "fields": schema["fields"][2:]}, defaults=False) is not None


JSON_CASES = [  # (schema, the fast path takes it for a JSON type, for a binary dialect's)
    *[(schema, False, False) for schema in NOT_FLAT.values()],
    (json.loads((ROOT / "event_types/page_view/schema.avsc").read_text()), True, True),
    (BAD_SCHEMA, False, False),  # a double: not a JSON column kind
    (record("bytes"), False, False), (record("float"), False, False), (record(["null", "double"]), False, False),
    (record({"type": "string", "logicalType": "uuid"}, ["null", "boolean"], "int"), True, True),
    (record("string", default="x"), False, True),  # a JSON line may leave it out: then the default, not null
    (record(["long", "null"], default=1), False, True),
    (record(["null", "int"], default=None), True, True),
    ({"type": "record", "name": "R", "fields": [  # an enum named by another spelling of its name
        {"name": "a", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}},
        {"name": "b", "type": ["E", "null"]}, {"name": "c", "type": "t.E"}]}, False, False),
]


@pytest.mark.parametrize(("schema", "json_flat", "binary_flat"), JSON_CASES)
def test_which_schemas_the_fast_path_takes(schema, json_flat, binary_flat):
    """event_etl.task.fastpath takes its fields from flat_fields, of JSON's kinds; a JSON type's field with a
    default other than null takes the record path, a binary dialect's does not (its payload carries every field)."""
    for payload, want in (("json", json_flat), ("protobuf", binary_flat)):
        got = _fields_of(SimpleNamespace(schema=schema, event_type=SimpleNamespace(payload=payload)))
        assert (got is not None) == want, payload
        if got is not None:
            assert [f.name for f in got] == [f["name"] for f in schema["fields"]]


# -- edges --------------------------------------------------------------------------------------------
def test_zero_rows():
    schema = json.loads((ROOT / "event_types/page_view/schema.avsc").read_text())
    reader = DatumColumns.of(schema)
    empty = np.zeros(0, dtype=np.int64)
    for cols in (reader.read(b"", empty, empty), reader.read(b"junk", empty, empty), reader.read_records([])):
        assert list(cols) == [f["name"] for f in schema["fields"]]
        assert all(len(c) == 0 for c in cols.values())
        assert cols["event_time"].type == pa.int64() and cols["device_type"].type == pa.string()
    assert DatumColumns.of(record()).read_records([b"", b""]) == {}
    assert DatumColumns.of(record()).read_records([b"", b"\x00"]) is None


def test_all_null_and_all_present_columns():
    schema = record(["null", "string"], ["null", "long"], ["boolean", "null"], ["null", "float"])
    recs = [{"f0": None, "f1": 1, "f2": None, "f3": None}, {"f0": None, "f1": 2, "f2": None, "f3": None}]
    cols = DatumColumns.of(schema).read_records(write(schema, recs))
    assert {k: v.to_pylist() for k, v in cols.items()} == {
        "f0": [None, None], "f1": [1, 2], "f2": [None, None], "f3": [None, None]}


def test_bounds_outside_the_buffer_are_the_callers_error():
    reader = DatumColumns.of(record("long"))
    with pytest.raises(ValueError, match="outside the buffer"):
        reader.read(b"\x02", np.array([0]), np.array([2]))
    with pytest.raises(ValueError, match="outside the buffer"):
        reader.read(b"\x02\x02", np.array([1]), np.array([0]))
    with pytest.raises(ValueError, match="one length"):
        reader.read(b"\x02", np.array([0]), np.array([1, 1]))


def test_reading_does_not_import_pandas():
    """pyarrow imports pandas at the first ``pa.array``, ``pa.scalar`` or ``to_numpy`` (~0.25 s in a fresh worker)."""
    code = (
        "import io, json, sys, fastavro\n"
        "from event_etl.payloads.avrocolumns import DatumColumns\n"
        f"schema = {BAD_SCHEMA!r}\n"
        "bio = io.BytesIO()\n"
        f"fastavro.schemaless_writer(bio, fastavro.parse_schema(schema), {GOOD!r})\n"
        "reader = DatumColumns.of(schema)\n"
        "assert reader.read_records([bio.getvalue()] * 3) is not None\n"
        "assert reader.read_records([]) is not None\n"
        "assert reader.read_records([b'\\x00']) is None\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
