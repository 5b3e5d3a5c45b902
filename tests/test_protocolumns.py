"""Protobuf messages read as columns from their wire format (event_etl.payloads.protocolumns) give what the C
decoder's path of ``ProtoDecoder.columns`` gives, array for array and the same count of unknown fields, and
``None`` wherever that path gives ``None``.

The messages are made as producers make them (upb's ``SerializeToString``), and then as the wire format allows:
fields in any order, a field twice (the last value wins; a Timestamp or a wrapper twice is merged), a varint
longer than it needs (an int32's 10-byte negative, a 5-byte tag), unknown fields between the known ones and inside
a Timestamp (a number the message lacks, or a known one with another wire type)."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from event_etl.payloads.protobuf import ProtoDecoder, ProtoSchema
from event_etl.payloads.protocolumns import WireColumns
from tests.lib.dialects import PAGE_VIEW_PROTO, compile_proto, page_view_message, page_view_record

ROOT = Path(__file__).resolve().parents[1]

KINDS_PROTO = """\
syntax = "proto3";
package wc;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/empty.proto";

enum Color { RED = 0; GREEN = 1; BLUE = 5; }

message All {
  string s = 1;
  int32 i32 = 2;
  int64 i64 = 3;
  uint32 u32 = 4;
  uint64 u64 = 5;
  sint32 s32 = 6;
  sint64 s64 = 7;
  fixed32 f32 = 8;
  fixed64 f64 = 9;
  sfixed32 sf32 = 10;
  sfixed64 sf64 = 11;
  bool b = 12;
  Color color = 13;
  google.protobuf.Timestamp at = 14;
  optional string os = 15;
  optional int32 oi32 = 16;
  optional sint64 os64 = 17;
  optional bool ob = 18;
  optional Color ocolor = 19;
  optional fixed64 of64 = 20;
  google.protobuf.Int64Value w_i64 = 21;
  google.protobuf.UInt64Value w_u64 = 22;
  google.protobuf.Int32Value w_i32 = 23;
  google.protobuf.UInt32Value w_u32 = 24;
  google.protobuf.BoolValue w_bool = 25;
  google.protobuf.StringValue w_str = 26;
  oneof pick { int64 left = 27; string right = 28; google.protobuf.Timestamp when = 29; }
  int32 far = 536870911;
}

message WithEmpty { string id = 1; google.protobuf.Empty nothing = 2; }
message Floats { string id = 1; double d = 2; }
message Plain { string id = 1; int64 n = 2; google.protobuf.Timestamp at = 3; optional string x = 4;
                google.protobuf.StringValue w = 5; }
"""

LEGACY_PROTO = """\
syntax = "proto2";
package wc2;
message Legacy { required string id = 1; optional int32 n = 2 [default = 5]; }
"""

# -- the wire format, written by hand -------------------------------------------------------------------------------
VARINT, FIXED64, LEN, GROUP, FIXED32 = 0, 1, 2, 3, 5


def varint(n: int, *, size: int = 0) -> bytes:
    """``n`` (below 2**64) as a varint, padded with continuation bytes to ``size`` bytes."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n or len(out) + 1 < size:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(number: int, wire: int, *, size: int = 0) -> bytes:
    return varint(number << 3 | wire, size=size)


def delimited(number: int, body: bytes) -> bytes:
    return tag(number, LEN) + varint(len(body)) + body


# -- the schema and its two readers ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def desc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_proto(tmp_path_factory.mktemp("wc"), {"kinds.proto": KINDS_PROTO, "legacy.proto": LEGACY_PROTO})


@pytest.fixture(scope="module")
def kinds(desc: Path) -> ProtoSchema:
    return ProtoSchema.load(desc, "wc.All")


def with_defaults(schema: ProtoSchema) -> dict[str, Any]:
    """The derived schema and fields the message lacks, each with a default."""
    avro = schema.avro_schema(timestamp="millis")
    avro["fields"] += [{"name": "source", "type": "string", "default": "web"},
                       {"name": "note", "type": ["null", "string"], "default": None},
                       {"name": "count", "type": "long", "default": -7},
                       {"name": "flag", "type": "boolean", "default": True},
                       {"name": "shade", "type": {"type": "enum", "name": "Shade", "symbols": ["DARK", "LIGHT"]},
                        "default": "LIGHT"}]
    return avro


@pytest.fixture(scope="module")
def decoders(kinds: ProtoSchema) -> list[ProtoDecoder]:
    return [kinds.decoder(), kinds.decoder(with_defaults(kinds))]


