"""Producers' dialects end to end, through real Spark, from each source kind (issue 56's done-when): the demo's page
views sent as Protobuf (``page_view_pb``: a message of a descriptor set protoc wrote, its Avro schema derived) and as
Confluent-framed Avro (``page_view_cf``: frames of confluent-kafka's own ``AvroSerializer``, schemas from the test
registry, :mod:`tests.lib.registry_server`), run as a fleet of the two, from a folder (base64 lines), from Pub/Sub (the
emulator) and from Kafka (noida-db).  Each good event lands once in its UTC hour, every hour is marked at the drain,
and each bad payload is a dead letter with its reason and its bytes."""

from __future__ import annotations

import base64
import os
import uuid
from collections import Counter
from pathlib import Path

import pytest

from event_etl.eventtypes import load_event_type
from event_etl.job.driver import run_fleet
from event_etl.job.setup import RunOptions
from event_etl.storage import Storage
from event_etl.storage.deadletter import iter_deadletters
from event_etl.timeutil import HOUR_MS, hour_floor, now_millis
from tests.lib.dialects import (
    ROOT,
    confluent_avro_serializer,
    message_class,
    page_view_message,
    page_view_record,
    page_view_types,
)
from tests.lib.harness import read_sink

NAMES = ("page_view_pb", "page_view_cf")


