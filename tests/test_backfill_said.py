"""Issue 50 item 1: a backfill older than ``max_backfill`` is dead-lettered, and the run says so.

A job's first batches (no watermark yet) dead-letter an event more than ``max_backfill`` before its arrival, with
a reason of its own, ``before_backfill`` (``too_late`` keeps its meaning: behind the watermark by more than
``allowed_lateness``).  The run says it once, in one line naming the count, the setting and the fix, in the
progress output and in the summary; ``event-etl status`` says it too while the job has no watermark.  Batches run
through the real executor and controller (:class:`tests.lib.harness.LocalPipeline`), printed by the real printer.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from event_etl.job.progress import BACKFILL_RUNBOOK, ProgressPrinter, format_summary
from event_etl.job.status import job_status
from event_etl.metrics.spec import OUTCOMES
from event_etl.rules.reasons import Reason
from event_etl.timeutil import DAY_MS, HOUR_MS, iso
from tests.lib.backfill import NOW, SETTINGS, pipeline, sixty_days_old
from tests.lib.harness import LocalPipeline, click, make_event_type, read_deadletter

DOCS = Path(__file__).resolve().parents[1] / "docs"


def printed(printer_out: io.StringIO) -> list[str]:
    return printer_out.getvalue().splitlines()


def summary_of(p: LocalPipeline) -> dict:
    """The run's summary as ``job.summary.run_summary`` builds it from the controller."""
    totals = dict(p.controller.totals)
    events_in = sum(totals.get(k, 0) for k in OUTCOMES)
    return {"event_type": p.et.name, "sink": str(p.sink), "checkpoint": str(p.ckpt.root),
            "batches": p.controller.batches, "seconds": 1.0, "events_in": events_in, "events_per_second": events_in,
            "totals": totals, "watermark": iso(p.controller.state.watermark),
            "hours_marked": [iso(h) for h in p.controller.hours_marked], "stopped_by": "end of input",
            "drained": True, "last_batch": p.controller.state.last_batch_id}


def test_a_backfill_older_than_max_backfill_gets_its_own_reason_and_the_run_says_so_once(tmp_path):
    p = pipeline(tmp_path)
    out = io.StringIO()
    printer = ProgressPrinter("click", p.clock, out=out, settings_file=p.et.settings_file)
    ev = p.batch(sixty_days_old(5), shards=2)
    assert ev.result.counts == {"before_backfill": 5}
    assert ev.result.backfill == {"events": 5, "max_backfill": 30 * DAY_MS, "oldest": NOW - 60 * DAY_MS,
                                  "newest": NOW - 60 * DAY_MS + 4 * 60_000}
    dl = read_deadletter(p.sink, "click")
    assert {r["reason"] for r in dl} == {Reason.BEFORE_BACKFILL.value} and len(dl) == 5
    assert "no watermark yet (max_backfill 30d)" in dl[0]["detail"]

    printer("batch", ev)
    lines = printed(out)
    assert len(lines) == 2, lines
    assert "dead-letter 5" in lines[0]
    said = lines[1]
    assert said.startswith("[click] 5 events dead-lettered as before_backfill (event times 2026-09-22T13:30")
    assert "more than max_backfill (30d) before their arrival, with no watermark yet" in said
    assert f'set max_backfill = "0" (no bound) or a longer bound in {p.et.settings_file}' in said
    assert said.endswith(f"replay them from the dead letters: {BACKFILL_RUNBOOK}")

    p.clock.now += 60_000
    printer("batch", p.batch(sixty_days_old(3)))
    assert len(printed(out)) == 3, "said once a run: the summary counts them all"

    text = format_summary(summary_of(p))
    row = [line for line in text.splitlines() if "before backfill" in line]
    assert len(row) == 1, text
    assert re.match(r"  before backfill 8 \(more than max_backfill before their arrival", row[0]), row[0]
    assert 'max_backfill = "0" or a longer bound in the type\'s etl.toml' in row[0]
    assert BACKFILL_RUNBOOK in row[0]
    assert "  too late        0" in text, "too_late keeps its meaning: none was behind a watermark"
    # every value in one column, the row with the longest label too (issue 60 item 6)
    labels = ("events in", "timely", "late", "too late", "future", "before backfill", "invalid", "duplicates",
              "dead-lettered", "files written", "watermark", "hours marked", "stopped by")
    columns = set()
    for line in text.splitlines()[1:]:
        label = next(x for x in labels if line.startswith(f"  {x} "))
        rest = line[2 + len(label):]
        columns.add(2 + len(label) + len(rest) - len(rest.lstrip()))
    assert columns == {18}, text


def test_a_batch_without_such_events_prints_no_such_line_nor_summary_row(tmp_path):
    p = pipeline(tmp_path)
    out = io.StringIO()
    printer = ProgressPrinter("click", p.clock, out=out)
    ev = p.batch([click("a", "13:10"), click("old", "2026-11-19T10:00")])  # too late against its batch's reference
    printer("batch", ev)
    assert ev.result.counts == {"timely": 1, "too_late": 1} and ev.result.backfill is None
    assert len(printed(out)) == 1
    assert "before backfill" not in format_summary(summary_of(p))


