"""Protobuf payloads: a message of the type's descriptor set, decoded without generated code, kept as Avro.

A type of ``payload = "protobuf"`` names its message in ``etl.toml`` (``protobuf_message = "pkg.Name"``) and
holds its descriptor set beside it, ``schema.desc``, as protoc writes it::

    protoc --include_imports --descriptor_set_out=schema.desc order.proto

No code is generated per type: :class:`ProtoSchema` builds the message class from the set
(``descriptor_pool`` + ``message_factory.GetMessageClass``) and every payload is parsed by the protobuf
package's C decoder (``ParseFromString``).  The data files stay Avro: in the schema derived from the message
(:meth:`ProtoSchema.avro_schema`) or in the type's own ``schema.avsc``, which :meth:`ProtoSchema.check_against`
checks field by field against the message when the type is loaded.

Loading
-------
:meth:`ProtoSchema.load` (a file), :meth:`ProtoSchema.from_bytes` (a set's bytes) and
:meth:`ProtoSchema.from_file_protos` (serialized ``FileDescriptorProto`` s, a schema registry's answer: the
schema and its references, in any order) raise :class:`~event_etl.errors.ConfigError` for a missing file, bytes
that are not a descriptor set, a set without a file that another imports (protoc was run without
``--include_imports``: the error names both files), an unknown message (it lists the close names and what the
set holds), a message that cannot be mapped (below: ``Any``, a recursive message) and a set the pool refuses.

What a schema keeps of the set is the message's file and the files it imports, transitively, in dependency
order, without ``source_code_info`` (comments): :attr:`ProtoSchema.descriptor_set`, a serialized
``FileDescriptorSet`` that rebuilds an equal schema (:meth:`ProtoSchema.from_bytes`).  Its SHA-256 is the
:attr:`ProtoSchema.fingerprint`: another file of the set, a comment or the order of the files does not change
it; a change to any message of those files does (even one that the message does not use).  Two schemas are
equal when their message and fingerprint are.

The mapping
-----------
The derived Avro schema is one record named by the message's full name (the package is its namespace; a
nested message ``pkg.Outer.Inner`` is ``Inner`` in namespace ``pkg.Outer``), its fields in the order the
``.proto`` file declares them (the descriptor's order, not the field numbers'), under their protobuf names
(not their ``json_name``).  A message or enum type used twice is defined once, then named.

==============================================  ==================================================================
protobuf                                        Avro
==============================================  ==================================================================
``double``, ``float``                           ``double``, ``float``
``int32``, ``sint32``, ``sfixed32``             ``int``
``uint32``, ``fixed32``                         ``long``
``int64``, ``sint64``, ``sfixed64``             ``long``
``uint64``, ``fixed64``                         ``long``; a value above 2**63-1 is refused (:class:`ProtoValueError`)
``bool``, ``string``, ``bytes``                 ``boolean``, ``string``, ``bytes``
a scalar without presence (proto3's plain)      the type itself, never null: unset is its zero value; default the
                                                zero value (``0``, ``""``, ``false``), so that a field added to the
                                                message gives a schema that still reads the older files
a scalar with presence (proto3 ``optional``,    ``["null", T]``, default null: unset is null
proto2 ``optional``, a ``oneof`` member)
``enum E``                                      ``enum`` named by E's full name, the symbols in declaration order,
                                                the enum's ``default`` its first symbol (an unknown symbol of a
                                                newer writer reads as it); a number without a symbol (an open
                                                enum's) is refused; a field's default: the first symbol
``repeated T``                                  ``array`` of T (never null, default ``[]``)
``map<K, V>``                                   ``map`` of V (default ``{}``); keys as text: ``"7"``, ``"true"``
a message field                                 ``["null", record]``, default null: unset is null (proto2
                                                ``required``: the record); in an array or a map: the record
``oneof``                                       each member its own ``["null", T]``: only the set one has a value
``google.protobuf.Timestamp``                   ``["null", {"type": "long", "logicalType": "timestamp-micros"}]``
                                                (``avro_schema(timestamp="millis")``: ``timestamp-millis``), rounded
                                                down; outside years 1..9999 (protobuf's range) it is refused
``google.protobuf.Duration``                    ``["null", "long"]``: microseconds, rounded down
``google.protobuf.*Value`` (the wrappers)       ``["null", T]`` of the wrapped scalar (``UInt64Value``: ``long``)
``google.protobuf.Struct``, ``Value``,          ``["null", "string"]``: the JSON of ``json_format``, compact, keys
``ListValue``                                   sorted; a value JSON cannot hold (NaN) is refused
``google.protobuf.Empty`` and any message       left out: a field of no value (a record of no field would break
without a field (after this mapping)            Parquet and Spark); a top-level message without a field is refused
``google.protobuf.Any``                         refused when the schema is loaded: no single Avro type holds it
a recursive message                             refused when the schema is loaded (the error names the field)
==============================================  ==================================================================

A given ``schema.avsc`` may differ from the derived schema where Avro's resolution would read the derived one
(:meth:`ProtoSchema.check_against`): the same field names (a field the message lacks needs a default, and a
message field the file lacks is an error, as its values would be dropped without a word), each type the
message's or one it is promoted to (``int`` to ``long``, ``float`` or ``double``; ``long`` to ``float`` or
``double``; ``float`` to ``double``; ``string`` and ``bytes`` either way), a nullable message field a union
with ``null``, an enum with all the message's symbols or a default, a timestamp a ``long`` of
``timestamp-millis`` or ``timestamp-micros`` (the unit the values are given in).  Record and enum names do
not matter.  The record is then in the file's shape: promoted values converted, a missing field its default.

Decoding
--------
:meth:`ProtoSchema.decoder` gives a :class:`ProtoDecoder` for one Avro schema.  :meth:`ProtoDecoder.decode`
turns one payload into ``(record, unknown)``: the record as fastavro's writers take it, and the number of
unknown fields dropped (fields whose numbers the descriptor set lacks, counted in the whole message tree,
Timestamps and wrappers included, the inside of a ``Struct`` not; a known field that arrives with another wire
type is one too: the C decoder keeps it aside rather than fail).  Bytes that do not parse raise
:class:`ProtoDecodeError`, with the decoder's reason and what a walk of the wire format adds (a value cut
short, at which byte, of which field; which string field is not UTF-8); a parsed value the schema cannot hold
raises :class:`ProtoValueError`, naming the field; a proto2 ``required`` field missing (which the C decoder does
not check) is a :class:`ProtoDecodeError`.  Bytes of another message type often parse (protobuf has no type
tag): the fields whose numbers and wire types happen to match fill the record, the others are counted as
unknown, which is worth a metric.  Schemas and decoders pickle (as the descriptor set and the Avro schema).

:meth:`ProtoDecoder.columns` is the fast path for a flat message (every field a string, an integer, a bool,
an enum, a Timestamp, a wrapper of one of those, plain or with presence): a list of payloads as Arrow columns
(string; int64 for every integer and timestamp, in the Avro field's unit; bool; an enum's symbol as string;
null where the record has null), the same values :meth:`~ProtoDecoder.decode` gives, in two thirds of its time
(a message of 9 fields: ~2.6 µs a payload against ~4, of which 0.6 are the C parser's).  It returns ``None`` when the
message is not flat or any payload of the list fails: the caller then decodes them one by one, which says what is
wrong with each.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter, methodcaller
from typing import Any, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from event_etl.errors import ConfigError
from event_etl.payloads.protocolumns import WireColumns
from event_etl.rules.compat import PROMOTIONS, describe_type

__all__ = ["ProtoSchema", "ProtoDecoder", "ProtoDecodeError", "ProtoValueError"]

_FIX_IMPORTS = "write the set with its imports: protoc --include_imports --descriptor_set_out=schema.desc your.proto"
_TIMESTAMP_UNITS = {"micros": 1_000_000, "millis": 1_000}
"""Units of a Timestamp's Avro long: per second."""
_LONG_MAX = 2**63 - 1
_SECONDS_MIN, _SECONDS_MAX = -62_135_596_800, 253_402_300_799
"""A Timestamp's valid seconds (protobuf's timestamp.proto): 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z."""


