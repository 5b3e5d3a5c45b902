"""The command line, in-process: help texts, listings, and errors that name the fix."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from tests.lib.harness import CLICK_SCHEMA, FakeClock, LocalPipeline, click, make_event_type, t


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize("command", [[], ["run"], ["types"], ["deadletter"]])
def test_every_command_explains_itself(runner, command):
    res = runner.invoke(main, [*command, "--help"])
    assert res.exit_code == 0
    assert "Usage:" in res.output and len(res.output.splitlines()) > 5


def test_run_help_lists_the_contract_options(runner):
    out = runner.invoke(main, ["run", "--help"]).output
    for opt in ("--source", "--sink", "--checkpoint", "--trigger-interval", "--max-files-per-batch", "--once",
                "--drain",
                "--master", "--conf", "--event-types"):
        assert opt in out


def test_types_lists_shipped_and_other_folders(runner, tmp_path):
    res = runner.invoke(main, ["types"])
    assert res.exit_code == 0
    for name in ("page_view", "payment_authorization", "db_change"):
        assert name in res.output
    make_event_type(tmp_path, "my_type")
    res = runner.invoke(main, ["types", "--event-types", str(tmp_path), "--json"])
    assert res.exit_code == 0 and list(json.loads(res.output)) == ["my_type"]
    res = runner.invoke(main, ["types"], env={"EVENT_ETL_EVENT_TYPES": str(tmp_path)})
    assert "my_type" in res.output and "page_view" not in res.output


def test_broken_type_is_a_clear_error(runner, tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "schema.avsc").write_text(json.dumps(CLICK_SCHEMA))
    (d / "etl.toml").write_text('time_field = "ts"\nout_of_orderness = "soon"\n')
    res = runner.invoke(main, ["types", "--event-types", str(tmp_path)])
    assert res.exit_code == 2
    assert "etl.toml: out_of_orderness" in res.output and "fix:" in res.output


def test_unknown_type_names_the_known_ones(runner):
    res = runner.invoke(main, ["run", "no_such_type"])
    assert res.exit_code == 2
    assert "no event type 'no_such_type'" in res.output and "page_view" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--source", "kafka://x"], "kafka:TOPIC"),
        (["--source", "s3://b/x"], "unknown source kind"),
        (["--source", "dir:/no/such/folder"], "is not a folder"),
        (["--conf", "novalue"], "key=value"),
        (["--trigger-interval", "soon"], "not a duration"),
        (["--checkpoint", "gs://b/ck"], "local or mounted"),
    ],
)
def test_run_rejects_bad_options_before_starting_spark(runner, tmp_path, args, message):
    res = runner.invoke(main, ["run", "page_view", "--sink", str(tmp_path / "s"), *args])
    assert res.exit_code != 0
    assert message in res.output and "fix:" in res.output


def test_deadletter_shows_reasons(runner, tmp_path):
    et = make_event_type(tmp_path / "types")
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:30")))
    p.batch([click("a", "13:00"), b"{oops", b"", click("f", "2027-01-01T00:00")])
    res = runner.invoke(main, ["deadletter", "click", "--sink", str(p.sink), "--event-types", str(tmp_path / "types")])
    assert res.exit_code == 0, res.output
    assert "invalid_json" in res.output and "future" in res.output and "empty_payload" in res.output
    res = runner.invoke(main, ["deadletter", "click", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                               "--counts"])
    assert "total                3" in res.output
    res = runner.invoke(main, ["deadletter", "click", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                               "--json", "--reason", "invalid_json"])
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert len(rows) == 1 and rows[0]["reason"] == "invalid_json" and rows[0]["payload_base64"] == "e29vcHM="


def test_a_fleet_ends_with_a_line_per_type():
    from event_etl.job.fleet import summary_lines

    lines = summary_lines({
        "b": {"state": "stopped", "batches": 3, "restarts": 1, "hours_marked": ["2026-11-20T13:00:00Z",
                                                                                "2026-11-20T14:00:00Z"],
              "totals": {"timely": 10, "late": 2, "invalid": 1, "duplicate": 1, "files": 4}},
        "a": {"state": "stopped", "batches": 0, "restarts": 0, "hours_marked": [], "totals": {}},
    })
    assert lines == [
        "[a] run finished (stopped): 0 batches, 0 events in, 0 hours marked, restarts 0",
        "[b] run finished (stopped): 3 batches, 14 events in, 2 hours marked (2026-11-20T13:00:00Z .. "
        "2026-11-20T14:00:00Z), restarts 1",
    ]


def test_a_replay_judged_by_a_checkpoint_of_another_sink_is_refused_as_a_usage_error(tmp_path):
    """`deadletter --replay-to --checkpoint CK` where CK's job writes to another sink: the error and fix, exit 2 (it
    raised a TypeError, the ConfigError lacking its file)."""
    from event_etl.cli.job import _check_live_job
    from event_etl.consumer.replay import parse_target
    from event_etl.errors import ConfigError
    from event_etl.storage import Storage

    ck = tmp_path / "ck"
    (ck / "etl").mkdir(parents=True)
    (ck / "etl" / "job.json").write_text(json.dumps({"sink": str(tmp_path / "other"), "source": f"dir:{tmp_path}"}))
    (tmp_path / "sink").mkdir()
    with pytest.raises(ConfigError, match="is of a job writing to") as caught:
        _check_live_job(ck, Storage(str(tmp_path / "sink")), parse_target(f"dir:{tmp_path}", None))
    assert caught.value.exit_code == 2 and "--checkpoint DIR" in (caught.value.fix or "")
