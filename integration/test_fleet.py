"""A fleet: several event types in one Spark application, through the shared engine."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

from event_etl.job.driver import run_fleet
from event_etl.job.setup import RunOptions
from event_etl.job.status import job_statuses, read_status
from tests.lib.harness import check_manifest_matches_folder, make_event_type, read_sink

BASE = 1_795_266_000_000  # 2026-11-21T09:00Z


def _type_with_files(root: Path, name: str, files: int, per_file: int = 200):
    src = root / "in" / name
    src.mkdir(parents=True)
    ids = []
    for k in range(files):
        lines = []
        for i in range(per_file):
            ids.append(f"{name}-{k}-{i}")
            lines.append(json.dumps({"id": f"{name}-{k}-{i}", "ts": BASE + k * 900_000 + i * 1000}))
        f = src / f"f{k:03d}.jsonl"
        f.write_text("\n".join(lines) + "\n")
        os.utime(f, ((BASE + (k + 1) * 900_000) / 1000,) * 2)
    et = make_event_type(root / "types", name, source=f"dir:{src}", max_backfill="0")
    return et, ids, src


def _check(sink: Path, name: str, ids: list[str]) -> None:
    content = read_sink(sink, name)
    got = Counter(i for hc in content.values() for i in hc.timely + hc.late)
    assert set(got) == set(ids) and max(got.values()) == 1
    assert all(hc.marker is not None for hc in content.values())
    for h in content:
        check_manifest_matches_folder(sink, name, h)


def test_a_fleet_runs_each_type_with_its_own_checkpoint_and_markers(spark, tmp_path):
    a, ids_a, _ = _type_with_files(tmp_path, "clicks", 4)
    b, ids_b, _ = _type_with_files(tmp_path, "views", 6)
    summary = run_fleet([a, b], RunOptions(sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck"), drain=True,
                                           quiet=True, max_files_per_batch=2),
                        spark=spark, install_signals=False)
    assert set(summary) == {"clicks", "views"}
    _check(tmp_path / "sink", "clicks", ids_a)
    _check(tmp_path / "sink", "views", ids_b)
    assert (tmp_path / "ck" / "clicks" / "etl" / "state.json").exists()
    assert (tmp_path / "ck" / "views" / "etl" / "state.json").exists()
    rows = {r["event_type"]: r for r in job_statuses(["clicks", "views"], sink=str(tmp_path / "sink"),
                                                     checkpoint_root=str(tmp_path / "ck"))}
    assert rows["clicks"]["state"] == rows["views"]["state"] == "stopped"
    assert rows["clicks"]["last_marker"] and rows["views"]["watermark"]


def test_a_failing_type_is_tried_again_with_backoff_and_the_others_keep_going(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENT_ETL_FLEET_BACKOFF", "2")
    good, ids_good, src_good = _type_with_files(tmp_path, "steady", 2)
    bad, ids_bad, src_bad = _type_with_files(tmp_path, "flaky", 2)
    result = {}
    options = RunOptions(sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck"), quiet=True,
                         max_files_per_batch=1, trigger_interval="500ms", max_seconds=150)

    stop = threading.Event()

    def fleet():
        result["summary"] = run_fleet([good, bad], options, spark=spark, install_signals=False, status_every_s=5,
                                      stop_event=stop)

    def wait(pred, what, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}")

    def placed(name):
        return {i for hc in read_sink(tmp_path / "sink", name).values() for i in hc.timely + hc.late}

    th = threading.Thread(target=fleet)
    th.start()
    try:
        wait(lambda: placed("flaky") >= set(ids_bad), "the flaky type's first files")
        away = src_bad.with_name("flaky.away")
        src_bad.rename(away)  # its source folder disappears: its batches fail
        wait(lambda: (read_status(tmp_path / "ck" / "flaky") or {}).get("restarts", 0) >= 1, "a restart")
        status = read_status(tmp_path / "ck" / "flaky")
        assert "flaky" in status["last_error"] or "cannot list" in status["last_error"], status
        # quarantined (for its backoff) while its folder is away
        wait(lambda: (read_status(tmp_path / "ck" / "flaky") or {}).get("state") == "quarantined", "quarantined")
        # the other type keeps going meanwhile
        more = src_good / "f999.jsonl"
        more.write_text(
            "\n".join(json.dumps({"id": f"more-{i}", "ts": BASE + 3 * 900_000 + i}) for i in range(5)) + "\n"
        )
        os.utime(more, ((BASE + 4 * 900_000) / 1000,) * 2)
        wait(lambda: placed("steady") >= set(ids_good) | {f"more-{i}" for i in range(5)}, "the healthy type's new file")
        # the folder comes back: the type, opened again, picks up new input
        away.rename(src_bad)
        extra = src_bad / "f998.jsonl"
        extra.write_text(json.dumps({"id": "back", "ts": BASE + 3 * 900_000}) + "\n")
        os.utime(extra, ((BASE + 4 * 900_000) / 1000,) * 2)
        wait(lambda: "back" in placed("flaky"), "the flaky type back at work")
        assert (read_status(tmp_path / "ck" / "flaky") or {}).get("state") == "running"
    finally:
        stop.set()
        th.join(timeout=120)
    assert result["summary"]["flaky"]["restarts"] >= 1
    assert result["summary"]["steady"]["restarts"] == 0
