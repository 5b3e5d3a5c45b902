"""The issue's acceptance, as a new user would try it: the demo job runs; `event-etl wait page_view <next hour>`
returns as soon as that hour's marker appears, and `event-etl cat` prints its records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from event_etl.consumer import HourState, hour_statuses, verify_hour
from event_etl.errors import NoDataError
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.timeutil import HOUR_MS, hour_floor, iso, now_millis, to_millis

EXE = str(Path(sys.executable).with_name("event-etl"))


def _env():
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}


def _an_unmarked_hour(sink: Path, deadline: float, job: subprocess.Popen) -> int:
    """The hour after next of the last complete one, once the job has marked at least one hour: at least one
    hour of the demo's event time (30 s) away, so that a marker written while the folders were being listed (the
    job marks the hours a step completes one after the other) cannot have marked it already."""
    now = hour_floor(now_millis())  # the demo's event time starts 2h15m before this hour and runs 120x faster
    while time.monotonic() < deadline:
        assert job.poll() is None, f"the demo job exited ({job.returncode}):\n{job.stdout.read()}"
        try:
            states = hour_statuses(sink, "page_view", iso(now - 6 * HOUR_MS), iso(now + 24 * HOUR_MS))
        except NoDataError:  # the job has not written its lease or first files yet
            time.sleep(0.5)
            continue
        complete = [s for s in states if s.is_complete]
        if complete:
            return to_millis(complete[-1].hour) + 2 * HOUR_MS
        time.sleep(0.5)
    raise AssertionError("the demo marked no hour in time")


@pytest.mark.slow
def test_wait_for_the_next_hour_of_the_demo_then_cat_it(tmp_path):
    job = subprocess.Popen([EXE, "run", "page_view"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        sink = tmp_path / "data"
        nxt = _an_unmarked_hour(sink, time.monotonic() + 120, job)
        marker = sink / hour_dir("page_view", nxt) / MARKER_NAME
        assert not marker.exists()
        waiter = subprocess.run([EXE, "wait", "page_view", iso(nxt), "--timeout", "3m", "--poll-interval", "1s"],
                                cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
        returned_at = time.time()
        assert waiter.returncode == 0, waiter.stdout + waiter.stderr
        assert f"page_view {iso(nxt)} complete" in waiter.stdout
        assert returned_at - marker.stat().st_mtime < 5, "wait returned soon after the marker appeared"
        cat = subprocess.run([EXE, "cat", "page_view", iso(nxt)], cwd=tmp_path, env=_env(), capture_output=True,
                             text=True, timeout=120)
        assert cat.returncode == 0, cat.stderr
        manifest = json.loads(marker.read_text())
        lines = cat.stdout.splitlines()
        assert len(lines) == manifest["records"] > 0
        assert all("event_id" in json.loads(line) for line in lines[:100])
        assert verify_hour(sink, "page_view", iso(nxt)).ok
        states = {s.state for s in hour_statuses(sink, "page_view", iso(nxt), iso(nxt + HOUR_MS))}
        assert states == {HourState.COMPLETE}
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                job.kill()
