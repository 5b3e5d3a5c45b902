"""Producers' dialects through the real executor and controller (``tests.lib.harness.LocalPipeline``: a folder source's
base64 lines, process_split, the controller's ledgers and markers; no Spark): Confluent-framed Avro against the
test registry (frames written by confluent-kafka's own ``AvroSerializer``), Gilt's frame, and the schema named by a
message's attribute.  Each bad frame is a dead letter with its reason and its bytes; the good records land in their
hours as the same records sent as JSON do; the fast path writes what the record path writes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from event_etl.errors import SchemaRegistryDown
from event_etl.eventtypes import load_event_type
from event_etl.payloads.frames import gilt_fingerprint
from event_etl.settings import Settings, settings_in_force
from event_etl.storage.deadletter import iter_deadletters
from event_etl.task.executor import BatchContext, process_split
from event_etl.task.payload import Decoder
from event_etl.timeutil import HOUR_MS
from tests.lib.dialects import ROOT, confluent_avro_serializer, page_view_record
from tests.lib.harness import FakeClock, LocalPipeline, read_sink, t

PV = ROOT / "event_types" / "page_view"
SCHEMA = json.loads((PV / "schema.avsc").read_text())


def _datum(schema: dict, rec: dict) -> bytes:
    bio = io.BytesIO()
    fastavro.schemaless_writer(bio, fastavro.parse_schema(schema), rec)
    return bio.getvalue()


def _cf_type(root: Path, url: str, **extra: str):
    d = root / "page_view_cf"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(PV / "schema.avsc", d / "schema.avsc")
    lines = ['time_field = "event_time"', 'id_field = "event_id"', 'payload = "confluent"',
             f'schema_registry = "{url}"', *[f"{k} = {json.dumps(v)}" for k, v in extra.items()]]
    (d / "etl.toml").write_text("\n".join(lines) + "\n")
    return load_event_type(d)


def _new_process() -> None:
    """As in a new executor process: no decoder, no registry client, nothing cached."""
    from event_etl.payloads import registry as client
    from event_etl.task import executor

    executor._DECODERS.clear()
    client._SHARED.clear()


@pytest.fixture
def registry(registry_server):
    registry_server.reset()
    _new_process()
    yield registry_server
    registry_server.reset()


def _ids(content: dict) -> dict[int, list[str]]:
    return {h: sorted(c.timely + c.late) for h, c in content.items() if c.timely or c.late}


def test_confluent_frames_land_in_their_hours_and_bad_frames_are_dead_letters(tmp_path, registry):
    et = _cf_type(tmp_path / "types", registry.url)
    serialize = confluent_avro_serializer(registry.url, SCHEMA)
    now = t("14:05")
    recs = [page_view_record(t("13:00") + i * 20_000) for i in range(150)]  # 13:00 .. 13:50
    good = [serialize(r) for r in recs]
    sid = int.from_bytes(good[0][1:5], "big")
    other = registry.register("payments-value", json.dumps(
        {"type": "record", "name": "Payment", "fields": [{"name": "amount", "type": "long"}]}))
    changed = dict(SCHEMA, fields=[dict(f, type="long") if f["name"] == "session_id" else f for f in SCHEMA["fields"]])
    changed_id = registry.register("page-views-value", json.dumps(changed))
    bad = {
        "truncated": (good[0][:-3], "invalid_avro"),
        "wrong magic": (b"\x01" + good[1][1:], "invalid_avro"),
        "short header": (b"\x00\x00\x01", "invalid_avro"),
        "unknown id": (b"\x00" + (9999).to_bytes(4, "big") + good[2][5:], "unknown_schema"),
        "another subject": (b"\x00" + other.to_bytes(4, "big") + _datum(
            {"type": "record", "name": "Payment", "fields": [{"name": "amount", "type": "long"}]}, {"amount": 5}),
            "incompatible_schema"),
        "a field changed": (b"\x00" + changed_id.to_bytes(4, "big") + _datum(changed, dict(recs[0], session_id=5)),
                            "incompatible_schema"),
        "trailing bytes": (good[3] + b"\x00", "invalid_avro"),
    }
    lines = [base64.b64encode(p) for p in good] + [base64.b64encode(p) for p, _ in bad.values()] + [b"not base64!"]
    pipe = LocalPipeline(tmp_path, et, FakeClock(now))
    pipe.batch(lines, shards=2)

    content = read_sink(pipe.sink, "page_view_cf", "event_id")
    assert _ids(content) == {t("13:00"): sorted(r["event_id"] for r in recs)}
    got = sorted((d.reason, d.payload) for d in iter_deadletters(pipe.storage, "page_view_cf"))
    want = sorted([(r, base64.b64encode(p)) for p, r in bad.values()] + [("invalid_avro", b"not base64!")])
    assert got == want, "each bad frame once, with its reason and the line it came in"
    details = {(d.reason, d.detail) for d in iter_deadletters(pipe.storage, "page_view_cf")}
    incompatible = sorted(detail for reason, detail in details if reason == "incompatible_schema")
    assert "record name changed from Payment" in incompatible[0], incompatible
    assert "field `session_id`" in incompatible[1] and f"registry id {changed_id}" in incompatible[1], incompatible
    assert any(reason == "unknown_schema" and "9999" in detail for reason, detail in details)
    assert registry.count(f"/schemas/ids/{sid}") == 1, "each writer schema is fetched once"
    assert registry.count("/schemas/ids/9999") <= 2, "an unknown id is asked once per split"
    kept = sorted(p.name for p in (tmp_path / "ckpt" / "etl" / "registry").iterdir())
    assert f"{sid}.json" in kept, "the writer schema is kept in the checkpoint"


def test_a_replay_decides_the_same_without_the_registry(tmp_path, registry):
    et = _cf_type(tmp_path / "types", registry.url)
    serialize = confluent_avro_serializer(registry.url, SCHEMA)
    recs = [page_view_record(t("13:00") + i * 60_000) for i in range(30)]
    lines = [base64.b64encode(serialize(r)) for r in recs]
    pipe = LocalPipeline(tmp_path, et, FakeClock(t("13:40")))
    pipe.batch(lines)
    before = {p: p.read_bytes() for p in sorted(pipe.sink.rglob("*.avro"))}
    registry.fail(status=500, times=1000)  # the registry is down from now on
    _new_process()  # it knows only what the checkpoint hands it
    pipe.restart()
    pipe.batch([], batch_id=0)  # the same batch replayed
    after = {p: p.read_bytes() for p in sorted(pipe.sink.rglob("*.avro"))}
    assert after == before
    assert registry.count("/schemas/ids/1") + registry.count("/schemas/ids/2") <= 1, "no request in the replay"


def test_an_unreachable_registry_waits_then_fails_the_batch_and_dead_letters_nothing(tmp_path, registry):
    et = _cf_type(tmp_path / "types", registry.url)
    serialize = confluent_avro_serializer(registry.url, SCHEMA)
    lines = [base64.b64encode(serialize(page_view_record(t("13:00") + i * 60_000))) for i in range(10)]
    _new_process()
    registry.fail(status=503, times=10_000)
    pipe = LocalPipeline(tmp_path, et, FakeClock(t("13:20")))
    env = {**os.environ, "EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS": "1.5"}
    with settings_in_force(Settings.from_env(env)), pytest.raises(SchemaRegistryDown) as err:
        pipe.batch(lines)
    assert "unreachable for 2s" in str(err.value) or "unreachable for 1s" in str(err.value)
    assert "fix:" in str(err.value) and "replayed" in str(err.value)
    assert list(iter_deadletters(pipe.storage, "page_view_cf")) == [], "nothing dead-lettered for the outage"
    registry.reset()  # the registry is back: the same batch, replayed, writes everything
    pipe.restart()
    pipe.batch([], batch_id=0)
    content = read_sink(pipe.sink, "page_view_cf", "event_id")
    assert sum(len(c.timely) for c in content.values()) == 10


def test_the_fast_path_writes_what_the_record_path_writes(tmp_path, registry):
    et = _cf_type(tmp_path / "types", registry.url)
    serialize = confluent_avro_serializer(registry.url, SCHEMA)
    import random

    rng = random.Random(3)
    recs = [page_view_record(t("13:00") + rng.randint(0, 2 * HOUR_MS), user_id=rng.choice([None, "u1", "ü"]),
                             price_minor=rng.choice([None, 0, -5, 2**40]), device_type=rng.choice(["DESKTOP", "OTHER"]),
                             country=rng.choice([None, "DE"]))
            for _ in range(400)]
    path = tmp_path / "in.b64"
    path.write_bytes(b"".join(base64.b64encode(serialize(r)) + b"\n" for r in recs))
    from event_etl.sources.splits import Split

    split = Split.of_files(0, [(str(path), 0, path.stat().st_size, t("15:30"))])
    out = {}
    for fast in (True, False):
        from event_etl.storage import Storage

        sink = tmp_path / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), 0, t("13:00"), t("15:30"), writer="3fa9c1")
        rep, keys = process_split(split, ctx, Storage(str(sink)))
        files = {p.relative_to(sink): hashlib.sha256(p.read_bytes()).hexdigest() for p in sink.rglob("*.avro")}
        out[fast] = (files, rep["counts"], keys)
    assert out[True] == out[False]
    assert sum(out[True][1].values()) == 400


def _gilt(schema: dict, rec: dict) -> bytes:
    return b"\x81" + bytes.fromhex(gilt_fingerprint(schema)) + _datum(schema, rec)


def test_gilt_frames_of_a_registered_version_are_read_and_others_are_dead_letters(tmp_path):
    et = load_event_type(PV)
    rec = page_view_record(t("13:10"))
    v1 = json.loads((PV / "schemas" / "v1.avsc").read_text())
    ok = _gilt(v1, rec)
    unknown = b"\x81" + hashlib.sha256(b"another schema").digest() + _datum(SCHEMA, rec)
    d = Decoder(et)
    good, got, ms = d.decode(ok)
    assert good and str(got["event_id"]) == rec["event_id"] and ms == t("13:10")
    assert d.decode(base64.b64encode(ok))[0], "a folder source's base64 line"
    assert d.decode(unknown)[1].value == "unknown_schema"
    assert d.decode(ok[:20])[1].value == "invalid_avro"
    assert d.decode(ok + b"\x01")[1].value == "invalid_avro"


def test_a_schema_named_by_an_attribute(tmp_path, registry):
    d = tmp_path / "types" / "pv"
    shutil.copytree(PV, d)
    with open(d / "etl.toml", "a") as fh:
        fh.write('\nschema_attribute = "schema"\n')
    toml = (d / "etl.toml").read_text()
    head, sep, rest = toml.partition("[pubsub]")
    (d / "etl.toml").write_text(head.replace('\nschema_attribute = "schema"\n', "") + 'schema_attribute = "schema"\n'
                                + f'schema_registry = "{registry.url}"\npayload = "avro"\n' + sep + rest)
    et = load_event_type(d)
    rec = page_view_record(t("13:10"))
    datum = _datum(SCHEMA, rec)
    sid = registry.register("pv-value", json.dumps(SCHEMA))
    dec = Decoder(et)
    fp = et.fingerprint
    for name in ("v1", f"crc64avro:{fp}", fp, f"sha256:{gilt_fingerprint(SCHEMA)}", str(sid)):
        ok, got, ms = dec.decode_message(datum, {"schema": name}, t("13:11"))
        assert ok and str(got["event_id"]) == rec["event_id"] and ms == t("13:10"), name
    ok, got, _ = dec.decode_message(datum, {}, t("13:11"))
    assert ok, "no attribute: a datum of the current schema (payload = avro)"
    for name, reason in (("v9", "unknown_schema"), ("nonsense", "unknown_schema"), ("424242", "unknown_schema")):
        ok, why, detail = dec.decode_message(datum, {"schema": name}, t("13:11"))
        assert not ok and why.value == reason, (name, why, detail)
    ok, why, _ = dec.decode_message(datum[:-4], {"schema": "v1"}, t("13:11"))
    assert not ok and why.value == "invalid_avro"


@pytest.fixture(scope="module")
def pb_types(tmp_path_factory, registry_server):
    from tests.lib.dialects import page_view_types

    return page_view_types(tmp_path_factory.mktemp("types"), registry_url=registry_server.url)


def test_protobuf_messages_land_in_their_hours_and_bad_bytes_are_dead_letters(tmp_path, pb_types):
    from tests.lib.dialects import message_class, page_view_message

    et = load_event_type(pb_types / "page_view_pb")
    cls = message_class(pb_types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
    recs = [page_view_record(t("13:00") + i * 20_000, user_id="u" if i % 3 else None) for i in range(150)]
    good = [page_view_message(cls, r).SerializeToString() for r in recs]
    with_unknown = good[5] + b"\xa8\x1f\x01"  # field 501 (varint 1): not in the descriptor, dropped and counted
    timestamp_cls = message_class(pb_types / "page_view_pb" / "schema.desc", "google.protobuf.Timestamp")
    bad = {
        "truncated": (good[0][:-4], "invalid_protobuf"),
        "random bytes": (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "invalid_protobuf"),
        "a length past the end": (b"\x0a\x05ab", "invalid_protobuf"),
        "a known field of another wire type": (b"\x08\x01" + good[4], "invalid_protobuf"),
        "a message of another type": (timestamp_cls(seconds=1795269600, nanos=5).SerializeToString(),
                                      "invalid_protobuf"),
        "a message without its time": (page_view_message(cls, dict(recs[1], event_time=None)).SerializeToString(),
                                       "missing_time"),
        "an enum number without a symbol": (good[2] + b"\x60\x2a", "schema_mismatch"),
        "oversized": (good[3] + b"\x5a" + b"\x80\x80\x04" + b"x" * 65536, "oversized"),
    }
    lines = ([base64.b64encode(p) for p in good[:5]] + [base64.b64encode(with_unknown)]
             + [base64.b64encode(p) for p in good[6:]] + [base64.b64encode(p) for p, _ in bad.values()])
    pipe = LocalPipeline(tmp_path, et, FakeClock(t("14:05")))
    pipe.batch(lines, shards=2)
    content = read_sink(pipe.sink, "page_view_pb", "event_id")
    assert _ids(content) == {t("13:00"): sorted(r["event_id"] for r in recs)}
    got = sorted((d.reason, d.payload) for d in iter_deadletters(pipe.storage, "page_view_pb"))
    assert got == sorted((r, base64.b64encode(p)) for p, r in bad.values())
    details = {d.reason: d.detail for d in iter_deadletters(pipe.storage, "page_view_pb")}
    assert "device_type" in details["schema_mismatch"] and "42" in details["schema_mismatch"], details
    wire = [d.detail for d in iter_deadletters(pipe.storage, "page_view_pb") if "came as" in d.detail]
    assert any("field 1 ('event_id')" in w and "came as varint, not as length-delimited" in w for w in wire), wire
    records = [r for c in content.values() for f in c.files.values() for r in _records(f)]
    by_id = {r["event_id"]: r for r in records}
    assert by_id[recs[0]["event_id"]]["user_id"] is None and by_id[recs[1]["event_id"]]["user_id"] == "u"
    assert by_id[recs[0]["event_id"]]["event_time"] == datetime_of(recs[0]["event_time"])
    assert pipe.controller.totals["dropped_fields"] == 1, "the field the descriptor does not know: dropped, counted"
    from event_etl.job.progress import ProgressPrinter

    batch = next(p for kind, p in pipe.events if kind == "batch")
    printer = ProgressPrinter("page_view_pb", clock=lambda: t("14:05"))
    assert "dropped fields 1" in printer.batch_line(batch), "the progress line says it"


def _records(data: bytes) -> list[dict]:
    return list(fastavro.reader(io.BytesIO(data)))


def datetime_of(ms: int):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def test_protobuf_fast_path_writes_what_the_record_path_writes_and_counts_unknown_fields(tmp_path, pb_types):
    import random

    from event_etl.sources.splits import Split
    from event_etl.storage import Storage
    from tests.lib.dialects import message_class, page_view_message

    et = load_event_type(pb_types / "page_view_pb")
    cls = message_class(pb_types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
    rng = random.Random(5)
    payloads = []
    for i in range(300):
        rec = page_view_record(t("13:00") + rng.randint(0, 2 * HOUR_MS), user_id=rng.choice([None, "u1", "ü"]),
                               price_minor=rng.choice([None, 0, -5, 2**40]),
                               device_type=rng.choice(["DESKTOP", "OTHER"]), country=rng.choice([None, "DE"]))
        p = page_view_message(cls, rec).SerializeToString()
        payloads.append(p + (b"\xa8\x1f\x01" if i % 10 == 0 else b""))
    path = tmp_path / "in.b64"
    path.write_bytes(b"".join(base64.b64encode(p) + b"\n" for p in payloads))
    split = Split.of_files(0, [(str(path), 0, path.stat().st_size, t("15:30"))])
    out = {}
    for fast in (True, False):
        sink = tmp_path / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), 0, t("13:00"), t("15:30"), writer="3fa9c1")
        rep, keys = process_split(split, ctx, Storage(str(sink)))
        files = {p.relative_to(sink): hashlib.sha256(p.read_bytes()).hexdigest() for p in sink.rglob("*.avro")}
        out[fast] = (files, rep["counts"], rep.get("dropped_fields"), keys)
    assert out[True] == out[False]
    assert out[True][2] == 30, "each unknown field dropped is counted"
    assert sum(out[True][1].values()) == 300


def test_confluent_protobuf_frames_are_read_against_the_registrys_descriptor(tmp_path, pb_types, registry):
    from tests.lib.dialects import confluent_protobuf_serializer, message_class, page_view_message

    cls = message_class(pb_types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
    d = tmp_path / "types" / "page_view_cfpb"
    d.mkdir(parents=True)
    (d / "schema.avsc").write_text(json.dumps(load_event_type(pb_types / "page_view_pb").schema))
    (d / "etl.toml").write_text(f'time_field = "event_time"\nid_field = "event_id"\npayload = "confluent"\n'
                                f'schema_registry = "{registry.url}"\n')
    et = load_event_type(d)
    serialize = confluent_protobuf_serializer(registry.url, cls)
    recs = [page_view_record(t("13:00") + i * 60_000) for i in range(40)]
    frames = [serialize(page_view_message(cls, r)) for r in recs]
    assert frames[0][0] == 0 and frames[0][5] == 0, "Confluent's Protobuf frame: magic, id, message index [0]"
    bad = {"indexes past the file's messages": (frames[0][:5] + b"\x02\x0a" + frames[0][6:], "incompatible_schema"),
           "a message cut short": (frames[1][:-3], "invalid_protobuf")}
    lines = [base64.b64encode(f) for f in frames] + [base64.b64encode(p) for p, _ in bad.values()]
    pipe = LocalPipeline(tmp_path, et, FakeClock(t("13:50")))
    pipe.batch(lines)
    content = read_sink(pipe.sink, "page_view_cfpb", "event_id")
    assert _ids(content) == {t("13:00"): sorted(r["event_id"] for r in recs)}
    got = sorted((dl.reason, dl.payload) for dl in iter_deadletters(pipe.storage, "page_view_cfpb"))
    assert got == sorted((r, base64.b64encode(p)) for p, r in bad.values())


def test_the_generator_of_a_protobuf_type_sends_its_messages(pb_types):
    """``event-etl run page_view_pb`` with the built-in generator (the demo of a Protobuf type): its payloads are
    the type's messages (one base64 line each, as a folder holds them; raw bytes on the wire), its invalid ones are
    not."""
    from dataclasses import replace

    from event_etl.sources.generator import Generator, GeneratorParams

    et = load_event_type(pb_types / "page_view_pb")
    gen = Generator(et, replace(GeneratorParams(start=t("10:00"), rate=1000, speedup=60), invalid=0.05))
    dec = Decoder(et)
    outcomes = Counter()
    for g in gen.range(0, 600):
        ok, rec, ms = dec.decode(g.payload)
        assert ok == (g.intent != "invalid"), (g.intent, rec, ms)
        assert dec.decode_message(gen.wire(g.payload), {}, g.arrival)[0] == ok
        if ok and g.event_time is not None:
            assert ms == g.event_time
        outcomes[g.intent] += 1
    assert outcomes["invalid"] > 10 and outcomes["timely"] > 400


def test_a_binary_dead_letter_is_replayed_as_the_target_carries_it():
    """A Protobuf type's dead letter from a folder is its base64 line, from a message its bytes: a replay to a message
    source sends the bytes, to a folder the line (dead letters of a JSON type go as they are)."""
    from event_etl.consumer.replay import wire_payload

    raw = b"\x0a\x03abc\n\xff"
    line = base64.b64encode(raw)
    assert wire_payload(line, "in.b64@0", "pubsub", binary=True) == raw
    assert wire_payload(line, "gen:5", "kafka", binary=True) == raw
    assert wire_payload(raw, "msg:12", "dir", binary=True) == line
    assert wire_payload(raw, "kafka:t/0@7", "kafka", binary=True) == raw
    assert wire_payload(line, "in.b64@0", "dir", binary=True) == line
    assert wire_payload(b"not base64!", "in.b64@9", "pubsub", binary=True) == b"not base64!"
    assert wire_payload(b'{"a": 1}', "msg:1", "dir", binary=False) == b'{"a": 1}'


_PV_FIELDS = dict(user_id=st.none() | st.text(max_size=12), product_category=st.none() | st.text(max_size=8),
                  price_minor=st.none() | st.integers(-2**63, 2**63 - 1), currency=st.none() | st.sampled_from(["EUR"]),
                  referrer_url=st.none() | st.text(max_size=20), country=st.none() | st.sampled_from(["DE", "SE"]),
                  device_type=st.sampled_from(["DESKTOP", "MOBILE", "TABLET", "OTHER"]),
                  anonymous_id=st.text(max_size=10), page_url=st.text(max_size=30))


@st.composite
def _pv_records(draw):
    import uuid as uuid_

    eid = str(uuid_.UUID(int=draw(st.integers(0, 2**128 - 1)), version=4))
    t_ = draw(st.integers(t("11:00"), t("14:30")))
    return page_view_record(t_, eid=eid, **{k: draw(v) for k, v in _PV_FIELDS.items()})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(_pv_records(), min_size=1, max_size=40), bad=st.lists(st.binary(max_size=30), max_size=4),
       dialect=st.sampled_from(["protobuf", "confluent"]), wm=st.sampled_from([None, t("12:10")]),
       chunk=st.sampled_from([300, 1 << 20]), where=st.sampled_from(["file", "messages"]))
def test_the_fast_and_record_paths_write_the_same_bytes_for_any_records(tmp_path_factory, pb_types, registry_server,
                                                                       monkeypatch, recs, bad, dialect, wm, chunk,
                                                                       where):
    """As for JSON (tests/test_fastpath.py): whatever the records, the bad payloads among them and the chunks they
    fall in, a binary dialect's fast path writes the files, reports and dedupe keys the record path writes, from a
    folder's base64 lines and from Kafka-like messages."""
    import numpy as np

    from event_etl.sources import read
    from event_etl.storage import Storage
    from tests.lib.dialects import message_class, page_view_message

    monkeypatch.setattr(read, "READ_BYTES", chunk)
    name = {"protobuf": "page_view_pb", "confluent": "page_view_cf"}[dialect]
    et = load_event_type(pb_types / name)
    if dialect == "protobuf":
        cls = message_class(pb_types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
        payloads = [page_view_message(cls, r).SerializeToString() for r in recs]
    else:
        serialize = confluent_avro_serializer(registry_server.url, SCHEMA)
        payloads = [serialize(r) for r in recs]
    payloads += bad
    tmp = tmp_path_factory.mktemp("both")
    out = {}
    for fast in (False, True):
        sink = tmp / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), 3, wm, t("15:00"), writer="abc123")
        if where == "file":
            src = tmp / "in.b64"
            src.write_bytes(b"".join(base64.b64encode(p) + b"\n" for p in payloads))
            from event_etl.sources.splits import Split

            split = Split.of_files(2, [(str(src), 0, src.stat().st_size, t("15:00"))])
            rep, keys = process_split(split, ctx, Storage(str(sink)), fast=fast)
        else:
            rep, keys = _messages_split(et, ctx, payloads, Storage(str(sink)), fast=fast)
        files = {p.relative_to(sink): p.read_bytes() for p in sink.rglob("*") if p.is_file()}
        out[fast] = (rep, sorted(np.frombuffer(keys, dtype=np.uint8).tolist()), files)
    (r1, k1, f1), (r0, k0, f0) = out[True], out[False]
    assert {k: v for k, v in r1.items() if r0.get(k) != v} == {}, {k: r0.get(k) for k in r1 if r0.get(k) != r1[k]}
    assert k1 == k0 and f1.keys() == f0.keys()
    assert [n for n in f0 if f1[n] != f0[n]] == []


