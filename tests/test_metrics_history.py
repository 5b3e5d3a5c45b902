"""The metrics history a job keeps: in its checkpoint by default, rotated past a size, read across the rotation, its
lag figures on the generator's clock when the job reads the generator, and nothing that scans a checkpoint disturbed
by it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from event_etl.errors import UsageError
from event_etl.job.checkpoint import Checkpoint
from event_etl.job.setup import RunOptions, open_parts, prepare_job
from event_etl.job.status import job_status
from event_etl.metrics import MetricsHistory, job_metrics, read_history
from event_etl.metrics.history import HISTORY_FILE, default_history_path, history_files
from event_etl.sources.splits import Split
from event_etl.storage import Storage
from event_etl.storage.temporaries import sweep_temporaries
from event_etl.task.executor import process_split
from event_etl.timeutil import format_duration
from tests.lib.harness import FakeClock, click, make_event_type, t

SPARK = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=2))
"""All of Spark that opening a job asks (its parallelism, recorded in the checkpoint)."""


def _record(i: int) -> dict:
    return {"kind": "watermark", "event_type": "click", "t": 1_795_266_000.0 + i, "seq": i, "pad": "x" * 100}


# -- where the history is -------------------------------------------------------------------------
def test_the_history_goes_to_the_checkpoint_unless_a_file_is_named(tmp_path):
    et = make_event_type(tmp_path / "types")
    clock = FakeClock(t("14:00"))
    ck = tmp_path / "ck"
    m = job_metrics(et, RunOptions(), clock=clock, checkpoint=str(ck))
    assert m.history is not None and m.history.path == str(ck / HISTORY_FILE)
    m.shutdown()
    m = job_metrics(et, RunOptions(metrics_history=str(tmp_path / "m.jsonl")), clock=clock, checkpoint=str(ck))
    assert m.history is not None and m.history.path == str(tmp_path / "m.jsonl")
    m.shutdown()
    assert default_history_path("gs://bucket/ck") is None  # a remote checkpoint keeps none
    assert default_history_path(f"file://{ck}") == str(ck / HISTORY_FILE)
    m = job_metrics(et, RunOptions(), clock=clock, checkpoint="gs://bucket/ck")
    assert m.history is None
    m.shutdown()


def _generator_offsets(spark_dir: Path, *, t0: int, start: int, rate: int = 100, speedup: int = 120) -> None:
    """Spark's offset log as the generator's first plan leaves it: its parameters frozen in its offset."""
    offsets = spark_dir / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    (offsets / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n'
                               + json.dumps({"n": 10, "t0": t0, "p": {"rate": rate, "speedup": speedup,
                                                                       "start": start}}) + "\n")


def test_a_job_on_the_generator_keeps_its_history_in_its_checkpoint_with_lags_on_the_generator_clock(tmp_path):
    """The job as `run` opens it (prepare_job, open_parts), one batch through its real controller and executor: the
    history is in the checkpoint, and its lag is the progress line's, measured against the generator's clock."""
    et = make_event_type(tmp_path / "types")
    clock = FakeClock(t("14:00"))
    options = RunOptions(source="generate:rate=100,speedup=120", sink=str(tmp_path / "sink"),
                         checkpoint=str(tmp_path / "ck"), quiet=True)
    p = prepare_job(et, options, clock=clock)
    job, _spec = open_parts(p, SPARK, clock=clock)
    try:
        # the generator started at 14:00 (wall), its event time at 11:45, running 120x: at 14:00:30 it is 12:45
        _generator_offsets(p.ckpt.spark_dir, t0=t("14:00"), start=t("11:45"))
        clock.now = t("14:00:30")
        generator_now = t("12:45")
        src = tmp_path / "batch-0.jsonl"
        src.write_bytes(b"\n".join(click(f"e{i}", generator_now - 60_000 + i * 1000) for i in range(30)))
        split = Split.of_files(0, [(str(src), 0, src.stat().st_size, generator_now)])
        ev = job.controller.run_batch(0, lambda ctx, shards: [process_split(split, ctx, p.storage)])
    finally:
        job.close()
    path = tmp_path / "ck" / HISTORY_FILE
    (line,) = [r for r in read_history(str(path)) if r["kind"] == "batch"]
    wm = ev.state.watermark
    assert wm is not None
    assert line["clock"] == "generator"
    assert line["watermark_lag_seconds"] == (generator_now - wm) / 1000  # 2m30s: the generator's lag
    assert line["watermark_lag_seconds"] != (clock.now - wm) / 1000  # not the wall clock's (1h17m)
    assert job.printer is not None
    assert job.printer.lag_text(wm) == format_duration(line["watermark_lag_seconds"] * 1000) + " (generator clock)"
    assert line["since"] <= line["t"] == clock.now / 1000


def test_a_job_on_another_source_measures_lag_on_the_wall_clock(tmp_path):
    et = make_event_type(tmp_path / "types")
    (tmp_path / "in").mkdir()
    clock = FakeClock(t("14:00"))
    p = prepare_job(et, RunOptions(source=f"dir:{tmp_path / 'in'}", sink=str(tmp_path / "sink"),
                                   checkpoint=str(tmp_path / "ck"), quiet=True), clock=clock)
    job, _spec = open_parts(p, SPARK, clock=clock)
    try:
        src = tmp_path / "batch-0.jsonl"
        src.write_bytes(b"\n".join(click(f"e{i}", "13:50") for i in range(5)))
        split = Split.of_files(0, [(str(src), 0, src.stat().st_size, clock.now)])
        ev = job.controller.run_batch(0, lambda ctx, shards: [process_split(split, ctx, p.storage)])
    finally:
        job.close()
    (line,) = [r for r in read_history(str(tmp_path / "ck" / HISTORY_FILE)) if r["kind"] == "batch"]
    assert "clock" not in line and line["watermark_lag_seconds"] == (clock.now - ev.state.watermark) / 1000


# -- rotation ---------------------------------------------------------------------------------------
def test_the_history_is_rotated_past_its_cap_and_read_across_the_rotation(tmp_path):
    path = tmp_path / "h.jsonl"
    h = MetricsHistory(str(path), max_bytes=4096)
    for i in range(200):  # ~180 bytes a line: 36 KB written in all
        h.write(_record(i))
    h.close()
    assert path.stat().st_size <= 4096 and (tmp_path / "h.jsonl.1").stat().st_size <= 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "h.jsonl.1"]  # one old file kept, no more
    assert history_files(str(path)) == [str(path) + ".1", str(path)]
    seqs = [r["seq"] for r in read_history(str(path))]
    assert seqs == list(range(seqs[0], 200)) and len(seqs) > 4096 // 200  # the newest lines, in order, none lost
    assert all(r["v"] == 1 for r in read_history(str(path)))  # the same format


def test_a_job_rotates_its_default_history_at_8_mib(tmp_path):
    et = make_event_type(tmp_path / "types")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / HISTORY_FILE).write_text(json.dumps({"v": 1, **_record(0), "pad": "x" * (8 * 1024 * 1024)}) + "\n")
    m = job_metrics(et, RunOptions(), clock=FakeClock(t("14:00")), checkpoint=str(ck))
    assert m.history is not None
    m.history.write(_record(1))
    m.shutdown()
    assert [r["seq"] for r in read_history(str(ck / HISTORY_FILE))] == [0, 1]
    assert (ck / (HISTORY_FILE + ".1")).stat().st_size > 8 * 1024 * 1024 > (ck / HISTORY_FILE).stat().st_size


def test_writers_sharing_a_file_rotate_it_once_and_lose_nothing(tmp_path):
    """The jobs of a fleet given one --metrics-history FILE: each has its own writer on the same file."""
    path = tmp_path / "fleet.jsonl"
    writers = [MetricsHistory(str(path), max_bytes=8192) for _ in range(3)]
    for i in range(120):
        writers[i % 3].write(_record(i))
    for w in writers:
        w.close()
    seqs = [r["seq"] for r in read_history(str(path))]
    assert seqs == list(range(seqs[0], 120)) and seqs[0] > 0


def test_an_unfinished_last_line_of_a_killed_writer_is_dropped_when_the_history_is_opened_again(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({"v": 1, **_record(0)}) + "\n" + '{"v":1,"kind":"batch","event_ty')
    h = MetricsHistory(str(path))
    h.write(_record(1))
    h.close()
    assert [r["seq"] for r in read_history(str(path))] == [0, 1]


# -- what scans a checkpoint ------------------------------------------------------------------------
def test_nothing_that_scans_a_checkpoint_minds_its_history(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in (HISTORY_FILE, HISTORY_FILE + ".1"):
        (ck / name).write_text(json.dumps({"v": 1, **_record(0)}) + "\n")
    assert sweep_temporaries(ck) == [] and (ck / HISTORY_FILE).exists() and (ck / (HISTORY_FILE + ".1")).exists()
    c = Checkpoint(ck)
    assert c.open_format(release="test") == 0  # a checkpoint holding only a history is new
    status = job_status("click", storage=Storage(str(tmp_path / "sink")), checkpoint_dir=ck, now=t("14:00"))
    assert status["state"] == "never run"
    # a job starts on it, and keeps appending to the history there
    et = make_event_type(tmp_path / "types")
    (tmp_path / "in").mkdir()
    clock = FakeClock(t("14:00"))
    p = prepare_job(et, RunOptions(source=f"dir:{tmp_path / 'in'}", sink=str(tmp_path / "sink"), checkpoint=str(ck),
                                   quiet=True), clock=clock)
    job, _spec = open_parts(p, SPARK, clock=clock)
    job.close()
    assert len(read_history(str(ck / HISTORY_FILE))) == 2


def test_a_history_that_cannot_be_written_names_the_checkpoint(tmp_path):
    et = make_event_type(tmp_path / "types")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / HISTORY_FILE).mkdir()  # a folder where the file should be
    with pytest.raises(UsageError) as err:
        job_metrics(et, RunOptions(), clock=FakeClock(t("14:00")), checkpoint=str(ck))
    assert "in the checkpoint" in err.value.message and str(ck) in err.value.message
