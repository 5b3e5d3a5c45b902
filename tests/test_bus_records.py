"""A bus routed by ``route_field`` whose producers frame their payloads (issue 59, item 1): each framed Avro or
Protobuf message goes to the type that claims its record's name (event_etl.bus.records), a JSON message on the same
bus by its field; a frame naming a schema no type has, or an id the registry does not hold, is unclaimed with why.
Confluent frames are written by confluent-kafka's own serializers against the test registry
(tests/lib/registry_server.py)."""

from __future__ import annotations

import io
import pickle

import fastavro
import pytest

from event_etl.bus.records import record_namer
from event_etl.errors import ConfigError
from event_etl.eventtypes import load_event_type, schema_fingerprint
from event_etl.payloads.frames import SOE_MAGIC, gilt_fingerprint
from event_etl.rules.routing import Route, Router, Unclaimed, claimed_by, plan_buses
from tests.lib.dialects import (
    confluent_avro_serializer,
    confluent_protobuf_serializer,
    message_class,
    page_view_message,
    page_view_record,
    page_view_types,
)
from tests.lib.harness import make_event_type

SUB = "kafka:datahub"
ORDER = {"type": "record", "name": "OrderPlaced", "namespace": "shop.orders",
         "fields": [{"name": "id", "type": "string"},
                    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
REFUND = dict(ORDER, name="RefundIssued", fields=[*ORDER["fields"], {"name": "amount", "type": "long"}])


def _datum(schema: dict, rec: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), rec)
    return out.getvalue()


def _soe(schema: dict, rec: dict) -> bytes:
    return SOE_MAGIC + bytes.fromhex(schema_fingerprint(schema)) + _datum(schema, rec)


def _gilt(schema: dict, rec: dict) -> bytes:
    return b"\x81" + bytes.fromhex(gilt_fingerprint(schema)) + _datum(schema, rec)


def _bus(tmp_path, **claims):
    """Types ``orders`` (schema OrderPlaced), ``refunds`` (RefundIssued) and ``clicks`` (JSON), one bus by field."""
    types = [make_event_type(tmp_path, "orders", ORDER, source=SUB, route_field="type", **claims.get("orders", {})),
             make_event_type(tmp_path, "refunds", REFUND, source=SUB, route_field="type",
                             **claims.get("refunds", {})),
             make_event_type(tmp_path, "clicks", source=SUB, route_field="type")]
    (plan,) = plan_buses([(et.name, SUB, et.route) for et in types])
    return types, plan.router().with_namer(record_namer(types))


def test_framed_avro_goes_to_the_type_claiming_its_records_name_and_json_by_its_field(tmp_path):
    _, router = _bus(tmp_path, orders={"route_value": "shop.orders.OrderPlaced"},
                     refunds={"route_value": "RefundIssued"})
    order = {"id": "o1", "ts": 1}
    refund = {"id": "r1", "ts": 1, "amount": 5}
    assert router.route(_soe(ORDER, order), None) == "orders", "a single-object frame, by the full name"
    assert router.route(_gilt(ORDER, order), None) == "orders", "Gilt's frame, by the full name"
    assert router.route(_soe(REFUND, refund), None) == "refunds", "the bare name claims it too"
    assert router.route(b'{"type": "clicks", "id": "c"}', None) == "clicks", "JSON on the same bus: by its field"
    assert router.route(b'{"type": "shop.orders.OrderPlaced"}', None) == "orders", "a JSON field may name it too"
    other = dict(ORDER, name="OrderShipped")
    got = router.route(_soe(other, order), None)
    assert isinstance(got, Unclaimed) and f"crc64avro:{schema_fingerprint(other)}" in got.detail
    assert "no type of the bus registers" in got.detail
    assert router.route(_soe(ORDER, order)[:6], None) == Unclaimed(
        "a framed payload cut short: an Avro single-object header is 10 bytes (C3 01 + 8-byte fingerprint), got 6")


def test_a_record_no_type_claims_is_unclaimed_naming_it(tmp_path):
    _, router = _bus(tmp_path, orders={"route_value": "shop.orders.OrderPlaced"})
    assert router.route(_soe(REFUND, {"id": "r", "ts": 1, "amount": 1}), None) == Unclaimed(
        "record 'shop.orders.RefundIssued' (a framed payload), which no type of the bus claims")


@pytest.fixture
def registry(registry_server):
    from event_etl.payloads import registry as client

    registry_server.reset()
    client._SHARED.clear()  # as in a new executor process
    yield registry_server
    registry_server.reset()


def test_confluent_frames_name_their_record_through_the_registry_avro_and_protobuf(tmp_path, registry):
    """Grab's Protobuf and a registry's Avro on one topic: the namer asks the registry of the bus's Confluent type
    for each id once, follows Protobuf's message indexes, and travels to the tasks pickled (what it fetched stays
    behind)."""
    types = page_view_types(tmp_path / "pv", registry_url=registry.url)
    pb = load_event_type(types / "page_view_pb")
    cf = load_event_type(types / "page_view_cf")
    avro_schema = cf.schema
    cls = message_class(types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
    rec = page_view_record(1_700_000_000_000)
    avro_frame = confluent_avro_serializer(registry.url, avro_schema)(rec)
    proto_frame = confluent_protobuf_serializer(registry.url, cls)(page_view_message(cls, rec))
    payment = confluent_avro_serializer(registry.url, ORDER)({"id": "p", "ts": 1})
    namer = record_namer([cf, pb])
    assert namer.registry_type is not None and namer.registry_type.name == "page_view_cf"
    assert namer(avro_frame) == "com.example.clickstream.ProductPageViewedEvent"
    assert namer(proto_frame) == "shop.events.ProductPageViewed"
    assert namer(payment) == "shop.orders.OrderPlaced"
    assert namer(b'{"a": 1}') is None, "JSON is no frame: routed by its field"
    missing = b"\x00" + (4242).to_bytes(4, "big") + avro_frame[5:]
    got = namer(missing)
    assert isinstance(got, Unclaimed) and "schema id 4242 is not in the registry" in got.detail
    asked = sum(n for path, n in registry.requests.items() if path.startswith("/schemas/ids/"))
    for _ in range(3):
        namer(avro_frame), namer(proto_frame)
    assert sum(n for path, n in registry.requests.items() if path.startswith("/schemas/ids/")) == asked, \
        "each id asked once"
    again = pickle.loads(pickle.dumps(namer))  # as every task of the bus gets it, in the same executor
    assert again(proto_frame) == "shop.events.ProductPageViewed"
    assert sum(n for path, n in registry.requests.items() if path.startswith("/schemas/ids/")) == asked, \
        "a task after the first asks nothing the executor knows (the process's registry client keeps what it fetched)"
    router = Router({"page_view_cf": Route("field", "type", ("ProductPageViewedEvent",)),
                     "page_view_cfpb": Route("field", "type", ("shop.events.ProductPageViewed",))}, again)
    assert router.route(avro_frame, None) == "page_view_cf"
    assert router.route(proto_frame, None) == "page_view_cfpb"
    assert claimed_by(Route("field", "type", ("shop.events.ProductPageViewed",)), proto_frame, "", "kafka:t/0@1",
                      again), "a type added later claims a kept frame by its record's name"
    assert not claimed_by(Route("field", "type", ("OrderPlaced",)), proto_frame, "", "kafka:t/0@1", again)


def test_a_confluent_frame_on_a_bus_without_a_registry_is_unclaimed_with_why(tmp_path):
    _, router = _bus(tmp_path)
    got = router.route(b"\x00\x00\x00\x00\x07\x02", None)
    assert isinstance(got, Unclaimed) and 'no type of the bus has payload = "confluent"' in got.detail


def test_route_field_over_bare_protobuf_or_avro_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_event_type(tmp_path, "bare", source=SUB, route_field="type", payload="avro", schema_attribute="schema")
    assert "a bare Avro datum: it carries neither" in str(err.value) and "route_attribute" in err.value.fix


def test_a_bus_by_attribute_ignores_frames_and_describes_what_a_field_claims(tmp_path):
    route = Route("field", "type", ("OrderPlaced",))
    assert "or a framed payload's record name" in route.describe()
    by_attribute = Router({"a": Route("attribute", "type", ("a",))}).with_namer(lambda p: "never asked")
    assert by_attribute.namer is None
    assert by_attribute.route(_soe(ORDER, {"id": "o", "ts": 1}), {"type": "a"}) == "a"