def _messages_split(et, ctx, payloads, storage, *, fast):
    """A split of Kafka records (their values), read as the Kafka reader reads them, without a broker."""
    import numpy as np

    from event_etl.sources import read
    from event_etl.task import executor

    chunk = read.KafkaChunk("t", 0, np.arange(len(payloads), dtype=np.int64),
                            np.full(len(payloads), t("15:00"), dtype=np.int64), list(payloads),
                            [None] * len(payloads), [None] * len(payloads))

    class Reader(read.KafkaReader):
        def payloads(self, split, et):
            return chunk.payloads()

        def part(self, split):
            return "0"

        def pieces(self, split, plan):
            fc, data = read._decoded_messages(plan, chunk.values, chunk.data)
            yield read.Piece(fc, data, chunk.arrivals, chunk.position, chunk.mids) if fc is not None else \
                read.Piece.undecoded(chunk.payloads())

    from event_etl.sources.splits import Split

    split = Split.of_files(2, [])
    real = executor.split_reader
    try:
        executor.split_reader = lambda kind: Reader()
        return process_split(split, ctx, storage, fast=fast)
    finally:
        executor.split_reader = real


def test_a_chunk_the_fast_path_gives_back_counts_its_dropped_fields_once(tmp_path, pb_types):
    """Columns read, then refused (a message without its time): the record path takes the chunk and counts the
    unknown fields; the fast path's reading of them counted nothing (found by the property test above)."""
    from event_etl.sources.splits import Split
    from event_etl.storage import Storage
    from tests.lib.dialects import message_class, page_view_message

    et = load_event_type(pb_types / "page_view_pb")
    cls = message_class(pb_types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
    good = page_view_message(cls, page_view_record(t("13:00"))).SerializeToString() + b"\xa8\x1f\x01"
    timeless = page_view_message(cls, dict(page_view_record(t("13:00")), event_time=None)).SerializeToString()
    src = tmp_path / "in.b64"
    src.write_bytes(base64.b64encode(good) + b"\n" + base64.b64encode(timeless) + b"\n")
    split = Split.of_files(0, [(str(src), 0, src.stat().st_size, t("13:05"))])
    for fast in (True, False):
        ctx = BatchContext(et, str(tmp_path / f"s{fast}"), 1, None, t("13:05"), writer="abc123")
        rep, _ = process_split(split, ctx, Storage(str(tmp_path / f"s{fast}")), fast=fast)
        assert rep.get("dropped_fields") == 1 and rep["reasons"] == {"missing_time": 1}, (fast, rep)
