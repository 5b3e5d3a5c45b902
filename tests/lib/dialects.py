"""Producers' payloads for the tests, made as producers make them: a ``.proto`` compiled by protoc (grpcio-tools)
into a descriptor set, messages built from it (no generated code), and Confluent's frames written by confluent-kafka's
own ``AvroSerializer`` and ``ProtobufSerializer`` against the test registry (:mod:`tests.lib.registry_server`).

:func:`page_view_types` writes the two types the end-to-end tests run beside the demo's ``page_view``: the same
events sent as Protobuf (``page_view_pb``) and as Confluent-framed Avro (``page_view_cf``)."""

from __future__ import annotations

import base64
import importlib.resources
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

__all__ = ["PAGE_VIEW_PROTO", "compile_proto", "message_class", "page_view_message", "page_view_types",
           "confluent_avro_serializer", "confluent_protobuf_serializer", "ROOT", "page_view_record"]

ROOT = Path(__file__).resolve().parents[2]

PAGE_VIEW_PROTO = (ROOT / "examples" / "event_types" / "page_view_pb" / "page_view.proto").read_text()
"""The page view as the shop's services send it: the example type's .proto (examples/event_types/page_view_pb)."""


def compile_proto(folder: Path, files: dict[str, str], *, out: str = "schema.desc") -> Path:
    """``files`` (name -> .proto text) written into ``folder`` and compiled as users do:
    ``protoc --include_imports --descriptor_set_out=<out>``; the path of the descriptor set."""
    from grpc_tools import protoc

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    target = folder / out
    args = ["protoc", f"-I{folder}", f"-I{include}", "--include_imports", f"--descriptor_set_out={target}",
            *[str(folder / n) for n in files]]
    if protoc.main(args) != 0:
        raise AssertionError(f"protoc failed: {args}")
    return target


def message_class(descriptor_set: Path | bytes, name: str) -> Any:
    """The message class of ``name`` in a descriptor set, built as a producer without generated code would."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    data = descriptor_set.read_bytes() if isinstance(descriptor_set, Path) else descriptor_set
    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def page_view_record(event_time: int, *, eid: str | None = None, **extra: Any) -> dict[str, Any]:
    """A page view as the demo's Avro schema has it (``event_time`` in ms)."""
    rec = {"event_id": eid or str(uuid.uuid4()), "event_time": event_time, "user_id": None, "anonymous_id": "a1",
           "session_id": "s1", "product_id": "p1", "product_category": None, "price_minor": None, "currency": None,
           "page_url": "https://shop.example.com/p/1", "referrer_url": None, "device_type": "MOBILE",
           "country": None}
    rec.update(extra)
    return rec


def page_view_message(cls: Any, rec: dict[str, Any]) -> Any:
    """The Protobuf message of a page view record (an unset optional field stays unset)."""
    msg = cls()
    for f in msg.DESCRIPTOR.fields:
        v = rec.get(f.name)
        if v is None:
            continue
        if f.name == "event_time":
            msg.event_time.FromMilliseconds(v)
        elif f.enum_type is not None:
            setattr(msg, f.name, f.enum_type.values_by_name[v].number)
        else:
            setattr(msg, f.name, v)
    return msg


def page_view_types(root: Path, *, registry_url: str, source: str = "generate:") -> Path:
    """A folder of event types: the demo's ``page_view`` (JSON), ``page_view_pb`` (the same events as Protobuf,
    its Avro schema derived from the message) and ``page_view_cf`` (Confluent-framed Avro of page_view's schema,
    its schemas from ``registry_url``).  Returns ``root``."""
    pv = ROOT / "event_types" / "page_view"
    shutil.copytree(pv, root / "page_view")
    common = ('time_field = "event_time"\nid_field = "event_id"\nmax_payload_bytes = 65536\n'
              f'source = "{source}"\n')
    pb = root / "page_view_pb"
    compile_proto(pb / "proto", {"page_view.proto": PAGE_VIEW_PROTO}, out="../schema.desc")
    (pb / "etl.toml").write_text(common + 'payload = "protobuf"\nprotobuf_message = "shop.events.ProductPageViewed"\n'
                                 'protobuf_timestamps = "millis"\n')
    cf = root / "page_view_cf"
    cf.mkdir()
    shutil.copy(pv / "schema.avsc", cf / "schema.avsc")
    (cf / "etl.toml").write_text(common + f'payload = "confluent"\nschema_registry = "{registry_url}"\n')
    return root


def confluent_avro_serializer(registry_url: str, schema: dict[str, Any]) -> Any:
    """``AvroSerializer(record) -> frame`` of confluent-kafka, registering ``schema`` under the topic's subject."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})
    ctx = SerializationContext("page-views", MessageField.VALUE)
    return lambda rec: ser(rec, ctx)


def confluent_protobuf_serializer(registry_url: str, cls: Any) -> Any:
    """``ProtobufSerializer(message) -> frame`` of confluent-kafka for messages of ``cls``."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    ser = ProtobufSerializer(cls, client, conf={"auto.register.schemas": True, "use.deprecated.format": False})
    ctx = SerializationContext("page-views-pb", MessageField.VALUE)
    return lambda msg: ser(msg, ctx)


def b64_lines(payloads: list[bytes]) -> bytes:
    """A folder source's file of binary payloads: one base64 line each."""
    return b"".join(base64.b64encode(p) + b"\n" for p in payloads)