_PLAIN: weakref.WeakKeyDictionary[ProtoDecoder, ProtoDecoder] = weakref.WeakKeyDictionary()
_READERS: weakref.WeakKeyDictionary[ProtoDecoder, WireColumns] = weakref.WeakKeyDictionary()


def upb_columns(decoder: ProtoDecoder, datas: list[bytes]) -> Any:
    """``ProtoDecoder.columns`` by the C decoder alone (a copy of the decoder, its wire reader left out)."""
    if decoder not in _PLAIN:
        plain = pickle.loads(pickle.dumps(decoder))
        plain.__dict__["_wire"] = None  # the cached reader: None takes the other path
        _PLAIN[decoder] = plain
    return _PLAIN[decoder].columns(datas)


def wire_columns(decoder: ProtoDecoder, datas: list[bytes]) -> Any:
    if decoder not in _READERS:
        reader = WireColumns.of(decoder)
        assert reader is not None
        _READERS[decoder] = reader
    return _READERS[decoder].read_messages(datas)


def assert_same(want: Any, got: Any) -> None:
    assert (want is None) == (got is None)
    if want is None:
        return
    assert got[1] == want[1], "unknown fields"
    assert list(got[0]) == list(want[0])
    for name, column in want[0].items():
        assert got[0][name].type == column.type, name
        assert got[0][name].equals(column), (name, got[0][name].to_pylist(), column.to_pylist())


def assert_reads_as_upb(decoder: ProtoDecoder, datas: list[bytes]) -> Any:
    want = upb_columns(decoder, datas)
    assert_same(want, wire_columns(decoder, datas))
    return want


