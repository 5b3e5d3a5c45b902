"""``event-etl wait | hours | verify | cat | audit`` in-process:
output and exit codes (the contract with schedulers)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import fastavro
import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.consumer import ExitCode, HourState, hour_status
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from tests.lib.consumer_scenario import build_hours, complete_hour_15
from tests.lib.harness import hour


@pytest.fixture
def sc(tmp_path):
    return build_hours(tmp_path)


@pytest.fixture
def run(sc):
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, [*args, "--sink", sc.sink, "--event-types", sc.types])

    return invoke


COMMANDS = {
    "wait": ["--timeout", "--poll-interval"],
    "hours": ["--since", "--until"],
    "verify": ["--since", "--until"],
    "cat": ["--format", "--no-late"],
    "audit": ["--expected", "--count-file"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_shows_the_options_and_the_exit_codes(command):
    res = CliRunner().invoke(main, [command, "--help"])
    assert res.exit_code == 0
    for opt in COMMANDS[command] + ["--sink", "--event-types"]:
        assert opt in res.output
    codes = res.output.split("Exit codes (the same for every command):")[1]
    assert [line.split()[0] for line in codes.strip().splitlines()] == [str(int(c)) for c in ExitCode]


@pytest.mark.parametrize("args", [
    ["wait", "click", "2026-11-21T13:30"], ["verify", "click", "yesterday"], ["cat", "click", "2026-13-01T00"],
    ["audit", "click", "2026-11-21T13+02:00", "--expected", "3"], ["hours", "click", "--since", "noon"],
])
def test_a_malformed_hour_is_a_usage_error(run, args):
    res = run(*args)
    assert res.exit_code == 2
    assert "HOUR" in res.output or "--since" in res.output
    assert "2026-11-21T13" in res.output, "the message shows the accepted form"


def test_an_unknown_type_is_a_usage_error(run):
    res = run("wait", "clack", "2026-11-21T13")
    assert res.exit_code == 2 and "no event type 'clack'" in res.output


# -- wait ----------------------------------------------------------------------------------
def test_wait_for_a_complete_hour(run):
    res = run("wait", "click", "2026-11-21T14:00Z")
    assert res.exit_code == 0
    assert "click 2026-11-21T14:00:00Z complete: records 2 (late 1)  files 2" in res.output
    assert "marker delay (wall clock) 10m" in res.output


def test_wait_times_out_with_exit_code_3(run):
    res = run("wait", "click", "2026-11-21T15", "--timeout", "0.3s", "--poll-interval", "0.1s")
    assert res.exit_code == 3
    assert "waiting: click 2026-11-21T15:00:00Z open" in res.output
    assert "still not complete after" in res.output


def test_wait_for_an_hour_the_job_never_marks_is_a_usage_error(run):
    res = run("wait", "click", "2026-11-21T12", "--timeout", "5m")
    assert res.exit_code == 2 and "will never be complete" in res.output


def test_wait_could_not_check_exit_code_4(tmp_path, sc):
    bad = tmp_path / "a-file"
    bad.write_text("not a folder")
    res = CliRunner().invoke(main, ["wait", "click", "2026-11-21T13", "--timeout", "5m", "--sink", str(bad),
                                    "--event-types", sc.types])
    assert res.exit_code == 4 and "Not a directory" in res.output


def test_wait_wakes_when_the_marker_appears(sc):
    """The CLI's own loop, started before the marker exists."""
    outcome = {}

    def waiter():
        outcome["res"] = CliRunner().invoke(main, ["wait", "click", "2026-11-21T15", "--timeout", "60s",
                                                   "--poll-interval", "0.01s", "--sink", sc.sink,
                                                   "--event-types", sc.types])

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    th.join(0.3)
    assert th.is_alive(), "still waiting: the hour is open"
    complete_hour_15(sc)
    th.join(10)
    assert not th.is_alive()
    assert outcome["res"].exit_code == 0 and "2026-11-21T15:00:00Z complete: records 1" in outcome["res"].output


