"""Protobuf payloads (event_etl.payloads.protobuf): the descriptor set, the Avro mapping, decoding, columns.

The .proto files are compiled here with grpc_tools' protoc (its bundled well-known types on the include path);
messages are built with the class the descriptor pool makes: no generated code, as in production.
"""

from __future__ import annotations

import importlib.resources
import io
import math
import pickle
import random
from pathlib import Path
from typing import Any

import fastavro
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from event_etl.errors import ConfigError
from event_etl.payloads.protobuf import ProtoDecodeError, ProtoSchema, ProtoValueError

COMMON = """
syntax = "proto3";
package shop.common;
message Money { string currency = 1; int64 units = 2; }
enum Channel { CHANNEL_UNSPECIFIED = 0; WEB = 1; APP = 2; }
"""

ORDER = """
syntax = "proto3";
package shop;
import "common.proto";
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/empty.proto";
message Order {
  string id = 1;
  int32 qty = 2;
  sint32 s32 = 3;
  sfixed32 f32 = 4;
  uint32 u32 = 5;
  fixed32 x32 = 6;
  int64 n64 = 7;
  sint64 s64 = 8;
  sfixed64 f64 = 9;
  uint64 big = 10;
  fixed64 x64 = 11;
  double price = 12;
  float ratio = 13;
  bool paid = 14;
  bytes blob = 15;
  shop.common.Channel channel = 16;
  repeated string tags = 17;
  map<string, int64> counts = 18;
  map<int32, shop.common.Money> by_id = 19;
  map<bool, string> flags = 20;
  shop.common.Money total = 21;
  repeated shop.common.Money lines = 22;
  oneof pay { string card = 23; int64 points = 24; }
  optional int32 maybe = 25;
  google.protobuf.Timestamp at = 26;
  google.protobuf.Duration took = 27;
  google.protobuf.Int64Value w_i64 = 28;
  google.protobuf.UInt64Value w_u64 = 29;
  google.protobuf.Int32Value w_i32 = 30;
  google.protobuf.UInt32Value w_u32 = 31;
  google.protobuf.BoolValue w_bool = 32;
  google.protobuf.StringValue w_str = 33;
  google.protobuf.BytesValue w_bytes = 34;
  google.protobuf.DoubleValue w_dbl = 35;
  google.protobuf.FloatValue w_flt = 36;
  google.protobuf.Struct attrs = 37;
  google.protobuf.Value value = 38;
  google.protobuf.ListValue list = 39;
  google.protobuf.Empty nothing = 40;
  enum Kind { KIND_UNSPECIFIED = 0; BIG = 1; }
  Kind kind = 41;
  repeated Kind kinds = 42;
  repeated google.protobuf.Timestamp times = 43;
  shop.common.Money refund = 44;
}
"""

LEGACY = """
syntax = "proto2";
package old;
message Legacy {
  required string id = 1;
  optional int32 n = 2 [default = 5];
  message Inner { optional string x = 1; }
  optional Inner inner = 3;
  required Inner must = 4;
}
"""

FLAT = """
syntax = "proto3";
package flat;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
message Click {
  string id = 1;
  string user = 2;
  int64 n = 3;
  int32 k = 4;
  bool ok = 5;
  enum Kind { K0 = 0; K1 = 1; K5 = 5; }
  Kind kind = 6;
  google.protobuf.Timestamp at = 7;
  optional string ref = 8;
  google.protobuf.Int64Value w = 9;
  uint64 u64 = 10;
  uint32 u32 = 11;
  sint32 s32 = 12;
  optional Kind maybe_kind = 13;
  google.protobuf.StringValue ws = 14;
  google.protobuf.BoolValue wb = 15;
  oneof pick { int64 left = 16; string right = 17; }
}
"""

BAD = """
syntax = "proto3";
package bad;
import "google/protobuf/any.proto";
message Node { string name = 1; repeated Node children = 2; }
message Tree { Branch top = 1; }
message Branch { string name = 1; Tree subtree = 2; }
message Holder { string id = 1; google.protobuf.Any payload = 2; }
"""

UNRELATED = """
syntax = "proto3";
package other;
message Unrelated { string x = 1; }
"""

WKT = str(importlib.resources.files("grpc_tools") / "_proto")


