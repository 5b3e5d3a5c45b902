"""Event-time transcripts (tests/transcripts/*.yaml) run through the real executor and controller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from event_etl.rules.buckets import MARKER_NAME
from tests.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    hour,
    make_event_type,
    read_deadletter,
    read_sink,
    t,
)

TRANSCRIPTS = sorted(Path(__file__).parent.joinpath("transcripts").glob("*.yaml"))
CASES = [(p.stem, case) for p in TRANSCRIPTS for case in yaml.safe_load(p.read_text())]


def _payload(ev: dict) -> bytes:
    if "raw" in ev:
        return ev["raw"].encode()
    return json.dumps({"id": ev["id"], "ts": t(ev["t"])}).encode()


def _check(p: LocalPipeline, expect: dict, where: str) -> None:
    if "watermark" in expect:
        want = None if expect["watermark"] is None else t(expect["watermark"])
        assert p.controller.state.watermark == want, f"{where}: watermark"
    content = read_sink(p.sink, p.et.name)
    if "hours" in expect:
        for h, kinds in expect["hours"].items():
            hc = content.get(hour(h))
            assert hc is not None, f"{where}: hour {h} has no folder"
            assert sorted(hc.timely) == sorted(kinds.get("timely", [])), f"{where}: timely ids of hour {h}"
            assert sorted(hc.late) == sorted(kinds.get("late", [])), f"{where}: late ids of hour {h}"
    if "complete" in expect:
        marked = sorted(h for h, hc in content.items() if hc.marker is not None)
        assert marked == sorted(hour(h) for h in expect["complete"]), f"{where}: hours with {MARKER_NAME}"
        for h in marked:
            check_manifest_matches_folder(p.sink, p.et.name, h)
    for key, attr in (("records", "records"), ("late_records", "late_records")):
        for h, n in expect.get(key, {}).items():
            m = content[hour(h)].marker
            assert m is not None, f"{where}: hour {h} has no marker"
            assert getattr(m, attr) == n, f"{where}: {attr} of hour {h}"
    if "deadletter" in expect:
        dl = read_deadletter(p.sink, p.et.name)
        for reason, want in expect["deadletter"].items():
            got = [r for r in dl if r["reason"] == reason]
            if isinstance(want, int):
                assert len(got) == want, f"{where}: dead-letter count of {reason}"
            else:
                ids = sorted(json.loads(r["payload"])["id"] for r in got)
                assert ids == sorted(want), f"{where}: dead-letter ids with reason {reason}"
            for r in got:
                assert r["payload"], "the original bytes are kept"


LOCAL_CASES = [(f, c) for f, c in CASES if "local" in c.get("runs_on", ("local", "spark"))]


def test_every_case_runs_somewhere():
    for f, c in CASES:
        assert set(c.get("runs_on", ("local", "spark"))) & {"local", "spark"}, f"{f}: {c['name']} runs nowhere"


@pytest.mark.parametrize("case", [c for _, c in LOCAL_CASES], ids=[f"{f}:{c['name']}" for f, c in LOCAL_CASES])
def test_transcript(case, tmp_path):
    settings = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}
    settings.update(case.get("settings", {}))
    et = make_event_type(tmp_path / "types", **settings)
    clock = FakeClock(t("00:00"))
    p = LocalPipeline(tmp_path, et, clock)
    batches: dict[int, list[bytes]] = {}
    for i, step in enumerate(case["steps"]):
        where = f"step {i + 1}"
        if "batch" in step:
            clock.now = t(step["at"])
            lines = [_payload(ev) for ev in step["batch"]]
            ev = p.batch(lines, shards=2 if len(lines) > 2 else 1)
            batches[ev.batch_id] = lines
        elif "idle" in step:
            clock.now = t(step["idle"])
            p.controller.tick()
        elif "drain" in step:
            p.controller.drain()
        elif "restart" in step:
            p.restart()
        elif "replay" in step:
            n = int(step["replay"])
            p.batch(batches[n], batch_id=n, shards=2 if len(batches[n]) > 2 else 1)
        else:
            raise AssertionError(f"unknown step {step}")
        _check(p, step.get("expect", {}), where)