def test_beside_recent_events_only_the_old_share_is_before_backfill(tmp_path):
    """The first batch holds recent events and a backfill 60 days old: the recent ones set the watermark, the old
    ones go to the dead letters as before_backfill, and the line names them alone."""
    p = pipeline(tmp_path)
    out = io.StringIO()
    printer = ProgressPrinter("click", p.clock, out=out)
    ev = p.batch([click("a", "13:10"), click("b", "13:20"), *sixty_days_old(2)])
    assert ev.result.counts == {"timely": 2, "before_backfill": 2}
    printer("batch", ev)
    lines = printed(out)
    assert len(lines) == 2 and lines[1].startswith("[click] 2 events dead-lettered as before_backfill")
    assert "click's etl.toml" in lines[1], "without the file's path: the type's etl.toml"


def test_status_says_how_many_sit_in_the_dead_letters_while_the_job_has_no_watermark(tmp_path):
    """Every event the job read went to the dead letters for max_backfill, and then max_backfill was raised: the
    next run on the same checkpoint reads nothing new, and status says where the events went and what to do."""
    p = pipeline(tmp_path)
    p.batch(sixty_days_old(4))
    assert p.ckpt.load_state().watermark is None
    st = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=NOW + HOUR_MS,
                    max_backfill=90 * DAY_MS, settings_file=p.et.settings_file)
    b = st["before_backfill"]
    assert (b["events"], b["oldest"], b["max_backfill"]) == (4, iso(NOW - 60 * DAY_MS), "90d")
    assert b["line"].startswith("4 events sit in the dead letters as before_backfill (event times ")
    assert f"in {p.et.settings_file}" in b["line"] and BACKFILL_RUNBOOK in b["line"]
    assert b["line"].endswith("(max_backfill is 90d now)")
    json.dumps(st)  # status --json prints it

    assert job_status("click", storage=p.storage, checkpoint_dir=tmp_path / "nothing", now=NOW)["before_backfill"] \
        is None, "never run: nothing to say"
    p.clock.now += 60_000
    p.batch([click("a", p.clock.now - 60_000)])  # a watermark now: the run said it batch by batch
    assert job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=NOW)["before_backfill"] is None


def test_a_run_on_a_checkpoint_that_sent_them_all_to_the_dead_letters_says_so_at_its_start(tmp_path, capsys):
    """After raising max_backfill, a run on the same checkpoint reads nothing again (its source consumed the
    files): its first lines say where the events went and how to take them."""
    from event_etl.job.setup import say_backfill_held

    p = pipeline(tmp_path)
    say_backfill_held(p.controller, p.storage)
    assert capsys.readouterr().out == "", "a new checkpoint: nothing to say"
    p.batch(sixty_days_old(2))
    p.et = make_event_type(tmp_path / "types", **{**SETTINGS, "max_backfill": "90d"})
    p.restart()
    say_backfill_held(p.controller, p.storage)
    out = capsys.readouterr().out
    assert out.startswith("[click] 2 events sit in the dead letters as before_backfill (event times "), out
    assert out.rstrip().endswith("(max_backfill is 90d now); this checkpoint does not read them again"), out
    p.clock.now += 60_000
    p.batch([click("a", p.clock.now - 60_000)])
    say_backfill_held(p.controller, p.storage)
    assert capsys.readouterr().out == "", "a job with a watermark said it batch by batch"


def test_status_prints_the_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from event_etl.cli import main

    p = pipeline(tmp_path)
    p.batch(sixty_days_old(3))
    ckroot = tmp_path / "ckroot"
    ckroot.mkdir()
    p.ckpt.root.rename(ckroot / "click")
    res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--checkpoint-root", str(ckroot),
                                    "--event-types", str(tmp_path / "types")])
    assert res.exit_code == 0, res.output
    assert "  3 events sit in the dead letters as before_backfill" in res.output
    assert 'max_backfill = "0" (no bound)' in res.output
    assert str(tmp_path / "types" / "click" / "etl.toml") in res.output
    res = CliRunner().invoke(main, ["status", "--json", "--sink", str(p.sink), "--checkpoint-root", str(ckroot),
                                    "--event-types", str(tmp_path / "types")])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert row["before_backfill"]["events"] == 3 and row["before_backfill"]["max_backfill"] == "30d"


def test_the_runbook_has_the_section_the_line_points_to():
    anchor = BACKFILL_RUNBOOK.split("#", 1)[1]
    headings = [re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", (DOCS / "runbook.md").read_text(), re.M)]
    assert anchor in headings


def test_the_start_line_goes_through_the_echo_the_command_line_passes(tmp_path, capsys):
    """Only the command line prints (CONTRIBUTING.md): a run's start says the backfill held through the ``echo`` the
    driver is given (on stdout: ``err`` not set), and prints nothing itself."""
    from types import SimpleNamespace

    from event_etl.job.setup import RunOptions, open_parts, prepare_job

    p = pipeline(tmp_path)
    p.batch(sixty_days_old(2))
    capsys.readouterr()
    options = RunOptions(source="generate:rate=100", sink=str(p.sink), checkpoint=str(p.ckpt.root))
    prepared = prepare_job(p.et, options, clock=p.clock)
    said: list[tuple[str, bool]] = []
    job, _spec = open_parts(prepared, SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=2)),
                            clock=p.clock, serve_metrics=False, echo=lambda line, err=False: said.append((line, err)))
    try:
        assert capsys.readouterr().out == ""
        assert [err for _, err in said] == [False], said
        assert said[0][0].startswith("[click] 2 events sit in the dead letters as before_backfill"), said
        assert said[0][0].endswith("; this checkpoint does not read them again"), said
    finally:
        job.close()
