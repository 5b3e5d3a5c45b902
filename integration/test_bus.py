"""A bus end to end, from the command line: one Pub/Sub subscription (Google's emulator) carrying three event types,
each message routed by an attribute to the type that claims it (Merpay's datahub), run as a fleet
(``event-etl run a b c --checkpoint-root``).  Each type gets exactly its own events in their own hours, each hour
one ``_COMPLETE``; messages no type claims (no attribute, or a value nobody claims) are kept once in the bus's dead
letters under ``<sink>/_unclaimed/<bus id>/``; a second run goes on where the first stopped, nothing twice."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import fastavro
import pytest

from event_etl.rules.buckets import MARKER_NAME
from event_etl.rules.routing import bus_id
from event_etl.timeutil import HOUR_MS, now_millis

EXE = str(Path(sys.executable).with_name("event-etl"))
PROJECT = "bus-project"
SCHEMA = {
    "type": "record", "name": "Event",
    "fields": [{"name": "id", "type": "string"},
               {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
               {"name": "kind", "type": ["null", "string"], "default": None}],
}


def _types(root: Path, source: str, rule: str = 'route_attribute = "type"') -> None:
    claims = {"clicks": None, "views": ["view", "page_view"], "buys": None}
    for name, values in claims.items():
        d = root / name
        d.mkdir(parents=True)
        (d / "schema.avsc").write_text(json.dumps(SCHEMA))
        lines = ['time_field = "ts"', 'id_field = "id"', 'out_of_orderness = "1m"', f'source = "{source}"', rule]
        if values is not None:
            lines.append(f"route_value = {json.dumps(values)}")
        (d / "etl.toml").write_text("\n".join(lines) + "\n")


def _sink_ids(sink: Path, name: str, late: set[str] | None = None) -> tuple[dict[str, list[str]], dict[str, bool]]:
    """``({hour folder: [ids]}, {hour folder: marked})`` of a type in a local sink; the ids of its late files (in an
    hour open when they came, after their own) added to ``late``."""
    ids: dict[str, list[str]] = {}
    marked: dict[str, bool] = {}
    for hour in sorted((sink / name).glob("dt=*/hour=*")):
        rel = str(hour.relative_to(sink / name))
        marked[rel] = (hour / MARKER_NAME).exists()
        for f in sorted(hour.glob("*.avro")):
            with open(f, "rb") as fh:
                got = [r["id"] for r in fastavro.reader(fh)]
            ids.setdefault(rel, []).extend(got)
            if late is not None and f.name.startswith("late-"):
                late.update(got)
    return ids, marked


def _hour_folder(t: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t // 1000, tz=UTC).strftime("dt=%Y-%m-%d/hour=%H")


def _unclaimed(sink: Path, bus: str) -> list[dict]:
    out = []
    for f in sorted((sink / "_unclaimed" / bus).glob("dt=*/*.avro")):
        out.extend(fastavro.reader(io.BytesIO(f.read_bytes())))
    return out


def test_a_pubsub_subscription_routed_by_attribute_to_three_types(tmp_path, pubsub_server):
    from google.cloud import pubsub_v1

    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    name = f"hub{uuid.uuid4().hex[:8]}"
    topic, subscription = pub.topic_path(PROJECT, name), sub.subscription_path(PROJECT, f"{name}-etl")
    pub.create_topic(name=topic)
    sub.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=10)
    source = f"pubsub:{subscription}"
    types = tmp_path / "types"
    _types(types, source)
    sink, ck = tmp_path / "sink", tmp_path / "ck"
    now = now_millis()
    h0 = now - now % HOUR_MS - 3 * HOUR_MS
    sent: dict[str, list[tuple[str, int]]] = {"clicks": [], "views": [], "buys": [], "unclaimed": []}
    attr_of: dict[str, str | None] = {}

    def publish(n: int, base: int) -> None:
        futures = []
        for i in range(n):
            t = base + i * 7_000
            eid = str(uuid.uuid4())
            attr = ["clicks", "view", "page_view", "buys", "refunds", None][i % 6]  # refunds: claimed by no type
            owner = {"view": "views", "page_view": "views", "refunds": "unclaimed", None: "unclaimed"}.get(attr, attr)
            sent[owner].append((eid, t))
            attr_of[eid] = attr
            data = json.dumps({"id": eid, "ts": t, "kind": attr}).encode()
            futures.append(pub.publish(topic, data, **({"type": attr} if attr else {"note": "none"})))
        for f in futures:
            f.result(timeout=30)

    # one pull stream: the emulator's delivery order (several reorder by up to a segment's age: some events late)
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": pubsub_server.host, "PYSPARK_PYTHON": sys.executable,
           "EVENT_ETL_PUBSUB_STREAMS": "1"}

    def run() -> subprocess.CompletedProcess:
        r = subprocess.run([EXE, "run", "clicks", "views", "buys", "--event-types", str(types), "--sink", str(sink),
                            "--checkpoint-root", str(ck), "--master", "local[2]", "--trigger-interval", "1s",
                            "--once", "--drain"], env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        return r

    publish(600, h0)  # about 70 minutes of events over hours h0 and h0+1
    first = run()
    bus = bus_id(source)
    assert (ck / "_bus" / bus / "pubsub").is_dir(), "the bus keeps its spool beside the types' checkpoints"
    assert "unclaimed" in first.stdout + first.stderr
    publish(300, h0 + 2 * HOUR_MS)  # a second run goes on where the first stopped
    run()
    _check(sink, sent, bus, "no attribute 'type'")
    status = subprocess.run([EXE, "status", "--sink", str(sink), "--checkpoint-root", str(ck), "--event-types",
                             str(types)], env=env, capture_output=True, text=True, timeout=120)
    assert f"bus {bus}: {len(sent['unclaimed'])} unclaimed message(s) kept in" in status.stdout, status.stdout

    # a type added to claim what was unclaimed takes it back: listed, replayed with its attributes, then written
    d = types / "refunds"
    d.mkdir()
    (d / "schema.avsc").write_text(json.dumps(SCHEMA))
    (d / "etl.toml").write_text(f'time_field = "ts"\nid_field = "id"\nsource = "{source}"\n'
                                'route_attribute = "type"\n')
    refunds = {eid for eid, _ in sent["unclaimed"] if attr_of[eid] == "refunds"}
    base = [EXE, "deadletter", "refunds", "--unclaimed", "--sink", str(sink), "--event-types", str(types)]
    listed = subprocess.run([*base, "--counts"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and f"unclaimed            {len(refunds)}" in listed.stdout, listed.stdout
    replay = subprocess.run([*base, "--replay-to", f"pubsub:{topic}", "--too-late"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert replay.returncode == 0 and f"sent {len(refunds)} dead letters" in replay.stdout, replay.stderr
    r = subprocess.run([EXE, "run", "clicks", "views", "buys", "refunds", "--event-types", str(types), "--sink",
                        str(sink), "--checkpoint-root", str(ck), "--master", "local[2]", "--trigger-interval", "1s",
                        "--once", "--drain"], env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    ids, marked = _sink_ids(sink, "refunds")
    assert Counter(i for hour in ids.values() for i in hour) == Counter(refunds), "each replayed message once"
    assert all(marked.values())


def _check(sink: Path, sent: dict[str, list[tuple[str, int]]], bus: str, missing: str) -> None:
    """Every type's events exactly once, each in its own hour (or, late, in an hour after it: Pub/Sub delivers out of
    order), every hour marked; the unclaimed kept once."""
    for name in ("clicks", "views", "buys"):
        late: set[str] = set()
        ids, marked = _sink_ids(sink, name, late)
        placed = Counter(i for hour in ids.values() for i in hour)
        expected = {eid for eid, _ in sent[name]}
        assert set(placed) == expected, f"{name}: {len(expected - set(placed))} missing, " \
                                        f"{len(set(placed) - expected)} not its own"
        assert max(placed.values()) == 1, f"{name}: an event written twice"
        assert all(marked.values()), f"{name}: drained, every hour holding data is complete"
        for eid, t in sent[name]:
            hour = next(h for h, hid in ids.items() if eid in hid)
            if eid in late:
                assert hour > _hour_folder(t), f"{name}: {eid} late in {hour}, not after its own hour"
            else:
                assert hour == _hour_folder(t), f"{name}: {eid} in {hour}"
        assert len(late) <= len(expected) // 10, f"{name}: {len(late)} late of {len(expected)}"
    kept = _unclaimed(sink, bus)
    assert Counter(json.loads(r["payload"])["id"] for r in kept) == Counter(eid for eid, _ in sent["unclaimed"]), \
        "every unclaimed message kept once"
    assert {r["reason"] for r in kept} == {"unclaimed"}
    assert any(missing in r["detail"] for r in kept)
    assert any("'refunds'" in r["detail"] for r in kept)


@pytest.mark.parametrize("by", ["header", "field"])
def test_a_kafka_topic_routed_by_header_or_by_field_to_three_types(tmp_path, noida, by):
    """Grab's and most Kafka shops' bus: one topic of two partitions, the type named by a header or by a field of
    the JSON value."""
    topic = f"bus-{by}-{uuid.uuid4().hex[:6]}"
    noida.create_topic(topic, partitions=2)
    source = f"kafka:{topic}"
    types = tmp_path / "types"
    _types(types, source, 'route_attribute = "type"' if by == "header" else 'route_field = "kind"')
    sink, ck = tmp_path / "sink", tmp_path / "ck"
    now = now_millis()
    h0 = now - now % HOUR_MS - 3 * HOUR_MS
    sent: dict[str, list[tuple[str, int]]] = {"clicks": [], "views": [], "buys": [], "unclaimed": []}

    def produce(n: int, base: int) -> None:
        records = []
        for i in range(n):
            t = base + i * 7_000
            eid = str(uuid.uuid4())
            attr = ["clicks", "view", "page_view", "buys", "refunds", None][i % 6]
            owner = {"view": "views", "page_view": "views", "refunds": "unclaimed", None: "unclaimed"}.get(attr, attr)
            sent[owner].append((eid, t))
            value = json.dumps({"id": eid, "ts": t, **({"kind": attr} if attr else {})}).encode()
            headers = [("type", attr.encode())] if attr and by == "header" else []
            records.append((i % 2, value, None, t, headers))
        noida.produce(topic, records)

    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": noida.bootstrap, "PYSPARK_PYTHON": sys.executable}

    def run() -> None:
        r = subprocess.run([EXE, "run", "clicks", "views", "buys", "--event-types", str(types), "--sink", str(sink),
                            "--checkpoint-root", str(ck), "--master", "local[2]", "--trigger-interval", "1s",
                            "--once", "--drain"], env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]

    produce(300, h0)
    run()
    produce(120, h0 + 2 * HOUR_MS)
    run()
    _check(sink, sent, bus_id(source), "no attribute 'type'" if by == "header" else "no field 'kind'")


def test_kafka_topics_by_pattern_each_claimed_by_a_type_and_a_topic_that_appears_later(tmp_path, noida):
    """Grab's CDC: a topic per table, read as one source by pattern (``kafka:re:``); each type claims its tables'
    topics by name; a topic no type claims is kept as unclaimed; a claimed topic created between two runs is read
    from its oldest record."""
    prefix = f"cdc{uuid.uuid4().hex[:6]}.shop"
    orders, refunds, audit, orders2 = (f"{prefix}.{t}" for t in ("orders", "refunds", "audit", "orders2"))
    for topic in (orders, refunds, audit):
        noida.create_topic(topic, partitions=2)
    source = f"kafka:re:{prefix}\\..*"
    types = tmp_path / "types"
    for name, claims in (("orders", [orders, orders2]), ("refunds", [refunds])):
        d = types / name
        d.mkdir(parents=True)
        (d / "schema.avsc").write_text(json.dumps(SCHEMA))
        (d / "etl.toml").write_text(f"time_field = \"ts\"\nid_field = \"id\"\nout_of_orderness = \"1m\"\n"
                                    f"source = '{source}'\nroute_value = {json.dumps(claims)}\n")
    sink, ck = tmp_path / "sink", tmp_path / "ck"
    now = now_millis()
    h0 = now - now % HOUR_MS - 3 * HOUR_MS
    sent: dict[str, list[tuple[str, int]]] = {"orders": [], "refunds": [], "unclaimed": []}

    def produce(topic: str, owner: str, n: int, base: int, partitions: int = 2) -> None:
        records = []
        for i in range(n):
            t = base + i * 20_000
            eid = str(uuid.uuid4())
            sent[owner].append((eid, t))
            records.append((i % partitions, json.dumps({"id": eid, "ts": t}).encode(), None, t, []))
        noida.produce(topic, records)

    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": noida.bootstrap, "PYSPARK_PYTHON": sys.executable}

    def run() -> None:
        r = subprocess.run([EXE, "run", "orders", "refunds", "--event-types", str(types), "--sink", str(sink),
                            "--checkpoint-root", str(ck), "--master", "local[2]", "--trigger-interval", "1s",
                            "--once", "--drain"], env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]

    produce(orders, "orders", 120, h0)
    produce(refunds, "refunds", 60, h0)
    produce(audit, "unclaimed", 30, h0)
    run()
    noida.create_topic(orders2, partitions=1)
    produce(orders2, "orders", 40, h0 + 2 * HOUR_MS, partitions=1)
    produce(refunds, "refunds", 30, h0 + 2 * HOUR_MS)
    run()
    for name in ("orders", "refunds"):
        ids, marked = _sink_ids(sink, name)
        placed = Counter(i for hour in ids.values() for i in hour)
        assert set(placed) == {eid for eid, _ in sent[name]} and max(placed.values()) == 1, name
        assert all(marked.values()), name
    kept = _unclaimed(sink, bus_id(source))
    assert Counter(json.loads(r["payload"])["id"] for r in kept) == Counter(eid for eid, _ in sent["unclaimed"])
    assert all(f"topic is '{audit}'" in r["detail"] for r in kept)


def test_a_kafka_topic_of_confluent_avro_and_protobuf_routed_by_record_name(tmp_path, noida, registry_server):
    """Grab's bus: one topic carrying Confluent-framed Protobuf and Avro (confluent-kafka's own serializers, the test
    registry), ``route_field`` set, each frame routed by its record's name (the registry's schema of its id; for
    Protobuf the message its indexes point at): ``page_view_cf`` claims the Avro record by its bare name,
    ``page_view_cfpb`` the Protobuf message by its full name; a frame of a record no type claims is kept unclaimed,
    naming the record."""
    from event_etl.eventtypes import load_event_type
    from tests.lib.dialects import (
        confluent_avro_serializer,
        confluent_protobuf_serializer,
        message_class,
        page_view_message,
        page_view_record,
        page_view_types,
    )
    from tests.lib.harness import read_sink

    registry_server.reset()
    topic = f"bus-records-{uuid.uuid4().hex[:6]}"
    noida.create_topic(topic, partitions=2)
    types = page_view_types(tmp_path / "types", registry_url=registry_server.url)
    cfpb = types / "page_view_cfpb"
    cfpb.mkdir()
    (cfpb / "schema.avsc").write_text(json.dumps(load_event_type(types / "page_view_pb").schema))
    common = (f'time_field = "event_time"\nid_field = "event_id"\npayload = "confluent"\nsource = "kafka:{topic}"\n'
              f'schema_registry = "{registry_server.url}"\nroute_field = "type"\n')
    (cfpb / "etl.toml").write_text(common + 'route_value = "shop.events.ProductPageViewed"\n')
    (types / "page_view_cf" / "etl.toml").write_text(common + 'route_value = "ProductPageViewedEvent"\n')
    cls = message_class(types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
    avro = confluent_avro_serializer(registry_server.url, load_event_type(types / "page_view_cf").schema)
    proto = confluent_protobuf_serializer(registry_server.url, cls)
    other = confluent_avro_serializer(registry_server.url, {
        "type": "record", "name": "OrderPlaced", "namespace": "shop.orders",
        "fields": [{"name": "id", "type": "string"}]})
    now = now_millis()
    h0 = now - now % HOUR_MS - 3 * HOUR_MS
    sent: dict[str, list[tuple[str, int]]] = {"page_view_cf": [], "page_view_cfpb": []}
    records, unclaimed = [], 0
    for i in range(240):  # three hours, in order
        rec = page_view_record(h0 + i * 45_000)
        if i % 8 == 7:
            records.append((i % 2, other({"id": rec["event_id"]}), None, rec["event_time"], []))
            unclaimed += 1
            continue
        name = "page_view_cf" if i % 2 else "page_view_cfpb"
        sent[name].append((rec["event_id"], rec["event_time"]))
        frame = avro(rec) if i % 2 else proto(page_view_message(cls, rec))
        records.append((i % 2, frame, None, rec["event_time"], []))
    noida.produce(topic, records)
    sink = tmp_path / "sink"
    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": noida.bootstrap, "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([EXE, "run", "page_view_cf", "page_view_cfpb", "--event-types", str(types), "--sink",
                        str(sink), "--checkpoint-root", str(tmp_path / "ck"), "--master", "local[2]",
                        "--trigger-interval", "1s", "--once", "--drain"], env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for name, events in sent.items():
        content = read_sink(sink, name, "event_id")
        placed = Counter(i for hc in content.values() for i in hc.timely + hc.late)
        assert set(placed) == {eid for eid, _ in events} and max(placed.values()) == 1, f"{name}: each event once"
        hour_of = {eid: t - t % HOUR_MS for eid, t in events}
        for hour, hc in content.items():
            assert all(hour_of[i] == hour for i in hc.timely), f"{name}: each event in its UTC hour"
            assert hc.marker is not None, f"{name}: drained, every hour marked"
    kept = _unclaimed(sink, bus_id(f"kafka:{topic}"))
    assert len(kept) == unclaimed
    assert all("record 'shop.orders.OrderPlaced'" in k["detail"] for k in kept), kept[0]["detail"]
