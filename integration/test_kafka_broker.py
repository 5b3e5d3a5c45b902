"""What a Kafka broker does to a topic under a running job (issue 48): partitions added, records deleted by
retention or DeleteRecords, transactions committed, aborted and left open.

The broker is noida-db's Kafka service (:class:`tests.lib.servers.NoidaKafka`): tansu refuses CreatePartitions,
AlterConfigs and DeleteRecords, and reports high watermarks below what it serves; noida-db does all of it and
reports true watermarks (the last stable offset to a ``read_committed`` client while a transaction is open).  The
job runs as users run it: ``event-etl run page_view --source kafka:TOPIC`` in a process of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from event_etl.timeutil import HOUR_MS, now_millis
from tests.lib.kafka_job import kafka_sink_content as _sink_content
from tests.lib.kafka_job import page_view_event as _event
from tests.lib.waiting import wait_until

EXE = str(Path(sys.executable).with_name("event-etl"))


def _types(tmp_path: Path, **settings: str) -> Path:
    """The page_view type with ``settings`` (etl.toml keys) changed."""
    from event_etl.eventtypes import resolve_event_types_dir

    types = tmp_path / "types"
    shutil.copytree(Path(resolve_event_types_dir(None)) / "page_view", types / "page_view")
    toml = types / "page_view" / "etl.toml"
    text = toml.read_text()
    for key, value in settings.items():
        if re.search(rf"(?m)^{key}\s*=", text):
            text = re.sub(rf"(?m)^{key}\s*=.*$", f'{key} = "{value}"', text)
        else:
            text += f'\n{key} = "{value}"\n'
    toml.write_text(text)
    return types


class Job:
    """``event-etl run page_view --source kafka:TOPIC`` on one sink and checkpoint, run as users run it."""

    def __init__(self, tmp_path: Path, broker, topic: str, **settings: str) -> None:
        self.tmp = tmp_path
        self.topic = topic
        self.sink, self.ckpt = tmp_path / "sink", tmp_path / "ck"
        self.types = _types(tmp_path, **settings)
        self.env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                    "PYSPARK_PYTHON": sys.executable}

    def args(self, *extra: str) -> list[str]:
        return [EXE, "run", "page_view", "--event-types", str(self.types), "--source", f"kafka:{self.topic}",
                "--sink", str(self.sink), "--checkpoint", str(self.ckpt), "--master", "local[2]",
                "--trigger-interval", "1s", *extra]

    def run(self, *extra: str, env: dict[str, str] | None = None, code: int = 0) -> subprocess.CompletedProcess:
        r = subprocess.run(self.args(*extra), env={**self.env, **(env or {})}, capture_output=True, text=True,
                           timeout=400)
        assert r.returncode == code, r.stdout[-4000:] + r.stderr[-4000:]
        return r

    def content(self) -> dict[int, dict]:
        return _sink_content(str(self.sink))

    def placed(self) -> Counter:
        return Counter(i for e in self.content().values() for i in e["ids"] + e["late"])

    def markers(self) -> dict[int, list[str]]:
        """Every marked hour's file list (a marked hour never changes)."""
        return {h: sorted(f.name for f in e["marker"].files) for h, e in self.content().items()
                if e["marker"] is not None}


def _records(events, partitions):
    return [(p, json.dumps(e).encode(), e["event_id"].encode(), None, None) for e, p in zip(events, partitions)]


def _committed(broker, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "event_etl.page_view"})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)]
    finally:
        c.close()


def _hours_ago(n: int) -> int:
    now = now_millis()
    return now - now % HOUR_MS - n * HOUR_MS


# -- 1. partitions added ---------------------------------------------------------------------------------------
def test_partitions_added_while_the_job_is_down_are_read_from_their_first_offset(tmp_path, noida):
    topic = f"grow-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 2)
    job = Job(tmp_path, noida, topic)
    h0 = _hours_ago(6)
    minute = 60_000
    wave1 = [_event(h0 + m * minute) for m in range(0, 120, 2)]  # hours h0 and h0+1, on partitions 0 and 1
    noida.produce(topic, _records(wave1, [i % 2 for i in range(len(wave1))]))
    job.run("--once")
    before = job.markers()
    assert h0 in before and h0 + HOUR_MS not in before, "h0 complete, h0+1 still open (watermark at its events)"

    noida.add_partitions(topic, 4)  # while the job is down
    # the new partitions: events of the open hour (timely), of the marked hour h0 (late: into the open hour), and
    # of the next hour
    wave2 = [_event(h0 + m * minute) for m in (10, 20, 65, 70, 100, 130, 140)]
    noida.produce(topic, _records(wave2, [2, 3, 2, 3, 2, 3, 2]))
    r = job.run("--once", "--drain")

    placed = job.placed()
    assert set(placed) == {e["event_id"] for e in wave1 + wave2} and max(placed.values()) == 1, "each event once"
    after = job.markers()
    for h, files in before.items():
        assert after[h] == files, "a marked hour never changes"
    content = job.content()
    late = {i for e in content.values() for i in e["late"]}
    assert late == {e["event_id"] for e in wave2[:2]}, "events of the marked hour h0 are late, in an open hour"
    assert all(e["marker"] is not None for e in content.values()), r.stdout
    assert _committed(noida, topic, 4) == [30, 30, 4, 3], "the group's offsets cover the new partitions"


