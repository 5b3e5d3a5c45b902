"""event_etl.payloads.registry against a registry over real HTTP (tests/lib/registry_server.py): confluent-kafka's own
serializers register schemas and write frames; Registry.schema(id) gives back what decodes them, asks each id once,
and tells "no such id" (SchemaNotFound) from "cannot ask" (RegistryUnavailable) in bounded time."""

from __future__ import annotations

import base64
import importlib.resources
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from event_etl.errors import UsageError
from event_etl.payloads.registry import (
    Registry,
    RegistrySchema,
    RegistryUnavailable,
    SchemaNotFound,
    url_has_credentials,
)
from event_etl.settings import ENV_SCHEMA_REGISTRY_AUTH, ENV_SCHEMA_REGISTRY_AUTH_FILE, Settings
from tests.lib.registry_server import UNRENDERED_PROTO, RegistryServer

CLICK = {
    "type": "record", "name": "Click", "namespace": "shop",
    "fields": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"},
               {"name": "ref", "type": ["null", "string"], "default": None}],
}

MAIN_PROTO = """syntax = "proto3";
package shop;
import "common/money.proto";
message Header { string source = 1; }
message Order { string id = 1; common.Money total = 2; repeated string items = 3; }
"""
MONEY_PROTO = """syntax = "proto3";
package common;
import "common/currency.proto";
message Money { int64 units = 1; common.Currency currency = 2; }
"""
CURRENCY_PROTO = """syntax = "proto3";
package common;
enum Currency { EUR = 0; USD = 1; }
"""


@pytest.fixture
def server(registry_server: RegistryServer) -> Iterator[RegistryServer]:
    registry_server.reset()
    yield registry_server
    registry_server.reset()


def _client(server: RegistryServer) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": server.url})


def _avro_frame(server: RegistryServer, topic: str, record: dict[str, Any], schema: dict[str, Any] = CLICK) -> bytes:
    serializer = AvroSerializer(_client(server), json.dumps(schema), conf={"auto.register.schemas": True})
    return bytes(serializer(record, SerializationContext(topic, MessageField.VALUE)))


