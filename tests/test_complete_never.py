"""``event-etl complete`` on a type created today (issue 60, item 4): the hours before a type's first hour
("never": no marker will come, the type has no data there) are not final unless the consumer says so with
``--never-final``.  Before, yesterday of a new type read ``0/24 (+24 never) ... is final``, exit 0, and a consumer's
DAG went on with nothing to read."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.consumer import ExitCode
from event_etl.consumer.grid import completeness, never_error, summarise
from event_etl.timeutil import DAY_MS
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t


@pytest.fixture
def sink(tmp_path) -> str:
    """``click`` created on 2026-11-21: its first hour is 13:00 (13 and 14 complete, 15 open)."""
    et = make_event_type(tmp_path / "types", "click")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    for now, at in (("13:10", "13:05"), ("14:10", "14:05"), ("15:10", "15:05")):
        clock.now = t(now)
        p.batch([click(f"c{now}", at)])
    return str(p.sink)


def run(*args: str):
    return CliRunner().invoke(main, ["complete", *args])


def test_yesterday_of_a_type_created_today_is_not_complete(sink):
    r = run("click", "--day", "2026-11-20", "--sink", sink)
    assert r.exit_code == ExitCode.USAGE, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("click"))
    assert row.split()[1:6] == ["------", "------", "------", "------", "0/24"], r.output
    assert "no data: 00:00 to 23:00 before its first hour" in row and "never)" not in row
    assert "is final" not in r.output
    assert "not complete: 24 hours of 1 of 1 type before the type's first hour, with no data (click)" in r.output
    error = next(line for line in r.output.splitlines() if line.startswith("error:"))
    assert "click 24 hours from 2026-11-20T00:00:00Z (its first hour is 2026-11-21T13:00:00Z)" in error
    assert "no marker will ever close" in error
    assert "--never-final" in next(line for line in r.output.splitlines() if line.strip().startswith("fix:"))
    assert "Traceback" not in r.output


def test_never_final_counts_them_as_final_when_asked(sink):
    r = run("click", "--day", "2026-11-20", "--never-final", "--sink", sink)
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if line.startswith("click"))
    assert "0/24 (+24 never)" in row
    assert r.output.splitlines()[-1].startswith("complete: every hour of 1 type from 2026-11-20T00:00:00Z")


def test_a_range_that_starts_before_the_first_hour_is_refused_and_from_it_on_is_complete(sink):
    r = run("click", "--since", "2026-11-21T11", "--until", "2026-11-21T15", "--sink", sink)
    assert r.exit_code == ExitCode.USAGE, r.output
    assert "click 2 hours from 2026-11-21T11:00:00Z (its first hour is 2026-11-21T13:00:00Z)" in r.output
    assert run("click", "--since", "2026-11-21T13", "--until", "2026-11-21T15", "--sink", sink).exit_code == 0
    # still open hours after the first: "not yet" (3) once the never hours are counted as final
    r = run("click", "--since", "2026-11-21T11", "--until", "2026-11-21T16", "--never-final", "--sink", sink)
    assert r.exit_code == ExitCode.NOT_COMPLETE, r.output


def test_json_and_the_library_say_the_same(sink):
    r = run("click", "--day", "2026-11-20", "--json", "--sink", sink)
    assert r.exit_code == ExitCode.USAGE
    doc = json.loads(r.output[:r.output.index("\nerror:")] if "\nerror:" in r.output else r.output)
    assert doc["complete"] is False and doc["never_final"] is False
    assert doc["types"]["click"]["never_hours"] == 24 and len(doc["types"]["click"]["no_data_before_first_hour"]) == 24
    day = t("2026-11-20T00:00:00Z")
    rows = completeness(sink, ["click"], day, day + DAY_MS)
    assert not rows[0].is_complete and never_error(rows) is not None
    rows = completeness(sink, ["click"], day, day + DAY_MS, never_final=True)
    assert rows[0].is_complete and never_error(rows) is None and summarise(rows, day, day + DAY_MS)["complete"]