class ProtoDecodeError(ValueError):
    """Bytes that do not parse as the message.  The text is the C decoder's reason (``Error parsing message with
    type 'pkg.Name': ...``) and what a walk of the wire format adds: which field is cut short, at which byte,
    which string is not UTF-8, which field came with a wire type its type never has."""


class ProtoValueError(ValueError):
    """A parsed message whose value the Avro schema cannot hold: a ``uint64`` above 2**63-1, an enum number
    without a symbol, a Timestamp outside years 1..9999, a ``Struct`` holding NaN... ``path`` names the field
    (``total.units``, ``lines[].sku``, ``counts{}``)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"field '{path}': {reason}")


# -- the message's shape ------------------------------------------------------------------------------
_F = FieldDescriptor
_SCALARS: dict[int, tuple[str, str]] = {
    _F.TYPE_DOUBLE: ("double", "double"), _F.TYPE_FLOAT: ("float", "float"),
    _F.TYPE_INT32: ("int32", "int"), _F.TYPE_SINT32: ("sint32", "int"), _F.TYPE_SFIXED32: ("sfixed32", "int"),
    _F.TYPE_UINT32: ("uint32", "long"), _F.TYPE_FIXED32: ("fixed32", "long"),
    _F.TYPE_INT64: ("int64", "long"), _F.TYPE_SINT64: ("sint64", "long"), _F.TYPE_SFIXED64: ("sfixed64", "long"),
    _F.TYPE_UINT64: ("uint64", "long"), _F.TYPE_FIXED64: ("fixed64", "long"),
    _F.TYPE_BOOL: ("bool", "boolean"), _F.TYPE_STRING: ("string", "string"), _F.TYPE_BYTES: ("bytes", "bytes"),
}
"""A scalar's protobuf type -> (its name, its Avro type)."""
_WRAPPERS: dict[str, int] = {
    "google.protobuf.DoubleValue": _F.TYPE_DOUBLE, "google.protobuf.FloatValue": _F.TYPE_FLOAT,
    "google.protobuf.Int64Value": _F.TYPE_INT64, "google.protobuf.UInt64Value": _F.TYPE_UINT64,
    "google.protobuf.Int32Value": _F.TYPE_INT32, "google.protobuf.UInt32Value": _F.TYPE_UINT32,
    "google.protobuf.BoolValue": _F.TYPE_BOOL, "google.protobuf.StringValue": _F.TYPE_STRING,
    "google.protobuf.BytesValue": _F.TYPE_BYTES,
}
_JSON_TYPES = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})
_ZEROS: dict[str, Any] = {"int": 0, "long": 0, "float": 0.0, "double": 0.0, "boolean": False, "string": "",
                          "bytes": ""}
"""The Avro default of a scalar without presence: its protobuf zero value (bytes: the empty JSON string)."""


@dataclass(eq=False)
class _Shape:
    """What a protobuf type is, in the terms of Avro.  ``kind``: ``scalar`` (also a wrapper), ``enum``,
    ``record``, ``array``, ``map``, ``timestamp``, ``duration``, ``json``."""

    kind: str
    proto: str  # as the message says it: "int64", "enum pkg.E", "message pkg.M", "google.protobuf.Timestamp"
    avro: str = ""  # a scalar's Avro type
    unsigned64: bool = False
    wrapper: bool = False  # a google.protobuf.*Value: the scalar is its field "value"
    enum: EnumDescriptor | None = None
    message: Descriptor | None = None
    fields: list[_Field] = field(default_factory=list)  # a record's
    item: _Shape | None = None  # an array's items, a map's values
    key: str = ""  # a map's key: "string", "int" or "bool"


