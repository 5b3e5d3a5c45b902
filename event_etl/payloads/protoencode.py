"""A record of a Protobuf type's Avro schema written back as its message: what a producer of the type sends.

The inverse of :meth:`event_etl.payloads.protobuf.ProtoDecoder.decode` over the mapping of
:mod:`event_etl.payloads.protobuf`, for the built-in generator (``event-etl run TYPE`` of a Protobuf type with the
default source, ``event-etl publish``) and for tests and benchmarks: a null leaves the field unset, an enum's symbol
is its number, a timestamp is in the Avro field's unit (or a ``datetime``), a ``Struct`` is its JSON text, a map's
keys are text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from event_etl.payloads.protobuf import ProtoSchema

__all__ = ["encoder"]

_WRAPPERS = {f"google.protobuf.{n}Value" for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool",
                                                    "String", "Bytes")}
_JSON = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def encoder(proto: ProtoSchema, avro: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
    """``encode(record) -> message bytes`` of ``proto``'s message for records of ``avro`` (the type's schema: its
    timestamps' unit, one for the whole schema as the mapping derives it)."""
    unit = "millis" if '"timestamp-millis"' in json.dumps(avro) else "micros"
    cls = proto.message_class

    def encode(rec: dict[str, Any]) -> bytes:
        msg = cls()
        _fill(msg, rec, unit)
        return bytes(msg.SerializeToString())

    return encode


def _fill(msg: Message, rec: dict[str, Any], unit: str) -> None:
    for fd in msg.DESCRIPTOR.fields:
        v = rec.get(fd.name)
        if v is None:
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            _map(getattr(msg, fd.name), fd.message_type, v, unit)
        elif fd.is_repeated:
            _repeated(getattr(msg, fd.name), fd, v, unit)
        elif fd.message_type is not None:
            _set(getattr(msg, fd.name), v, unit)
        else:
            setattr(msg, fd.name, _scalar(fd, v))


def _scalar(fd: Any, v: Any) -> Any:
    if fd.enum_type is not None:
        return fd.enum_type.values_by_name[v].number if isinstance(v, str) else int(v)
    return v


def _set(sub: Any, v: Any, unit: str) -> None:
    """A message field's value (set in place): a well-known type's, or a nested record's."""
    name = sub.DESCRIPTOR.full_name
    if name == "google.protobuf.Timestamp":
        if isinstance(v, datetime):
            sub.FromDatetime(v)
        elif unit == "millis":
            sub.FromMilliseconds(int(v))
        else:
            sub.FromMicroseconds(int(v))
    elif name == "google.protobuf.Duration":
        sub.FromMicroseconds(int(v))
    elif name in _WRAPPERS:
        sub.value = v
    elif name in _JSON:
        json_format.Parse(v if isinstance(v, str) else json.dumps(v), sub)
    else:
        sub.SetInParent()
        _fill(sub, v, unit)


def _repeated(field: Any, fd: Any, values: list[Any], unit: str) -> None:
    for v in values:
        if fd.message_type is not None:
            _set(field.add(), v, unit)
        else:
            field.append(_scalar(fd, v))


def _map(field: Any, entry: Any, values: dict[str, Any], unit: str) -> None:
    key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
    for k, v in values.items():
        key: Any = k
        if key_fd.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
            key = k in ("true", "True", True)
        elif key_fd.cpp_type != FieldDescriptor.CPPTYPE_STRING:
            key = int(k)
        if value_fd.message_type is not None:
            _set(field[key], v, unit)
        else:
            field[key] = _scalar(value_fd, v)
