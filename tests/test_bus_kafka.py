"""A Kafka bus's split read as columns and routed (event_etl.bus.task.route_kafka_split): every type writes the same
files, reports and keys as when the split is read record by record and routed (the path a Pub/Sub bus takes), and the
unclaimed records are kept the same.  The records come from a scripted consumer (confluent-kafka's own ``Message``
objects, as tests/test_kafka_reader.py makes them): headers naming a type, the same header twice, none, a value no
type claims, a type of the bus outside the group, a value that is not JSON."""

from __future__ import annotations

import hashlib
import json

import fastavro
import numpy as np
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from event_etl.bus import task as bus_task
from event_etl.rules.routing import Route, Router
from event_etl.settings import Settings, settings_in_force
from event_etl.sources import read
from event_etl.sources.splits import Split
from event_etl.storage import Storage
from event_etl.task.executor import BatchContext, process_split, store_unclaimed
from tests.lib.harness import make_event_type

T0 = 1_795_000_000_000
N = 240


def _messages() -> list[Message]:
    out = []
    for off in range(N):
        kind = off % 8
        headers = {0: [("type", b"a")], 1: [("type", b"b")], 2: [("type", b"a"), ("type", b"b")], 3: None,
                   4: [("type", b"refunds")], 5: [("type", b"c")], 6: [("x", b"1"), ("type", b"a")],
                   7: [("type", b"b")]}[kind]
        value = b"not json" if off == 17 else json.dumps({"id": f"e{off}", "ts": T0 + off * 1000}).encode()
        out.append(Message(topic="bus", partition=3, offset=off, value=value, key=b"k%d" % off, headers=headers,
                           timestamp=(TIMESTAMP_CREATE_TIME, T0 + off * 1000 + 5)))
    return out


class _Script:
    """``confluent_kafka.Consumer``'s stand-in: the records in runs of 50, then nothing."""

    runs: list[list[Message]] = []

    def __init__(self, conf) -> None:
        self.conf = conf

    def assign(self, tps) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return _Script.runs.pop(0) if _Script.runs else []

    def close(self) -> None:
        pass


@pytest.fixture
def scripted(monkeypatch):
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Consumer", _Script)
    monkeypatch.setattr(read, "READ_BYTES", 2000)  # several chunks, cut across the consumer's runs
    with settings_in_force(Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})):
        yield _Script


def _read(tmp_path, name: str, types, *, columnar: bool) -> tuple[dict, dict, list]:
    msgs = _messages()
    _Script.runs = [msgs[i:i + 50] for i in range(0, N, 50)]
    sink = tmp_path / name
    storage = Storage(str(sink))
    contexts = {et.name: BatchContext(et, str(sink), 4, T0, T0 + N * 1000, writer="b0c1a5") for et in types}
    router = Router({"a": Route("attribute", "type", ("a",)), "b": Route("attribute", "type", ("b",)),
                     "c": Route("attribute", "type", ("c",))})
    split = Split(0, "kafka", "bus", 0, N, 0, json.dumps({"partition": 3}))
    out = {}
    for who, report, keys, error in bus_task.process_bus_split(split, contexts, router, "bus-1", lambda _: storage,
                                                               process=process_split,
                                                               store_unclaimed=store_unclaimed, columnar=columnar):
        assert error is None, error
        out[who] = (json.dumps(report, sort_keys=True), keys)
    files = {str(p.relative_to(sink)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(sink.rglob("*"))
             if p.is_file()}
    unclaimed = [r for p in sorted(sink.glob("_unclaimed/bus-1/dt=*/*.avro")) for r in fastavro.reader(p.open("rb"))]
    return out, files, unclaimed


def _rows(keys: bytes | None) -> list:
    from event_etl.task.dedupe import KEY_DTYPE

    return sorted(np.frombuffer(keys or b"", dtype=KEY_DTYPE).tolist())


def test_a_kafka_split_routed_as_columns_writes_what_the_record_path_writes(tmp_path, scripted):
    types = [make_event_type(tmp_path / "types", n, source="kafka:bus", route_attribute="type",
                             max_backfill="0") for n in ("a", "b")]
    cols, col_files, col_kept = _read(tmp_path, "columns", types, columnar=True)
    recs, rec_files, rec_kept = _read(tmp_path, "records", types, columnar=False)
    assert {w: r for w, (r, _) in cols.items()} == {w: r for w, (r, _) in recs.items()}, "each type's report"
    assert {w: _rows(k) for w, (_, k) in cols.items()} == {w: _rows(k) for w, (_, k) in recs.items()}, \
        "each type's dedupe keys (the driver orders them by shard, file and record)"
    assert col_files == rec_files, "each file, byte for byte (data, dead letters, unclaimed)"
    assert col_kept == rec_kept
    a = json.loads(cols["a"][0])
    b = json.loads(cols["b"][0])
    assert sum(a["counts"].values()) == 2 * N // 8, "a: kinds 0 and 6"
    assert sum(b["counts"].values()) == 3 * N // 8, "b: kinds 1 and 7, and 2 (of two headers, the last wins)"
    assert b["counts"].get("invalid") == 1, "the value that is not JSON: b's dead letter"
    assert len(col_kept) == 2 * N // 8, "no header, or a value no type claims; c's records are left to c's batch"
    assert {r["source"] for r in col_kept} == {f"kafka:bus/3@{o}" for o in range(N) if o % 8 in (3, 4)}
    assert any("attribute 'type' is 'refunds'" in r["detail"] for r in col_kept)
