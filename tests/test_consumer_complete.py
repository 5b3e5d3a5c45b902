"""``event-etl complete``: is everything complete?  Several types at once, a grid and ``wait``'s exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.consumer import ExitCode, HourState
from event_etl.consumer.grid import TypeHours, grid_lines, summarise
from event_etl.timeutil import HOUR_MS
from tests.lib.consumer_scenario import build_hours
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

# build_hours: click on 2026-11-21, hours 13 and 14 complete (13 the job's first), hour 15 open


@pytest.fixture
def sink(tmp_path):
    """Two types in one sink: ``click`` (13, 14 complete; 15 open) and ``view`` (13 to 15 complete)."""
    sc = build_hours(tmp_path / "click")
    et = make_event_type(tmp_path / "types", "view")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path / "view", et, clock, sink_url=sc.sink)
    for now, at in (("13:10", "13:05"), ("14:10", "14:05"), ("15:10", "15:05"), ("16:10", "16:05")):
        clock.now = t(now)
        p.batch([click(f"v{now}", at)])
    return sc.sink


def run(*args: str):
    return CliRunner().invoke(main, ["complete", *args])


def test_every_type_of_the_sink_when_none_is_named_and_exit_3_while_an_hour_is_open(sink):
    r = run("--since", "2026-11-21T12", "--until", "2026-11-21T16", "--never-final", "--sink", sink)
    assert r.exit_code == ExitCode.NOT_COMPLETE, r.output
    rows = {line.split()[0]: line for line in r.output.splitlines() if line.startswith(("click", "view"))}
    assert set(rows) == {"click", "view"}
    # 12 is before both types' first hour (never), 13-14 complete, 15: open for click, complete for view
    assert rows["click"].split()[1:3] == ["-##o", "2/4"], r.output
    assert "not yet: 15:00 open" in rows["click"]
    assert rows["view"].split()[1:3] == ["-###", "3/4"], r.output
    assert "not yet" not in rows["view"]
    assert r.output.splitlines()[-1].startswith("not yet: 1 hour of 1 of 2 types not complete (click)")


def test_the_types_named_only_and_exit_0_when_every_hour_is_final(sink):
    r = run("view", "--since", "2026-11-21T12", "--until", "2026-11-21T16", "--never-final", "--sink", sink)
    assert r.exit_code == 0, r.output
    assert "click" not in r.output
    assert r.output.splitlines()[-1].startswith("complete: every hour of 1 type from 2026-11-21T12:00:00Z")


def test_json_lists_what_is_not_complete_per_type(sink):
    r = run("click", "view", "--day", "2026-11-21", "--json", "--never-final", "--sink", sink)
    assert r.exit_code == ExitCode.NOT_COMPLETE, r.output
    doc = json.loads(r.output)
    assert doc["since"] == "2026-11-21T00:00:00Z" and doc["until"] == "2026-11-22T00:00:00Z"
    assert doc["complete"] is False
    click_hours = doc["types"]["click"]
    assert click_hours["hours"] == 24 and click_hours["complete_hours"] == 2 and click_hours["never_hours"] == 13
    assert click_hours["not_complete"][0] == {"hour": "2026-11-21T15:00:00Z", "state": "open"}
    assert {h["state"] for h in click_hours["not_complete"][1:]} == {"not started"}
    assert doc["types"]["view"]["complete_hours"] == 3


def test_a_misspelled_type_is_no_data_not_a_not_yet(sink):
    r = run("clik", "--day", "2026-11-21", "--sink", sink)
    assert r.exit_code == ExitCode.NO_DATA, r.output
    assert "error:" in r.output and "fix:" in r.output


@pytest.mark.parametrize("args", [["--day", "21/11/2026"], ["--day", "2026-11-21", "--since", "2026-11-21T01"],
                                  ["--until", "2026-11-21T01"]])
def test_bad_ranges_are_usage_errors_with_a_fix(sink, args):
    r = run(*args, "--sink", sink)
    assert r.exit_code == ExitCode.USAGE, r.output
    assert "fix:" in r.output


def test_the_grid_draws_a_day_per_row_group_with_the_hours_ruler():
    day = t("2026-11-21T00:00:00Z")
    states = [HourState.NEVER] * 6 + [HourState.COMPLETE] * 10 + [HourState.AUDITED, HourState.MISMATCH] + \
        [HourState.OPEN] + [HourState.NOT_STARTED] * 5
    rows = [TypeHours("page_view", tuple((day + i * HOUR_MS, s) for i, s in enumerate(states)), never_final=True)]
    lines = grid_lines(rows, day, day + 24 * HOUR_MS)
    assert lines[0].startswith("2026-11-21 (UTC)  00     06     12     18") and lines[0].endswith("complete")
    assert lines[1].split()[:6] == ["page_view", "------", "######", "####A!", "o.....", "12/24"]
    assert "(+6 never)" in lines[1] and "not yet: 18:00 open, 19:00 not started, 20:00 not started, 21:00 not " \
        "started and 2 more" in lines[1]
    assert summarise(rows, day, day + 24 * HOUR_MS)["types"]["page_view"]["complete"] is False