# -- random messages --------------------------------------------------------------------------------------------
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
U32 = st.integers(0, 2**32 - 1)
U63 = st.integers(0, 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
COLORS = st.sampled_from([0, 1, 5])
SECONDS = st.integers(-62_135_596_800, 253_402_300_799)
NANOS = st.integers(0, 999_999_999)
SCALARS: dict[str, Any] = {
    "s": texts, "i32": I32, "i64": I64, "u32": U32, "u64": U63, "s32": I32, "s64": I64, "f32": U32, "f64": U63,
    "sf32": I32, "sf64": I64, "b": st.booleans(), "color": COLORS, "os": texts, "oi32": I32, "os64": I64,
    "ob": st.booleans(), "ocolor": COLORS, "of64": U63, "left": I64, "right": texts, "far": I32,
}
WRAPPERS: dict[str, Any] = {"w_i64": I64, "w_u64": U63, "w_i32": I32, "w_u32": U32, "w_bool": st.booleans(),
                            "w_str": texts}
RAW_VARINTS: dict[str, Any] = {
    # a varint field given any 64 bits: the 32-bit kinds keep the low 32 (an enum's must name a symbol)
    "i32": U64, "u32": U64, "s32": U64, "i64": U64, "s64": U64, "b": U64, "oi32": U64, "os64": U64, "ob": U64,
    "u64": U63, "color": st.sampled_from([0, 1, 5, 2**32 + 5, 2**64 - 2**32 + 1]), "far": U64,
}
UNKNOWN_NUMBERS = st.sampled_from([30, 31, 100, 1000, 2**20, 2**29 - 2])


@st.composite
def unknown_field(draw: st.DrawFn, numbers: Any = UNKNOWN_NUMBERS) -> bytes:
    number = draw(numbers)
    wire = draw(st.sampled_from([VARINT, FIXED64, LEN, FIXED32]))
    if wire == VARINT:
        return tag(number, wire) + varint(draw(U64))
    if wire == LEN:
        return delimited(number, draw(st.binary(max_size=6)))
    width = 8 if wire == FIXED64 else 4
    return tag(number, wire) + draw(st.binary(min_size=width, max_size=width))


@st.composite
def timestamp_body(draw: st.DrawFn) -> bytes:
    """A Timestamp's bytes: seconds, nanos, both or neither, in either order, maybe with unknown fields (a field 1
    as 32-bit is one: the C decoder counts it, it does not refuse it)."""
    parts = []
    if draw(st.booleans()):
        parts.append(tag(1, VARINT) + varint(draw(SECONDS) % 2**64))
    if draw(st.booleans()):
        parts.append(tag(2, VARINT) + varint(draw(NANOS)))
    parts += draw(st.lists(unknown_field(st.sampled_from([1, 2, 3, 99])).filter(
        lambda b: b[0] not in (0x08, 0x10)), max_size=2))
    return b"".join(draw(st.permutations(parts)))


@st.composite
def piece(draw: st.DrawFn, cls: Any) -> bytes:
    """One or a few fields of an ``All``, written by upb or by hand."""
    how = draw(st.sampled_from(["scalar", "scalar", "scalar", "wrapper", "timestamp", "raw", "unknown", "padded"]))
    if how == "scalar":
        name = draw(st.sampled_from(sorted(SCALARS)))
        return bytes(cls(**{name: draw(SCALARS[name])}).SerializeToString())
    if how == "wrapper":
        name = draw(st.sampled_from(sorted(WRAPPERS)))
        m = cls()
        getattr(m, name).SetInParent()  # present, maybe of value zero: an empty wrapper
        if draw(st.booleans()):
            getattr(m, name).value = draw(WRAPPERS[name])
        return bytes(m.SerializeToString())
    if how == "timestamp":
        return delimited(draw(st.sampled_from([14, 29])), draw(timestamp_body()))
    if how == "raw":
        name = draw(st.sampled_from(sorted(RAW_VARINTS)))
        number = cls.DESCRIPTOR.fields_by_name[name].number
        return tag(number, VARINT) + varint(draw(RAW_VARINTS[name]), size=draw(st.integers(0, 10)))
    if how == "padded":
        return tag(1, LEN, size=5) + varint(len(b"pad")) + b"pad"
    return draw(unknown_field())


@st.composite
def messages(draw: st.DrawFn, cls: Any) -> bytes:
    return b"".join(draw(st.lists(piece(cls), max_size=14)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_messages_read_as_upb_reads_them(kinds: ProtoSchema, decoders: list[ProtoDecoder],
                                                data: st.DataObject) -> None:
    datas = data.draw(st.lists(messages(kinds.message_class), max_size=8))
    for decoder in decoders:
        assert assert_reads_as_upb(decoder, datas) is not None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(datas=st.lists(st.binary(max_size=24), max_size=4))
def test_random_bytes_are_never_read_otherwise(decoders: list[ProtoDecoder], datas: list[bytes]) -> None:
    """Bytes of no message: where both read them, the same; where the C decoder's path refuses, so does the wire's
    (which refuses a group too: an unknown field to the C decoder)."""
    for decoder in decoders:
        want, got = upb_columns(decoder, datas), wire_columns(decoder, datas)
        if got is not None or want is None:
            assert_same(want, got)
        else:
            assert any(has_group(d) for d in datas)


MESSAGE_FIELDS = {14, 21, 22, 23, 24, 25, 26, 29}


def has_group(data: bytes, *, inner: bool = False) -> bool:
    """Whether a message the C decoder parsed holds a group, in it or in one of its Timestamps or wrappers."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == GROUP:
            return True
        if wire == VARINT:
            pos = read_varint(data, pos)[1]
        elif wire == LEN:
            size, pos = read_varint(data, pos)
            if not inner and number in MESSAGE_FIELDS and has_group(data[pos:pos + size], inner=True):
                return True
            pos += size
        else:
            pos += 8 if wire == FIXED64 else 4
    return False


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if b < 0x80:
            return value, pos


def full(cls: Any) -> Any:
    """An ``All`` with every field set to a value far from zero."""
    m = cls(s="héllo ✓", i32=-5, i64=-(2**63), u32=2**32 - 1, u64=2**63 - 1, s32=-(2**31), s64=2**63 - 1,
            f32=2**32 - 1, f64=2**63 - 1, sf32=-(2**31), sf64=-(2**63), b=True, color=5, os="", oi32=0, os64=-1,
            ob=False, ocolor=0, of64=7, right="r", far=-1)
    m.at.seconds, m.at.nanos = -62_135_596_800, 999_999_999
    for name, value in [("w_i64", -1), ("w_u64", 2**63 - 1), ("w_i32", -(2**31)), ("w_u32", 2**32 - 1),
                        ("w_bool", True), ("w_str", "ünï")]:
        getattr(m, name).value = value
    return m


def test_every_kind_zero_and_full_and_shuffled(kinds: ProtoSchema, decoders: list[ProtoDecoder]) -> None:
    cls = kinds.message_class
    whole = bytes(full(cls).SerializeToString())
    fields = [bytes(cls(**{n: getattr(full(cls), n)}).SerializeToString()) for n in SCALARS if n != "left"]
    shuffled = list(fields)
    random.Random(7).shuffle(shuffled)
    datas = [whole, b"", b"".join(shuffled), bytes(cls().SerializeToString()), whole + whole]
    for decoder in decoders:
        columns, unknown = assert_reads_as_upb(decoder, datas)
        assert unknown == 0
    columns, _ = wire_columns(decoders[1], datas)
    assert columns["i32"].to_pylist()[:2] == [-5, 0] and columns["os"].to_pylist()[:2] == ["", None]
    assert columns["at"].to_pylist()[:2] == [-62_135_596_800_000 + 999, None]
    assert columns["shade"].to_pylist() == ["LIGHT"] * 5 and columns["note"].null_count == 5


def test_last_value_wins_and_messages_merge(kinds: ProtoSchema, decoders: list[ProtoDecoder]) -> None:
    cls = kinds.message_class
    t1, t2 = cls(), cls()
    t1.at.seconds, t2.at.nanos = 100, 5_000_000
    w1, w2 = cls(), cls()
    w1.w_str.value = "kept"
    w2.w_str.SetInParent()
    seconds, nanos = delimited(29, tag(1, VARINT) + varint(9)), delimited(29, tag(2, VARINT) + b"\x07")
    datas = [
        bytes(cls(s="a", i32=1).SerializeToString() + cls(s="b", i32=2).SerializeToString()),
        bytes(t1.SerializeToString() + t2.SerializeToString()),  # at: 100 s and 5 ms
        bytes(w1.SerializeToString() + w2.SerializeToString()),  # an empty StringValue merges: its value stays
        bytes(cls(left=3).SerializeToString() + cls(right="x").SerializeToString()),  # a oneof: the last member
        bytes(cls(right="\xff").SerializeToString() + cls(left=4).SerializeToString()),
        # when (9 s), left, when (7 ns): a new Timestamp; when twice: merged
        seconds + tag(27, VARINT) + varint(1) + nanos,
        seconds + nanos,
    ]
    for decoder in decoders:
        assert_reads_as_upb(decoder, datas)
    columns, _ = wire_columns(decoders[0], datas)
    assert columns["s"].to_pylist()[0] == "b" and columns["i32"].to_pylist()[0] == 2
    assert columns["at"].to_pylist()[1] == 100_005_000
    assert columns["w_str"].to_pylist()[2] == w1.w_str.value
    assert columns["left"].to_pylist()[3:5] == [None, 4] and columns["right"].to_pylist()[3:5] == ["x", None]
    assert columns["when"].to_pylist()[5:] == [7 // 1000, 9_000_000]


def test_unknown_fields_are_counted_in_timestamps_and_wrappers(kinds: ProtoSchema,
                                                               decoders: list[ProtoDecoder]) -> None:
    unknown = tag(100, VARINT) + varint(1)
    datas = [unknown + delimited(14, tag(1, VARINT) + b"\x05" + tag(1, FIXED32) + b"\0\0\0\0" + unknown),
             delimited(21, tag(1, VARINT) + b"\x02" + delimited(7, b"xyz")) + unknown * 3]
    for decoder in decoders:
        _columns, count = assert_reads_as_upb(decoder, datas)
        assert count == 3 + 4


def page(cls: Any, n: int) -> list[bytes]:
    rng = random.Random(5)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789/:.-_ é✓"

    def text(k: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, k)))

    def maybe(v: Any) -> Any:
        return v if rng.random() < 0.6 else None

    out = []
    for _ in range(n):
        rec = page_view_record(rng.randint(-62_135_596_800_000, 253_402_300_799_999), eid=text(36),
                               user_id=maybe(text(12)), anonymous_id=text(12), session_id=text(20),
                               product_id=text(10), product_category=maybe(text(16)),
                               price_minor=maybe(rng.randint(-(2**63), 2**63 - 1)), currency=maybe(text(3)),
                               page_url="https://shop.example.com/p/" + text(30), referrer_url=maybe(text(40)),
                               device_type=rng.choice(["DESKTOP", "MOBILE", "TABLET", "OTHER"]),
                               country=maybe(text(2)))
        out.append(bytes(page_view_message(cls, rec).SerializeToString()))
    return out


def test_page_views(tmp_path: Path) -> None:
    schema = ProtoSchema.load(compile_proto(tmp_path, {"page_view.proto": PAGE_VIEW_PROTO}),
                              "shop.events.ProductPageViewed")
    decoder = schema.decoder(schema.avro_schema(timestamp="millis"))
    datas = page(schema.message_class, 10_000)
    columns, unknown = assert_reads_as_upb(decoder, datas)
    assert unknown == 0 and len(columns["event_id"]) == 10_000
    got = decoder.columns(datas)  # through the hook: the wire reader's
    assert got is not None
    assert_same((columns, unknown), got)
    assert "_wire" in decoder.__dict__ and decoder.__dict__["_wire"] is not None
    again = pickle.loads(pickle.dumps(decoder))  # the reader is not pickled, it is made again
    assert "_wire" not in again.__dict__
    assert_same(got, again.columns(datas))


# -- what is refused ---------------------------------------------------------------------------------------------
GOOD = delimited(1, b"ok") + tag(2, VARINT) + varint(1)
BAD: dict[str, bytes] = {
    "truncated varint": GOOD + tag(2, VARINT) + b"\x80",
    "truncated fixed": GOOD + tag(8, FIXED32) + b"\x01\x02",
    "truncated tag": GOOD + b"\x80",
    "length past the end": GOOD + tag(1, LEN) + varint(9) + b"abc",
    "length past a timestamp's end": delimited(14, tag(1, LEN) + varint(5) + b"ab"),
    "varint of 11 bytes": tag(3, VARINT) + b"\x80" * 10 + b"\x01",
    "tag of 6 bytes": tag(3, VARINT, size=6) + b"\x01",
    "length of 6 bytes": tag(1, LEN) + varint(1, size=6) + b"a",
    "length of 2**31-1": tag(1, LEN) + varint(2**31 - 1) + b"a",
    "field number 0": b"\x00\x01",
    "wire type 6": tag(40, 6) + b"\x01",
    "wire type 7": tag(40, 7),
    "known field as 32-bit": tag(2, FIXED32) + b"\0\0\0\0",
    "string as varint": tag(1, VARINT) + b"\x01",
    "int as length-delimited": delimited(3, b"\x01"),
    "timestamp as varint": tag(14, VARINT) + b"\x01",
    "wrapper as 64-bit": tag(21, FIXED64) + b"\0" * 8,
    "unknown group": tag(40, GROUP) + tag(40, 4),
    "known group": tag(3, GROUP) + tag(3, 4),
    "group in a timestamp": delimited(14, tag(5, GROUP) + tag(5, 4)),
    "end group": tag(40, 4),
    "invalid utf-8": delimited(1, b"\xff"),
    "surrogate": delimited(15, b"\xed\xa0\x80"),
    "overlong": delimited(28, b"\xc0\xaf"),
    "invalid utf-8 replaced": delimited(1, b"\xff") + delimited(1, b"fine"),
    "invalid utf-8 in a cleared oneof": delimited(28, b"\xff") + tag(27, VARINT) + b"\x01",
    "invalid utf-8 in a wrapper": delimited(26, delimited(1, b"a\xfe")),
    "enum without a symbol": tag(13, VARINT) + varint(3),
    "optional enum without a symbol": tag(19, VARINT) + varint(2**64 - 1),
    "uint64 above 2**63-1": tag(5, VARINT) + varint(2**63),
    "fixed64 above 2**63-1": tag(9, FIXED64) + (2**64 - 1).to_bytes(8, "little"),
    "wrapped uint64 above 2**63-1": delimited(22, tag(1, VARINT) + varint(2**64 - 1)),
    "timestamp before year 1": delimited(14, tag(1, VARINT) + varint(2**64 - 62_135_596_801)),
    "timestamp after year 9999": delimited(29, tag(1, VARINT) + varint(253_402_300_800)),
    "negative nanos": delimited(14, tag(2, VARINT) + varint(2**64 - 1)),
    "nanos of a second": delimited(14, tag(2, VARINT) + varint(1_000_000_000)),
}
CAUTIOUS = {"unknown group", "group in a timestamp"}
"""What the C decoder's path reads (an unknown group: one unknown field) but the wire reader leaves to it."""


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_message_among_good_ones_gives_none(kinds: ProtoSchema, decoders: list[ProtoDecoder],
                                                  case: str) -> None:
    cls = kinds.message_class
    bad = BAD[case]
    good = [bytes(full(cls).SerializeToString()), b""]
    for decoder in decoders:
        assert wire_columns(decoder, [*good, bad]) is None
        if case in CAUTIOUS:
            assert upb_columns(decoder, [*good, bad]) is not None
            assert decoder.columns([*good, bad]) is not None  # the hook falls back to the C decoder
        else:
            assert upb_columns(decoder, [*good, bad]) is None  # the same answer as the C decoder's path
        assert wire_columns(decoder, good) is not None


def test_bits_of_a_varint_beyond_64_are_dropped_as_upb_drops_them(decoders: list[ProtoDecoder]) -> None:
    datas = [tag(3, VARINT) + b"\xff" * 9 + b"\x7f", tag(2, VARINT) + b"\x85" + b"\x80" * 8 + b"\x7e",
             tag(4, VARINT) + b"\xff" * 9 + b"\x01"]
    for decoder in decoders:
        columns, _ = assert_reads_as_upb(decoder, datas)
        assert columns["i64"].to_pylist()[0] == -1 and columns["i32"].to_pylist()[1] == 5
        assert columns["u32"].to_pylist()[2] == 2**32 - 1


def test_every_prefix_of_a_message(kinds: ProtoSchema, decoders: list[ProtoDecoder]) -> None:
    whole = bytes(full(kinds.message_class).SerializeToString())
    for k in range(len(whole)):
        assert_same(upb_columns(decoders[0], [whole[:k]]), wire_columns(decoders[0], [whole[:k]]))


def test_messages_anywhere_in_a_buffer(kinds: ProtoSchema, decoders: list[ProtoDecoder]) -> None:
    """Bounds out of buffer order, with gaps and a message read twice: the strings are gathered, not taken."""
    cls = kinds.message_class
    datas = [bytes(cls(s=f"m{i}", os="é" * i, w_str={"value": str(i)}).SerializeToString()) for i in range(4)]
    buf = b"junk" + b"".join(d + b"\xff" for d in datas)
    starts = 4 + np.cumsum([0] + [len(d) + 1 for d in datas[:-1]])
    ends = starts + [len(d) for d in datas]
    order = np.array([3, 1, 1, 0, 2])
    reader = WireColumns.of(decoders[0])
    assert reader is not None
    got = reader.read(buf, starts[order], ends[order])
    assert_same(upb_columns(decoders[0], [datas[i] for i in order]), got)
    with pytest.raises(ValueError, match="outside the buffer"):
        reader.read(buf, np.array([0]), np.array([len(buf) + 1]))


def test_zero_messages(decoders: list[ProtoDecoder]) -> None:
    for decoder in decoders:
        assert_reads_as_upb(decoder, [])


def test_messages_it_leaves_to_the_c_decoder(desc: Path, kinds: ProtoSchema) -> None:
    """A field outside the plan (an Empty), a proto2 required field: no reader, and columns still answer; a message
    that is not flat: neither."""
    for name, datas in [("wc.WithEmpty", [b"\x0a\x01a\x12\x00"]), ("wc2.Legacy", [b"\x0a\x01a"])]:
        decoder = ProtoSchema.load(desc, name).decoder()
        assert decoder.flat and WireColumns.of(decoder) is None
        assert decoder.columns(datas) is not None
    floats = ProtoSchema.load(desc, "wc.Floats").decoder()
    assert not floats.flat and WireColumns.of(floats) is None


def test_reading_does_not_import_pandas(desc: Path) -> None:
    """pyarrow imports pandas at the first ``pa.array`` or ``to_numpy`` (~0.25 s in a fresh worker): the reader uses
    neither (a decoder of a message without enums is made without them too)."""
    code = (
        "import sys\n"
        "from event_etl.payloads.protobuf import ProtoSchema\n"
        f"schema = ProtoSchema.load({str(desc)!r}, 'wc.Plain')\n"
        "decoder = schema.decoder()\n"
        "before = 'pandas' in sys.modules\n"
        "m = schema.message_class(id='a', n=-1, x='b')\n"
        "m.at.seconds = 5\n"
        "m.w.value = 'c'\n"
        "assert decoder._wire is not None\n"
        "assert decoder._wire.read_messages([m.SerializeToString()] * 3 + [b'']) is not None\n"
        "assert decoder._wire.read_messages([]) is not None\n"
        "assert decoder._wire.read_messages([b'\\x0a\\x01\\xff']) is None\n"
        "print(before, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_arrow_types_are_the_c_decoders(decoders: list[ProtoDecoder], kinds: ProtoSchema) -> None:
    columns, _ = wire_columns(decoders[1], [bytes(full(kinds.message_class).SerializeToString())])
    types = {n: c.type for n, c in columns.items()}
    assert types["s"] == pa.string() and types["u64"] == pa.int64() and types["b"] == pa.bool_()
    assert types["color"] == pa.string() and types["at"] == pa.int64() and types["w_str"] == pa.string()
    assert types["note"] == pa.string() and types["flag"] == pa.bool_() and types["count"] == pa.int64()