def _protoc(src: Path, out: Path, *files: str, imports: bool = True) -> Path:
    args = ["protoc", f"-I{src}", f"-I{WKT}", f"--descriptor_set_out={out}", *[str(src / f) for f in files]]
    if imports:
        args.insert(3, "--include_imports")
    assert protoc.main(args) == 0, args
    return out


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    src = tmp_path_factory.mktemp("proto")
    for name, text in [("common.proto", COMMON), ("order.proto", ORDER), ("legacy.proto", LEGACY),
                       ("flat.proto", FLAT), ("bad.proto", BAD), ("unrelated.proto", UNRELATED)]:
        (src / name).write_text(text)
    return {
        "order": _protoc(src, src / "order.desc", "order.proto"),
        "order+unrelated": _protoc(src, src / "both.desc", "unrelated.proto", "order.proto"),
        "no-imports": _protoc(src, src / "noimports.desc", "order.proto", imports=False),
        "legacy": _protoc(src, src / "legacy.desc", "legacy.proto"),
        "flat": _protoc(src, src / "flat.desc", "flat.proto"),
        "bad": _protoc(src, src / "bad.desc", "bad.proto"),
    }


@pytest.fixture(scope="module")
def order(sets: dict[str, Path]) -> ProtoSchema:
    return ProtoSchema.load(sets["order"], "shop.Order")


@pytest.fixture(scope="module")
def flat(sets: dict[str, Path]) -> ProtoSchema:
    return ProtoSchema.load(sets["flat"], "flat.Click")


def _no_logical(t: Any) -> Any:
    """The schema without logical types: fastavro then reads a timestamp back as the long it wrote."""
    if isinstance(t, list):
        return [_no_logical(b) for b in t]
    if isinstance(t, dict):
        return {k: _no_logical(v) for k, v in t.items() if k != "logicalType"}
    return t


def _round_trip(schema: dict[str, Any], record: dict[str, Any]) -> Any:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, fastavro.parse_schema(_no_logical(schema)))


def _fields(schema: dict[str, Any]) -> dict[str, Any]:
    return {f["name"]: f for f in schema["fields"]}


# -- the mapping ------------------------------------------------------------------------------------------
def test_derived_schema_maps_every_row_of_the_table(order: ProtoSchema) -> None:
    schema = order.avro_schema()
    fastavro.parse_schema(schema)
    assert (schema["type"], schema["name"], schema["namespace"]) == ("record", "Order", "shop")
    f = _fields(schema)
    plain = {"id": "string", "qty": "int", "s32": "int", "f32": "int", "u32": "long", "x32": "long", "n64": "long",
             "s64": "long", "f64": "long", "big": "long", "x64": "long", "price": "double", "ratio": "float",
             "paid": "boolean", "blob": "bytes"}
    for name, avro in plain.items():
        assert f[name]["type"] == avro, name
    assert [f[n]["default"] for n in ("id", "qty", "price", "paid", "blob")] == ["", 0, 0.0, False, ""]
    assert f["channel"]["type"] == {"type": "enum", "name": "Channel", "namespace": "shop.common",
                                    "symbols": ["CHANNEL_UNSPECIFIED", "WEB", "APP"], "default": "CHANNEL_UNSPECIFIED"}
    assert f["channel"]["default"] == "CHANNEL_UNSPECIFIED"
    assert f["tags"] == {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}
    assert f["counts"]["type"] == {"type": "map", "values": "long"}
    # Money is defined once (by_id comes first in declaration order), then named
    assert f["by_id"]["type"]["values"]["name"] == "Money"
    assert f["total"] == {"name": "total", "type": ["null", "shop.common.Money"], "default": None}
    assert f["lines"]["type"] == {"type": "array", "items": "shop.common.Money"}
    assert f["card"] == {"name": "card", "type": ["null", "string"], "default": None}
    assert f["points"]["type"] == ["null", "long"]
    assert f["maybe"] == {"name": "maybe", "type": ["null", "int"], "default": None}
    assert f["at"]["type"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]
    assert f["took"]["type"] == ["null", "long"]
    wrappers = {"w_i64": "long", "w_u64": "long", "w_i32": "int", "w_u32": "long", "w_bool": "boolean",
                "w_str": "string", "w_bytes": "bytes", "w_dbl": "double", "w_flt": "float"}
    for name, avro in wrappers.items():
        assert f[name] == {"name": name, "type": ["null", avro], "default": None}, name
    for name in ("attrs", "value", "list"):
        assert f[name]["type"] == ["null", "string"]
    assert "nothing" not in f  # google.protobuf.Empty carries no value: left out
    assert f["kind"]["type"]["namespace"] == "shop.Order"
    assert f["kinds"]["type"] == {"type": "array", "items": "shop.Order.Kind"}
    assert f["times"]["type"] == {"type": "array", "items": {"type": "long", "logicalType": "timestamp-micros"}}
    # declaration order, not field-number order (the same here), and no field dropped but Empty
    assert [x["name"] for x in schema["fields"]] == [
        fd.name for fd in order.descriptor.fields if fd.name != "nothing"]
    millis = _fields(order.avro_schema(timestamp="millis"))
    assert millis["at"]["type"][1]["logicalType"] == "timestamp-millis"
    assert order.avro_schema() == schema  # deterministic
    with pytest.raises(ValueError, match="micros"):
        order.avro_schema(timestamp="nanos")


