"""The production path against real servers: Pub/Sub emulator -> event_etl -> GCS emulator.

Every test publishes a known set of events, runs the job as users do (a separate
`event-etl` process with PUBSUB_EMULATOR_HOST and STORAGE_EMULATOR_HOST set), and checks
every bucket, marker and dead-letter record against the set by event id.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from event_etl.timeutil import HOUR_MS, now_millis
from tests.lib.pubsub_scenario import EXE, PROJECT, Scenario, env
from tests.lib.waiting import wait_until


def _hour(t: int) -> int:
    return t - t % HOUR_MS


def test_known_event_set_through_pubsub_to_gcs(scenario):
    s = scenario
    # one pull stream: the emulator's delivery order, so that hours published in order stay timely
    # however the spool is cut into batches (several streams reorder by up to a segment's age)
    s.env["EVENT_ETL_PUBSUB_STREAMS"] = "1"
    now = now_millis()
    h0 = _hour(now) - 5 * HOUR_MS
    rng = random.Random(5)
    phase1 = []
    for k in range(4):  # hours h0..h0+3, published about in event-time order, mildly out of order
        base = h0 + k * HOUR_MS
        evs = sorted((s.event(base + rng.randint(0, HOUR_MS - 1), "timely") for _ in range(60)), key=lambda e: e["t"])
        for i in range(0, len(evs) - 1, 2):  # neighbours swapped: disorder well within out_of_orderness
            if evs[i + 1]["t"] - evs[i]["t"] < 60_000:
                evs[i], evs[i + 1] = evs[i + 1], evs[i]
        phase1 += evs
    # The fetcher pulls in parallel streams and a batch takes what has accumulated: these hours may
    # span several batches, so the events of each hour must not be further apart in publish order
    # than out_of_orderness allows.
    last = max(e["t"] for e in phase1)
    recent = [s.event(last - rng.randint(0, 90_000), "timely") for _ in range(12)]
    phase1 += recent
    phase1.append(s.event(last + 1000, "timely"))
    # producer retries, same bytes again, of events inside the dedupe window (10 minutes of event time)
    retries = [dict(e, kind="duplicate") for e in rng.sample(recent, 8)]
    invalid = [{"id": None, "t": None, "kind": "invalid", "payload": p} for p in
               (b"{broken", b"[1,2]", b"", b'{"event_id": "x"}', b"\xff\xfe")]
    too_late = [s.event(h0 - 3 * 24 * HOUR_MS, "too_late") for _ in range(3)]
    s.publish(phase1 + retries + invalid + too_late)
    r = s.run("--once")
    assert r.returncode == 0, r.stdout + r.stderr
    # phase 2: events for hours now complete (late), more retries, too late, then the end of input
    wm = max(e["t"] for e in phase1) - s.et.out_of_orderness
    late = [s.event(h0 + HOUR_MS + rng.randint(0, HOUR_MS - 1), "late") for _ in range(7)]
    assert all(_hour(e["t"]) + HOUR_MS <= wm for e in late)
    more = [s.event(last + 2000 + i, "timely") for i in range(20)]
    retries2 = [dict(e, kind="duplicate") for e in more[:3] + recent[:3]]
    s.publish(late + more + retries2 + [s.event(h0 - 2 * 24 * HOUR_MS, "too_late")])
    r = s.run("--once", "--drain")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run finished" in r.stdout

    content = s.sink_content()
    s.check_manifests(content)
    placed = Counter((h, i, False) for h, e in content.items() for i in e["timely"])
    placed.update((h, i, True) for h, e in content.items() for i in e["late"])
    ids = Counter(i for _, i, _ in placed)
    assert max(ids.values()) == 1, "nothing written twice (producer retries removed)"
    valid = {e["id"]: e for e in s.sent if e["kind"] in ("timely", "late")}
    assert set(ids) == set(valid), "every valid event that was not too late is in a bucket"
    open_hour_of_phase2 = _hour(wm)
    for h, i, is_late in placed:
        e = valid[i]
        if e["kind"] == "late":
            assert is_late and h == open_hour_of_phase2, "a late event goes to the hour open when it arrived"
        else:
            assert not is_late and h == _hour(e["t"]), "a timely event goes to its own hour"
    assert all(e["marker"] is not None for e in content.values()), "drained: every hour holding data is complete"
    hours = sorted(content)
    assert hours == list(range(hours[0], hours[-1] + HOUR_MS, HOUR_MS))
    dl = Counter(d["reason"] for d in s.deadletters())
    assert dl["too_late"] == 4
    assert sum(n for r, n in dl.items() if r != "too_late") == len(invalid)
    assert {"invalid_json", "not_an_object", "empty_payload", "missing_time", "invalid_utf8"} <= set(dl)


def _committed(s: Scenario) -> int:
    d = Path(s.checkpoint) / "spark" / "commits"
    return len([p for p in d.glob("[0-9]*")]) if d.is_dir() else 0


def _written_ids(s: Scenario) -> set[str]:
    return {i for e in s.sink_content().values() for i in e["timely"] + e["late"]}


# SIGKILLs mid-stream against the emulators: integration/test_campaign.py::test_campaign_pubsub_to_gcs
# (ten of them, at chosen fault points and at random) replaces the three kills that were here.


def test_waves_published_while_the_job_is_killed_end_exactly_once_each_in_its_own_hour(scenario):
    """Issue 37's scenario: 3 hours of 300 events published in waves while the live job is SIGKILLed 3 times
    with messages leased (pulled, not yet in the spool), then `--once --drain`.  Before, messages still leased to a
    killed process were taken for absent by `--once` and delivered later, and an hour was marked before half of
    its events were read.  Now a restart settles for the killed run's leases: every event is written exactly
    once, in its own hour (none late), and no hour is marked before all of its events were read."""
    s = scenario  # subscription ack deadline 10 s: a restart settles for ~12 s
    s.env["EVENT_ETL_FAULT_LOG"] = str(s.tmp / "faults.log")
    s.env["EVENT_ETL_FAULT_PAUSE"] = "pulled=0.3"  # a pull's messages stay leased a moment before they are spooled
    h0 = _hour(now_millis()) - 4 * HOUR_MS
    waves = []
    for k in range(3):  # hour h0+k in two waves, each in event-time order
        evs = sorted((s.event(h0 + k * HOUR_MS + i * 12_000, "timely") for i in range(300)), key=lambda e: e["t"])
        waves += [evs[:150], evs[150:]]
    waves.append([s.event(h0 + 3 * HOUR_MS + 5 * 60_000, "timely")])  # moves the watermark past hour h0+2

    def pulls() -> int:
        log = s.tmp / "faults.log"
        return log.read_text().count("pulled ") if log.exists() else 0

    for kill in range(3):
        proc = subprocess.Popen(s.command(), env=s.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            for wave in waves[2 * kill:2 * kill + 2]:
                s.publish(wave)
            seen = pulls()
            wait_until(lambda seen=seen: pulls() > seen, 120, "a pull after the waves")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # inside the pause: that pull's messages are leased to a dead job
            proc.wait()
    s.publish(waves[6])
    r = s.run("--once", "--drain", timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    content = s.sink_content()
    s.check_manifests(content)
    placed = Counter(i for e in content.values() for i in e["timely"] + e["late"])
    sent = {e["id"]: e for e in s.sent}
    assert set(placed) == set(sent) and max(placed.values()) == 1, "every event exactly once"
    for h, e in content.items():
        assert not e["late"], f"hour {h}: no event was late (no hour closed before its events came back)"
        assert all(_hour(sent[i]["t"]) == h for i in e["timely"])
        assert e["marker"] is not None and e["marker"].records == sum(1 for x in sent.values() if _hour(x["t"]) == h)


@pytest.fixture
def own_pubsub(tmp_path, monkeypatch):
    """An emulator of the test's own, for a test that stops it (the session's serves the worker's other tests: its
    port, free while it was stopped, could be taken by another server meanwhile)."""
    from tests.lib.servers import PubSubEmulator

    server = PubSubEmulator(tmp_path / "pubsub").start(timeout=90)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.host)
    yield server
    server.stop()


def test_pubsub_outage_exits_clearly_and_a_restart_resumes(tmp_path, own_pubsub, gcs_server, gcs_bucket):
    pubsub_server = own_pubsub
    s = Scenario(tmp_path, pubsub_server, gcs_server, gcs_bucket)
    now = now_millis() - 60_000
    first = [s.event(now + i, "timely") for i in range(300)]
    s.publish(first)
    proc = subprocess.Popen(s.command(), env={**s.env, "EVENT_ETL_PUBSUB_OUTAGE_SECONDS": "20"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # every event of the first wave written and its batch committed (the first batch may hold only part)
        wait_until(lambda: _written_ids(s) >= {e["id"] for e in first} and _committed(s) >= 1, 120,
              "the first wave written and committed")
        time.sleep(2)
        pubsub_server.stop()
        time.sleep(15)
        pubsub_server.start(timeout=90)  # the emulator keeps nothing: topic and subscription are gone
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "error:" in out and s.subscription in out and "fix:" in out, out[-2000:]
    # what was committed before the outage is in the sink, once
    content = s.sink_content()
    ids = Counter(i for e in content.values() for i in e["timely"] + e["late"])
    assert set(ids) == {e["id"] for e in first} and max(ids.values()) == 1
    # the operator recreates the subscription; new messages flow; a restart resumes
    s.setup()
    second = [s.event(now_millis() - 30_000 + i, "timely") for i in range(200)]
    s.publish(second)
    r = s.run("--once", "--drain")
    assert r.returncode == 0, r.stdout + r.stderr
    content = s.sink_content()
    s.check_manifests(content)
    ids = Counter(i for e in content.values() for i in e["timely"] + e["late"])
    missing = {e["id"] for e in first + second} - set(ids)
    assert not missing, f"{len(missing)} events missing; last run said:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert set(ids) == {e["id"] for e in first + second} and max(ids.values()) == 1


def test_a_missing_subscription_stops_at_once_naming_it_and_the_fix(tmp_path, pubsub_server, gcs_server, gcs_bucket):
    r = subprocess.run([EXE, "run", "page_view", "--source", f"pubsub:projects/{PROJECT}/subscriptions/no-such-sub",
                        "--sink", f"{gcs_bucket}/out", "--checkpoint", str(tmp_path / "ck")],
                       env=env(pubsub_server, gcs_server), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"projects/{PROJECT}/subscriptions/no-such-sub" in r.stderr and "event-etl setup" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_missing_bucket_stops_at_once_with_the_fix(tmp_path, pubsub_server, gcs_server):
    r = subprocess.run([EXE, "run", "page_view", "--source", "generate:count=10", "--sink", "gs://no-such-bucket-x/out",
                        "--checkpoint", str(tmp_path / "ck")],
                       env=env(pubsub_server, gcs_server), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "gs://no-such-bucket-x/out cannot be written" in r.stderr and "fix:" in r.stderr
