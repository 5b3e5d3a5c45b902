"""The Kafka reader's fast read (issue 48 item 5): runs of messages read as columns, the garbage collector paused
only while a ``consume`` makes messages, and chunks that hold exactly the records of a range.

The reading loop is driven by a scripted consumer (confluent-kafka's own ``Message`` objects, made by its test
constructor) for what a broker rarely shows on demand: gaps in the offsets, a partition's end inside a run,
records beyond the range, an offset gone; and once against the module's tansu broker, chunks cut across runs."""

from __future__ import annotations

import gc
import json
import uuid

import numpy as np
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, KafkaError, Message

from event_etl.errors import SourceError
from event_etl.settings import Settings, settings_in_force
from event_etl.sources import kafka, read
from event_etl.sources.kafka import RecordRun, read_messages, read_runs, record_columns

T0 = 1_764_000_000_000


def _msg(off: int, value: bytes | None = None, *, key: bytes | None = None, headers=None, ts: int | None = None,
         kind: int = TIMESTAMP_CREATE_TIME) -> Message:
    return Message(topic="t", partition=0, offset=off, value=b'{"i":%d}' % off if value is None else value, key=key,
                   headers=headers, timestamp=(kind, T0 + off if ts is None else ts))


def _eof(off: int) -> Message:
    return Message(topic="t", partition=0, offset=off, error=KafkaError(KafkaError._PARTITION_EOF))


class _Script:
    """A stand-in for ``confluent_kafka.Consumer``: each ``consume`` returns the next scripted list (then none),
    and records whether the garbage collector ran while it made them."""

    batches: list[list[Message]] = []
    gc_during_consume: list[bool] = []
    closed = 0

    def __init__(self, conf) -> None:
        self.conf = conf

    def assign(self, tps) -> None:
        self.assigned = tps

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        _Script.gc_during_consume.append(gc.isenabled())
        return _Script.batches.pop(0) if _Script.batches else []

    def close(self) -> None:
        _Script.closed += 1


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """A tansu broker for the module (tests/lib/servers.py ``KafkaBroker``)."""
    from tests.lib.servers import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def scripted(monkeypatch):
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Consumer", _Script)
    _Script.batches, _Script.gc_during_consume, _Script.closed = [], [], 0
    with settings_in_force(Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})):
        yield _Script


def test_a_run_is_read_as_columns_whether_its_offsets_are_consecutive_or_not():
    take = record_columns("t", 0)
    run = [_msg(5, key=b"k5", headers=[("h", b"v")]), _msg(6, b""), _msg(7)]
    run[1].set_value(None)  # a record without a value: b"", as the record path reads it
    for consecutive in (True, False):
        r = take(run, consecutive)
        assert isinstance(r, RecordRun) and len(r) == 3
        assert r.offsets.dtype == np.int64 and r.offsets.tolist() == [5, 6, 7]
        assert r.times.dtype == np.int64 and r.times.tolist() == [T0 + 5, T0 + 6, T0 + 7]
        assert r.values == [b'{"i":5}', b"", b'{"i":7}']
        assert r.keys == [b"k5", None, None] and r.headers == [[("h", b"v")], None, None]
    gaps = take([_msg(5), _msg(9), _msg(12)], False)  # a compacted topic, transaction markers
    assert gaps.offsets.tolist() == [5, 9, 12] and gaps.times.tolist() == [T0 + 5, T0 + 9, T0 + 12]


def test_a_record_without_a_timestamp_is_named():
    take = record_columns("clicks", 3)
    with pytest.raises(SourceError, match="clicks partition 3 offset 8 has no timestamp") as info:
        take([_msg(7), _msg(8, kind=TIMESTAMP_NOT_AVAILABLE, ts=0)], True)
    assert "timestamp" in info.value.fix


def test_the_runs_hold_exactly_the_range_and_the_collector_runs_while_the_caller_does(scripted):
    scripted.batches = [
        [_msg(3), _msg(4), _msg(5)],  # from before the range (a message set's head): cut
        [_msg(6), _msg(8), _msg(9)],  # a gap (offset 7 holds a transaction marker)
        [_eof(10)],  # the partition's end for now: read on
        [_msg(10), _msg(11), _msg(12), _msg(13)],  # beyond the range's end: cut
    ]
    seen = []
    assert gc.isenabled()
    for run in read_runs("t", 0, 4, 12, take=lambda msgs, consecutive: (
            [m.offset() for m in msgs], consecutive, gc.isenabled())):
        seen.append(run)
        assert gc.isenabled(), "the collector is never paused while the caller runs"
    assert seen == [([4, 5], False, False), ([6, 8, 9], False, False), ([10, 11], True, False)]
    assert not any(scripted.gc_during_consume), "paused while consume makes messages"
    assert gc.isenabled() and scripted.closed == 1


