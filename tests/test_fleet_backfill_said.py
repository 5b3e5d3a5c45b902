"""A fleet's closing summary names the events dead-lettered as before_backfill, as the single-type summary does
(issue 50): an operator running several types sees the backfill that went to the dead letters."""

from event_etl.job.fleet import summary_lines
from event_etl.job.progress import BACKFILL_RUNBOOK


def test_fleet_summary_names_before_backfill() -> None:
    summary = {
        "clicks": {"state": "stopped", "batches": 1, "totals": {"timely": 0, "before_backfill": 1234},
                   "hours_marked": [], "restarts": 0},
        "views": {"state": "stopped", "batches": 2, "totals": {"timely": 5}, "hours_marked": [], "restarts": 0},
    }
    lines = summary_lines(summary)
    clicks = next(line for line in lines if line.startswith("[clicks]"))
    assert "before backfill 1,234 (more than max_backfill before their arrival" in clicks
    assert BACKFILL_RUNBOOK in clicks
    views = next(line for line in lines if line.startswith("[views]"))
    assert "backfill" not in views
