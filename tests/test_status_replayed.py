"""status says how many before_backfill dead letters still wait and how many a replay took back (issue 50): an
operator who followed the runbook (raised max_backfill, replayed) no longer reads the replayed ones as waiting."""

from __future__ import annotations

import json

from event_etl.consumer.replay import Criteria, load_entries, parse_target, plan_replay, replay_records, run_replay
from event_etl.job.status import job_status
from event_etl.rules.reasons import Reason
from event_etl.timeutil import HOUR_MS
from tests.lib.backfill import NOW, pipeline, sixty_days_old


def replay(p, folder, limit=None) -> None:
    folder.mkdir(exist_ok=True)
    plan = plan_replay(load_entries(p.storage, "click"), replay_records(p.storage, "click"),
                       parse_target(f"dir:{folder}"), now=NOW,
                       criteria=Criteria(reasons=[Reason.BEFORE_BACKFILL.value], limit=limit))
    run_replay(p.storage, "click", plan, now=NOW)


def test_status_counts_the_replayed_before_backfill_dead_letters_apart(tmp_path):
    p = pipeline(tmp_path)
    p.batch(sixty_days_old(4))
    replay(p, tmp_path / "out", limit=3)

    def backfill() -> dict:
        st = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=NOW + HOUR_MS)
        json.dumps(st)  # status --json prints it
        return st["before_backfill"]

    b = backfill()
    assert (b["events"], b["waiting"], b["replayed"]) == (4, 1, 3), "events: all of them, as before"
    assert b["line"].startswith("1 event sit in the dead letters as before_backfill")
    assert "(3 replayed)" in b["line"]

    replay(p, tmp_path / "out2")
    b = backfill()
    assert (b["events"], b["waiting"], b["replayed"]) == (4, 0, 4)
    assert b["line"].startswith("4 events dead-lettered as before_backfill, all replayed")
    assert "sit in the dead letters" not in b["line"]