@dataclass(frozen=True, eq=False)
class _Field:
    name: str
    shape: _Shape
    nullable: bool  # ["null", T], default null: read with HasField


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Shapes:
    """The shape of a message, its types analysed once each; refuses ``Any`` and recursion (ConfigError)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.records: dict[str, _Shape | None] = {}
        self.enums: dict[str, _Shape] = {}

    def record(self, desc: Descriptor, path: str, stack: tuple[str, ...]) -> _Shape | None:
        """A message's record, or None if it has no field to map."""
        if desc.full_name in stack:
            raise ConfigError(f"field '{path}' holds {desc.full_name}, a message that contains itself: a recursive "
                              "message has no Avro schema of fixed depth", file=self.origin, field=path,
                              fix="send a message without the recursion (e.g. flatten the tree into a list)")
        if desc.full_name in self.records:
            return self.records[desc.full_name]
        inner = (*stack, desc.full_name)
        fields = [f for f in (self.field(fd, path, inner) for fd in desc.fields) if f is not None]
        shape = _Shape("record", f"message {desc.full_name}", message=desc, fields=fields) if fields else None
        self.records[desc.full_name] = shape
        return shape

    def field(self, fd: FieldDescriptor, path: str, stack: tuple[str, ...]) -> _Field | None:
        fpath = _join(path, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            vshape = self.value(value, fpath + "{}", stack)
            if vshape is None:
                return None
            kname, _avro = _SCALARS[key.type]
            keykind = "bool" if kname == "bool" else "string" if kname == "string" else "int"
            return _Field(fd.name, _Shape("map", f"map<{kname}, {vshape.proto}>", item=vshape, key=keykind), False)
        shape = self.value(fd, fpath + ("[]" if fd.is_repeated else ""), stack)
        if shape is None:
            return None
        if fd.is_repeated:
            return _Field(fd.name, _Shape("array", f"repeated {shape.proto}", item=shape), False)
        return _Field(fd.name, shape, fd.has_presence and not fd.is_required)

    def value(self, fd: FieldDescriptor, path: str, stack: tuple[str, ...]) -> _Shape | None:
        if fd.message_type is not None:
            return self.message(fd.message_type, path, stack)
        if fd.enum_type is not None:
            return self.enum(fd.enum_type)
        proto, avro = _SCALARS[fd.type]
        return _Shape("scalar", proto, avro=avro, unsigned64=fd.type in (_F.TYPE_UINT64, _F.TYPE_FIXED64))

    def message(self, desc: Descriptor, path: str, stack: tuple[str, ...]) -> _Shape | None:
        name = desc.full_name
        if name in _WRAPPERS:
            proto, avro = _SCALARS[_WRAPPERS[name]]
            return _Shape("scalar", name, avro=avro, wrapper=True, message=desc,
                          unsigned64=_WRAPPERS[name] == _F.TYPE_UINT64)
        special = {"google.protobuf.Timestamp": "timestamp", "google.protobuf.Duration": "duration"}
        if name in special:
            return _Shape(special[name], name, message=desc)
        if name in _JSON_TYPES:
            return _Shape("json", name, message=desc)
        if name == "google.protobuf.Any":
            raise ConfigError(f"field '{path}' is a google.protobuf.Any, which cannot be mapped to one Avro type",
                              file=self.origin, field=path,
                              fix="give the event a field of the message the Any would carry, or bytes")
        return self.record(desc, path, stack)

    def enum(self, desc: EnumDescriptor) -> _Shape:
        if desc.full_name not in self.enums:
            self.enums[desc.full_name] = _Shape("enum", f"enum {desc.full_name}", enum=desc)
        return self.enums[desc.full_name]


# -- the derived Avro schema ------------------------------------------------------------------------------
def _named(full_name: str) -> dict[str, Any]:
    namespace, _dot, name = full_name.rpartition(".")
    return {"name": name, "namespace": namespace}


def _avro_type(shape: _Shape, unit: str, defined: set[str]) -> Any:
    """The Avro type of a shape (not null); a named type already ``defined`` by its full name."""
    if shape.kind == "scalar":
        return shape.avro
    if shape.kind in ("record", "enum"):
        desc: Descriptor | EnumDescriptor | None = shape.message if shape.kind == "record" else shape.enum
        assert desc is not None
        if desc.full_name in defined:
            return desc.full_name
        defined.add(desc.full_name)
        if isinstance(desc, EnumDescriptor):
            symbols = [v.name for v in desc.values]
            return {"type": "enum", **_named(desc.full_name), "symbols": symbols, "default": symbols[0]}
        return {"type": "record", **_named(desc.full_name),
                "fields": [_avro_field(f, unit, defined) for f in shape.fields]}
    if shape.kind in ("array", "map"):
        assert shape.item is not None
        inner = _avro_type(shape.item, unit, defined)
        return {"type": "array", "items": inner} if shape.kind == "array" else {"type": "map", "values": inner}
    if shape.kind == "timestamp":
        return {"type": "long", "logicalType": f"timestamp-{unit}"}
    return "long" if shape.kind == "duration" else "string"  # json


def _avro_field(f: _Field, unit: str, defined: set[str]) -> dict[str, Any]:
    t = _avro_type(f.shape, unit, defined)
    if f.nullable:
        return {"name": f.name, "type": ["null", t], "default": None}
    out: dict[str, Any] = {"name": f.name, "type": t}
    kind = f.shape.kind
    if kind == "scalar":
        out["default"] = _ZEROS[f.shape.avro]
    elif kind == "enum":
        assert f.shape.enum is not None
        out["default"] = f.shape.enum.values[0].name
    elif kind in ("array", "map"):
        out["default"] = [] if kind == "array" else {}
    return out  # a proto2 required message: no default


# -- a schema.avsc's types ------------------------------------------------------------------------------
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


class _Names:
    """The named types of an Avro schema (JSON), to follow a reference to its definition."""

    def __init__(self, schema: Any) -> None:
        self.names: dict[str, tuple[dict[str, Any], str]] = {}
        self._index(schema, "")

    def _index(self, t: Any, ns: str) -> None:
        if isinstance(t, list):
            for b in t:
                self._index(b, ns)
            return
        if not isinstance(t, dict):
            return
        kind = t.get("type")
        if isinstance(kind, (dict, list)):
            self._index(kind, ns)
        elif kind in ("record", "error", "enum", "fixed") and isinstance(t.get("name"), str):
            full = t["name"] if "." in t["name"] else ".".join(p for p in (t.get("namespace", ns), t["name"]) if p)
            self.names.setdefault(full, (t, full.rpartition(".")[0]))
            for f in t.get("fields", []) if kind != "enum" else []:
                self._index(f.get("type"), full.rpartition(".")[0])
        elif kind in ("array", "map"):
            self._index(t.get("items" if kind == "array" else "values"), ns)

    def resolve(self, t: Any, ns: str) -> tuple[Any, str]:
        """``(t, namespace)``, a reference replaced by its definition, ``{"type": "long"}`` by ``"long"``."""
        for _ in range(64):
            if isinstance(t, str) and t not in _PRIMITIVES:
                hit = self.names.get(f"{ns}.{t}" if ns and "." not in t else t) or self.names.get(t)
                if hit is None:
                    return t, ns
                t, ns = hit
            elif isinstance(t, dict) and (isinstance(t.get("type"), (dict, list)) or (
                    t.get("type") in _PRIMITIVES and "logicalType" not in t)):
                t = t["type"]
            else:
                return t, ns
        return t, ns


def _namespace(t: dict[str, Any], ns: str) -> str:
    """The namespace a named type gives the names inside it."""
    name = str(t.get("name", ""))
    return name.rpartition(".")[0] if "." in name else str(t.get("namespace", ns))


def _kind(t: Any) -> str:
    """An Avro type's kind (resolved): a primitive, ``record``, ``enum``, ``array``, ``map``, ``union``..."""
    if isinstance(t, list):
        return "union"
    if isinstance(t, str):
        return t
    kind = t.get("type") if isinstance(t, dict) else None
    return "record" if kind == "error" else kind if isinstance(kind, str) else "unknown"


def _fits(shape: _Shape, t: Any) -> bool:
    """Whether an Avro type (resolved, not a union) can hold the shape's values (at its top: records, arrays
    and maps are then checked inside)."""
    kind = _kind(t)
    if shape.kind == "scalar":
        return kind == shape.avro or kind in PROMOTIONS.get(shape.avro, ())
    if shape.kind == "timestamp":
        return kind == "long" and isinstance(t, dict) and t.get("logicalType") in ("timestamp-micros",
                                                                                    "timestamp-millis")
    wanted = {"duration": "long", "json": "string"}.get(shape.kind, shape.kind)
    return kind == wanted


# -- check_against ------------------------------------------------------------------------------------
class _Check:
    """Walks the message's shape and a schema.avsc together, collecting one problem per field."""

    def __init__(self, avsc: dict[str, Any]) -> None:
        self.names = _Names(avsc)
        self.problems: list[str] = []
        self._seen: set[tuple[int, int]] = set()

    def ours(self, shape: _Shape, nullable: bool) -> str:
        avro = describe_type(_avro_type(shape, "micros", set()))
        if shape.kind == "timestamp":
            avro = "long (timestamp-micros or -millis)"
        return f"{shape.proto} (Avro {'[null, ' + avro + ']' if nullable else avro})"

    def add(self, path: str, shape: _Shape, nullable: bool, t: Any, why: str = "") -> None:
        self.problems.append(f"field '{path}': the message has {self.ours(shape, nullable)}, schema.avsc says "
                             f"{describe_type(t)}" + (f": {why}" if why else ""))

    def match(self, shape: _Shape, nullable: bool, t: Any, ns: str, path: str) -> None:
        r, rns = self.names.resolve(t, ns)
        branch = _branch(self.names, shape, r, rns)
        if branch is None:
            self.add(path, shape, nullable, r)
            return
        if nullable and not (isinstance(r, list) and any(self.names.resolve(b, rns)[0] == "null" for b in r)):
            self.add(path, shape, nullable, r, "the message's field may be unset (null): make it a union with null")
            return
        self.inside(shape, branch[0], branch[1], path)

    def inside(self, shape: _Shape, t: Any, ns: str, path: str) -> None:
        if shape.kind in ("array", "map"):
            assert shape.item is not None
            inner = t.get("items") if shape.kind == "array" else t.get("values")
            self.match(shape.item, False, inner, ns, path + ("[]" if shape.kind == "array" else "{}"))
        elif shape.kind == "enum":
            self.enum(shape, t, path)
        elif shape.kind == "record":
            self.record(shape, t, ns, path)

    def enum(self, shape: _Shape, t: dict[str, Any], path: str) -> None:
        assert shape.enum is not None
        symbols = t.get("symbols") or []
        missing = [v.name for v in shape.enum.values if v.name not in symbols]
        if missing and t.get("default") not in symbols:
            self.add(path, shape, False, t, f"it lacks the symbol{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(missing)} and has no default")

    def record(self, shape: _Shape, t: dict[str, Any], ns: str, path: str) -> None:
        key = (id(shape), id(t))
        if key in self._seen:
            return
        self._seen.add(key)
        rns = _namespace(t, ns)
        theirs = {f.get("name"): f for f in t.get("fields", [])}
        for f in shape.fields:
            fpath = _join(path, f.name)
            if f.name not in theirs:
                self.problems.append(f"field '{fpath}': the message has {self.ours(f.shape, f.nullable)}, "
                                     "schema.avsc lacks it: its values would be dropped")
                continue
            self.match(f.shape, f.nullable, theirs[f.name].get("type"), rns, fpath)
        ours = {f.name for f in shape.fields}
        for name, f in theirs.items():
            if name not in ours and "default" not in f:
                self.problems.append(f"field '{_join(path, str(name))}': schema.avsc has "
                                     f"{describe_type(f.get('type'))} without a default, the message has no such "
                                     "field")


def _branch(names: _Names, shape: _Shape, t: Any, ns: str) -> tuple[Any, str] | None:
    """The type (resolved) of ``t`` that holds the shape's values: ``t`` itself, or the first branch of a union
    that does (Avro's rule for a reader union); None if none does."""
    if not isinstance(t, list):
        return (t, ns) if _fits(shape, t) else None
    for b in t:
        r, rns = names.resolve(b, ns)
        if _fits(shape, r):
            return r, rns
    return None


# -- decoding: one record ---------------------------------------------------------------------------------
Conv = Callable[[Any, list[int]], Any]
"""A value of the message -> its Avro value; the list counts the unknown fields met."""


def _promotion(src: str, dst: str, path: str) -> Callable[[Any], Any] | None:
    """How a scalar of Avro type ``src`` becomes one of ``dst`` (None: as it is)."""
    if dst in ("float", "double") and src in ("int", "long"):
        return float
    if src == "string" and dst == "bytes":
        return str.encode
    if src == "bytes" and dst == "string":
        def text(v: bytes) -> str:
            try:
                return v.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ProtoValueError(path, f"bytes that are not UTF-8 for a string: {err.reason}") from err
        return text
    return None


def _scalar_conv(shape: _Shape, t: Any, path: str) -> Conv | None:
    promote = _promotion(shape.avro, _kind(t), path)
    check = shape.unsigned64

    def scalar(v: Any, cnt: list[int]) -> Any:
        if shape.wrapper:
            cnt[0] += len(UnknownFieldSet(v))
            v = v.value
        if check and v > _LONG_MAX:
            raise ProtoValueError(path, f"{shape.proto} {v} is above 2**63-1, the largest Avro long")
        return v if promote is None else promote(v)

    return scalar if (promote is not None or check or shape.wrapper) else None


def _enum_table(shape: _Shape, t: dict[str, Any]) -> dict[int, str]:
    """An enum number -> the Avro symbol: its name, or the Avro enum's default where the file lacks the name."""
    assert shape.enum is not None
    symbols = t.get("symbols") or []
    default = t.get("default")
    return {n: (v.name if v.name in symbols else str(default)) for n, v in shape.enum.values_by_number.items()}


def _enum_conv(shape: _Shape, t: dict[str, Any], path: str) -> Conv:
    table = _enum_table(shape, t)
    assert shape.enum is not None
    name = shape.enum.full_name

    def enum(v: int, _cnt: list[int]) -> str:
        try:
            return table[v]
        except KeyError:
            raise ProtoValueError(path, f"enum {name} has no value {v}") from None

    return enum


def _seconds_nanos_check(path: str, what: str, seconds: int, nanos: int) -> None:
    if what == "google.protobuf.Timestamp":
        if not (_SECONDS_MIN <= seconds <= _SECONDS_MAX and 0 <= nanos < 1_000_000_000):
            raise ProtoValueError(path, f"Timestamp seconds={seconds} nanos={nanos} is outside years 1..9999")
    elif not (-315_576_000_000 <= seconds <= 315_576_000_000 and -1_000_000_000 < nanos < 1_000_000_000):
        raise ProtoValueError(path, f"Duration seconds={seconds} nanos={nanos} is outside +-10000 years")


def _time_conv(shape: _Shape, t: Any, path: str) -> Conv:
    per_second = 1_000_000
    if shape.kind == "timestamp":
        per_second = 1_000 if t.get("logicalType") == "timestamp-millis" else 1_000_000
    nanos_per = 1_000_000_000 // per_second

    def time(v: Any, cnt: list[int]) -> int:
        cnt[0] += len(UnknownFieldSet(v))
        seconds, nanos = v.seconds, v.nanos
        _seconds_nanos_check(path, shape.proto, seconds, nanos)
        return int((seconds * 1_000_000_000 + nanos) // nanos_per)

    return time


def _json_conv(shape: _Shape, path: str) -> Conv:
    def to_json(v: Message, _cnt: list[int]) -> str:
        try:
            return json.dumps(json_format.MessageToDict(v), separators=(",", ":"), sort_keys=True,
                              ensure_ascii=False, allow_nan=False)
        except (ValueError, json_format.Error) as err:
            raise ProtoValueError(path, f"{shape.proto} without a JSON form: {err}") from err

    return to_json


_MAP_KEYS: dict[str, Callable[[Any], str]] = {"string": str, "int": str, "bool": lambda k: "true" if k else "false"}


def _container_conv(shape: _Shape, item: Conv | None) -> Conv:
    if shape.kind == "array":
        if item is None:
            return lambda v, _cnt: list(v)
        return lambda v, cnt: [item(x, cnt) for x in v]
    key = _MAP_KEYS[shape.key]
    if item is None:
        return lambda v, _cnt: {key(k): x for k, x in v.items()}
    return lambda v, cnt: {key(k): item(x, cnt) for k, x in v.items()}


@dataclass(frozen=True)
class _Step:
    """One Avro field of a record: where its value comes from."""

    name: str
    proto: str | None  # the message's field; None: the schema's default
    conv: Conv | None = None  # None: the value as protobuf gives it
    presence: bool = False  # HasField first: unset is null
    default: Any = None


class _RecordConv:
    """A message -> its record: the fields of the Avro record in its order."""

    def __init__(self, steps: list[_Step], desc: Descriptor | None = None) -> None:
        self.steps = steps
        self.desc = desc

    def __call__(self, msg: Message, cnt: list[int]) -> dict[str, Any]:
        unknown = UnknownFieldSet(msg)
        if len(unknown):
            cnt[0] += len(unknown)
            if self.desc is not None:
                _check_wire_types(self.desc, unknown)
        out: dict[str, Any] = {}
        for s in self.steps:
            if s.proto is None:
                out[s.name] = s.default
            elif s.presence and not msg.HasField(s.proto):
                out[s.name] = None
            elif s.conv is None:
                out[s.name] = getattr(msg, s.proto)
            else:
                out[s.name] = s.conv(getattr(msg, s.proto), cnt)
        return out


def _default_value(t: Any, value: Any, names: _Names, ns: str) -> Any:
    """A JSON default as fastavro's writer takes it (bytes: the JSON string's code points)."""
    r, _ns = names.resolve(t[0] if isinstance(t, list) else t, ns)
    return value.encode("latin-1") if _kind(r) in ("bytes", "fixed") and isinstance(value, str) else value


class _Compiler:
    """Builds the converters of a message's shape for one Avro schema (checked first: it fits)."""

    def __init__(self, avro: dict[str, Any]) -> None:
        self.names = _Names(avro)
        self.records: dict[tuple[int, int], _RecordConv] = {}

    def conv(self, shape: _Shape, t: Any, ns: str, path: str) -> Conv | None:
        r, rns = self.names.resolve(t, ns)
        branch = _branch(self.names, shape, r, rns)
        assert branch is not None, path  # check_against said it fits
        t, ns = branch
        if shape.kind in ("array", "map"):
            assert shape.item is not None
            inner = t.get("items") if shape.kind == "array" else t.get("values")
            item = self.conv(shape.item, inner, ns, path + ("[]" if shape.kind == "array" else "{}"))
            return _container_conv(shape, item)
        if shape.kind == "record":
            return self.record(shape, t, ns, path)
        simple: dict[str, Callable[[], Conv | None]] = {
            "scalar": lambda: _scalar_conv(shape, t, path),
            "enum": lambda: _enum_conv(shape, t, path),
            "timestamp": lambda: _time_conv(shape, t, path),
            "duration": lambda: _time_conv(shape, t, path),
            "json": lambda: _json_conv(shape, path),
        }
        return simple[shape.kind]()

    def record(self, shape: _Shape, t: dict[str, Any], ns: str, path: str) -> _RecordConv:
        key = (id(shape), id(t))
        if key in self.records:  # a type used twice (never recursive: refused when loaded)
            return self.records[key]
        rns = _namespace(t, ns)
        ours = {f.name: f for f in shape.fields}
        steps = []
        for af in t["fields"]:
            f = ours.get(af["name"])
            if f is None:
                steps.append(_Step(af["name"], None, default=_default_value(af["type"], af["default"], self.names,
                                                                            rns)))
                continue
            conv = self.conv(f.shape, af["type"], rns, _join(path, f.name))
            steps.append(_Step(f.name, f.name, conv, presence=f.nullable))
        out = self.records[key] = _RecordConv(steps, shape.message)
        return out


_WIRE_OF = {FieldDescriptor.TYPE_DOUBLE: 1, FieldDescriptor.TYPE_FIXED64: 1, FieldDescriptor.TYPE_SFIXED64: 1,
            FieldDescriptor.TYPE_FLOAT: 5, FieldDescriptor.TYPE_FIXED32: 5, FieldDescriptor.TYPE_SFIXED32: 5,
            FieldDescriptor.TYPE_STRING: 2, FieldDescriptor.TYPE_BYTES: 2, FieldDescriptor.TYPE_MESSAGE: 2,
            FieldDescriptor.TYPE_GROUP: 3}
"""The wire type of a field's type (every other scalar: 0, varint); a repeated scalar may also come packed (2)."""


def _check_wire_types(desc: Descriptor, unknown: Any) -> None:
    """A field the descriptor knows that the parser set aside as unknown came with another wire type: the bytes are
    not this message (another type's, or corrupt), and would otherwise lose that field's value without a word."""
    for i in range(len(unknown)):
        u = unknown[i]
        fd = desc.fields_by_number.get(u.field_number)
        if fd is not None:
            expected = _WIRE_OF.get(fd.type, 0)
            came = _WIRE_NAMES.get(u.wire_type, str(u.wire_type))
            raise ProtoDecodeError(f"Error parsing message with type '{desc.full_name}': field {u.field_number} "
                                   f"({fd.name!r}) came as {came}, not as {_WIRE_NAMES.get(expected, str(expected))}: "
                                   "a message of another type?")


# -- decoding: columns ------------------------------------------------------------------------------------
_ARROW = {"string": pa.string(), "int": pa.int64(), "long": pa.int64(), "boolean": pa.bool_(), "enum": pa.string()}
"""The Arrow type of a flat field's Avro kind (a timestamp's: int64)."""
_FLAT_SCALARS = {"string": ("string",), "int": ("int", "long"), "long": ("long",), "boolean": ("boolean",)}
"""A flat scalar's Avro type -> the Avro types of a schema.avsc that take it as a column."""


_SLICE = 1024
"""Payloads parsed at once by :meth:`ProtoDecoder.columns` (20,000 alive at once cost the collector ~2 µs each)."""


class _Refused(Exception):
    """A payload of the list the columns cannot give (the record path will say why)."""


@dataclass(frozen=True)
class _Column:
    """How one Avro field of a flat record is read from the parsed messages."""

    name: str
    index: int  # in the getter's tuple; -1: the schema's default
    kind: str  # "scalar", "enum", "timestamp"
    arrow: Any
    presence: str | None = None  # the field to ask HasField
    wrapper: bool = False
    per_second: int = 1_000_000
    symbols: Any = None  # enum: (numbers, symbols) as Arrow arrays
    default: Any = None


def _flat_column(f: _Field, t: Any, names: _Names, ns: str, index: int) -> _Column | None:
    """The column of one message field, or None if it is not flat."""
    r, rns = names.resolve(t, ns)
    branch = _branch(names, f.shape, r, rns)
    if branch is None:
        return None
    target, _ns = branch
    presence = f.name if f.nullable else None
    kind = _kind(target)
    if f.shape.kind == "scalar" and kind in _FLAT_SCALARS.get(f.shape.avro, ()):
        return _Column(f.name, index, "scalar", _ARROW[kind], presence, wrapper=f.shape.wrapper)
    if f.shape.kind == "enum" and kind == "enum":
        table = _enum_table(f.shape, target)
        symbols = (pa.array(list(table), pa.int64()), pa.array(list(table.values()), pa.string()))
        return _Column(f.name, index, "enum", pa.string(), presence, symbols=symbols)
    if f.shape.kind == "timestamp":
        per_second = 1_000 if target.get("logicalType") == "timestamp-millis" else 1_000_000
        return _Column(f.name, index, "timestamp", pa.int64(), presence, per_second=per_second)
    return None


def _default_column(af: dict[str, Any], names: _Names, ns: str) -> _Column | None:
    t = af["type"]
    if isinstance(t, list):
        if "null" not in t or len(t) != 2 or af.get("default", "") is not None:
            return None
        t = next(b for b in t if b != "null")
    r, _ns = names.resolve(t, ns)
    kind = _kind(r)
    if kind not in _ARROW:
        return None
    return _Column(af["name"], -1, "scalar", _ARROW[kind], default=af["default"])


def _flat_plan(shape: _Shape, avro: dict[str, Any]) -> tuple[list[_Column], list[str]] | None:
    """The columns of a flat message in an Avro record (and the message fields the getter reads), or None."""
    names = _Names(avro)
    ns = _namespace(avro, "")
    ours = {f.name: f for f in shape.fields}
    columns: list[_Column] = []
    attrs: list[str] = []
    for af in avro["fields"]:
        f = ours.get(af["name"])
        col = _default_column(af, names, ns) if f is None else _flat_column(f, af["type"], names, ns, len(attrs))
        if col is None:
            return None
        if f is not None:
            attrs.append(f.name)
        columns.append(col)
    return columns, attrs


def _present(msgs: list[Message], col: _Column) -> np.ndarray[Any, Any] | None:
    if col.presence is None:
        return None
    return np.fromiter(map(methodcaller("HasField", col.presence), msgs), dtype=bool, count=len(msgs))


def _time_column(subs: Sequence[Message], col: _Column, present: np.ndarray[Any, Any] | None) -> Any:
    n = len(subs)
    seconds = np.fromiter(map(attrgetter("seconds"), subs), dtype=np.int64, count=n)
    nanos = np.fromiter(map(attrgetter("nanos"), subs), dtype=np.int64, count=n)
    if n and (seconds.min() < _SECONDS_MIN or seconds.max() > _SECONDS_MAX or nanos.min() < 0
              or nanos.max() >= 1_000_000_000):
        raise _Refused
    values = seconds * col.per_second + nanos // (1_000_000_000 // col.per_second)
    return pa.array(values, pa.int64(), mask=None if present is None else ~present)


def _enum_column(values: Sequence[int], col: _Column, present: np.ndarray[Any, Any] | None) -> Any:
    numbers, symbols = col.symbols
    codes = pa.array(values, pa.int64(), mask=None if present is None else ~present)
    indexes = pc.index_in(codes, value_set=numbers)
    if indexes.null_count != codes.null_count:
        raise _Refused  # a number without a symbol
    return symbols.take(indexes)


def _column(col: _Column, values: Sequence[Any], msgs: list[Message], cnt: list[int]) -> Any:
    """One Arrow column of the parsed messages (``values``: the field's value of each)."""
    n = len(msgs)
    if col.index < 0:
        return pa.nulls(n, col.arrow) if col.default is None else pa.array([col.default] * n, col.arrow)
    present = _present(msgs, col)
    if col.kind == "timestamp" or col.wrapper:
        cnt[0] += sum(map(len, map(UnknownFieldSet, values)))
    if col.kind == "timestamp":
        return _time_column(values, col, present)
    if col.wrapper:
        values = list(map(attrgetter("value"), values))
    if col.kind == "enum":
        return _enum_column(values, col, present)
    try:
        return pa.array(values, col.arrow, mask=None if present is None else ~present)
    except (pa.ArrowInvalid, OverflowError) as err:
        raise _Refused from err  # a uint64 above 2**63-1


# -- the wire format, to explain a payload that does not parse ------------------------------------------------
_WIRE_NAMES = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "start-group", 4: "end-group", 5: "32-bit"}
_WIRE_OF_TYPE = {**{t: 0 for t in (_F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_UINT32, _F.TYPE_UINT64, _F.TYPE_SINT32,
                                   _F.TYPE_SINT64, _F.TYPE_BOOL, _F.TYPE_ENUM)},
                 **{t: 1 for t in (_F.TYPE_FIXED64, _F.TYPE_SFIXED64, _F.TYPE_DOUBLE)},
                 **{t: 5 for t in (_F.TYPE_FIXED32, _F.TYPE_SFIXED32, _F.TYPE_FLOAT)},
                 **{t: 2 for t in (_F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE)}, _F.TYPE_GROUP: 3}


class _Wire:
    """A walk of a payload's wire format (pure Python: only for a payload the C decoder refused) that says the
    first thing wrong with it, and the fields that came with a wire type their type never has."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.odd: list[str] = []

    def varint(self, pos: int, end: int, what: str) -> tuple[int, int]:
        """``(value, position after it)`` of the varint at ``pos``."""
        value, shift, start = 0, 0, pos
        while True:
            if pos >= end:
                raise _WireProblem(f"truncated: {what} at byte {start} runs past the end ({end})")
            b = self.data[pos]
            value |= (b & 0x7F) << shift
            pos += 1
            if not b & 0x80:
                return value, pos
            shift += 7
            if shift >= 70:
                raise _WireProblem(f"{what} at byte {start} is a varint of more than 10 bytes")

    def walk(self, desc: Descriptor | None, pos: int, end: int, path: str, group: int | None = None) -> int:
        while pos < end:
            start = pos
            tag, pos = self.varint(pos, end, "a tag")
            number, wire = tag >> 3, tag & 7
            fd = desc.fields_by_number.get(number) if desc is not None else None
            where = f"field {number}" + (f" ('{_join(path, fd.name)}')" if fd is not None else "")
            if number == 0:
                raise _WireProblem(f"field number 0 at byte {start}" + (f" in '{path}'" if path else ""))
            if wire == 4:
                if group == number:
                    return pos
                raise _WireProblem(f"an end-group tag of {where} at byte {start} without its start")
            self.note(fd, wire, where)
            pos = self.value(fd, wire, pos, end, where, _join(path, fd.name) if fd is not None else path, number)
        if group is not None:
            raise _WireProblem(f"truncated: the group of field {group} has no end")
        return pos

    def note(self, fd: FieldDescriptor | None, wire: int, where: str) -> None:
        if fd is None or wire not in _WIRE_NAMES:
            return
        expected = _WIRE_OF_TYPE[fd.type]
        if wire != expected and not (wire == 2 and fd.is_repeated and expected in (0, 1, 5)):  # packed
            self.odd.append(f"{where} came as {_WIRE_NAMES[wire]}, not as {_WIRE_NAMES[expected]}")

    def value(self, fd: FieldDescriptor | None, wire: int, pos: int, end: int, where: str, path: str,
              number: int) -> int:
        if wire == 0:
            return self.varint(pos, end, f"the value of {where}")[1]
        if wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise _WireProblem(f"truncated: {where} needs {size} bytes at byte {pos}, {end - pos} remain")
            return pos + size
        if wire == 2:
            size, pos = self.varint(pos, end, f"the length of {where}")
            if pos + size > end:
                raise _WireProblem(f"truncated: {where} says {size} bytes at byte {pos}, {end - pos} remain")
            self.inside(fd, pos, pos + size, where, path)
            return pos + size
        if wire == 3:
            inner = fd.message_type if fd is not None and fd.type == _F.TYPE_GROUP else None
            return self.walk(inner, pos, end, path, group=number)
        raise _WireProblem(f"wire type {wire} (there is none such) for {where} at byte {pos - 1}")

    def inside(self, fd: FieldDescriptor | None, pos: int, end: int, where: str, path: str) -> None:
        if fd is None:
            return
        if fd.type == _F.TYPE_MESSAGE:
            self.walk(fd.message_type, pos, end, path)
        elif fd.type == _F.TYPE_STRING:
            try:
                self.data[pos:end].decode("utf-8")
            except UnicodeDecodeError as err:
                raise _WireProblem(f"{where} is not UTF-8 ({err.reason} at byte {pos + err.start})") from None


class _WireProblem(Exception):
    pass


def _explain(desc: Descriptor, data: bytes, err: Exception) -> str:
    """The C decoder's reason, and what a walk of the wire format adds to it."""
    wire = _Wire(data)
    try:
        wire.walk(desc, 0, len(data), "")
        found = ""
    except _WireProblem as problem:
        found = str(problem)
    except RecursionError:
        found = "nested too deep"
    odd = f" (before that, {'; '.join(wire.odd[:3])}: a message of another type?)" if wire.odd and found else ""
    return f"{err}" + (f": {found}{odd}" if found else "")


# -- the schema and the decoder -----------------------------------------------------------------------------
def _message_names(files: Iterable[descriptor_pb2.FileDescriptorProto]) -> dict[str, str]:
    """Every message's full name (map entries aside) -> the file that defines it."""
    out: dict[str, str] = {}

    def visit(prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto], file: str) -> None:
        for m in messages:
            if m.options.map_entry:
                continue
            full = f"{prefix}.{m.name}" if prefix else m.name
            out[full] = file
            visit(full, m.nested_type, file)

    for f in files:
        visit(f.package, f.message_type, f.name)
    return out


