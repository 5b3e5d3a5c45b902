"""The ``pubsub`` commit policy and ``event-etl wait --subscription`` against Google's Pub/Sub emulator, on the real
controller and policy chain (local disk, no Spark): a message per complete hour, after its marker, again after a
SIGKILL between the marker and the publish."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from event_etl.eventtypes import load_event_type
from event_etl.job.setup import start_policies
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.sources.publisher import setup_pubsub
from event_etl.sources.pubsub import subscriber_client
from event_etl.timeutil import iso
from tests.lib.harness import CLICK_SCHEMA, FakeClock, LocalPipeline, click, t

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def topic(pubsub_server):
    """A fresh topic and a subscription of it: ``(topic, subscription)``."""
    name = uuid.uuid4().hex[:10]
    topic, sub = f"projects/test-project/topics/hours-{name}", f"projects/test-project/subscriptions/hours-{name}"
    setup_pubsub(topic, sub, ack_deadline=10)
    return topic, sub


def event_type(root: Path, topic: str):
    d = root / "click"
    d.mkdir(parents=True, exist_ok=True)
    (d / "schema.avsc").write_text(json.dumps(CLICK_SCHEMA))
    (d / "etl.toml").write_text(f'time_field = "ts"\nid_field = "id"\n[[commit_policy]]\nkind = "pubsub"\n'
                                f'topic = "{topic}"\ntimeout = "10s"\n')
    return load_event_type(d)


def pull_all(sub: str, want: int, timeout: float = 30) -> list:
    client, got = subscriber_client(), []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            resp = client.pull(subscription=sub, max_messages=100, timeout=10)
            if resp.received_messages:
                got.extend(resp.received_messages)
                client.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in resp.received_messages])
            else:
                time.sleep(0.1)
    finally:
        client.close()
    return got


def three_hours(p: LocalPipeline, clock: FakeClock) -> None:
    clock.now = t("13:10")
    p.batch([click("a", "10:05"), click("b", "11:30"), click("c", "12:59")])
    clock.now = t("13:20")
    p.batch([click("d", "13:15")])  # watermark 13:13: hours 10, 11 and 12 complete


def test_a_message_per_complete_hour_with_the_marker_as_its_body(tmp_path, topic):
    topic_path, sub = topic
    et = event_type(tmp_path / "types", topic_path)
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    chain = start_policies(p.controller)
    three_hours(p, clock)
    got = pull_all(sub, 3)
    assert chain.stop() == {}
    by_hour = {m.message.attributes["hour"]: m.message for m in got}
    assert sorted(by_hour) == [iso(t(h)) for h in ("10:00", "11:00", "12:00")] and len(got) == 3
    msg = by_hour[iso(t("11:00"))]
    marker = p.sink / hour_dir("click", t("11:00")) / MARKER_NAME
    assert msg.data == marker.read_bytes()
    assert dict(msg.attributes) == {"event_type": "click", "hour": iso(t("11:00")), "records": "1",
                                    "late_records": "0", "marker": p.storage.display(
                                        f"{hour_dir('click', t('11:00'))}/{MARKER_NAME}"),
                                    "sha256": hashlib.sha256(marker.read_bytes()).hexdigest()}


def test_wait_with_a_subscription_wakes_on_the_message(tmp_path, topic):
    from event_etl.consumer.wait import wait_for_hour

    topic_path, sub = topic
    et = event_type(tmp_path / "types", topic_path)
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    clock.now = t("13:10")
    p.batch([click("a", "10:05"), click("b", "11:30")])  # hour 10 complete, 11 open
    out: dict = {}

    def wait() -> None:
        started = time.monotonic()
        out["manifest"] = wait_for_hour(str(p.sink), "click", iso(t("11:00")), timeout=120, poll_interval=100,
                                        subscription=sub)
        out["seconds"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(2)  # the wait looked once (not complete) and now sleeps on the subscription (its poll is 100 s)
    chain = start_policies(p.controller)
    clock.now = t("13:20")
    p.batch([click("d", "13:15")])  # hour 11 complete: marker, then its message
    waiter.join(60)
    chain.stop()
    assert not waiter.is_alive() and out["manifest"].records == 1
    assert out["seconds"] < 30  # woken by the message, not by its 100-s look at the marker


def test_wait_with_a_subscription_still_trusts_the_marker_alone(tmp_path, topic):
    """No message ever comes (the job has no policy): the marker, looked at every poll_interval, ends the wait."""
    from event_etl.consumer.wait import wait_for_hour

    _, sub = topic
    d = tmp_path / "types" / "click"
    d.mkdir(parents=True)
    (d / "schema.avsc").write_text(json.dumps(CLICK_SCHEMA))
    (d / "etl.toml").write_text('time_field = "ts"\nid_field = "id"\n')
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, load_event_type(d), clock)
    three_hours(p, clock)
    m = wait_for_hour(str(p.sink), "click", iso(t("12:00")), timeout=10, poll_interval=0.5, subscription=sub)
    assert m.records == 1
    from click.testing import CliRunner

    from event_etl.cli import main

    res = CliRunner().invoke(main, ["wait", "click", "2026-11-21T12", "--sink", str(p.sink), "--timeout", "10s",
                                    "--subscription", sub, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["records"] == 1, res.output
    res = CliRunner().invoke(main, ["wait", "click", "2026-11-21T13", "--sink", str(p.sink), "--timeout", "1s",
                                    "--poll-interval", "0.2s", "--subscription", sub])
    assert res.exit_code == 3, res.output  # not complete: the same exit code as without a subscription
    res = CliRunner().invoke(main, ["wait", "click", "2026-11-21T12", "--sink", str(p.sink),
                                    "--subscription", "projects/test-project/subscriptions/missing-one"])
    assert res.exit_code != 0 and "does not exist" in res.output, res.output


KILLED_RUN = """
import sys
sys.path.insert(0, {root!r})
from event_etl.eventtypes import load_event_type
from event_etl.job.setup import start_policies
from tests.lib.harness import FakeClock, LocalPipeline, click, t
p = LocalPipeline({tmp!r}, load_event_type({types!r}), FakeClock(t("13:10")))
start_policies(p.controller)
p.batch([click("a", "10:05"), click("b", "11:30")])  # hour 10 complete: its marker, then the policy (paused)
import time
time.sleep(120)
"""


def test_a_kill_between_the_marker_and_the_publish_is_published_after_the_restart(tmp_path, topic):
    topic_path, sub = topic
    et = event_type(tmp_path / "types", topic_path)
    faults = tmp_path / "faults.log"
    env = {**os.environ, "EVENT_ETL_FAULT_LOG": str(faults), "EVENT_ETL_FAULT_PAUSE": "before_policy=60",
           "PYTHONPATH": str(ROOT)}
    script = KILLED_RUN.format(root=str(ROOT), tmp=str(tmp_path), types=et.directory)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not (faults.exists() and "before_policy" in faults.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the job never reached before_policy"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the marker is durable, the message not sent
    finally:
        proc.kill()
        proc.wait()
    marker = tmp_path / "sink" / hour_dir("click", t("10:00")) / MARKER_NAME
    assert marker.exists()
    assert pull_all(sub, 1, timeout=3) == []  # nothing published before the kill
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:30")))  # the restart: a new controller on the checkpoint
    chain = start_policies(p.controller)
    got = pull_all(sub, 1)
    assert chain.stop() == {}
    assert [m.message.attributes["hour"] for m in got] == [iso(t("10:00"))]
    assert got[0].message.data == marker.read_bytes()