def test_proto2_optional_is_nullable_and_required_is_not(sets: dict[str, Path]) -> None:
    legacy = ProtoSchema.load(sets["legacy"], "old.Legacy")
    f = _fields(legacy.avro_schema())
    assert f["id"]["type"] == "string"
    assert f["n"] == {"name": "n", "type": ["null", "int"], "default": None}
    assert f["inner"]["type"] == ["null", {"type": "record", "name": "Inner", "namespace": "old.Legacy",
                                           "fields": [{"name": "x", "type": ["null", "string"], "default": None}]}]
    assert f["must"]["type"] == "old.Legacy.Inner"
    cls = legacy.message_class
    record, unknown = legacy.decoder().decode(cls(id="a", must=cls.Inner()).SerializeToString())
    assert record == {"id": "a", "n": None, "inner": None, "must": {"x": None}} and unknown == 0
    # the C decoder leaves required fields unchecked: the decoder does not
    with pytest.raises(ProtoDecodeError, match="required fields missing: id, must"):
        legacy.decoder().decode(b"")


def _full_order(order: ProtoSchema) -> Any:
    cls = order.message_class
    m = cls(id="o-1", qty=-3, s32=-4, f32=-5, u32=2**32 - 1, x32=7, n64=-(2**63), s64=-8, f64=9, big=2**63 - 1,
            x64=11, price=1.5, ratio=0.25, paid=True, blob=b"\x00\xff", channel=2, tags=["a", "b"], card="visa",
            maybe=0, kind=1, kinds=[1, 0])
    m.counts["k"] = 5
    m.by_id[4].units = 2
    m.flags[True] = "yes"
    m.total.currency, m.total.units = "EUR", 300
    m.lines.add(currency="USD", units=1)
    m.at.seconds, m.at.nanos = 1_700_000_000, 123_456_789
    m.took.seconds, m.took.nanos = 2, 500_000_000
    for name, value in [("w_i64", -1), ("w_u64", 3), ("w_i32", 4), ("w_u32", 5), ("w_bool", False), ("w_str", ""),
                        ("w_bytes", b"b"), ("w_dbl", 2.5), ("w_flt", 0.5)]:
        getattr(m, name).value = value
    m.attrs.update({"b": [1, "x", None], "a": {"c": True}})
    m.value.string_value = "v"
    m.list.values.add().number_value = 3
    m.nothing.SetInParent()
    m.times.add(seconds=1, nanos=1500)
    return m