def _unknown_message(message: str, names: dict[str, str], origin: str) -> ConfigError:
    short = message.rpartition(".")[2]
    close = [n for n in names if n.rpartition(".")[2] == short]
    close += [n for n in difflib.get_close_matches(message, list(names), n=3, cutoff=0.6) if n not in close]
    listed = sorted(names)
    held = ", ".join(listed[:20]) + (f" and {len(listed) - 20} more" if len(listed) > 20 else "")
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return ConfigError(f"no message {message!r} in the descriptor set{hint} It holds: {held or 'no message'}",
                       file=origin, field="protobuf_message",
                       fix="name one of its messages by its full name (package included): "
                           f'protobuf_message = "{close[0] if close else (listed[0] if listed else "pkg.Name")}"')


def _closure(by_name: dict[str, descriptor_pb2.FileDescriptorProto], root: str,
             origin: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """The file ``root`` and those it imports, transitively: dependencies first (in their import order)."""
    order: list[descriptor_pb2.FileDescriptorProto] = []
    done: set[str] = set()
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        name, i = stack.pop()
        deps = by_name[name].dependency
        if i < len(deps):
            stack.append((name, i + 1))
            dep = deps[i]
            if dep not in by_name:
                raise ConfigError(f"{name} imports {dep}, which the descriptor set lacks", file=origin,
                                  fix=_FIX_IMPORTS)
            if dep not in done and all(dep != s for s, _ in stack):
                stack.append((dep, 0))
        elif name not in done:
            done.add(name)
            order.append(by_name[name])
    return order


def _canonical(files: list[descriptor_pb2.FileDescriptorProto]) -> bytes:
    out = descriptor_pb2.FileDescriptorSet()
    for f in files:
        copy = out.file.add()
        copy.CopyFrom(f)
        copy.ClearField("source_code_info")
    return out.SerializeToString(deterministic=True)


class _Initialized(Protocol):
    """What a message of the C decoder has beyond the stubs' ``Message``."""

    def FindInitializationErrors(self) -> list[str]: ...  # protobuf's name


def _has_required(desc: Descriptor, seen: set[str]) -> bool:
    """Whether a message or one it holds has a proto2 ``required`` field."""
    seen.add(desc.full_name)
    return any(fd.is_required or (fd.message_type is not None and fd.message_type.full_name not in seen
                                  and _has_required(fd.message_type, seen)) for fd in desc.fields)


def _rebuild(descriptor_set: bytes, message: str, origin: str) -> ProtoSchema:
    return ProtoSchema.from_bytes(descriptor_set, message, origin=origin)


class ProtoSchema:
    """A message type of a descriptor set: its class, its Avro schema, its decoders.  Picklable (as its
    :attr:`descriptor_set`)."""

    message: str
    """The message's full name."""
    descriptor_set: bytes
    """A serialized ``FileDescriptorSet`` of the message's file and its imports (dependencies first, no
    ``source_code_info``): what a batch's intent freezes; :meth:`from_bytes` rebuilds an equal schema from it."""
    fingerprint: str
    """``sha256:<hex>`` of :attr:`descriptor_set`: other files of the set and comments do not change it."""
    origin: str
    """Where the set came from, as errors name it."""

    def __init__(self, files: list[descriptor_pb2.FileDescriptorProto], message: str, *, origin: str) -> None:
        """``files``: the message's file and its imports, dependencies first (see :meth:`from_file_protos`)."""
        self.message = message
        self.origin = origin
        self.descriptor_set = _canonical(files)
        self.fingerprint = "sha256:" + hashlib.sha256(self.descriptor_set).hexdigest()
        pool = descriptor_pool.DescriptorPool()
        try:
            for f in descriptor_pb2.FileDescriptorSet.FromString(self.descriptor_set).file:
                pool.Add(f)
            self.descriptor: Descriptor = pool.FindMessageTypeByName(message)
        except (TypeError, ValueError, KeyError) as err:
            raise ConfigError(f"the descriptor set does not build: {err}", file=origin,
                              fix=f"write it again with protoc: {_FIX_IMPORTS.split(': ', 1)[1]}") from err
        self._pool = pool  # the descriptors live as long as their pool
        self.message_class: type[Message] = message_factory.GetMessageClass(self.descriptor)
        root = _Shapes(origin).record(self.descriptor, "", ())
        if root is None:
            raise ConfigError(f"the message {message} has no field to map to Avro", file=origin,
                              field="protobuf_message", fix="name the message the producers send")
        self._shape = root

    @classmethod
    def load(cls, path: str | os.PathLike[str], message: str) -> ProtoSchema:
        """The message ``message`` of the descriptor set in file ``path`` (``schema.desc``)."""
        name = os.fspath(path)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except FileNotFoundError as err:
            raise ConfigError("the descriptor set does not exist", file=name, fix=_FIX_IMPORTS) from err
        except OSError as err:
            raise ConfigError(f"the descriptor set cannot be read: {err.strerror}", file=name,
                              fix="make it a readable file") from err
        return cls.from_bytes(data, message, origin=name)

    @classmethod
    def from_bytes(cls, data: bytes, message: str, *, origin: str) -> ProtoSchema:
        """The message ``message`` of a serialized ``FileDescriptorSet``; ``origin`` names it in errors."""
        not_a_set = ConfigError("not a descriptor set (a serialized google.protobuf.FileDescriptorSet)",
                                file=origin, fix=_FIX_IMPORTS)
        try:
            fds = descriptor_pb2.FileDescriptorSet.FromString(data)
        except DecodeError as err:
            raise not_a_set from err
        if not fds.file or len(UnknownFieldSet(fds)) or any(not f.name for f in fds.file):
            raise not_a_set
        return cls._of(list(fds.file), message, origin)

    @classmethod
    def from_file_protos(cls, files: list[bytes], message: str, *, origin: str) -> ProtoSchema:
        """The message ``message`` of serialized ``FileDescriptorProto`` s, in any order (a registry's answer: the
        schema and its references); ``origin`` names them in errors."""
        protos = []
        for i, data in enumerate(files):
            try:
                fd = descriptor_pb2.FileDescriptorProto.FromString(data)
            except DecodeError as err:
                raise ConfigError(f"file {i + 1} of {len(files)} is not a FileDescriptorProto: {err}",
                                  file=origin) from err
            if not fd.name or len(UnknownFieldSet(fd)):
                raise ConfigError(f"file {i + 1} of {len(files)} is not a FileDescriptorProto", file=origin)
            protos.append(fd)
        return cls._of(protos, message, origin)

    @classmethod
    def _of(cls, files: list[descriptor_pb2.FileDescriptorProto], message: str, origin: str) -> ProtoSchema:
        by_name: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        for f in files:
            if f.name in by_name and by_name[f.name] != f:
                raise ConfigError(f"two different files named {f.name}", file=origin, fix=_FIX_IMPORTS)
            by_name[f.name] = f
        message = message.lstrip(".")
        names = _message_names(by_name.values())
        if message not in names:
            raise _unknown_message(message, names, origin)
        return cls(_closure(by_name, names[message], origin), message, origin=origin)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProtoSchema):
            return NotImplemented
        return (self.message, self.fingerprint) == (other.message, other.fingerprint)

    def __hash__(self) -> int:
        return hash((self.message, self.fingerprint))

    def __repr__(self) -> str:
        return f"ProtoSchema({self.message!r}, {self.fingerprint[:19]}...)"

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.descriptor_set, self.message, self.origin)

    def avro_schema(self, *, timestamp: str = "micros") -> dict[str, Any]:
        """The Avro record schema derived from the message (a new JSON-able dict, the same for the same
        message); ``timestamp``: the unit of a Timestamp, ``"micros"`` or ``"millis"``."""
        if timestamp not in _TIMESTAMP_UNITS:
            raise ValueError(f"timestamp must be 'micros' or 'millis', not {timestamp!r}")
        schema: dict[str, Any] = _avro_type(self._shape, timestamp, set())
        return schema

    def check_against(self, avro: dict[str, Any]) -> list[str]:
        """Why the Avro schema ``avro`` (a type's schema.avsc) cannot hold every message, one line per field
        (``field 'amount': the message has int64 (Avro long), schema.avsc says string``); ``[]``: it can."""
        check = _Check(avro)
        names = check.names
        top, ns = names.resolve(avro, "")
        if _kind(top) != "record":
            return [f"schema.avsc is {describe_type(top)}, not a record: the message {self.message} is one"]
        check.record(self._shape, top, ns, "")
        return check.problems

    def decoder(self, avro: dict[str, Any] | None = None) -> ProtoDecoder:
        """A decoder of payloads into records of ``avro`` (the type's schema; default: :meth:`avro_schema`).
        :class:`ConfigError` if ``avro`` cannot hold every message (:meth:`check_against`)."""
        if avro is None:
            avro = self.avro_schema()
        problems = self.check_against(avro)
        if problems:
            raise ConfigError(f"the Avro schema does not fit the message {self.message}:\n  " + "\n  ".join(problems),
                              file=self.origin, fix="make schema.avsc fit the message, or leave it out to use the "
                                                    "schema derived from the message")
        return ProtoDecoder(self, avro)


