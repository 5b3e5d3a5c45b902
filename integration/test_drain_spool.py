"""A drain never marks an hour while acknowledged messages wait in the spool (issue 47, item 6).

With ``EVENT_ETL_PUBSUB_ACK=spooled`` a message is acknowledged once it is in the checkpoint's spool; from then
until its batch commits the spool is its only copy.  A drain (SIGTERM to a job run with ``--drain-on-stop``) moves
the watermark past the last hour
holding data and marks it: if messages of that hour still sat in an open segment, or in a closed one no batch had
read yet, they would come back as ``late-`` records of the next run.  The job runs as users run it, against the
Pub/Sub emulator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from event_etl.timeutil import HOUR_MS, now_millis
from tests.lib.pubsub_scenario import Scenario


def test_a_drain_on_stop_sigterm_reads_what_the_spool_holds_before_it_marks_the_hour(tmp_path, pubsub_server,
                                                                                     gcs_server, gcs_bucket):
    s = Scenario(tmp_path, pubsub_server, gcs_server, gcs_bucket)
    s.sink = str(tmp_path / "sink")
    now = now_millis()
    h = now - now % HOUR_MS - 3 * HOUR_MS
    minute = 60_000
    first = [s.event(h + k * minute // 2, "timely") for k in range(50)]  # h:00 to h:24, one full segment
    s.publish(first)
    env = {**s.env, "EVENT_ETL_PUBSUB_SEGMENT_MESSAGES": "50",  # the first 50 make a segment a batch reads
           "EVENT_ETL_PUBSUB_SEGMENT_AGE": "600"}  # the next ones stay in an open segment until the stop
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(s.command("--drain-on-stop"), env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while {e["id"] for e in first} - _placed(s):
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first segment never read\n" + (tmp_path / "run.log").read_text()
            time.sleep(0.3)
        second = [s.event(h + 30 * minute + k * minute // 2, "timely") for k in range(30)]  # h:30 to h:44
        s.publish(second)
        segdir = Path(s.checkpoint) / "etl" / "source" / "pubsub" / "segments"
        while not _acknowledged_in_open_segment(segdir, 30):  # pulled, durable, acknowledged: only in the spool
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the second wave never spooled\n" + (tmp_path / "run.log").read_text()
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)  # as Kubernetes does: stop, and (--drain-on-stop) drain
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "run.log").read_text()
    assert code == 0, out[-3000:]
    content = s.sink_content()
    assert content[h]["marker"] is not None, out[-3000:]
    assert sorted(content[h]["timely"]) == sorted(e["id"] for e in first + second), \
        "every acknowledged message of the hour is in it, read before the drain marked it"
    assert content[h]["marker"].records == 80
    assert not [i for e in content.values() for i in e["late"]], "none left for the next run to bring late"
    assert not list(segdir.glob("*.open")), "no open segment left"
    assert not list(segdir.glob("*.seg")), "the spool is empty"


def _placed(s: Scenario) -> set[str]:
    return {i for e in s.sink_content().values() for i in e["timely"] + e["late"]}


def _acknowledged_in_open_segment(segdir: Path, n: int) -> bool:
    """Whether the open segments hold ``n`` messages, the last frame durable (acknowledged soon after)."""
    from event_etl.sources.spool.segment import _scan

    total = 0
    for p in segdir.glob("*.open"):
        total += _scan(p.read_bytes()).count
    return total >= n


def test_a_drain_after_a_kill_waits_for_the_killed_runs_leases_before_it_marks(tmp_path, pubsub_server, gcs_server,
                                                                             gcs_bucket):
    """A run killed between its pull and the spool leaves those messages leased (20 s here: longer than the next
    run's Spark start on a loaded machine); the next run (--drain-on-stop) is stopped with SIGTERM at once: its drain
    waits until they
    can have come back, reads them, then marks."""
    s = Scenario(tmp_path, pubsub_server, gcs_server, gcs_bucket, ack_deadline=20)
    s.sink = str(tmp_path / "sink")
    now = now_millis()
    h = now - now % HOUR_MS - 3 * HOUR_MS
    events = [s.event(h + k * 60_000, "timely") for k in range(20)]
    s.publish(events)
    faults = tmp_path / "faults.log"
    env = {**s.env, "EVENT_ETL_FAULT_LOG": str(faults), "EVENT_ETL_FAULT_PAUSE": "pulled=60"}
    # the messages stay leased for the subscription's 20 s
    proc = subprocess.Popen(s.command(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (faults.exists() and "pulled " in faults.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the first run never pulled"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # pulled, not spooled: the messages stay leased
        proc.wait(timeout=30)
    log = open(tmp_path / "run2.log", "w")
    proc = subprocess.Popen(s.command("--drain-on-stop"), env=s.env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "settl" not in (tmp_path / "run2.log").read_text() and "until then no hour" not in \
                (tmp_path / "run2.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run2.log").read_text()[-3000:]
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGTERM)  # while it settles
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "run2.log").read_text()
    assert code == 0, out[-3000:]
    assert "before the drain marks hours: waiting" in out, out[-3000:]
    content = s.sink_content()
    assert sorted(content[h]["timely"]) == sorted(e["id"] for e in events), out[-3000:]
    assert content[h]["marker"] is not None and content[h]["marker"].records == 20
