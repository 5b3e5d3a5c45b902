"""Checks of the benchmark harness's own logic (no Spark): ``.venv/bin/python -m pytest bench``.

The figures are only as good as the code that computes them: percentiles, the results
file's sections, the record counts, the input generator and the profile categories.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import pytest

from bench import datagen, flame
from bench.contenders import WrongOutput, count_manifests, count_spark_output, event_etl_batches
from bench.figures import percentile, weighted_percentile
from bench.livefeed import Feed, file_index_of
from bench.memory import summarize as memory_summary
from bench.results import update_section
from bench.spark_sink import spark_ddl


def test_percentiles_are_observed_values_by_nearest_rank():
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile([], 50) is None
    # 98 events at 1 s, 2 at 10 s: p99 falls on the slow ones, p50 not
    assert weighted_percentile([1.0, 10.0], [98, 2], 50) == 1.0
    assert weighted_percentile([1.0, 10.0], [98, 2], 99) == 10.0


def test_sections_are_replaced_in_place_and_other_text_is_kept(tmp_path: Path):
    f = tmp_path / "RESULTS.md"
    update_section("compare", "first", f)
    f.write_text(f.read_text() + "\nnotes written by hand\n")
    update_section("latency", "lat", f)
    update_section("compare", "second", f)
    text = f.read_text()
    assert "first" not in text and text.count("second") == 1
    assert "notes written by hand" in text and "lat" in text
    assert text.index("second") < text.index("lat")


def test_manifest_counts_and_batch_lines(tmp_path: Path):
    for hour, n in (("01", 3), ("02", 4)):
        d = tmp_path / "page_view" / "dt=2026-11-21" / f"hour={hour}"
        d.mkdir(parents=True)
        (d / "_COMPLETE").write_text(json.dumps({"records": n, "files": [{"name": "x"}]}))
    assert count_manifests(tmp_path, "page_view") == (7, 2, 2)
    out = ("[page_view] batch 0: in 1,000  timely 1,000  late 0  dead-letter 0  files 2 (1.0 MB)  watermark x lag 1s  "
           "marked 0  0.50s  2,000 ev/s\n[page_view] batch 1 (replay): in 20  timely 20 ...  0.10s  200 ev/s\n")
    assert event_etl_batches(out) == [(1000, 0.5), (20, 0.1)]


def test_spark_output_counts_only_committed_files(tmp_path: Path):
    (tmp_path / "_spark_metadata").mkdir()
    part = tmp_path / "dt=2026-11-21" / "hour=01"
    part.mkdir(parents=True)
    (part / "a.json").write_text("{}\n{}\n")
    (part / "uncommitted.json").write_text("{}\n" * 5)
    entry = {"path": f"file://{part / 'a.json'}", "action": "add"}
    (tmp_path / "_spark_metadata" / "0").write_text("v1\n" + json.dumps(entry) + "\n")
    assert count_spark_output(tmp_path, "json") == (2, 1)
    with pytest.raises(WrongOutput):
        count_spark_output(tmp_path / "nothing", "json")


def test_spark_schema_follows_the_avro_schema():
    schema = json.loads((Path(__file__).parent.parent / "event_types/page_view/schema.avsc").read_text())
    ddl = spark_ddl(schema)
    assert "`event_time` bigint" in ddl and "`price_minor` bigint" in ddl and "`device_type` string" in ddl
    assert ddl.count("`") == 2 * len(schema["fields"])


def test_generator_sizes_and_determinism(tmp_path: Path):
    a = datagen.generate(tmp_path / "a", 300, files=2, seed=3)
    b = datagen.generate(tmp_path / "b", 300, files=2, seed=3)
    assert a == b
    assert (tmp_path / "a/events-00000.jsonl").read_bytes() == (tmp_path / "b/events-00000.jsonl").read_bytes()
    for shape, size in (("small_view", 100), ("page_view", 1024), ("page_view", 10240)):
        info = datagen.generate(tmp_path / f"{shape}{size}", 50, files=1, shape=shape, event_bytes=size)
        lines = (tmp_path / f"{shape}{size}" / "events-00000.jsonl").read_bytes().splitlines()
        assert {len(line) + 1 for line in lines} == {size} and info["bytes_per_event"] == size


def test_feed_event_ids_name_their_file(tmp_path: Path):
    eid = str(uuid.UUID(int=(12345 << 96) | random.Random(1).getrandbits(96), version=4))
    assert file_index_of(eid) == 12345
    feed = Feed(tmp_path / "in", tmp_path / "stage", files=3, events_per_file=10, interval=1.0, speedup=60,
                event_start=Feed.event_start_for(1_795_242_629_000, files=3, interval=1.0, speedup=60))
    feed.stage_all()
    lines = (tmp_path / "stage" / "events-000002.jsonl").read_bytes().splitlines()
    assert {file_index_of(json.loads(line)["event_id"]) for line in lines} == {2}
    assert feed.event_start % 3_600_000 == 0 and feed.fed[2].max_event_time < 1_795_242_629_000


def test_flame_counts_c_code_as_what_it_does():
    stack = ["<module> (x.py:1)", "RollingFiles.add (event_etl/storage/rolling.py:110)",
             "write_record (fastavro/_write.c:1)", "Py_DECREF (object.h:537)"]
    assert flame.category_of(stack) == "Avro encoding (fastavro writer)"
    assert flame.category_of(["main (pyspark/worker.py:1)", "_find_and_load (<frozen importlib._bootstrap>:1)",
                              "x (pyarrow/__init__.py:1)"]) == flame.IMPORTS
    assert flame.category_of(["decode (event_etl/task/payload.py:110)", "loads (orjson/orjson.so)"]).startswith("JSON")
    assert flame.category_of(["process_split (event_etl/task/executor.py:500)",
                              "RollingFiles._write_run (event_etl/storage/rolling.py:170)"]).startswith("executor loop")


def test_memory_verdict_flags_growth():
    def samples(grow: float) -> list[dict]:
        out = []
        for i in range(100):
            rss = int(100e6 * (1 + grow * i / 99))
            parts = {p: {"rss": rss, "pss": rss, "procs": 1} for p in ("driver JVM", "Python driver", "Python workers")}
            parts["other"] = {"rss": 0, "pss": 0, "procs": 0}
            out.append({"t": float(i * 5), "parts": parts, "rss": 3 * rss, "pss": 3 * rss})
        return out

    assert memory_summary(samples(0.02), warmup=30, tolerance=10)["flat"]
    grown = memory_summary(samples(0.5), warmup=30, tolerance=10)
    assert not grown["flat"] and grown["growth"]["driver JVM"] > 10


def test_the_sink_watcher_lists_only_open_hours(tmp_path: Path):
    from bench.sinkwatch import SinkWatcher

    done, open_ = tmp_path / "pv" / "dt=2026-11-21" / "hour=09", tmp_path / "pv" / "dt=2026-11-21" / "hour=10"
    for d in (done, open_):
        d.mkdir(parents=True)
        (d / "a.avro").write_bytes(b"x")
    (done / "_COMPLETE").write_text("{}")
    w = SinkWatcher(tmp_path)
    w.scan()
    assert set(w.seen) == {"pv/dt=2026-11-21/hour=09/a.avro", "pv/dt=2026-11-21/hour=09/_COMPLETE",
                           "pv/dt=2026-11-21/hour=10/a.avro"}
    (done / "b.avro").write_bytes(b"x")  # never happens to a complete hour: its folder is not listed again
    (open_ / "_COMPLETE").write_text("{}")
    w.scan()
    assert "pv/dt=2026-11-21/hour=10/_COMPLETE" in w.seen
    assert "pv/dt=2026-11-21/hour=09/b.avro" not in w.seen


def test_phases_split_a_run_at_its_marks_and_take_the_batchs_tasks_only(tmp_path: Path):
    from bench.phases import phases_of, task_times

    marks = {"process": [100.0], "jvm_launch": [100.5], "jvm_up": [101.5], "session": [103.0], "submit": [103.2],
             "collected": [110.0], "batch_end": [110.5], "end": [110.8]}
    log = tmp_path / "evlog" / "app"
    log.parent.mkdir()
    events = [{"Event": "SparkListenerJobStart", "Job ID": 0, "Stage IDs": [0]},  # starting the workers
              {"Event": "SparkListenerJobStart", "Job ID": 1, "Stage IDs": [1]}]
    for stage, launch, finish, run in [(0, 102.0, 102.1, 10), (1, 103.3, 106.0, 2600), (1, 103.4, 109.8, 6300)]:
        events.append({"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Metrics": {"Executor Run Time": run},
                       "Task Info": {"Launch Time": int(launch * 1000), "Finish Time": int(finish * 1000)}})
    log.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    p = phases_of(marks, task_times(tmp_path / "evlog"))
    assert p["task_count"] == 2 and abs(p["task_run"] - 8.9) < 1e-9
    assert abs(p["first_task"] - 0.1) < 1e-6 and abs(p["tasks"] - 6.5) < 1e-6 and abs(p["results"] - 0.2) < 1e-6
    phases = ("imports", "jvm", "session", "planning", "first_task", "tasks", "results", "driver", "stop")
    assert abs(sum(p[k] for k in phases) - p["total"]) < 1e-6, "the phases add up to the whole run"


def test_kafka_report_judges_the_local_run_and_shows_a_failed_cluster_run():
    from bench import kafka

    args = kafka.parse_args(["--scenarios", "backlog", "--records", "1000", "--executors", "1,2", "--label", "Smoke 1"])
    assert args.executors == [1, 2] and kafka.section_name("backlog", args.label) == "kafka-backlog-smoke-1"
    job = {"label": "event-etl run, local[2]", "wall": 10.0, "rate": 100.0, "cpu": 9.0, "peak_pss": 2**30,
           "largest_batch": (1000, 1.0), "batches": 1, "ratio": 0.6, "totals": {}, "hours": 1, "files": 1}
    res = {"kind": "backlog", "records": 1000, "load": 0.5, "produce": {"seconds": 1.0},
           "bare": {"seconds": 6.0, "rate": 166.0}, "jobs": [job, {"label": "event-etl submit, 1 executor",
                                                                 "error": "error: not a folder"}]}
    text = kafka.report(res, args, {"CPU": "test"}, "cmd")
    assert "**MET** (0.60×)" in text and "failed: error: not a folder" in text


def test_kafka_tail_gives_every_partition_one_record_of_its_own():
    # a phase's last `partitions` indexes are consecutive: one per partition, whatever the phase's first index
    for first, count, partitions in ((0, 100, 4), (1000, 37, 4), (5, 9, 3)):
        tail = range(first + count - partitions, first + count)
        assert sorted(i % partitions for i in tail) == list(range(partitions))


def test_spark_avro_output_counts_its_blocks_records(tmp_path: Path):
    import fastavro

    (tmp_path / "_spark_metadata").mkdir()
    part = tmp_path / "dt=2026-11-21" / "hour=01"
    part.mkdir(parents=True)
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}
    with open(part / "a.avro", "wb") as f:
        fastavro.writer(f, schema, [{"n": i} for i in range(5)], codec="snappy", sync_interval=16)
    entry = {"path": f"file://{part / 'a.avro'}", "action": "add"}
    (tmp_path / "_spark_metadata" / "0").write_text("v1\n" + json.dumps(entry) + "\n")
    assert count_spark_output(tmp_path, "avro") == (5, 1)


def test_fleet_scale_groups_the_drivers_threads_by_name():
    from bench.fleet_scale import parse_dump, thread_groups

    dump = ('Thread 10 (idle): "MainThread"\n    run (event_etl/job/engine.py:1)\n'
            'Thread 11 (idle): "pubsub-pull-0"\nThread 12 (active+gil): "pubsub-pull-12"\n')
    names = parse_dump(dump)
    assert names == {10: "MainThread", 11: "pubsub-pull-0", 12: "pubsub-pull-12"}
    comms = {10: "event-etl", 11: "event-etl", 12: "event-etl", 13: "event-etl", 14: "grpc_global_tim",
             15: "rdk:broker7", 16: "rdk:broker12"}
    assert thread_groups(comms, names, 10) == {"py: pubsub-pull-N": 2, "py: MainThread": 1, "unnamed": 1,
                                               "native: grpc_global_tim": 1, "native: rdk:brokerN": 2}