class ProtoDecoder:
    """Payloads of one message type -> records (or columns) of one Avro schema.  Picklable."""

    def __init__(self, schema: ProtoSchema, avro: dict[str, Any]) -> None:
        """Use :meth:`ProtoSchema.decoder` (which checks that ``avro`` fits the message)."""
        self.schema = schema
        self.avro = avro
        self._parse = schema.message_class.FromString
        self._required = _has_required(schema.descriptor, set())  # the C decoder does not check them
        self._numbers = frozenset(schema.descriptor.fields_by_number)
        top, ns = _Names(avro).resolve(avro, "")
        self._record = _Compiler(avro).record(schema._shape, top, ns, "")
        plan = _flat_plan(schema._shape, top)
        self._columns: list[_Column] | None = plan[0] if plan else None
        self._getter: Callable[[Message], Any] | None = None
        if plan and plan[1]:
            getter = attrgetter(*plan[1])
            self._getter = getter if len(plan[1]) > 1 else (lambda m: (getter(m),))

    def __reduce__(self) -> tuple[Any, ...]:
        return ProtoDecoder, (self.schema, self.avro)

    @property
    def flat(self) -> bool:
        """Whether :meth:`columns` reads this message (its every field a flat one)."""
        return self._columns is not None

    def decode(self, data: bytes) -> tuple[dict[str, Any], int]:
        """One payload -> ``(record, unknown fields dropped)``.  :class:`ProtoDecodeError` if it does not parse,
        :class:`ProtoValueError` if a value does not fit the Avro schema."""
        try:
            msg = self._parse(data)
        except DecodeError as err:
            raise ProtoDecodeError(_explain(self.schema.descriptor, data, err)) from err
        if self._required and not msg.IsInitialized():
            raise ProtoDecodeError(f"Error parsing message with type '{self.schema.message}': required fields "
                                   f"missing: {', '.join(cast(_Initialized, msg).FindInitializationErrors())}")
        cnt = [0]
        return self._record(msg, cnt), cnt[0]

    def columns(self, datas: Sequence[bytes]) -> tuple[dict[str, Any], int] | None:
        """Payloads -> ``({Avro field: Arrow array}, unknown fields dropped)``, the values :meth:`decode` gives;
        None if the message is not flat, or any payload fails to parse or holds a value the schema cannot.

        The payloads are read from their wire format first (:class:`~.protocolumns.WireColumns`), by the C decoder
        when that reader says None."""
        if self._columns is None:
            return None
        if self._wire is not None:
            got = self._wire.read_messages(datas)
            if got is not None:
                return got
        if len(datas) <= _SLICE:
            return self._slice(datas, self._columns)
        parts = []
        for start in range(0, len(datas), _SLICE):  # few messages alive at once: the garbage collector's
            part = self._slice(datas[start:start + _SLICE], self._columns)  # passes stay short
            if part is None:
                return None
            parts.append(part)
        columns = {c.name: pa.concat_arrays([p[0][c.name] for p in parts]) for c in self._columns}
        return columns, sum(p[1] for p in parts)

    @cached_property
    def _wire(self) -> WireColumns | None:
        """The reader of :meth:`columns` from the wire format (made at its first use; a pickle does not carry it)."""
        return WireColumns.of(self)

    def _slice(self, datas: Sequence[bytes], plan: list[_Column]) -> tuple[dict[str, Any], int] | None:
        try:
            msgs = list(map(self._parse, datas))
        except DecodeError:
            return None
        if self._required and not all(map(methodcaller("IsInitialized"), msgs)):
            return None
        unknown = [u for u in map(UnknownFieldSet, msgs) if len(u)]
        cnt = [sum(map(len, unknown))]
        if any(fs[i].field_number in self._numbers for fs in unknown for i in range(len(fs))):
            return None  # a known field with another wire type: decode() says which
        values: list[Sequence[Any]] = []
        if self._getter is not None:
            values = list(zip(*map(self._getter, msgs))) if msgs else [()] * len(plan)
        try:
            out = {c.name: _column(c, values[c.index] if c.index >= 0 else (), msgs, cnt) for c in plan}
        except _Refused:
            return None
        return out, cnt[0]
