"""The consumer API and commands on GCS (fake-gcs-server), over sinks written by the real executor and controller."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from event_etl.consumer import (
    AuditResult,
    CouldNotCheckError,
    HourState,
    WaitTimeoutError,
    audit_hour,
    hour_status,
    hour_statuses,
    read_records,
    read_table,
    verify_hour,
    wait_for_hour,
)
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.storage import Storage
from tests.lib.consumer_scenario import build_hours, complete_hour_15
from tests.lib.harness import hour

EXE = str(Path(sys.executable).with_name("event-etl"))
UTC = dt.UTC


@pytest.fixture
def sc(tmp_path, gcs_bucket):
    return build_hours(tmp_path, sink_url=f"{gcs_bucket}/events")


def rel(h: str, name: str = "") -> str:
    d = hour_dir("click", hour(h))
    return f"{d}/{name}" if name else d


def test_status_of_every_kind_of_hour(sc):
    states = [s.state for s in hour_statuses(sc.sink, "click", "2026-11-21T12", "2026-11-21T17")]
    assert states == [HourState.NEVER, HourState.COMPLETE, HourState.COMPLETE, HourState.OPEN, HourState.NOT_STARTED]


def test_an_empty_bucket_is_no_data_not_not_started(gcs_bucket):
    """A mistyped sink on GCS: nothing at <sink>/<type>/ is its own answer (exit code 6), never "not yet"."""
    from event_etl.errors import NoDataError

    with pytest.raises(NoDataError) as err:
        hour_status(f"{gcs_bucket}/nothing", "click", "2026-11-21T13")
    assert err.value.exit_code == 6 and f"{gcs_bucket}/nothing/click" in err.value.message
    Storage(f"{gcs_bucket}/nothing").write_atomic("click/_LEASE", b"{}")  # a job started there: now "not started"
    assert hour_status(f"{gcs_bucket}/nothing", "click", "2026-11-21T13").state is HourState.NOT_STARTED


def test_read_a_complete_hour(sc):
    assert sorted(r["id"] for r in read_records(sc.sink, "click", "2026-11-21T14")) == ["c", "d"]
    assert read_table(sc.sink, sc.et, "2026-11-21T14", include_late=False).column("id").to_pylist() == ["c"]


def test_verify_catches_a_deleted_an_added_and_a_corrupted_file(sc):
    st = Storage(sc.sink)
    assert verify_hour(sc.sink, "click", "2026-11-21T13").ok
    first, second = sorted(n for n in st.list_files(rel("13")) if n.endswith(".avro"))
    kept = st.read(rel("13", first))
    st.delete(rel("13", first))
    data = bytearray(st.read(rel("13", second)))
    data[-5] ^= 0x01
    st.write_atomic(rel("13", second), bytes(data))
    added = "part-2026112113-b0000000077-s0000-0000.avro"
    st.write_atomic(rel("13", added), kept)
    r = verify_hour(sc.sink, "click", "2026-11-21T13")
    assert not r.ok
    assert r.missing == (first,) and r.extra == (added,)
    assert (second, "sha256") in {(p.name, p.what) for p in r.corrupted}


def test_a_waiter_started_before_the_marker_wakes_when_it_appears(sc):
    looked = threading.Event()
    outcome: dict = {}

    def waiter():
        try:
            outcome["manifest"] = wait_for_hour(
                sc.sink, "click", "2026-11-21T15", timeout=120, poll_interval=0.05,
                on_status=lambda s: looked.set() if s.state is HourState.OPEN else None)
        except BaseException as err:  # noqa: BLE001 - any outcome: the main thread reports it
            outcome["error"] = err

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    assert looked.wait(30), "the waiter saw the hour open before its marker existed"
    assert th.is_alive() and not Storage(sc.sink).exists(rel("15", MARKER_NAME))
    complete_hour_15(sc)
    th.join(30)
    assert not th.is_alive() and "error" not in outcome, outcome.get("error")
    assert outcome["manifest"].hour == hour("15")


def test_audit_is_recorded_next_to_the_marker(sc):
    marker = Storage(sc.sink).read(rel("13", MARKER_NAME))
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=3, now=dt.datetime(2026, 11, 21, 17, tzinfo=UTC))
    assert rec.result is AuditResult.MATCH and rec.recorded
    assert hour_status(sc.sink, "click", "2026-11-21T13").state is HourState.AUDITED
    assert Storage(sc.sink).read(rel("13", MARKER_NAME)) == marker


def _cli(sc, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"]}
    return subprocess.run([EXE, *args, "--sink", sc.sink, "--event-types", sc.types], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_the_commands_as_a_process(sc):
    """`event-etl wait` returns once the marker appears (exit 0), then `cat` prints the hour's records."""
    proc = subprocess.Popen([EXE, "wait", "click", "2026-11-21T15", "--timeout", "2m", "--poll-interval", "0.2s",
                             "--sink", sc.sink, "--event-types", sc.types],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        line = proc.stderr.readline()  # "waiting: ... open": it has looked at least once
        assert "waiting: click 2026-11-21T15:00:00Z open" in line, line
        assert proc.poll() is None
        complete_hour_15(sc)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "click 2026-11-21T15:00:00Z complete: records 1" in out
    res = _cli(sc, "cat", "click", "2026-11-21T15")
    assert res.returncode == 0 and '"id":"e"' in res.stdout
    assert _cli(sc, "wait", "click", "2026-11-21T16", "--timeout", "0").returncode == 3
    assert _cli(sc, "wait", "click", "2026-11-21T16:30").returncode == 2
    assert _cli(sc, "audit", "click", "2026-11-21T13", "--expected", "9").returncode == 5


@pytest.mark.slow
def test_could_not_check_when_the_storage_server_is_down(tmp_path, monkeypatch):
    """A stopped server is "could not check" (after the retries, ~1 s here), never "not started" or a timeout."""
    from tests.lib.servers import GcsEmulator

    server = GcsEmulator(tmp_path / "gcs").start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        monkeypatch.setenv("EVENT_ETL_STORAGE_RETRY_SECONDS", "1")  # all the retries: gcsfs tries each request once
        server.create_bucket("down")
        sink = "gs://down/events"
        from event_etl.errors import NoDataError

        with pytest.raises(NoDataError):  # up: nothing there, and it can tell
            hour_status(sink, "click", "2026-11-21T13")
        server.stop()
        with pytest.raises(CouldNotCheckError) as err:
            wait_for_hour(sink, "click", "2026-11-21T13", timeout=600, poll_interval=1)
        assert not isinstance(err.value, WaitTimeoutError) and err.value.exit_code == 4
        assert "Cannot connect" in err.value.message
    finally:
        server.stop()
