"""The real Spark job on the directory source: no loss, no duplicate, identical replays, restarts."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from event_etl.errors import CheckpointMismatchError
from event_etl.job.checkpoint import Checkpoint
from event_etl.job.driver import run_job
from event_etl.job.setup import RunOptions
from event_etl.timeutil import HOUR_MS
from tests.lib.generated import GEN, placement, write_inputs
from tests.lib.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    make_event_type,
    read_deadletter,
    read_sink,
    t,
)


def listed_arrivals(ckpt: Path) -> dict[str, int]:
    """When the job first listed each input file (its payloads' arrival), from the source's log."""
    out = {}
    for seg in sorted((ckpt / "etl" / "source" / "dir").glob("[0-9]*.json")):
        out.update({e["name"]: int(e["arrival"]) for e in json.loads(seg.read_text())})
    return out


def opts(tmp: Path, **kw) -> RunOptions:
    base = dict(source=f"dir:{tmp / 'in'}", sink=str(tmp / "sink"), checkpoint=str(tmp / "ckpt"), quiet=True)
    base.update(kw)
    return RunOptions(**base)


@pytest.fixture
def et(tmp_path):
    return make_event_type(tmp_path / "types", "page", schema=json.loads(
        (Path(__file__).resolve().parent.parent / "event_types/page_view/schema.avsc").read_text()),
        time_field="event_time", id_field="event_id", max_events_per_file=150)


def test_every_event_once_and_the_same_result_as_without_spark(spark, tmp_path, et):
    batches = write_inputs(et, tmp_path / "in", files=8, per_file=400)
    summary = run_job(et, opts(tmp_path, once=True, max_files_per_batch=2), spark=spark,
                      clock=FakeClock(t("14:00")), install_signals=False)
    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert summary["batches"] == len(groups)
    sink = tmp_path / "sink"
    got = placement(sink, et.name)
    # nothing twice
    assert max(got.values()) == 1
    ids_in_buckets = Counter(i for _, i, _ in got)
    assert max(ids_in_buckets.values()) == 1
    # each generated event is in a bucket or in the dead-letter area with the reason its kind implies;
    # "future" is measured against when the job listed the file, not against the generator's clock
    arrivals = listed_arrivals(tmp_path / "ckpt")
    dl = read_deadletter(sink, et.name)
    dl_reasons = Counter(r["reason"] for r in dl)
    everything = [g for b in batches for g in b]
    by_intent = Counter(g.intent for g in everything)
    future = {g.event_id for k, b in enumerate(batches) for g in b if g.intent != "invalid"
              and g.event_time > arrivals[f"events-{k:04d}.jsonl"] + et.max_future_skew}
    assert dl_reasons["future"] == len(future)
    assert sum(n for r, n in dl_reasons.items() if r not in ("future", "too_late")) == by_intent["invalid"]
    valid = [g for g in everything if g.intent != "invalid" and g.event_id not in future]
    too_late_ids = {json.loads(r["payload"])["event_id"] for r in dl if r["reason"] == "too_late"}
    assert set(ids_in_buckets) | too_late_ids == {g.event_id for g in valid}
    assert not set(ids_in_buckets) & too_late_ids
    # timely events sit in their own hour; late ones in a later hour's late file
    times = {g.event_id: g.event_time for g in valid}
    for h, i, late in got:
        own = times[i] - times[i] % HOUR_MS
        assert (own == h) if not late else (own < h)
    # every hour from the first to the last complete one is marked, and its manifest is exact
    content = read_sink(sink, et.name, et.id_field)
    marked = sorted(h for h, hc in content.items() if hc.marker)
    assert marked == list(range(marked[0], marked[-1] + HOUR_MS, HOUR_MS))
    for h in marked:
        check_manifest_matches_folder(sink, et.name, h)
    # the same batches through the executor and controller without Spark give the same placement
    ref = LocalPipeline(tmp_path / "ref", et, FakeClock(t("14:00")))
    for g in groups:
        _batch_with_arrivals(ref, [(batches[k], arrivals[f"events-{k:04d}.jsonl"]) for k in g])
    assert placement(ref.sink, et.name) == got
    ref_markers = {h: (hc.marker.records, hc.marker.late_records)
                   for h, hc in read_sink(ref.sink, et.name, et.id_field).items() if hc.marker}
    assert ref_markers == {h: (content[h].marker.records, content[h].marker.late_records) for h in marked}


def _batch_with_arrivals(ref: LocalPipeline, files: list[tuple[list, int]]) -> None:
    """One reference batch whose splits are the given files ``(events, arrival)``."""
    from event_etl.sources.splits import Split

    batch_id = ref.next_batch
    ref.next_batch += 1
    splits = []
    for shard, (evs, arrival) in enumerate(files):
        f = ref.inputs / f"b{batch_id}-{shard}.jsonl"
        f.write_bytes(b"\n".join(g.payload for g in evs) + b"\n")
        splits.append(Split.of_files(shard, [(str(f), 0, f.stat().st_size, arrival)]))
    ref.controller.run_batch(batch_id, ref.task_runner(splits))


def snapshot(sink: Path) -> dict[str, bytes]:
    return {str(p.relative_to(sink)): p.read_bytes() for p in sorted(sink.rglob("*")) if p.is_file()}


def test_a_crash_before_the_commit_replays_to_the_identical_sink(spark, tmp_path, et):
    """Crash points reproduced on disk: files half written, markers written, state not saved, no commit."""
    write_inputs(et, tmp_path / "in", files=6, per_file=300)
    shutil.copytree(tmp_path / "in", tmp_path / "clean" / "in")
    clock = FakeClock(t("14:00"))
    run_job(et, opts(tmp_path / "clean", drain=True, max_files_per_batch=1), spark=spark, clock=clock,
            install_signals=False)
    reference = snapshot(tmp_path / "clean" / "sink")
    # Same job identity as the clean run (its writer id is part of every file name), another sink.
    clean_job = Checkpoint(tmp_path / "clean" / "ckpt").job()
    Checkpoint(tmp_path / "ckpt").bind({**clean_job, "sink": str(tmp_path / "sink"),
                                        "source": f"dir:{tmp_path / 'in'}"})
    # the same arrivals as the clean run: its source log, which records when each file was listed
    shutil.copytree(tmp_path / "clean" / "ckpt" / "etl" / "source" / "dir",
                    tmp_path / "ckpt" / "etl" / "source" / "dir")
    reference = {k: v.replace(str(tmp_path / "clean").encode(), str(tmp_path).encode()) for k, v in reference.items()}

    states = []
    run_job(et, opts(tmp_path, once=True, max_files_per_batch=1), spark=spark, clock=clock, install_signals=False,
            listeners=[lambda kind, ev: states.append(ev.state) if kind == "batch" else None])
    ck = Checkpoint(tmp_path / "ckpt")
    sink = tmp_path / "sink"
    # The crash: batch 5 wrote some of its files and the markers its watermark allowed, but the job
    # died before saving its state and before Spark committed it.
    last = 5
    os.remove(ck.spark_dir / "commits" / str(last))
    (ck.spark_dir / "commits" / f".{last}.crc").unlink(missing_ok=True)  # a query of 0.3 wrote one; the engine not
    ck.save_state(states[last - 1])
    from event_etl.rules.buckets import parse_data_file_name
    from event_etl.rules.compaction import is_merged_name

    # A file batch 5 wrote itself (a merge after its commit is durable before it is recorded: a
    # crash never loses a merged file that the checkpoint knows)
    victims = sorted(p for p in sink.rglob("*.avro") if "_deadletter" not in str(p)
                     and parse_data_file_name(p.name).batch_id == last and not is_merged_name(p.name))
    assert victims, "batch 5 wrote files"
    victims[0].unlink()
    (victims[0].parent / f".{victims[0].name}.deadbeef.tmp").write_bytes(b"half a file")
    run_job(et, opts(tmp_path, drain=True, max_files_per_batch=1), spark=spark, clock=clock, install_signals=False)
    assert snapshot(sink) == reference, "the replay completed the batch exactly as a run without crash"


def test_restart_continues_and_a_second_sink_is_refused(spark, tmp_path, et):
    batches = write_inputs(et, tmp_path / "in", files=6, per_file=200)
    for f in sorted((tmp_path / "in").iterdir())[3:]:
        f.rename(tmp_path / f.name)  # not there yet
    clock = FakeClock(t("14:00"))
    s1 = run_job(et, opts(tmp_path, once=True, max_files_per_batch=1), spark=spark, clock=clock, install_signals=False)
    assert s1["batches"] == 3
    for f in sorted(tmp_path.glob("events-*.jsonl")):
        f.rename(tmp_path / "in" / f.name)
    s2 = run_job(et, opts(tmp_path, drain=True, max_files_per_batch=1), spark=spark, clock=clock, install_signals=False)
    assert s2["batches"] == 3
    got = placement(tmp_path / "sink", et.name)
    assert max(Counter(i for _, i, _ in got).values()) == 1
    valid = {g.event_id for b in batches for g in b if g.intent not in ("invalid", "future", "too_late")}
    assert valid <= {i for _, i, _ in got}
    content = read_sink(tmp_path / "sink", et.name, et.id_field)
    last_hour = max(content)
    assert all(hc.marker is not None for hc in content.values()), "drain marked every hour holding data"
    assert content[last_hour].marker.watermark == last_hour + HOUR_MS
    with pytest.raises(CheckpointMismatchError, match="sink"):
        run_job(et, opts(tmp_path, once=True, sink=str(tmp_path / "other")), spark=spark, clock=clock,
                install_signals=False)


def test_a_new_checkpoint_cuts_a_batch_into_whole_rounds_of_tasks_and_a_format_2_one_keeps_its_cut(spark, tmp_path,
                                                                                                     et):
    """Three splits' worth of input on a 2-core session: 4 tasks for a new checkpoint (format 3, split_plan 2),
    3 for one of format 2 (release 0.2.0's cut: its pending batch is replayed into the same files)."""
    from event_etl.rules.buckets import parse_data_file_name
    from event_etl.rules.compaction import MERGED_SHARD_BASE

    # the generator of 0.2.0 (version 1): every task's events reach the hour left open, so the files there tell the
    # tasks apart (version 2's first hours hold only timely events, and the early tasks' hour is merged at its marker)
    write_inputs(et, tmp_path / "in", files=3, per_file=200, params=replace(GEN, version=1))
    size = (tmp_path / "in" / "events-0000.jsonl").stat().st_size
    shards = {}
    for fmt in (None, 2):
        ckpt = tmp_path / f"ckpt-{fmt}"
        if fmt is not None:  # created by 0.2.0, which stopped before its first batch
            (ckpt / "etl").mkdir(parents=True)
            (ckpt / "etl" / "format.json").write_text(json.dumps({"format": fmt, "written_by": "event_etl 0.2.0"}))
        sink = tmp_path / f"sink-{fmt}"
        run_job(et, opts(tmp_path, once=True, split_bytes=size, checkpoint=str(ckpt), sink=str(sink)), spark=spark,
                clock=FakeClock(t("14:00")), install_signals=False)
        job = json.loads((ckpt / "etl" / "job.json").read_text())
        written = {parse_data_file_name(f.name).shard for f in sink.rglob("part-*.avro")}
        shards[fmt] = (json.loads((ckpt / "etl" / "format.json").read_text())["format"], job.get("split_plan"),
                       len({s for s in written if s < MERGED_SHARD_BASE}))  # not the files merged since
    assert shards == {None: (3, 2, 4), 2: (2, None, 3)}


def test_generator_source_once_with_count(spark, tmp_path):
    from event_etl.eventtypes import load_event_type

    et = load_event_type(Path(__file__).resolve().parent.parent / "event_types" / "db_change")
    s = run_job(et, RunOptions(source="generate:count=6000,rate=1000,speedup=600,seed=3", sink=str(tmp_path / "sink"),
                               checkpoint=str(tmp_path / "ckpt"), drain=True, quiet=True, max_events_per_batch=2500),
                spark=spark, install_signals=False)
    assert s["batches"] == 3 and s["events_in"] == 6000
    content = read_sink(tmp_path / "sink", "db_change", id_field="change_id")
    total = sum(len(hc.timely) + len(hc.late) for hc in content.values())
    assert total == s["totals"]["timely"] + s["totals"].get("late", 0)
    assert all(hc.marker for hc in content.values())
    # the same count again is nothing new: the offsets remember
    s2 = run_job(et, RunOptions(source="generate:count=6000,rate=1000,speedup=600,seed=3", sink=str(tmp_path / "sink"),
                                checkpoint=str(tmp_path / "ckpt"), once=True, quiet=True), spark=spark,
                                install_signals=False)
    assert s2["batches"] == 0


def test_a_local_jobs_jvm_compiles_with_c1_only_collects_serially_and_keeps_the_log_settings(spark):
    """A local job's driver JVM runs with LOCAL_JIT and LOCAL_GC (its optimizing compiler and G1's threads would
    take CPU from the Python workers on the same cores) and with event_etl's log4j settings, all given at its
    launch; task results up to 64 MiB come back with the task's status, not through the block manager."""
    from event_etl.job.session import LOCAL_GC, LOCAL_JIT

    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert LOCAL_JIT in args and LOCAL_GC in args, args
    collectors = [b.getName() for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()]
    assert collectors == ["Copy", "MarkSweepCompact"], collectors  # the serial collector's two generations
    assert spark.sparkContext.getConf().get("spark.task.maxDirectResultSize") == "64m"
    assert any(a.startswith("-Dlog4j2.configurationFile=file:") for a in args), args


def test_a_local_session_starts_its_python_workers_and_they_import_the_installed_pyspark(spark):
    """A local session starts the Python workers in the background as it is built, so that a job's first
    batch finds them running; they import PySpark from the installed package, not from the zip Spark puts
    first on their path (whose modules would be compiled again in every daemon)."""
    import time

    from event_etl.job.session import WORKERS_GROUP

    sc = spark.sparkContext
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(WORKERS_GROUP)
    assert jobs, "no job started the workers when the session was built"
    deadline = time.monotonic() + 60
    while (info := tracker.getJobInfo(jobs[0])) is not None and info.status == "RUNNING":
        assert time.monotonic() < deadline, "the job starting the workers is still running after 60 s"
        time.sleep(0.1)
    assert info is not None and info.status == "SUCCEEDED", info
    got = sc.parallelize(range(2), 2).map(lambda _: (__import__("pyspark").__file__,
                                                     __import__("gc").get_freeze_count())).collect()
    assert got and not any(".zip" in f for f, _ in got), got
    # the modules the daemon loaded are in the collector's permanent generation: the full collection
    # PySpark's worker runs after every task does not walk them again
    assert all(frozen > 10_000 for _, frozen in got), got