def test_decode_gives_every_value_and_fastavro_writes_it_back(order: ProtoSchema) -> None:
    m = _full_order(order)
    record, unknown = order.decoder().decode(m.SerializeToString())
    assert unknown == 0
    assert record == {
        "id": "o-1", "qty": -3, "s32": -4, "f32": -5, "u32": 2**32 - 1, "x32": 7, "n64": -(2**63), "s64": -8,
        "f64": 9, "big": 2**63 - 1, "x64": 11, "price": 1.5, "ratio": 0.25, "paid": True, "blob": b"\x00\xff",
        "channel": "APP", "tags": ["a", "b"], "counts": {"k": 5}, "by_id": {"4": {"currency": "", "units": 2}},
        "flags": {"true": "yes"}, "total": {"currency": "EUR", "units": 300},
        "lines": [{"currency": "USD", "units": 1}], "card": "visa", "points": None, "maybe": 0,
        "at": 1_700_000_000_123_456, "took": 2_500_000, "w_i64": -1, "w_u64": 3, "w_i32": 4, "w_u32": 5,
        "w_bool": False, "w_str": "", "w_bytes": b"b", "w_dbl": 2.5, "w_flt": 0.5,
        "attrs": '{"a":{"c":true},"b":[1.0,"x",null]}', "value": '"v"', "list": "[3.0]", "kind": "BIG",
        "kinds": ["BIG", "KIND_UNSPECIFIED"], "times": [1_000_001], "refund": None,
    }
    assert _round_trip(order.avro_schema(), record) == record
    millis, _ = order.decoder(order.avro_schema(timestamp="millis")).decode(m.SerializeToString())
    assert (millis["at"], millis["times"]) == (1_700_000_000_123, [1_000])


def test_unset_fields_are_zero_values_without_presence_and_null_with_it(order: ProtoSchema) -> None:
    record, unknown = order.decoder().decode(b"")
    assert unknown == 0
    assert (record["id"], record["qty"], record["paid"], record["channel"], record["tags"], record["counts"]) == \
        ("", 0, False, "CHANNEL_UNSPECIFIED", [], {})
    nullable = ["total", "card", "points", "maybe", "at", "took", "w_i64", "w_str", "attrs", "refund"]
    assert [record[n] for n in nullable] == [None] * len(nullable)
    # set to its zero value, a field with presence is not null
    zero = order.message_class(maybe=0, points=0)
    zero.w_i64.value = 0
    record, _ = order.decoder().decode(zero.SerializeToString())
    assert (record["maybe"], record["points"], record["w_i64"], record["card"]) == (0, 0, 0, None)
    assert _round_trip(order.avro_schema(), record) == record


# -- the descriptor set --------------------------------------------------------------------------------
def test_descriptor_set_rebuilds_an_equal_schema_and_ignores_unrelated_files(sets: dict[str, Path],
                                                                              order: ProtoSchema) -> None:
    again = ProtoSchema.from_bytes(order.descriptor_set, "shop.Order", origin="intent")
    assert again == order and again.fingerprint == order.fingerprint and again.descriptor_set == order.descriptor_set
    assert again.avro_schema() == order.avro_schema()
    assert order.fingerprint.startswith("sha256:") and len(order.fingerprint) == 7 + 64
    with_unrelated = ProtoSchema.load(sets["order+unrelated"], "shop.Order")
    assert with_unrelated.fingerprint == order.fingerprint
    kept = descriptor_pb2.FileDescriptorSet.FromString(order.descriptor_set)
    assert kept.file[-1].name == "order.proto" and "unrelated.proto" not in [f.name for f in kept.file]
    other = ProtoSchema.load(sets["legacy"], "old.Legacy")
    assert other.fingerprint != order.fingerprint
    # what is shipped to executors: pickles as its descriptor set
    decoder = pickle.loads(pickle.dumps(order.decoder()))
    assert decoder.schema == order
    assert decoder.decode(_full_order(order).SerializeToString()) == order.decoder().decode(
        _full_order(order).SerializeToString())


def test_file_protos_in_any_order_give_the_same_schema(sets: dict[str, Path], order: ProtoSchema) -> None:
    files = [f.SerializeToString() for f in
             descriptor_pb2.FileDescriptorSet.FromString(sets["order"].read_bytes()).file]
    for arrangement in (files, files[::-1], files[2:] + files[:2]):
        assert ProtoSchema.from_file_protos(arrangement, "shop.Order", origin="registry") == order
    with pytest.raises(ConfigError, match="order.proto imports common.proto"):
        ProtoSchema.from_file_protos([f for f in files if b"shop.common" not in f or b"shop.Order" in f],
                                     "shop.Order", origin="registry")
    with pytest.raises(ConfigError, match="file 2 of 2 is not a FileDescriptorProto"):
        ProtoSchema.from_file_protos([files[0], b"\xff\xff"], "shop.Order", origin="registry")


