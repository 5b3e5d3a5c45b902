"""The shared engine with Spark: a type moves between a run of its own and a fleet, both ways; a checkpoint a
Spark streaming query wrote (0.3's ``--engine queries``, every job before 0.2) is resumed in integration/test_upgrade.py
(release 0.1.0's fixtures)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from event_etl.job.driver import run_fleet, run_job
from event_etl.job.setup import RunOptions
from tests.lib.harness import check_manifest_matches_folder, make_event_type, read_sink

BASE = 1_795_266_000_000  # 2026-11-21T09:00Z


def _add_files(src: Path, name: str, first: int, count: int, per_file: int = 50) -> list[str]:
    src.mkdir(parents=True, exist_ok=True)
    ids = []
    for k in range(first, first + count):
        lines = []
        for i in range(per_file):
            ids.append(f"{name}-{k}-{i}")
            lines.append(json.dumps({"id": f"{name}-{k}-{i}", "ts": BASE + k * 600_000 + i * 1000}))
        f = src / f"f{k:03d}.jsonl"
        f.write_text("\n".join(lines) + "\n")
        os.utime(f, ((BASE + (k + 1) * 600_000) / 1000,) * 2)
    return ids


def _placed_once(sink: Path, name: str, ids: list[str]) -> None:
    content = read_sink(sink, name)
    got = Counter(i for hc in content.values() for i in hc.timely + hc.late)
    assert max(got.values()) == 1, [i for i, n in got.items() if n > 1][:5]
    assert set(got) == set(ids), f"lost {len(set(ids) - set(got))}, foreign {len(set(got) - set(ids))}"
    for h in content:
        check_manifest_matches_folder(sink, name, h)


def _batches(ck: Path, kind: str) -> list[int]:
    return sorted(int(p.name) for p in (ck / "spark" / kind).iterdir() if p.name.isdigit())


def test_a_type_moves_from_a_fleet_to_a_run_of_its_own_and_back(spark, tmp_path):
    src_a, src_b = tmp_path / "in" / "clicks", tmp_path / "in" / "views"
    ids_a = _add_files(src_a, "clicks", 0, 3)
    ids_b = _add_files(src_b, "views", 0, 2)
    a = make_event_type(tmp_path / "types", "clicks", source=f"dir:{src_a}", max_backfill="0")
    b = make_event_type(tmp_path / "types", "views", source=f"dir:{src_b}", max_backfill="0")
    sink, ck = tmp_path / "sink", tmp_path / "ck"

    def fleet(**kw):
        return run_fleet([a, b], RunOptions(sink=str(sink), checkpoint=str(ck), quiet=True, max_files_per_batch=2,
                                            **kw), spark=spark, install_signals=False)

    fleet(once=True)
    assert _batches(ck / "clicks", "commits") == [0, 1]  # 3 files, at most 2 a batch
    assert not (ck / "clicks" / "spark" / "sources").exists()  # no streaming query ran for it
    ids_a += _add_files(src_a, "clicks", 3, 2)
    # on its own now: it goes on from the log the fleet wrote, from batch 2 on
    alone = run_job(a, RunOptions(sink=str(sink), checkpoint=str(ck / "clicks"), quiet=True, once=True,
                                  max_files_per_batch=2), spark=spark, install_signals=False)
    assert alone["batches"] == 1 and alone["last_batch"] == 2 and alone["events_in"] == 100
    ids_a += _add_files(src_a, "clicks", 5, 1)
    ids_b += _add_files(src_b, "views", 2, 1)
    # and back: the fleet goes on after the batch of the type's own run
    summary = fleet(drain=True)
    assert summary["clicks"]["last_batch"] == 3 and summary["views"]["last_batch"] == 1
    assert _batches(ck / "clicks", "commits") == [0, 1, 2, 3]
    _placed_once(sink, "clicks", ids_a)
    _placed_once(sink, "views", ids_b)
    assert all(hc.marker is not None for hc in read_sink(sink, "clicks").values())


def test_a_batch_a_crash_left_unfinished_is_replayed_first_over_the_same_input(spark, tmp_path):
    from event_etl.job.engine import FleetMember
    from event_etl.job.setup import acquire_lease, open_shared, prepare_job

    src = tmp_path / "in" / "clicks"
    ids = _add_files(src, "clicks", 0, 2)
    et = make_event_type(tmp_path / "types", "clicks", source=f"dir:{src}", max_backfill="0")
    sink, ck = tmp_path / "sink", tmp_path / "ck"
    options = RunOptions(sink=str(sink), checkpoint=str(ck), quiet=True, max_files_per_batch=5)
    # a first run offers batch 0 (its offset is durable) and dies before running it
    p = prepare_job(et, options, clock=lambda: BASE + 3_600_000, checkpoint=str(ck / "clicks"))
    acquire_lease(p)
    m = FleetMember(et, p)
    try:
        m.job, m.lane = open_shared(p, spark, clock=lambda: BASE + 3_600_000, serve_metrics=False)
        assert m.lane.offer(now=1, conf={}) == (0, {"files": 0}, {"files": 2})
    finally:
        m.job.close()
        p.lease.release()
    ids += _add_files(src, "clicks", 2, 3)  # more arrives meanwhile
    summary = run_fleet([et], RunOptions(sink=str(sink), checkpoint=str(ck), quiet=True, max_files_per_batch=5,
                                         drain=True), spark=spark, install_signals=False)
    assert summary["clicks"]["batches"] == 2  # batch 0 as offered (2 files), then batch 1 (3 files)
    ledger_0 = [json.loads(line) for line in (ck / "clicks" / "spark" / "offsets" / "0").read_text().splitlines()[2:]]
    assert ledger_0 == [{"files": 2}]
    _placed_once(sink, "clicks", ids)


def test_a_shared_fleet_killed_at_each_step_of_a_round_loses_and_duplicates_nothing(tmp_path):
    """SIGKILL after a type's offset is durable, after a batch's files are written, after its state is saved (its
    commit not yet written): each run after a kill replays what was cut short; a drain then closes every hour."""
    import signal
    import subprocess
    import sys
    import time

    exe = str(Path(sys.executable).with_name("event-etl"))
    names = ("clicks", "views", "buys")
    ids: dict[str, list[str]] = {}
    for k, name in enumerate(names):
        ids[name] = _add_files(tmp_path / "in" / name, name, 0, 4 + k)
        make_event_type(tmp_path / "types", name, source=f"dir:{tmp_path / 'in' / name}", max_backfill="0")
    sink, ck, faults = tmp_path / "sink", tmp_path / "ck", tmp_path / "faults.log"
    cmd = [exe, "run", "--all", "--event-types", str(tmp_path / "types"), "--sink", str(sink), "--checkpoint", str(ck),
           "--master", "local[2]", "--trigger-interval", "1s", "--max-files-per-batch", "1", "--quiet"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR",
           "EVENT_ETL_FAULT_LOG": str(faults)}
    for point in ("offset_written", "files_written", "state_saved"):
        seen = faults.read_text().count(f"{point} ") if faults.exists() else 0
        with open(tmp_path / f"{point}.log", "w") as out:
            proc = subprocess.Popen(cmd, env={**env, "EVENT_ETL_FAULT_PAUSE": f"{point}=5"}, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.monotonic() + 120
                while (faults.read_text().count(f"{point} ") if faults.exists() else 0) <= seen:
                    assert proc.poll() is None, (tmp_path / f"{point}.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, f"the fleet never reached {point}"
                    time.sleep(0.1)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
    done = subprocess.run([*cmd, "--drain"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in names:
        _placed_once(sink, name, ids[name])
        assert all(hc.marker is not None for hc in read_sink(sink, name).values())
