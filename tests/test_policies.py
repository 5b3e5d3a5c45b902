"""Commit policies (event_etl.job.policies): their settings, and the chain run by the real controller on local disk."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from event_etl.errors import ConfigError
from event_etl.eventtypes import load_event_type
from event_etl.job.policies import CompleteHour, PolicyChain
from event_etl.job.status import job_status
from event_etl.metrics.exporters import PrometheusEndpoint
from event_etl.metrics.job import JobMetrics
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.timeutil import iso
from tests.lib.harness import CLICK_SCHEMA, FakeClock, LocalPipeline, click, t
from tests.lib.metrics import samples, value
from tests.lib.waiting import wait_until

PUBSUB = '[[commit_policy]]\nkind = "pubsub"\ntopic = "projects/p1/topics/hours"\n'


def write_type(root: Path, extra: str, name: str = "click") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "schema.avsc").write_text(json.dumps(CLICK_SCHEMA))
    (d / "etl.toml").write_text('time_field = "ts"\nid_field = "id"\n' + extra)
    return d


# -- settings ------------------------------------------------------------------------------------
def test_policies_are_read_in_order_with_their_defaults(tmp_path):
    et = load_event_type(write_type(tmp_path, PUBSUB + '[[commit_policy]]\nkind = "openlineage"\n'
                                    '[[commit_policy]]\nkind = "pubsub"\nname = "audit_topic"\n'
                                    'topic = "projects/p1/topics/audit"\ntimeout = "5s"\n'))
    assert et.commit_policies == (
        {"kind": "pubsub", "name": "pubsub", "topic": "projects/p1/topics/hours", "timeout": 30_000},
        {"kind": "openlineage", "name": "openlineage", "namespace": "event_etl", "job_name": ""},
        {"kind": "pubsub", "name": "audit_topic", "topic": "projects/p1/topics/audit", "timeout": 5_000},
    )
    assert load_event_type(write_type(tmp_path, "", "plain")).commit_policies == ()


@pytest.mark.parametrize("toml, field, fix", [
    ('[[commit_policy]]\nkind = "pubsbu"\n', "commit_policy[0].kind", "did you mean 'pubsub'?"),
    ('[[commit_policy]]\ntopic = "projects/p1/topics/hours"\n', "commit_policy[0].kind", "pubsub, openlineage"),
    ('[[commit_policy]]\nkind = "pubsub"\n', "commit_policy[0].topic", 'add topic = "..."'),
    ('[[commit_policy]]\nkind = "pubsub"\ntopic = "hours"\n', "commit_policy[0].topic", "projects/<project>/topics"),
    (PUBSUB + 'topc = "x"\n', "commit_policy[0].topc", "did you mean 'topic'?"),
    (PUBSUB + PUBSUB, "commit_policy[1].name", 'name = "pubsub_2"'),
    (PUBSUB + 'timeout = "soon"\n', "commit_policy[0].timeout", 'timeout = "30s"'),
    ('commit_policy = "pubsub"\n', "commit_policy", "[[commit_policy]]"),
    (PUBSUB + 'name = "Hours Topic"\n', "commit_policy[0].name", "lower-case"),
])
def test_a_wrong_policy_fails_with_the_field_and_the_fix(tmp_path, toml, field, fix):
    with pytest.raises(ConfigError) as err:
        load_event_type(write_type(tmp_path, toml))
    assert err.value.field == field and fix in err.value.fix, (err.value.field, err.value.fix)


# -- the chain, on the real controller ----------------------------------------------------------
class Recording:
    """A policy that records each hour, checking that its marker and the state recording it are durable."""

    kind = "test"

    def __init__(self, name: str, p: LocalPipeline, fail: int = 0, gate: threading.Event | None = None) -> None:
        self.name, self.p, self.fail, self.gate = name, p, fail, gate
        self.done: list[int] = []
        self.attempts = 0

    def run(self, hour: CompleteHour) -> None:
        self.attempts += 1
        if self.gate is not None:
            self.gate.wait()
        marker = self.p.sink / hour_dir("click", hour.hour) / MARKER_NAME
        assert marker.read_bytes() == hour.marker  # never before its marker: it is there, with these bytes
        assert self.p.ckpt.load_state().marked_through >= hour.hour  # and the state that records it is saved
        if self.fail:
            self.fail -= 1
            raise ConnectionError("topic unreachable")
        self.done.append(hour.hour)

    def close(self) -> None:
        pass


def chain(p: LocalPipeline, policies, **kw) -> PolicyChain:
    c = p.controller
    ch = PolicyChain(policies, c.ctx, marked=lambda: (p.controller.state.first_hour, p.controller.state.marked_through),
                     **kw)
    c.listeners.append(ch.on_event)
    return ch


def three_hours(p: LocalPipeline, clock: FakeClock) -> None:
    clock.now = t("13:10")
    p.batch([click("a", "10:05"), click("b", "11:30"), click("c", "12:59")])
    clock.now = t("13:20")
    p.batch([click("d", "13:15")])  # watermark 13:13: hours 10, 11 and 12 complete


def test_every_policy_runs_once_per_complete_hour_in_order_after_its_marker(tmp_path):
    et = load_event_type(write_type(tmp_path / "types", ""))
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    first, second = Recording("first", p), Recording("second", p)
    order: list[tuple[str, int]] = []
    ch = chain(p, [first, second], listeners=[lambda k, v: order.append(v) if k == "policy_done" else None]).start()
    three_hours(p, clock)
    wait_until(ch.idle, what="the chain idle")
    assert ch.stop(1.0) == {}
    hours = [t("10:00"), t("11:00"), t("12:00")]
    assert first.done == second.done == hours
    assert order == [(n, h) for h in hours for n in ("first", "second")]  # a chain: each hour, the policies in turn
    rec = json.loads((p.ckpt.etl / "policies" / "second.json").read_text())
    assert rec["done_through"] == t("12:00") and rec["format"] == 1 and rec["failures"] == 0


def test_failures_are_retried_counted_and_shown_and_never_change_an_hour(tmp_path):
    et = load_event_type(write_type(tmp_path / "types", ""))
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    prom = PrometheusEndpoint()
    metrics = JobMetrics("click", clock=clock, controller_state=lambda: p.controller.state, exports=[prom],
                         policies=["flaky"])
    p.controller.listeners.extend(metrics.listeners)
    flaky = Recording("flaky", p, fail=3)
    ch = chain(p, [flaky], listeners=metrics.listeners, backoff_first=0.01, backoff_cap=0.05)
    metrics.policy_pending = ch.pending
    s = samples(prom.text())
    assert value(s, "event_etl_policy_failures_total", event_type="click", policy="flaky") == 0
    three_hours(p, clock)
    markers = {h: (p.sink / hour_dir("click", h) / MARKER_NAME).read_bytes() for h in (t("10:00"), t("11:00"))}
    status = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=clock())["policies"]["flaky"]
    assert status["pending"] == 3 and status["done_through"] is None  # not started yet: every marked hour waits
    assert value(samples(prom.text()), "event_etl_policy_backlog_markers", event_type="click", policy="flaky") == 3
    ch.start()
    wait_until(ch.idle, what="the chain idle")
    ch.stop(1.0)
    s = samples(prom.text())
    assert value(s, "event_etl_policy_failures_total", event_type="click", policy="flaky") == 3
    assert value(s, "event_etl_policy_runs_total", event_type="click", policy="flaky") == 3
    assert value(s, "event_etl_policy_backlog_markers", event_type="click", policy="flaky") == 0
    assert flaky.done == [t("10:00"), t("11:00"), t("12:00")] and flaky.attempts == 6
    status = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=clock())["policies"]["flaky"]
    assert status == {"kind": "test", "done_through": iso(t("12:00")), "pending": 0, "failures": 3,
                      "last_error": f"{iso(t('10:00'))}: ConnectionError: topic unreachable",
                      "last_error_at": iso(clock())}
    for h, data in markers.items():  # the hours are as they were
        assert (p.sink / hour_dir("click", h) / MARKER_NAME).read_bytes() == data
    metrics.shutdown()
    from click.testing import CliRunner

    from event_etl.cli import main

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "click").symlink_to(p.ckpt.root)
    res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                                    "--checkpoint-root", str(tmp_path / "root")])
    assert res.exit_code == 0, res.output
    assert (f"  policy flaky (test): done through {iso(t('12:00'))}, 0 pending, 3 failures; last error at "
            f"{iso(clock())}: {iso(t('10:00'))}: ConnectionError: topic unreachable") in res.output.splitlines()


def test_a_restart_resumes_from_the_record_and_a_stop_is_bounded(tmp_path):
    et = load_event_type(write_type(tmp_path / "types", ""))
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    gate = threading.Event()
    stuck = Recording("notify", p, gate=gate)
    ch = chain(p, [stuck]).start()
    three_hours(p, clock)
    wait_until(lambda: stuck.attempts == 1, what="one attempt")
    started = time.monotonic()
    assert ch.stop(0.2) == {"notify": 3}  # a stop waits a bounded time, then leaves the hours to the next start
    assert time.monotonic() - started < 3
    gate.set()  # the hung call returns, after the stop: the thread saves its record and ends
    ch._thread.join(5)
    p.restart()
    again = Recording("notify", p)
    ch = chain(p, [again]).start()
    wait_until(ch.idle, what="the chain idle")
    ch.stop(1.0)
    assert sorted(set(stuck.done + again.done)) == [t("10:00"), t("11:00"), t("12:00")]  # each at least once


def test_a_policy_added_to_a_running_job_starts_after_the_hours_marked_before(tmp_path):
    et = load_event_type(write_type(tmp_path / "types", ""))
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    three_hours(p, clock)
    late = Recording("late", p)
    ch = chain(p, [late]).start()
    clock.now = t("14:20")
    p.batch([click("e", "14:15")])  # hour 13 complete
    wait_until(ch.idle, what="the chain idle")
    ch.stop(1.0)
    assert late.done == [t("13:00")]
    assert ch.pending() == {"late": 0} and p.controller.state.marked_through == t("13:00")


# -- openlineage, through openlineage-python's own transports -------------------------------------
OPENLINEAGE = '[[commit_policy]]\nkind = "openlineage"\nnamespace = "etl-test"\n'


def lineage_run(tmp_path: Path) -> tuple[LocalPipeline, list[int]]:
    from event_etl.job.setup import start_policies

    et = load_event_type(write_type(tmp_path / "types", OPENLINEAGE))
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    ch = start_policies(p.controller)
    three_hours(p, clock)
    wait_until(ch.idle, what="the chain idle")
    assert ch.stop(5.0) == {}
    return p, [t("10:00"), t("11:00"), t("12:00")]


def check_events(p: LocalPipeline, events: list[dict], hours: list[int]) -> None:
    assert [e["eventType"] for e in events] == ["COMPLETE"] * len(hours)
    assert [e["job"] for e in events] == [{"namespace": "etl-test", "name": "event_etl.click", "facets": {}}] * 3
    for e, h in zip(events, hours):
        (out,) = e["outputs"]
        assert out["namespace"] == "file" and out["name"] == str(p.sink / hour_dir("click", h))
        assert [f["name"] for f in out["facets"]["schema"]["fields"]] == ["id", "ts", "page"]
        assert out["outputFacets"]["outputStatistics"]["rowCount"] == 1
        assert e["eventTime"] == json.loads((p.sink / hour_dir("click", h) / MARKER_NAME).read_bytes())[
            "completed_at"]
    assert len({e["run"]["runId"] for e in events}) == 3


def test_openlineage_events_through_its_file_transport(tmp_path, monkeypatch):
    log = tmp_path / "lineage.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {log}\n  append: true\n")
    monkeypatch.delenv("OPENLINEAGE_URL", raising=False)
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    p, hours = lineage_run(tmp_path)
    check_events(p, [json.loads(line) for line in log.read_text().splitlines()], hours)


def test_openlineage_events_over_http_with_a_retry_after_a_refusal(tmp_path, monkeypatch):
    """A small HTTP receiver (OPENLINEAGE_URL) that refuses the first event: retried, then every hour once."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from event_etl.job import policies

    got: list[dict] = []
    refused: list[int] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not refused:
                refused.append(1)
                self.send_response(400)  # not one the transport retries itself (it does 5xx): the chain does
            else:
                got.append(body)
                self.send_response(201)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("OPENLINEAGE_CONFIG", raising=False)
    monkeypatch.setenv("OPENLINEAGE_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(policies, "BACKOFF_FIRST_S", 0.05)
    try:
        p, hours = lineage_run(tmp_path)
    finally:
        server.shutdown()
    check_events(p, got, hours)
    rec = json.loads((p.ckpt.etl / "policies" / "openlineage.json").read_text())
    assert rec["failures"] == 1 and "400" in rec["last_error"] and rec["done_through"] == t("12:00")


def test_openlineage_without_a_transport_refuses_to_start(tmp_path, monkeypatch):
    from event_etl.job.setup import start_policies

    for var in ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    et = load_event_type(write_type(tmp_path / "types", OPENLINEAGE))
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:10")))
    with pytest.raises(ConfigError) as err:
        start_policies(p.controller)
    assert "OPENLINEAGE_URL" in err.value.fix