def test_load_errors_say_what_is_wrong_and_the_fix(sets: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as err:
        ProtoSchema.load(tmp_path / "schema.desc", "shop.Order")
    assert err.value.file == str(tmp_path / "schema.desc") and "--include_imports" in (err.value.fix or "")

    (tmp_path / "text.desc").write_text(ORDER)
    with pytest.raises(ConfigError, match="not a descriptor set"):
        ProtoSchema.load(tmp_path / "text.desc", "shop.Order")
    for seed in range(20):
        junk = random.Random(seed).randbytes(64)
        with pytest.raises(ConfigError):
            ProtoSchema.from_bytes(junk, "shop.Order", origin="junk")

    with pytest.raises(ConfigError, match="order.proto imports common.proto, which the descriptor set lacks") as err:
        ProtoSchema.load(sets["no-imports"], "shop.Order")
    assert "protoc --include_imports" in (err.value.fix or "")

    with pytest.raises(ConfigError, match="no message 'Order'.*did you mean shop.Order") as err:
        ProtoSchema.load(sets["order"], "Order")
    assert err.value.field == "protobuf_message" and "shop.common.Money" in str(err.value)
    with pytest.raises(ConfigError, match="did you mean shop.Order"):
        ProtoSchema.load(sets["order"], "shop.Ordr")


def test_any_and_recursive_messages_are_refused_naming_the_field(sets: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="field 'payload' is a google.protobuf.Any") as err:
        ProtoSchema.load(sets["bad"], "bad.Holder")
    assert err.value.field == "payload"
    with pytest.raises(ConfigError, match=r"field 'children\[\]' holds bad.Node, a message that contains itself"):
        ProtoSchema.load(sets["bad"], "bad.Node")
    with pytest.raises(ConfigError, match="field 'top.subtree' holds bad.Tree"):
        ProtoSchema.load(sets["bad"], "bad.Tree")


# -- bad payloads --------------------------------------------------------------------------------------------
def test_truncated_payload_says_which_field_is_cut_short(order: ProtoSchema) -> None:
    data = order.message_class(id="abcdef", qty=1).SerializeToString()  # 0a 06 'abcdef' 10 01
    with pytest.raises(ProtoDecodeError, match=r"Error parsing message with type 'shop.Order'.*truncated: "
                                               r"field 1 \('id'\) says 6 bytes at byte 2, 3 remain"):
        order.decoder().decode(data[:5])
    with pytest.raises(ProtoDecodeError, match=r"truncated: the value of field 2 \('qty'\)"):
        order.decoder().decode(data[:-1] + b"\x80")
    nested = order.message_class()
    nested.total.currency = "EUR"
    cut = bytearray(nested.SerializeToString())  # aa 01 05 0a 03 'EUR': the inner length says more than it holds
    cut[4] = 9
    with pytest.raises(ProtoDecodeError, match=r"field 1 \('total.currency'\) says 9 bytes"):
        order.decoder().decode(bytes(cut))


def test_bad_utf8_and_a_wrong_wire_type(order: ProtoSchema) -> None:
    with pytest.raises(ProtoDecodeError, match=r"field 1 \('id'\) is not UTF-8"):
        order.decoder().decode(b"\x0a\x02\xff\xfe")
    # a known field with another wire type: the C decoder keeps it aside as an unknown field; the decoder refuses
    # it (its value would be lost without a word): the bytes are another message's, or corrupt
    with pytest.raises(ProtoDecodeError, match=r"'shop.Order': field 2 \('qty'\) came as length-delimited"):
        order.decoder().decode(b"\x12\x03abc")  # qty (int32) as length-delimited
    with pytest.raises(ProtoDecodeError, match=r"field 2 \('qty'\) came as length-delimited, not as varint"):
        order.decoder().decode(b"\x12\x03abc\x0a\x05x")


def test_random_bytes_and_another_type_fail_or_count_unknown_fields(order: ProtoSchema, flat: ProtoSchema) -> None:
    outcomes = set()
    for seed in range(200):
        junk = random.Random(seed).randbytes(random.Random(seed).randint(1, 40))
        try:
            _record, unknown = order.decoder().decode(junk)
        except ProtoDecodeError as err:
            assert str(err).startswith("Error parsing message with type 'shop.Order'")
            outcomes.add("error")
        except ProtoValueError as err:
            outcomes.add("value")  # e.g. an enum number without a symbol
            assert err.path
        else:
            outcomes.add("unknown" if unknown else "parsed")
    assert "error" in outcomes
    # a Money read as a Click: its field 2 (units, a varint) is a string there: the C decoder keeps it aside, the
    # decoder refuses it, naming the field (else "units" would be lost and the Click written without its user)
    money = type(order.message_class().total)(currency="EUR", units=3)
    with pytest.raises(ProtoDecodeError, match=r"'flat.Click': field 2 \('user'\) came as varint, not as "
                                               r"length-delimited: a message of another type\?"):
        flat.decoder().decode(money.SerializeToString())
    # an Order read as a Click does not: its blob (bytes) is a BoolValue there, the error says where and why
    with pytest.raises(ProtoDecodeError, match=r"field number 0 at byte \d+ in 'wb'.*came as varint, not as "
                                               r"length-delimited.*a message of another type\?"):
        flat.decoder().decode(_full_order(order).SerializeToString())


def test_values_avro_cannot_hold_are_refused_naming_the_field(order: ProtoSchema) -> None:
    cls = order.message_class
    with pytest.raises(ProtoValueError, match=r"field 'big': uint64 18446744073709551615 is above 2\*\*63-1"):
        order.decoder().decode(cls(big=2**64 - 1).SerializeToString())
    wrapped = cls()
    wrapped.w_u64.value = 2**63
    with pytest.raises(ProtoValueError, match="field 'w_u64'"):
        order.decoder().decode(wrapped.SerializeToString())
    with pytest.raises(ProtoValueError, match="field 'channel': enum shop.common.Channel has no value 7"):
        order.decoder().decode(cls(channel=7).SerializeToString())
    with pytest.raises(ProtoValueError, match=r"field 'kinds\[\]': enum shop.Order.Kind has no value 9"):
        order.decoder().decode(cls(kinds=[0, 9]).SerializeToString())
    late = cls()
    late.at.seconds = 253_402_300_800  # year 10000
    with pytest.raises(ProtoValueError, match="field 'at': Timestamp .* outside years 1..9999"):
        order.decoder().decode(late.SerializeToString())
    nan = cls()
    nan.value.number_value = math.nan
    with pytest.raises(ProtoValueError, match="field 'value'"):
        order.decoder().decode(nan.SerializeToString())


def test_unknown_fields_are_counted_in_the_whole_tree(order: ProtoSchema) -> None:
    m = order.message_class(id="x")
    m.total.currency = "EUR"
    m.at.seconds = 5
    extra = b"\xa0\x06\x01"  # field 100, varint 1
    total = b"\xaa\x01" + bytes([len(m.total.SerializeToString()) + 3]) + m.total.SerializeToString() + extra
    at = b"\xd2\x01" + bytes([len(m.at.SerializeToString()) + 3]) + m.at.SerializeToString() + extra
    data = order.message_class(id="x").SerializeToString() + total + at + extra + extra
    record, unknown = order.decoder().decode(data)
    assert (record["id"], record["total"], record["at"]) == ("x", {"currency": "EUR", "units": 0}, 5_000_000)
    assert unknown == 4


# -- a given schema.avsc ---------------------------------------------------------------------------------
def _avsc(flat: ProtoSchema) -> dict[str, Any]:
    return flat.avro_schema()


def test_check_against_accepts_the_derived_schema_and_promotions(order: ProtoSchema, flat: ProtoSchema) -> None:
    assert order.check_against(order.avro_schema()) == []
    assert order.check_against(order.avro_schema(timestamp="millis")) == []
    avsc = _avsc(flat)
    f = _fields(avsc)
    f["k"]["type"] = ["null", "double"]  # int -> double, in a union
    f["n"]["type"] = "double"
    f["ok"]["type"] = ["null", "boolean"]
    avsc["fields"].append({"name": "source", "type": "string", "default": "web"})
    assert flat.check_against(avsc) == []
    m = flat.message_class(id="a", k=3, n=4, ok=True)
    record, _ = flat.decoder(avsc).decode(m.SerializeToString())
    assert (record["k"], record["n"], record["ok"], record["source"]) == (3.0, 4.0, True, "web")
    assert type(record["k"]) is float
    assert _round_trip(avsc, record) == record


def test_check_against_names_each_field_and_both_types(flat: ProtoSchema) -> None:
    wrong = _avsc(flat)
    _fields(wrong)["n"]["type"] = "string"
    assert flat.check_against(wrong) == ["field 'n': the message has int64 (Avro long), schema.avsc says string"]
    narrowed = _avsc(flat)
    _fields(narrowed)["u32"]["type"] = "int"
    assert flat.check_against(narrowed) == ["field 'u32': the message has uint32 (Avro long), schema.avsc says int"]
    missing = _avsc(flat)
    missing["fields"] = [f for f in missing["fields"] if f["name"] != "user"]
    assert flat.check_against(missing) == [
        "field 'user': the message has string (Avro string), schema.avsc lacks it: its values would be dropped"]
    extra = _avsc(flat)
    extra["fields"].append({"name": "source", "type": "string"})
    assert flat.check_against(extra) == [
        "field 'source': schema.avsc has string without a default, the message has no such field"]
    not_null = _avsc(flat)
    _fields(not_null)["ref"]["type"] = "string"
    [problem] = flat.check_against(not_null)
    assert problem.startswith("field 'ref': the message has string (Avro [null, string]), schema.avsc says string")
    symbols = _avsc(flat)
    _fields(symbols)["kind"]["type"] = {"type": "enum", "name": "Kind", "namespace": "flat.Click",
                                        "symbols": ["K0", "K1"]}
    kind, maybe_kind = flat.check_against(symbols)  # maybe_kind names the same enum
    assert kind.startswith("field 'kind': the message has enum flat.Click.Kind") and "lacks the symbol K5" in kind
    assert maybe_kind.startswith("field 'maybe_kind': the message has enum flat.Click.Kind") and "K5" in maybe_kind
    _fields(symbols)["kind"]["type"]["default"] = "K0"  # an unknown symbol reads as the default
    assert flat.check_against(symbols) == []
    record, _ = flat.decoder(symbols).decode(flat.message_class(kind=5, maybe_kind=1).SerializeToString())
    assert (record["kind"], record["maybe_kind"]) == ("K0", "K1")
    with pytest.raises(ConfigError, match="field 'n': the message has int64"):
        flat.decoder(wrong)


def test_nested_check_names_the_path(order: ProtoSchema) -> None:
    avsc = order.avro_schema()
    money = _fields(avsc)["by_id"]["type"]["values"]
    _fields(money)["units"]["type"] = "int"
    problems = order.check_against(avsc)
    assert problems == ["field 'by_id{}.units': the message has int64 (Avro long), schema.avsc says int"]


# -- columns ---------------------------------------------------------------------------------------------
UNKNOWN = b"\xa0\x06\x07"  # field 100: unknown to every message here


@st.composite
def clicks(draw: st.DrawFn, flat: ProtoSchema) -> bytes:
    cls = flat.message_class
    text = st.text(max_size=8)
    m = cls(id=draw(text), user=draw(text), n=draw(st.integers(-(2**63), 2**63 - 1)),
            k=draw(st.integers(-(2**31), 2**31 - 1)), ok=draw(st.booleans()), kind=draw(st.sampled_from([0, 1, 5])),
            u64=draw(st.integers(0, 2**63 - 1)), u32=draw(st.integers(0, 2**32 - 1)),
            s32=draw(st.integers(-(2**31), 2**31 - 1)))
    if draw(st.booleans()):
        m.at.seconds = draw(st.integers(-62_135_596_800, 253_402_300_799))
        m.at.nanos = draw(st.integers(0, 999_999_999))
    for name, values in [("ref", text), ("maybe_kind", st.sampled_from([0, 1, 5])),
                         ("left", st.integers(-5, 5)), ("right", text)]:
        if draw(st.booleans()):
            setattr(m, name, draw(values))
    for name, values in [("w", st.integers(-(2**63), 2**63 - 1)), ("ws", text), ("wb", st.booleans())]:
        if draw(st.booleans()):
            getattr(m, name).value = draw(values)
    return m.SerializeToString() + UNKNOWN * draw(st.integers(0, 2))


def _assert_columns_equal_records(decoder: Any, datas: list[bytes]) -> None:
    got = decoder.columns(datas)
    assert got is not None
    columns, unknown = got
    decoded = [decoder.decode(d) for d in datas]
    assert unknown == sum(u for _r, u in decoded)
    for name, column in columns.items():
        assert column.to_pylist() == [r[name] for r, _u in decoded], name
    assert list(columns) == [f["name"] for f in decoder.avro["fields"]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_columns_equal_decode_on_random_messages(flat: ProtoSchema, data: st.DataObject) -> None:
    datas = data.draw(st.lists(clicks(flat), max_size=12))
    _assert_columns_equal_records(flat.decoder(), datas)
    _assert_columns_equal_records(flat.decoder(flat.avro_schema(timestamp="millis")), datas)


def test_columns_types_and_a_given_schema(flat: ProtoSchema) -> None:
    import pyarrow as pa

    cls = flat.message_class
    m = cls(id="a", k=1, kind=5, ok=True)
    m.at.seconds = 1
    datas = [m.SerializeToString(), b""]
    columns, unknown = flat.decoder().columns(datas) or ({}, -1)
    assert unknown == 0
    assert {n: str(c.type) for n, c in columns.items() if n in ("id", "k", "n", "ok", "kind", "at", "ref", "wb")} == \
        {"id": "string", "k": "int64", "n": "int64", "ok": "bool", "kind": "string", "at": "int64", "ref": "string",
         "wb": "bool"}
    assert columns["kind"].to_pylist() == ["K5", "K0"] and columns["at"].to_pylist() == [1_000_000, None]
    avsc = flat.avro_schema()
    avsc["fields"] += [{"name": "source", "type": "string", "default": "web"},
                       {"name": "note", "type": ["null", "string"], "default": None}]
    _assert_columns_equal_records(flat.decoder(avsc), datas)
    columns, _ = flat.decoder(avsc).columns(datas) or ({}, -1)
    assert columns["source"].to_pylist() == ["web", "web"] and columns["note"].type == pa.string()


def test_columns_give_none_for_one_bad_message_or_a_message_not_flat(flat: ProtoSchema, order: ProtoSchema) -> None:
    good = [flat.message_class(id=str(i)).SerializeToString() for i in range(5)]
    decoder = flat.decoder()
    assert decoder.flat and decoder.columns(good) is not None
    late = flat.message_class()
    late.at.seconds = 253_402_300_800
    for bad in (good[0][:-1], flat.message_class(u64=2**63).SerializeToString(),
                flat.message_class(kind=3).SerializeToString(), late.SerializeToString()):
        assert decoder.columns([*good, bad]) is None
        with pytest.raises((ProtoDecodeError, ProtoValueError)):
            decoder.decode(bad)  # the record path says why
    assert not order.decoder().flat and order.decoder().columns(good) is None
    promoted = flat.avro_schema()
    _fields(promoted)["k"]["type"] = "double"
    assert flat.decoder(promoted).columns(good) is None  # a double column is not among the fast path's
    assert decoder.columns([]) is not None
    # a long list is read in slices: the same values, and one bad payload in the last slice still refuses them all
    many = [flat.message_class(id=str(i), kind=i % 2, n=i).SerializeToString() + UNKNOWN * (i % 2)
            for i in range(2500)]
    _assert_columns_equal_records(decoder, many)
    assert decoder.columns([*many, good[0][:-1]]) is None


def test_a_record_written_back_as_its_message_reads_as_the_same_record(order: ProtoSchema, flat: ProtoSchema) -> None:
    """protoencode (the generator's producer, the benchmark's) is decode's inverse over the whole mapping."""
    from event_etl.payloads.protoencode import encoder

    for schema, msg in ((order, _full_order(order)), (flat, flat.message_class())):
        for unit in ("micros", "millis"):
            avro = schema.avro_schema(timestamp=unit)
            dec = schema.decoder(avro)
            rec, _ = dec.decode(msg.SerializeToString())
            again, unknown = dec.decode(encoder(schema, avro)(rec))
            assert (again, unknown) == (rec, 0), unit