class Producers:
    """The events of one test, as each type's producer sends them: good ones over three hours, and bad ones."""

    def __init__(self, types: Path, registry_url: str) -> None:
        import json

        now = now_millis()
        self.h0 = now - now % HOUR_MS - 4 * HOUR_MS
        self.recs = [page_view_record(self.h0 + i * 36_000) for i in range(300)]  # three hours, in order
        cls = message_class(types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
        schema = json.loads((ROOT / "event_types" / "page_view" / "schema.avsc").read_text())
        avro = confluent_avro_serializer(registry_url, schema)
        pb = [page_view_message(cls, r).SerializeToString() for r in self.recs]
        cf = [avro(r) for r in self.recs]
        self.good = {"page_view_pb": pb, "page_view_cf": cf}
        self.bad = {
            "page_view_pb": [(pb[0][:-4], "invalid_protobuf"), (b"\x08\x01" + pb[1], "invalid_protobuf"),
                             (pb[2] + b"\x60\x2a", "schema_mismatch")],
            "page_view_cf": [(cf[0][:-3], "invalid_avro"), (b"\x07" + cf[1][1:], "invalid_avro"),
                             (b"\x00" + (777).to_bytes(4, "big") + cf[2][5:], "unknown_schema")],
        }

    def payloads(self, name: str) -> list[bytes]:
        return self.good[name] + [p for p, _ in self.bad[name]]

    def check(self, sink: str, *, lines: bool = False) -> None:
        """``lines``: a folder source's (its dead letters keep the base64 line a payload came in)."""
        want = sorted(r["event_id"] for r in self.recs)
        hours = {hour_floor(r["event_time"]) for r in self.recs}
        for name in NAMES:
            content = read_sink(Path(sink), name, "event_id")
            placed = Counter(i for hc in content.values() for i in hc.timely + hc.late)
            assert sorted(placed) == want and max(placed.values()) == 1, f"{name}: each event once"
            by_id = {r["event_id"]: hour_floor(r["event_time"]) for r in self.recs}
            for h, hc in content.items():
                assert all(by_id[i] == h for i in hc.timely), f"{name}: each event in its UTC hour"
                assert hc.marker is not None and hc.marker.records == len(hc.timely) + len(hc.late), name
            assert hours <= set(content), f"{name}: every hour of the events marked at the drain"
            got = Counter((d.reason, d.payload) for d in iter_deadletters(Storage(sink), name))
            want_dl = Counter((r, base64.b64encode(x) if lines else x) for x, r in self.bad[name])
            assert got == want_dl, f"{name}: each bad payload once, with its reason and bytes"


@pytest.fixture
def dialect_types(tmp_path, registry_server):
    registry_server.reset()
    return page_view_types(tmp_path / "types", registry_url=registry_server.url)


def _set_source(types: Path, name: str, source: str) -> None:
    toml = types / name / "etl.toml"
    lines = [ln for ln in toml.read_text().splitlines() if not ln.startswith("source")]
    toml.write_text("\n".join([f'source = "{source}"', *lines]) + "\n")


def _run(types: Path, tmp_path: Path, spark) -> dict:
    ets = [load_event_type(types / n) for n in NAMES]
    return run_fleet(ets, RunOptions(sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck"), once=True,
                                     drain=True, quiet=True, trigger_interval="1s"),
                     spark=spark, install_signals=False)


def test_from_a_folder(spark, tmp_path, dialect_types, registry_server):
    p = Producers(dialect_types, registry_server.url)
    for name in NAMES:
        src = tmp_path / "in" / name
        src.mkdir(parents=True)
        f = src / "000.b64"
        f.write_bytes(b"".join(base64.b64encode(x) + b"\n" for x in p.payloads(name)))
        os.utime(f, ((p.h0 + 3 * HOUR_MS) / 1000,) * 2)
        _set_source(dialect_types, name, f"dir:{src}")
    summary = _run(dialect_types, tmp_path, spark)
    assert set(summary) == set(NAMES)
    p.check(str(tmp_path / "sink"), lines=True)


def test_from_pubsub(spark, tmp_path, dialect_types, registry_server, pubsub_server):
    from google.cloud import pubsub_v1

    p = Producers(dialect_types, registry_server.url)
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    project = "event-etl-test"
    for name in NAMES:
        topic = f"projects/{project}/topics/{name}-{uuid.uuid4().hex[:8]}"
        sub = topic.replace("/topics/", "/subscriptions/") + "-etl"
        publisher.create_topic(name=topic)
        subscriber.create_subscription(name=sub, topic=topic, ack_deadline_seconds=10)
        for f in [publisher.publish(topic, x) for x in p.payloads(name)]:
            f.result(timeout=30)
        _set_source(dialect_types, name, f"pubsub:{sub}")
    _run(dialect_types, tmp_path, spark)
    p.check(str(tmp_path / "sink"))


def test_from_kafka(tmp_path, dialect_types, registry_server, noida):
    """As users run it (a separate ``event-etl run`` of both types): Spark's Python workers read the cluster's
    address from the environment they start with."""
    import subprocess
    import sys

    p = Producers(dialect_types, registry_server.url)
    for name in NAMES:
        topic = f"{name}-{uuid.uuid4().hex[:8]}"
        noida.create_topic(topic, 2)
        noida.produce(topic, [(i % 2, x, None, None, None) for i, x in enumerate(p.payloads(name))])
        _set_source(dialect_types, name, f"kafka:{topic}")
    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": noida.bootstrap, "PYSPARK_PYTHON": sys.executable}
    sink = str(tmp_path / "sink")
    r = subprocess.run([str(Path(sys.executable).with_name("event-etl")), "run", *NAMES, "--event-types",
                        str(dialect_types), "--sink", sink, "--checkpoint-root", str(tmp_path / "ck"), "--once",
                        "--drain", "--master", "local[2]", "--trigger-interval", "1s"],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    p.check(sink)


def test_the_readmes_protobuf_recipe_runs_as_written(tmp_path):
    """README's two lines for a Protobuf type, as written (``bin/event-etl`` is the venv's command after its first
    run): ``check`` prints the derived schema; ``run`` writes page views from the generator's messages into hours
    until it is stopped (here by SIGTERM after a while: a plain stop, exit 0)."""
    import re
    import signal
    import subprocess
    import sys
    import time

    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("Try a Protobuf type:"):]
    lines = re.findall(r"^(bin/event-etl [^#\n]+?)\s*(?:#.*)?$", block[:block.index("```\n\n")], re.M)
    assert len(lines) == 2, lines
    exe = str(Path(sys.executable).with_name("event-etl"))
    check, run = ([exe, *line.split()[1:]] for line in lines)
    r = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "derived from shop.events.ProductPageViewed" in r.stdout, r.stdout + r.stderr
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    sink, ckpt = tmp_path / "data", tmp_path / "ck"
    proc = subprocess.Popen([*run, "--sink", str(sink), "--checkpoint", str(ckpt), "--master", "local[2]"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(sink.glob("page_view_pb/dt=*/hour=*/*.avro")):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    files = list(sink.glob("page_view_pb/dt=*/hour=*/*.avro"))
    assert files, out
    import fastavro

    with open(files[0], "rb") as fh:
        recs = list(fastavro.reader(fh))
    assert recs and all(r["event_id"] and r["device_type"] in ("DESKTOP", "MOBILE", "TABLET", "OTHER") for r in recs)


def test_an_unreachable_registry_ends_the_job_with_the_fix_and_a_rerun_writes_everything(tmp_path, dialect_types,
                                                                                          registry_server):
    """The registry answers 503 to everything: the batch waits out EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS, the job
    ends with error:/fix: (exit 1) and nothing is dead-lettered; once it is back, the same command writes every
    event (the batch replayed)."""
    import subprocess
    import sys

    p = Producers(dialect_types, registry_server.url)
    src = tmp_path / "in"
    src.mkdir()
    f = src / "000.b64"
    f.write_bytes(b"".join(base64.b64encode(x) + b"\n" for x in p.good["page_view_cf"]))
    os.utime(f, ((p.h0 + 3 * HOUR_MS) / 1000,) * 2)
    registry_server.fail(status=503, times=100_000)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS": "3"}
    sink = tmp_path / "sink"
    cmd = [str(Path(sys.executable).with_name("event-etl")), "run", "page_view_cf", "--event-types", str(dialect_types),
           "--source", f"dir:{src}", "--sink", str(sink), "--checkpoint", str(tmp_path / "ck"), "--once", "--drain",
           "--master", "local[2]"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "schema registry" in r.stderr and "unreachable for 3s" in r.stderr and "fix:" in r.stderr, r.stderr
    assert "EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS" in r.stderr, r.stderr
    assert list(iter_deadletters(Storage(str(sink)), "page_view_cf")) == [], "nothing dead-lettered for the outage"
    registry_server.reset()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    content = read_sink(sink, "page_view_cf", "event_id")
    assert sorted(i for hc in content.values() for i in hc.timely) == sorted(e["event_id"] for e in p.recs)