def _compile(tmp_path: Path, files: dict[str, str], main: str) -> descriptor_pool.DescriptorPool:
    """``files`` compiled by protoc (no generated code): a pool holding ``main`` and what it imports."""
    from grpc_tools import protoc

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    out = tmp_path / "set.desc"
    include = importlib.resources.files("grpc_tools") / "_proto"
    assert protoc.main(["protoc", f"-I{tmp_path}", f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={out}", main]) == 0
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(file)
    return pool


def _pool_of(answer: RegistrySchema, name: str) -> descriptor_pool.DescriptorPool:
    """A pool built from the registry's answer alone, as the lead builds it from its checkpoint."""
    pool = descriptor_pool.DescriptorPool()
    for dep_name, text in answer.resolved:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
        assert proto.name == dep_name
        pool.Add(proto)
    main = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(answer.schema))
    main.name = main.name or name
    pool.Add(main)
    return pool


def _split_protobuf_frame(frame: bytes) -> tuple[int, list[int], bytes]:
    """Confluent's Protobuf frame: magic, id, then message indexes (zig-zag varints: count, then each)."""
    assert frame[0] == 0
    schema_id = int.from_bytes(frame[1:5], "big")
    pos = 5

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            byte = frame[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)

    count = varint()
    indexes = [0] if count == 0 else [varint() for _ in range(count)]
    return schema_id, indexes, frame[pos:]


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed on leaving: nothing listens there


# -- what the serializers write, and what schema() gives back ---------------------------------------------------


def test_an_avro_frame_decodes_with_the_schema_its_id_names(server: RegistryServer) -> None:
    record = {"user": "ana", "n": 7, "ref": None}
    frame = _avro_frame(server, "clicks", record)
    schema_id = int.from_bytes(frame[1:5], "big")
    assert frame[0] == 0 and schema_id == server.register("clicks-value", json.dumps(CLICK))

    answer = Registry(server.url).schema(schema_id)
    assert (answer.id, answer.schema_type, answer.references, answer.resolved) == (schema_id, "AVRO", (), ())
    parsed = fastavro.parse_schema(json.loads(answer.schema))
    assert fastavro.schemaless_reader(io.BytesIO(frame[5:]), parsed) == record
    assert server.calls[-1].query == {}  # an Avro id is asked once, in its default format

    # ids are global: the same schema under another subject is the same id; another schema, another id
    assert int.from_bytes(_avro_frame(server, "clicks-replay", record)[1:5], "big") == schema_id
    other = {**CLICK, "fields": CLICK["fields"][:2]}
    assert int.from_bytes(_avro_frame(server, "clicks", {"user": "b", "n": 1}, other)[1:5], "big") != schema_id


def test_a_protobuf_frame_decodes_with_the_serialized_descriptor_and_its_references(
        server: RegistryServer, tmp_path: Path) -> None:
    pool = _compile(tmp_path, {"shop/order.proto": MAIN_PROTO, "common/money.proto": MONEY_PROTO,
                               "common/currency.proto": CURRENCY_PROTO}, "shop/order.proto")
    order_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    header_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Header"))
    order = order_class(id="o-1", items=["a", "b"])
    order.total.units, order.total.currency = 42, 1
    conf = {"auto.register.schemas": True}
    ctx = SerializationContext("orders", MessageField.VALUE)
    frame = ProtobufSerializer(order_class, _client(server), conf)(order, ctx)
    header_frame = ProtobufSerializer(header_class, _client(server), conf)(
        header_class(source="web"), SerializationContext("hdr", MessageField.VALUE))

    schema_id, indexes, body = _split_protobuf_frame(frame)
    assert indexes == [1] and frame[5:7] == b"\x02\x02"  # the file's second message: count 1, index 1, zig-zag
    assert header_frame[5] == 0 and _split_protobuf_frame(header_frame)[1] == [0]  # [0]: a single 0 byte

    serializers_calls = len(server.calls)
    answer = Registry(server.url).schema(schema_id)
    assert answer.schema_type == "PROTOBUF" and answer.schema != UNRENDERED_PROTO
    assert answer.references == (("common/money.proto", "common/money.proto", 1),)
    assert [name for name, _ in answer.resolved] == ["common/currency.proto", "common/money.proto"]  # deps first
    decoded = message_factory.GetMessageClass(
        _pool_of(answer, "shop/order.proto").FindMessageTypeByName("shop.Order")).FromString(body)
    assert (decoded.id, list(decoded.items), decoded.total.units, decoded.total.currency) == ("o-1", ["a", "b"], 42, 1)
    # the serialized form was asked for, of the id's schema and of each reference
    asked = [(c.path, c.query.get("format")) for c in server.calls[serializers_calls:]]
    assert asked[2][0] in ("/subjects/orders-value/versions/1", "/subjects/hdr-value/versions/1")  # one file, one id
    assert asked[:2] + asked[3:] == [(f"/schemas/ids/{schema_id}", None), (f"/schemas/ids/{schema_id}/versions", None),
                                     ("/subjects/common%2Fmoney.proto/versions/1", "serialized"),
                                     ("/subjects/common%2Fcurrency.proto/versions/1", "serialized")]
    assert asked[2][1] == "serialized"


def test_the_answer_goes_through_a_checkpoint_unchanged(server: RegistryServer, tmp_path: Path) -> None:
    answer = RegistrySchema(id=3, schema_type="PROTOBUF", schema="CgA=", references=(("a.proto", "a", 2),),
                            resolved=(("a.proto", "CgJh"),))
    assert RegistrySchema.from_json(json.loads(json.dumps(answer.to_json()))) == answer
    for bad in ({}, {"id": "3", "schemaType": "AVRO", "schema": "{}", "references": []},
                {"id": 3, "schemaType": "AVRO", "schema": "{}", "references": [{"name": "x"}]}, [], None):
        with pytest.raises(ValueError, match="not a registry schema"):
            RegistrySchema.from_json(bad)


# -- once per id, and the two kinds of failure ------------------------------------------------------------------


def test_each_id_is_asked_once_even_by_many_threads(server: RegistryServer) -> None:
    schema_id = server.register("once-value", json.dumps({**CLICK, "name": "Once"}))
    registry = Registry(server.url)
    answers: list[RegistrySchema] = []
    threads = [threading.Thread(target=lambda: answers.append(registry.schema(schema_id))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(answers) == 8 and len(set(answers)) == 1
    assert registry.schema(schema_id) is answers[0]
    assert server.count(f"/schemas/ids/{schema_id}") == 1


def test_an_unknown_id_is_not_found_and_asked_again_later(server: RegistryServer) -> None:
    registry = Registry(server.url)
    with pytest.raises(SchemaNotFound) as caught:
        registry.schema(9999)
    assert caught.value.schema_id == 9999 and "9999" in str(caught.value)
    with pytest.raises(SchemaNotFound):
        registry.schema(9999)
    assert server.count("/schemas/ids/9999") == 2  # "absent" is not kept: it may be registered by then


def test_one_5xx_is_retried_more_are_unavailable(server: RegistryServer) -> None:
    schema_id = server.register("retry-value", json.dumps({**CLICK, "name": "Retry"}))
    server.fail(503, times=1)
    assert Registry(server.url, timeout=2).schema(schema_id).id == schema_id

    server.fail(500, times=10)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable) as caught:
        Registry(server.url, timeout=2).schema(schema_id)
    assert time.monotonic() - started < 3
    assert caught.value.status == 500 and "HTTP 500" in caught.value.message and caught.value.fix
    assert not isinstance(caught.value, LookupError)


def test_an_answer_that_is_not_the_registrys_json_is_unavailable(server: RegistryServer) -> None:
    schema_id = server.register("garbage-value", json.dumps({**CLICK, "name": "Garbage"}))
    server.garbage(times=1)
    with pytest.raises(RegistryUnavailable, match="not the schema registry's JSON") as caught:
        Registry(server.url, timeout=2).schema(schema_id)
    assert "proxy" in (caught.value.fix or "")
    # a url that is not the registry's root: a 404 that is not the registry's "schema not found"
    with pytest.raises(RegistryUnavailable, match="HTTP 404"):
        Registry(server.url + "/ui", timeout=2).schema(schema_id)


def test_a_registry_that_does_not_answer_is_unavailable_after_the_timeout(server: RegistryServer) -> None:
    schema_id = server.register("paused-value", json.dumps({**CLICK, "name": "Paused"}))
    server.pause()
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="cannot reach") as caught:
        Registry(server.url, timeout=1).schema(schema_id)
    took = time.monotonic() - started
    server.resume()
    assert 0.9 < took < 3, took
    assert "ReadTimeout" in caught.value.message and "network" in (caught.value.fix or "")
    assert Registry(server.url, timeout=1).schema(schema_id).id == schema_id  # and answers again once resumed


def test_a_port_nothing_listens_on_is_unavailable_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="ConnectError"):
        Registry(f"http://127.0.0.1:{_dead_port()}", timeout=5).schema(1)
    assert time.monotonic() - started < 2