def test_consecutive_runs_are_said_so_and_read_messages_yields_the_messages(scripted):
    scripted.batches = [[_msg(0), _msg(1), _msg(2)], [_msg(3), _msg(4)]]
    flags = [c for _, c in read_runs("t", 0, 0, 5, take=lambda msgs, consecutive: (msgs, consecutive))]
    assert flags == [True, True]
    scripted.batches = [[_msg(0), _msg(1)], [_msg(2), _eof(3)]]
    runs = list(read_messages("t", 0, 0, 3, timeout=0))
    assert [[m.offset() for m in run] for run in runs] == [[0, 1], [2]]
    scripted.batches = [[_msg(0), _eof(2)]]  # offset 1 holds no record and the range ends at it: done
    assert [[m.offset() for m in run] for run in read_messages("t", 0, 0, 2, timeout=0)] == [[0]]


def test_an_offset_gone_or_a_silent_cluster_is_a_source_error_and_the_collector_is_back_on(scripted):
    gone = Message(topic="t", partition=0, offset=4, error=KafkaError(KafkaError.OFFSET_OUT_OF_RANGE))
    scripted.batches = [[gone]]
    with pytest.raises(SourceError, match="offset 4 is no longer there"):
        list(read_runs("t", 0, 4, 10, take=record_columns("t", 0)))
    assert gc.isenabled() and scripted.closed == 1
    scripted.batches = [[_msg(4)]]
    with pytest.raises(SourceError, match="no record after offset 4") as info:
        list(read_runs("t", 0, 4, 10, timeout=0, take=record_columns("t", 0)))
    assert "reachable" in info.value.fix and gc.isenabled()


def test_a_paused_collector_stays_paused(scripted):
    scripted.batches = [[_msg(0), _msg(1)]]
    gc.disable()
    try:
        assert [len(r) for r in read_runs("t", 0, 0, 2, take=record_columns("t", 0))] == [2]
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_consumer_fetches_more_unless_the_properties_say_otherwise(scripted, tmp_path):
    scripted.batches = [[_msg(0)]]
    made = []
    orig = scripted.__init__

    def init(self, conf):
        made.append(conf)
        orig(self, conf)

    scripted.__init__ = init  # type: ignore[method-assign]
    try:
        list(read_messages("t", 0, 0, 1))
        assert made[-1]["max.partition.fetch.bytes"] == kafka.READER_DEFAULTS["max.partition.fetch.bytes"]
        props = tmp_path / "client.properties"
        props.write_text("max.partition.fetch.bytes=1048576\n")
        env = {"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "EVENT_ETL_KAFKA_PROPERTIES": str(props)}
        with settings_in_force(Settings.from_env(env)):
            scripted.batches = [[_msg(0)]]
            list(read_messages("t", 0, 0, 1))
        assert made[-1]["max.partition.fetch.bytes"] == "1048576"
    finally:
        scripted.__init__ = orig  # type: ignore[method-assign]


def test_chunks_hold_the_range_exactly_across_runs(kafka_broker, monkeypatch):
    """On a broker: chunks of ~1,000 bytes over runs of 7 records hold every record of the range once, in order,
    with its value, timestamp and message id; the record path's payloads of a chunk are the records'."""
    monkeypatch.setattr(read, "READ_BYTES", 1000)
    monkeypatch.setattr(kafka, "CONSUME_RECORDS", 7)
    topic = f"t-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [(0, json.dumps({"i": i, "pad": "x" * (i % 13)}).encode(), f"k{i}".encode(), T0 + i,
                                  [("src", b"web")]) for i in range(120)])
    with settings_in_force(Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap})):
        chunks = list(read.kafka_chunks(topic, 0, 3, 117))
        assert len(chunks) > 3
        assert all(len(c.data or b"") <= 1000 + 40 for c in chunks)  # cut after the record that fills one
        offsets = np.concatenate([c.offsets for c in chunks]).tolist()
        assert offsets == list(range(3, 117))
        for c in chunks:
            assert c.data is not None and c.data.split(b"\n") == [
                json.dumps({"i": int(o), "pad": "x" * (int(o) % 13)}).encode() for o in c.offsets]
            assert c.arrivals.tolist() == [T0 + int(o) for o in c.offsets]
            assert list(c.mids) == [f"{topic}/0/{int(o)}" for o in c.offsets]
            assert c.position(0) == f"kafka:{topic}/0@{int(c.offsets[0])}"
        rows = list(chunks[1].payloads())
        assert rows == list(kafka.read_range(topic, 0, int(chunks[1].offsets[0]), int(chunks[1].offsets[-1]) + 1))
        value, ts, where, off, (mid, attrs) = rows[0]
        assert attrs["kafka.key"] == f"k{off}" and attrs["src"] == "web" and mid == f"{topic}/0/{off}"