def test_a_partition_added_while_the_job_runs_is_read_and_holds_the_watermark_only_once_it_has_records(
        tmp_path, noida):
    idle_s = 10
    topic = f"grow-live-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 2)
    job = Job(tmp_path, noida, topic, idle_timeout=f"{idle_s}s")
    h0 = _hours_ago(5)
    minute = 60_000
    first = [_event(h0 + m * minute) for m in range(0, 50, 5)]
    noida.produce(topic, _records(first, [i % 2 for i in range(len(first))]))
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(job.args(), env=job.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)

    def state() -> dict:
        try:
            return json.loads((job.ckpt / "etl" / "state.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def wait_for(predicate, what: str, timeout: float = 180) -> None:
        wait_until(predicate, timeout, what, proc=proc, log=tmp_path / "run.log")

    try:
        wait_for(lambda: set(job.placed()) >= {e["event_id"] for e in first}, "the first events written")
        noida.add_partitions(topic, 3)  # partition 2: no records yet
        more = [_event(h0 + 60 * minute + m * minute) for m in range(0, 30, 5)]  # h0+1, on partitions 0 and 1
        noida.produce(topic, _records(more, [i % 2 for i in range(len(more))]))
        wait_for(lambda: state().get("max_event_time") == more[-1]["event_time"], "the second wave read")
        # an empty new partition holds nothing back: the watermark follows partitions 0 and 1
        slowest = min(max(e["event_time"] for e in (first + more)[p::2]) for p in (0, 1))
        assert state()["watermark"] == slowest - 2 * minute, state()
        new = [_event(h0 + 61 * minute), _event(h0 + 62 * minute)]  # partition 2 wakes, behind the others
        noida.produce(topic, _records(new, [2, 2]))
        wait_for(lambda: "2" in state().get("parts", {}), "partition 2 in the watermark's parts")
        assert state()["parts"]["2"] == new[-1]["event_time"]
        wait_for(lambda: set(job.placed()) >= {e["event_id"] for e in first + more + new}, "all events written")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    placed = job.placed()
    assert max(placed.values()) == 1 and set(placed) == {e["event_id"] for e in first + more + new}


# -- 2. retention passing an unread offset ---------------------------------------------------------------------
def test_records_deleted_unread_stop_the_job_with_fail_and_are_counted_exactly_with_skip(tmp_path, noida):
    topic = f"retention-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 2)
    job = Job(tmp_path, noida, topic)
    h0 = _hours_ago(8)
    minute = 60_000
    read = [_event(h0 + m * minute) for m in range(0, 40)]
    noida.produce(topic, _records(read, [i % 2 for i in range(40)]))
    job.run("--once")
    unread = [_event(h0 + 40 * minute + m * minute) for m in range(0, 60)]
    noida.produce(topic, _records(unread, [i % 2 for i in range(60)]))  # offsets 20..49 of each partition
    noida.delete_records(topic, 0, 32)  # 12 unread records of partition 0 deleted (offsets 20..31)
    noida.delete_records(topic, 1, 25)  # 5 of partition 1 (offsets 20..24)
    deleted = {e["event_id"] for k, e in enumerate(unread) if (k % 2 == 0 and k // 2 < 12) or
               (k % 2 == 1 and k // 2 < 5)}
    assert len(deleted) == 17
    before = job.markers()

    r = job.run("--once", "--drain", env={"EVENT_ETL_KAFKA_ON_DATA_LOSS": "fail"}, code=1)
    assert "error:" in r.stderr and "12 records of Kafka topic" in r.stderr and "fix:" in r.stderr, r.stderr[-2000:]
    assert "EVENT_ETL_KAFKA_ON_DATA_LOSS=skip" in r.stderr
    assert job.markers() == before and set(job.placed()) == {e["event_id"] for e in read}, "nothing written"

    r = job.run("--once", "--drain", env={"EVENT_ETL_KAFKA_ON_DATA_LOSS": "skip"})
    assert "LOST 17" in r.stdout, r.stdout[-3000:]
    placed = job.placed()
    assert set(placed) == {e["event_id"] for e in read + unread} - deleted and max(placed.values()) == 1


def test_retention_lowered_on_a_stopped_job_counts_exactly_what_it_deleted_unread(tmp_path, noida):
    topic = f"retention-ms-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 1)
    job = Job(tmp_path, noida, topic)
    h0 = _hours_ago(7)
    first = [_event(h0 + k * 1000) for k in range(30)]
    noida.produce(topic, _records(first, [0] * 30))
    job.run("--once")
    unread = [_event(h0 + 60_000 + k * 1000) for k in range(20)]
    noida.produce(topic, _records(unread, [0] * 20))
    noida.set_retention(topic, 1000)
    deadline = time.monotonic() + 30
    while noida.watermarks(topic, 0)[0] < 50:  # every record really deleted, the 20 unread ones too
        assert time.monotonic() < deadline, f"retention did not delete: {noida.watermarks(topic, 0)}"
        time.sleep(0.5)
    noida.set_retention(topic, 7 * 24 * 3600 * 1000)
    later = [_event(h0 + 120_000 + k * 1000) for k in range(5)]
    noida.produce(topic, _records(later, [0] * 5))
    r = job.run("--once", "--drain", env={"EVENT_ETL_KAFKA_ON_DATA_LOSS": "skip"})
    assert "LOST 20" in r.stdout, r.stdout[-3000:]
    placed = job.placed()
    assert set(placed) == {e["event_id"] for e in first + later} and max(placed.values()) == 1


def test_a_range_planned_then_deleted_before_the_executor_reads_it_fails_with_the_fix(noida, monkeypatch):
    """The reader's OFFSET_OUT_OF_RANGE path, for real: the range's first records are gone when the task starts."""
    from event_etl.errors import SourceError
    from event_etl.settings import ENV_KAFKA_BOOTSTRAP_SERVERS
    from event_etl.sources.kafka import read_messages

    monkeypatch.setenv(ENV_KAFKA_BOOTSTRAP_SERVERS, noida.bootstrap)
    topic = f"gone-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 1)
    noida.produce(topic, [(0, b"x%d" % i, None, None, None) for i in range(20)])
    noida.delete_records(topic, 0, 12)
    with pytest.raises(SourceError, match="no longer there") as err:
        for _ in read_messages(topic, 0, 5, 20, timeout=20):
            pass
    assert "retention" in err.value.fix


# -- 3. transactions -------------------------------------------------------------------------------------------
def test_aborted_transactions_are_never_written_and_an_open_one_holds_back_only_itself(tmp_path, noida):
    from confluent_kafka import Producer

    topic = f"tx-{uuid.uuid4().hex[:8]}"
    noida.create_topic(topic, 2)
    job = Job(tmp_path, noida, topic)
    h0 = _hours_ago(9)
    minute = 60_000
    prod = Producer({"bootstrap.servers": noida.bootstrap, "transactional.id": f"tx-{topic}"})
    prod.init_transactions(30)
    committed, aborted = [], []
    for k in range(6):  # transactions over both partitions: commit, abort, commit, abort...
        events = [_event(h0 + (10 * k + j) * minute) for j in range(10)]
        prod.begin_transaction()
        for j, e in enumerate(events):
            prod.produce(topic, json.dumps(e).encode(), partition=j % 2)
        if k % 2 == 0:
            prod.commit_transaction(30)
            committed += events
        else:
            prod.abort_transaction(30)
            aborted += events
    opened = [_event(h0 + (70 + j) * minute) for j in range(4)]
    prod.begin_transaction()
    for e in opened:
        prod.produce(topic, json.dumps(e).encode(), partition=0)
    prod.flush(30)  # produced, not committed: read_committed may not read them yet

    start = time.monotonic()
    job.run("--once")  # ends: the open transaction is not waited for (the planner sees the last stable offset)
    assert time.monotonic() - start < 120
    placed = job.placed()
    assert set(placed) == {e["event_id"] for e in committed} and max(placed.values()) == 1, \
        "the committed records once, no aborted one, none of the open transaction"

    prod.commit_transaction(30)
    job.run("--once", "--drain")
    placed = job.placed()
    assert set(placed) == {e["event_id"] for e in committed + opened} and max(placed.values()) == 1
    assert not set(placed) & {e["event_id"] for e in aborted}