# -- credentials ------------------------------------------------------------------------------------------------


def test_the_environments_credentials_reach_the_registry(server: RegistryServer, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    schema_id = server.register("auth-value", json.dumps({**CLICK, "name": "Auth"}))
    server.auth = "etl:s3cret"
    monkeypatch.setenv(ENV_SCHEMA_REGISTRY_AUTH, "etl:s3cret")
    assert Registry.for_url(server.url).schema(schema_id).id == schema_id
    assert server.calls[-1].auth == "etl:s3cret"
    assert Registry.for_url(server.url) is Registry.for_url(server.url)  # one per url and credentials

    monkeypatch.delenv(ENV_SCHEMA_REGISTRY_AUTH)
    (tmp_path / "auth").write_text("etl:s3cret\nignored\n")
    monkeypatch.setenv(ENV_SCHEMA_REGISTRY_AUTH_FILE, str(tmp_path / "auth"))
    server.calls.clear()
    assert Registry.for_url(server.url + "/").schema(schema_id).id == schema_id
    assert server.calls[-1].auth == "etl:s3cret"


@pytest.mark.parametrize("auth", ["etl:wrong", None])
def test_refused_credentials_are_unavailable_not_absent(server: RegistryServer, monkeypatch: pytest.MonkeyPatch,
                                                        auth: str | None) -> None:
    schema_id = server.register("auth-value", json.dumps({**CLICK, "name": "Auth"}))
    server.auth = "etl:s3cret"
    if auth is not None:
        monkeypatch.setenv(ENV_SCHEMA_REGISTRY_AUTH, auth)
    else:
        monkeypatch.delenv(ENV_SCHEMA_REGISTRY_AUTH, raising=False)
    monkeypatch.delenv(ENV_SCHEMA_REGISTRY_AUTH_FILE, raising=False)
    with pytest.raises(RegistryUnavailable, match="HTTP 401") as caught:
        Registry.for_url(server.url).schema(schema_id)
    assert caught.value.status == 401 and ENV_SCHEMA_REGISTRY_AUTH in (caught.value.fix or "")
    assert "wrong" not in str(caught.value)


def test_credentials_in_the_url_are_never_shown(server: RegistryServer) -> None:
    server.auth = "etl:s3cret"
    url = server.url.replace("http://", "http://etl:hunter2@")
    assert url_has_credentials(url) and url_has_credentials(f"{server.url},{url}")
    assert not url_has_credentials(server.url) and not url_has_credentials("https://sr.example:8081/api")
    with pytest.raises(RegistryUnavailable) as caught:
        Registry(url, timeout=2).schema(1)
    assert "hunter2" not in str(caught.value) and "***@127.0.0.1" in str(caught.value)
    assert caught.value.url == server.url.replace("http://", "http://***@")
    with pytest.raises(UsageError, match="cannot be used") as usage:
        Registry(url, auth="etl:s3cret")  # both: Confluent's client refuses, and so do we
    assert "hunter2" not in str(usage.value)
    dead = f"http://etl:hunter2@127.0.0.1:{_dead_port()}"
    with pytest.raises(RegistryUnavailable) as unreachable:
        Registry(dead, timeout=2).schema(1)
    assert "hunter2" not in str(unreachable.value)


def test_bad_credential_settings_are_usage_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = Settings.from_env({ENV_SCHEMA_REGISTRY_AUTH: "a:b", ENV_SCHEMA_REGISTRY_AUTH_FILE: "/x"})
    assert (settings.schema_registry_auth, settings.schema_registry_auth_file) == ("a:b", "/x")
    monkeypatch.setenv(ENV_SCHEMA_REGISTRY_AUTH, "a:b")
    monkeypatch.setenv(ENV_SCHEMA_REGISTRY_AUTH_FILE, str(tmp_path / "absent"))
    with pytest.raises(UsageError, match="both"):
        Registry.for_url("http://127.0.0.1:1")
    monkeypatch.delenv(ENV_SCHEMA_REGISTRY_AUTH)
    with pytest.raises(UsageError, match="cannot read"):
        Registry.for_url("http://127.0.0.1:1")
    (tmp_path / "absent").write_text("no-colon-secret\n")
    with pytest.raises(UsageError, match="not user:password") as caught:
        Registry.for_url("http://127.0.0.1:1")
    assert "no-colon-secret" not in str(caught.value)


# -- the test registry itself -----------------------------------------------------------------------------------


def test_the_test_registry_answers_the_clients_other_calls(server: RegistryServer) -> None:
    client = _client(server)
    _avro_frame(server, "listed", {"user": "x", "n": 1, "ref": "y"})
    assert "listed-value" in client.get_subjects()
    assert client.get_versions("listed-value") == [1]
    latest = client.get_latest_version("listed-value")
    assert latest.version == 1 and json.loads(latest.schema.schema_str) == json.loads(json.dumps(CLICK))
    versions = client.get_schema_versions(latest.schema_id)
    assert ("listed-value", 1) in [(v.subject, v.version) for v in versions]
    assert client.lookup_schema("listed-value", latest.schema).schema_id == latest.schema_id
    assert client.set_compatibility("listed-value", "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility("listed-value") == "NONE"
    assert client.get_compatibility() == "BACKWARD"
    with pytest.raises(Exception, match="40401"):
        client.get_versions("never-registered")