# -- hours ---------------------------------------------------------------------------------
def test_hours_table(run):
    res = run("hours", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T17")
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0].split() == ["hour", "status", "records", "late", "files", "completed", "at", "marker", "delay",
                                "(wall", "clock)"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert rows["2026-11-21T12:00:00Z"].split()[1] == "never"
    assert rows["2026-11-21T14:00:00Z"].split()[1:] == ["complete", "2", "1", "2", "2026-11-21T15:10:00Z", "10m"]
    assert rows["2026-11-21T15:00:00Z"].split()[1:] == ["open", "-", "-", "1", "-", "-"]
    assert "not started" in rows["2026-11-21T16:00:00Z"]


def test_hours_since_a_future_hour_says_so_not_until(run):
    """``hours --since <an hour to come>`` with no --until (issue 60 item 4): the error says the hour is in the future
    and names the current one; it used to blame an --until the user never gave."""
    from event_etl.timeutil import HOUR_MS, iso, now_millis

    future = iso(now_millis() + 30 * HOUR_MS)[:13]
    res = run("hours", "click", "--since", future)
    assert res.exit_code == 2, res.output
    assert f"--since {future}:00:00Z is after the current hour by the wall clock" in res.output, res.output
    assert "until" not in res.output.split("fix:")[0].replace("--since", ""), res.output
    assert "fix:" in res.output and "Traceback" not in res.output


# -- verify --------------------------------------------------------------------------------
def test_verify_ok_then_failed(run, sc):
    res = run("verify", "click", "2026-11-21T13")
    assert res.exit_code == 0 and "ok (2 files, 2 records)" in res.output
    folder = Path(sc.sink) / hour_dir("click", hour("13"))
    victim = sorted(folder.glob("part-*.avro"))[0]
    victim.unlink()
    res = run("verify", "click", "2026-11-21T13")
    assert res.exit_code == 5 and "FAILED" in res.output and f"{victim.name}: missing" in res.output


def test_verify_range_and_exit_codes(run, sc):
    assert run("verify", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T15").exit_code == 0
    res = run("verify", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T16")
    assert res.exit_code == 3 and "2026-11-21T15:00:00Z: open, not verified" in res.output
    assert run("verify", "click", "2026-11-21T15").exit_code == 3
    assert run("verify", "click").exit_code == 2
    assert run("verify", "click", "2026-11-21T13", "--since", "2026-11-21T12").exit_code == 2


# -- cat -----------------------------------------------------------------------------------
def test_cat_prints_the_records_late_ones_included_unless_asked(run):
    res = run("cat", "click", "2026-11-21T14")
    assert res.exit_code == 0
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["id"] for r in recs] == ["c", "d"], "the hour's own records first, then its late ones"
    assert {r["id"]: r["ts"] for r in recs}["d"] == "2026-11-21T13:30:00Z"
    assert res.stderr.strip() == ("2 records, the last 1 of them late records of earlier hours that arrived after "
                                  "those were complete (--no-late leaves them out)")
    res = run("cat", "click", "2026-11-21T14", "--no-late")
    assert [json.loads(line)["id"] for line in res.stdout.splitlines()] == ["c"]
    assert res.stderr == ""


def test_cat_avro(sc):
    res = CliRunner().invoke(main, ["cat", "click", "2026-11-21T14", "--format", "avro", "--sink", sc.sink,
                                    "--event-types", sc.types])
    assert res.exit_code == 0
    assert sorted(r["id"] for r in fastavro.reader(io.BytesIO(res.stdout_bytes))) == ["c", "d"]


def test_cat_an_open_hour_exit_code_3(run):
    res = run("cat", "click", "2026-11-21T15")
    assert res.exit_code == 3 and "event-etl wait click" in res.output


# -- audit ---------------------------------------------------------------------------------
def test_audit_match_then_hours_says_audited(run, sc):
    res = run("audit", "click", "2026-11-21T13", "--expected", "3")
    assert res.exit_code == 0
    assert "match: counted 3 (timely 2, late 1 found in 1 later hours), expected 3" in res.output
    assert "recorded in _AUDIT" in res.output
    assert hour_status(sc.sink, "click", "2026-11-21T13").state is HourState.AUDITED
    assert "audited" in run("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T14").output


def test_audit_mismatch_exit_code_5(run, sc):
    res = run("audit", "click", "2026-11-21T13", "--expected", "10")
    assert res.exit_code == 5 and "mismatch" in res.output and "difference -7" in res.output
    assert "mismatch" in run("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T14").output


def test_audit_inconclusive_exit_code_3_and_nothing_recorded(run, sc):
    res = run("audit", "click", "2026-11-21T14", "--expected", "2")
    assert res.exit_code == 3 and "not recorded" in res.output
    assert not (Path(sc.sink) / hour_dir("click", hour("14")) / "_AUDIT").exists()


def test_audit_from_a_count_file(run, sc, tmp_path):
    counts = tmp_path / "click-counts.json"
    counts.write_text(json.dumps({"event_type": "click", "counts": {"2026-11-21T13:00:00Z": 3}}))
    res = run("audit", "click", "2026-11-21T13", "--count-file", str(counts))
    assert res.exit_code == 0 and "match" in res.output
    rec = json.loads((Path(sc.sink) / hour_dir("click", hour("13")) / "_AUDIT").read_text())
    assert rec["source"] == str(counts)
    res = run("audit", "click", "2026-11-21T14", "--count-file", str(counts))
    assert res.exit_code == 2 and "no count for 2026-11-21T14:00:00Z" in res.output


def test_audit_needs_one_source_of_the_expected_count(run):
    assert run("audit", "click", "2026-11-21T13").exit_code == 2
    assert run("audit", "click", "2026-11-21T13", "--expected", "3", "--count-file", "x.json").exit_code == 2
    assert run("audit", "click", "2026-11-21T13", "--expected", "-1").exit_code == 2


def test_marker_is_never_touched_by_the_commands(run, sc):
    marker = Path(sc.sink) / hour_dir("click", hour("13")) / MARKER_NAME
    before = marker.read_bytes()
    for args in (["wait", "click", "2026-11-21T13"], ["verify", "click", "2026-11-21T13"],
                 ["cat", "click", "2026-11-21T13"], ["audit", "click", "2026-11-21T13", "--expected", "3"]):
        assert run(*args).exit_code == 0
    assert marker.read_bytes() == before


@pytest.mark.parametrize("command", [["cat", "click", "2026-11-21T14"], ["cat", "click", "2026-11-21T14", "--format",
                                                                          "avro"], ["deadletter", "click"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(sc, command):
    """`event-etl cat ... | head -1`: the pipe closes under the command, which ends as cat and grep do, with nothing
    on stderr (no `error: unexpected BrokenPipeError`) and the shell's code for a process SIGPIPE ended."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first record is written
    try:
        proc = subprocess.run([sys.executable, "-m", "event_etl", *command, "--sink", sc.sink, "--event-types",
                               sc.types], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 141


def test_hours_by_default_shows_the_hours_that_hold_data_even_ahead_of_the_wall_clock(sc):
    """The demo's generator runs event time ahead of the wall clock: `hours` without a window showed 18 "never" rows
    and hid the demo's hours. The default window now ends after the latest hour holding data and starts no earlier
    than the job's first hour."""
    from event_etl.consumer.status import default_window

    wall = hour("10")  # the wall clock hours behind the sink's event time (the sink holds hours 13 to 15)
    assert default_window(sc.sink, "click", now=wall + 25 * 60_000) == (hour("13"), hour("16"))
    later = hour("15") + 30 * 3_600_000  # the wall clock long past the data: the usual 24 hours up to now
    assert default_window(sc.sink, "click", now=later) == (later - later % 3_600_000 - 23 * 3_600_000,
                                                           later - later % 3_600_000 + 3_600_000)


def test_hours_says_ahead_where_a_marker_came_before_its_hour_ended_by_the_wall_clock(sc, run):
    """A generator's event clock runs ahead of the wall clock: its markers are written (wall clock) before their hour
    ends (event time). A negative marker delay read as nonsense (`-4h02m`); the table says `ahead` and why."""
    marker = Path(sc.sink) / "click" / hour_dir("click", hour("14")).split("/", 1)[1] / MARKER_NAME
    doc = json.loads(marker.read_text())
    marker.write_text(json.dumps({**doc, "completed_at": "2026-11-21T10:50:00Z"}))
    res = run("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T15")
    rows = {ln.split()[0]: ln for ln in res.output.splitlines()[1:]}
    assert rows["2026-11-21T14:00:00Z"].split()[-1] == "ahead" and rows["2026-11-21T13:00:00Z"].split()[-1] != "ahead"
    assert "ahead: 1 hour was marked before it ended by the wall clock" in res.output


def test_status_says_ahead_when_the_watermark_runs_ahead_of_the_wall_clock(sc):
    from event_etl.job.status import job_status
    from event_etl.storage import Storage

    ck = sc.pipeline.tmp / "ckpt"
    wm = sc.pipeline.ckpt.load_state().watermark
    assert job_status("click", storage=Storage(sc.sink), checkpoint_dir=ck, now=wm + 62_000)["lag"] == "1m02s"
    assert job_status("click", storage=Storage(sc.sink), checkpoint_dir=ck, now=wm - 4 * 3_600_000)["lag"] == "ahead"


# -- issue 50 item 4: one marker delay, on the wall clock, never negative; verify says what it left out ---------
@pytest.fixture
def drained(sc):
    """``sc`` drained at 15:10 by the wall clock: the open hour 15 is marked 50 minutes before it ends."""
    marked = sc.pipeline.controller.drain()
    assert [(m.extra["closed_by"], m.marker_delay_ms) for m in marked] == [("drain", -50 * 60_000)]
    return marked[0]


def test_a_drained_hour_reads_drained_in_hours_wait_and_the_runs_line_never_a_negative_delay(run, sc, drained):
    import re

    from event_etl.job.progress import ProgressPrinter

    res = run("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T16")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split("  ")[-1].strip() == "marker delay (wall clock)", lines[0]
    rows = {ln.split()[0]: ln.split()[-1] for ln in lines[1:4]}
    assert rows == {"2026-11-21T13:00:00Z": "10m", "2026-11-21T14:00:00Z": "10m",
                    "2026-11-21T15:00:00Z": "drained"}
    assert "drained: 1 hour was marked before it ended by the wall clock, by a drain" in res.output
    assert "ahead:" not in res.output
    res = run("wait", "click", "2026-11-21T15", "--timeout", "0")
    assert res.exit_code == 0 and res.output.rstrip().endswith("marker delay (wall clock) drained"), res.output
    # the run's own line says the same of the same hour, whatever clock its lag is read on
    printer = ProgressPrinter("click", sc.clock, event_clock=lambda: drained.hour - 3_600_000)
    assert printer.marker_line(drained).endswith("  marker delay (wall clock) drained")
    assert not re.search(r"delay.* -\d", printer.marker_line(drained))
    # --json keeps its fields (the manifest's figure, negative here) and adds why
    doc = json.loads(run("wait", "click", "2026-11-21T15", "--timeout", "0", "--json").output)
    assert doc["marker_delay_seconds"] == -3000 and doc["marked_early"] == "drained"
    rows_json = json.loads(run("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T16",
                               "--json").output)
    assert [(r["marker_delay_seconds"], r["marked_early"]) for r in rows_json] == [(600, None), (600, None),
                                                                                  (-3000, "drained")]


def test_the_runs_marker_line_and_hours_agree_on_the_wall_clock_with_a_generator_clock(run, sc):
    """The run used to print the marker delay on the generator's clock (`1h45m`, `-45m10s`) where `hours` printed the
    wall clock's (`4h34m`, `ahead`): one definition now, the manifest's, on the wall clock."""
    from event_etl.job.progress import ProgressPrinter
    from event_etl.rules.manifest import Manifest

    path = Path(sc.sink) / "click" / hour_dir("click", hour("14")).split("/", 1)[1] / MARKER_NAME
    m = Manifest.from_json(json.loads(path.read_text()))
    generator_ahead = lambda: m.hour + 3_600_000 + 105 * 60_000  # noqa: E731 - its clock 1h45m past the hour's end
    line = ProgressPrinter("click", sc.clock, event_clock=generator_ahead).marker_line(m)
    assert line.endswith("  marker delay (wall clock) 10m") and "generator" not in line, line
    res = run("hours", "click", "--since", "2026-11-21T14", "--until", "2026-11-21T15")
    assert res.output.splitlines()[1].split()[-1] == "10m"
    # written before its hour ended by the wall clock, not by a drain: `ahead` in both
    early = Manifest.from_json({**m.to_json(), "completed_at": "2026-11-21T14:20:00Z"})
    assert ProgressPrinter("click", sc.clock).marker_line(early).endswith("  marker delay (wall clock) ahead")


def test_verify_since_says_which_complete_hours_after_the_wall_clocks_hour_it_left_out(run, sc, monkeypatch):
    """The sink's event time runs ahead of the wall clock (13:30 here): `verify --since` without --until stops at the
    wall clock's hour; the complete hours 13 and 14 after it used to be left out in silence."""
    import event_etl.cli.consumer as consumer_cli

    monkeypatch.setattr(consumer_cli, "now_millis", lambda: hour("13") + 30 * 60_000)
    res = run("verify", "click", "--since", "2026-11-21T12")
    assert res.exit_code == 0, res.output
    assert ("left out: 2 complete hours from 2026-11-21T13:00:00Z on (2026-11-21T13:00:00Z .. 2026-11-21T14:00:00Z), "
            "not verified") in res.stderr
    assert "pass --until 2026-11-21T15:00:00Z to verify them" in res.stderr
    res = run("verify", "click", "--since", "2026-11-21T12", "--json")
    assert [r["hour"] for r in json.loads(res.stdout)] == ["2026-11-21T12:00:00Z"] and "left out: 2" in res.stderr
    # --since after the wall clock's hour: nothing in the range, and the hours from --since on named (it was an error)
    res = run("verify", "click", "--since", "2026-11-21T14")
    assert res.exit_code == 0 and res.stdout == ""
    assert "left out: 1 complete hour from 2026-11-21T14:00:00Z on (2026-11-21T14:00:00Z)" in res.stderr
    # with --until, the range is what was asked: nothing is said
    res = run("verify", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T13")
    assert res.exit_code == 0 and "left out" not in res.output
    res = run("verify", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T15")
    assert res.exit_code == 0 and res.stdout.count(": ok (") == 2
