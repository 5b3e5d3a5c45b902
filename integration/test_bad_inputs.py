"""The bad-input matrix through the real job: each bad input lands in the dead-letter area with its
own reason and its original bytes; the job keeps running; the good events around it are unaffected."""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest

from event_etl.eventtypes import load_event_type
from event_etl.job.driver import run_job
from event_etl.job.setup import RunOptions
from event_etl.storage import Storage
from event_etl.storage.deadletter import iter_deadletters
from event_etl.timeutil import HOUR_MS
from integration.campaigns.campaign import INVALID_KINDS, invalid_payload
from tests.lib.harness import FakeClock, read_sink, t

ROOT = Path(__file__).resolve().parent.parent


def matrix(et, arrival: int, rng: random.Random, *, first: bool) -> list[tuple[str, bytes, str | None]]:
    """(kind, payload, expected reason or None for a good event): good events around every bad one.  ``first``: the
    job's first batch, without a watermark: an event 400 days old is more than max_backfill before its arrival."""

    def rec(eid, ts):
        return {"event_id": eid, "event_time": ts, "anonymous_id": "a", "session_id": "s", "product_id": "p",
                "page_url": "u", "device_type": "MOBILE"}

    def good():
        eid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return ("good", json.dumps(rec(eid, arrival - rng.randint(0, 60_000))).encode(), None)

    bad = [(k, invalid_payload(k, rec, et.parsed_schema(), et, arrival, rng), r) for k, r in INVALID_KINDS.items()]
    bad.append(("far_future", json.dumps(rec(str(uuid.uuid4()), arrival + 400 * 24 * HOUR_MS)).encode(), "future"))
    bad.append(("far_past", json.dumps(rec(str(uuid.uuid4()), arrival - 400 * 24 * HOUR_MS)).encode(),
                "before_backfill" if first else "too_late"))
    out = []
    for b in bad:
        out += [good(), b, good()]
    return out


@pytest.mark.parametrize("batches", [1, 3])
def test_every_bad_input_gets_its_reason_and_keeps_its_bytes(spark, tmp_path, batches):
    et = load_event_type(ROOT / "event_types" / "page_view")
    rng = random.Random(batches)
    src = tmp_path / "in"
    src.mkdir()
    arrival = t("13:30")
    sent = []
    for k in range(batches):
        rows = matrix(et, arrival + k * 60_000, rng, first=k == 0)
        sent += rows
        f = src / f"{k:03d}.jsonl"
        f.write_bytes(b"\n".join(p for _, p, _ in rows) + b"\n")
        os.utime(f, ((arrival + k * 60_000) / 1000,) * 2)
    summary = run_job(et, RunOptions(source=f"dir:{src}", sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck"),
                                     once=True, quiet=True, max_files_per_batch=1), spark=spark,
                      clock=FakeClock(t("14:00")), install_signals=False)
    assert summary["batches"] == batches, "the job kept running through every bad input"
    dl = list(iter_deadletters(Storage(str(tmp_path / "sink")), "page_view"))
    expected = Counter((reason, payload) for _, payload, reason in sent if reason)
    got = Counter((d.reason, d.payload) for d in dl)
    assert got == expected, "each bad input once, with its specific reason and its original bytes"
    assert len({r for r, _ in expected}) == len(INVALID_KINDS) + (2 if batches == 1 else 3)  # future, before_backfill
    # (the first batch, no watermark yet), too_late (the next ones)
    good_ids = sorted(json.loads(p)["event_id"] for kind, p, _ in sent if kind == "good")
    content = read_sink(tmp_path / "sink", "page_view", "event_id")
    assert sorted(i for hc in content.values() for i in hc.timely + hc.late) == good_ids
    assert summary["totals"]["invalid"] == len(INVALID_KINDS) * batches
    for d in dl:
        assert d.detail and d.arrived_at and d.source
