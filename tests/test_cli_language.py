"""One CLI language: durations, a wrong sink is its own answer, one type loaded at a time, --json, one exit-code
table, every failure as one ``error:`` and one ``fix:`` line, missing extras named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import click as click_lib
import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.cli.params import DURATION, Duration, to_duration
from event_etl.exitcodes import ExitCode
from tests.lib.consumer_scenario import build_hours
from tests.lib.harness import CLICK_SCHEMA


@pytest.fixture
def sc(tmp_path):
    return build_hours(tmp_path)


def invoke(*args, env=None):
    return CliRunner().invoke(main, list(args), env=env)


def error_lines(output: str) -> tuple[list[str], list[str]]:
    lines = output.splitlines()
    return [x for x in lines if x.startswith("error:")], [x for x in lines if x.startswith("  fix:")]


# -- durations ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [("90", 90), ("0.5", 0.5), ("0", 0), ("90s", 90), ("5m", 300),
                                           ("1h30m", 5400), ("250ms", 0.25), ("1d", 86400), (" 2h ", 7200)])
def test_a_duration_is_a_unit_or_bare_seconds_like_sleep(text, seconds):
    d = to_duration(text)
    assert d == seconds and isinstance(d, float)
    assert d == f"{seconds}s", "equal to the same duration written otherwise"
    from event_etl.timeutil import parse_duration

    assert parse_duration(d.text) == round(seconds * 1000), "its text is what the rest of event_etl parses"


@pytest.mark.parametrize("text", ["soon", "-5", "5 parsecs", "nan", "inf", ""])
def test_not_a_duration(text):
    with pytest.raises(ValueError):
        to_duration(text)


def _all_commands(group=main, prefix=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click_lib.Group):
            yield from _all_commands(cmd, prefix + (name,))
        else:
            yield prefix + (name,), cmd


DURATION_OPTIONS = {"timeout", "poll_interval", "trigger_interval", "step", "window", "last", "duration",
                    "ack_deadline", "allowed_lateness"}


def test_every_duration_option_has_the_one_duration_type():
    seen = set()
    for path, cmd in _all_commands():
        for p in cmd.params:
            if p.name in DURATION_OPTIONS:
                assert p.type is DURATION, f"{' '.join(path)} --{p.name} is not a DURATION"
                seen.add(p.name)
            elif isinstance(p, click_lib.Option) and p.help and any(w in p.help for w in ("90s", "seconds,")):
                pytest.fail(f"{' '.join(path)} {p.opts[0]} reads like a duration but has type {p.type}")
    assert seen == DURATION_OPTIONS


def test_wait_takes_bare_seconds(sc):
    res = invoke("wait", "click", "2026-11-21T15", "--timeout", "0.2", "--poll-interval", "0.1", "--sink", sc.sink,
                 "--event-types", sc.types)
    assert res.exit_code == ExitCode.NOT_COMPLETE, res.output


# -- one exit-code table, one error line and one fix line ---------------------------------------------------
def test_every_command_shows_the_one_exit_code_table():
    for path, _cmd in _all_commands():
        res = invoke(*path, "--help")
        assert res.exit_code == 0
        table = res.output.split("Exit codes (the same for every command):")[1]
        assert [int(line.split()[0]) for line in table.strip().splitlines()] == [int(c) for c in ExitCode], path


@pytest.mark.parametrize("args", [["nosuch"], ["hours"], ["wait", "click", "2026-11-21T13", "--timeout", "soon"],
                                  ["run", "page_view", "--checkpoint", "a", "--checkpoint-root", "b"],
                                  ["run", "page_view", "--no-such-option"]])
def test_usage_errors_are_one_error_line_and_one_fix_line(args):
    res = invoke(*args)
    errors, fixes = error_lines(res.output)
    assert res.exit_code == ExitCode.USAGE, res.output
    assert len(errors) == 1 and len(fixes) == 1, res.output
    assert "Traceback" not in res.output and "Usage:" not in res.output


def test_a_lease_held_elsewhere_is_busy_not_not_yet():
    from event_etl.errors import LeaseHeldError

    assert LeaseHeldError("x").exit_code == ExitCode.BUSY == 7


# -- a wrong sink is not "not yet" -----------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ["hours", "click"], ["wait", "click", "2026-11-21T13"], ["verify", "click", "2026-11-21T13"],
    ["cat", "click", "2026-11-21T13"], ["audit", "click", "2026-11-21T13", "--expected", "2"],
    ["deadletter", "click"], ["verify", "click", "--since", "2026-11-21T13"],
])
def test_a_mistyped_sink_is_no_data_exit_6_in_every_command_that_reads_a_sink(sc, tmp_path, args):
    wrong = str(tmp_path / "dataa")
    result = {}
    th = threading.Thread(target=lambda: result.update(res=invoke(*args, "--sink", wrong, "--event-types", sc.types)),
                          daemon=True)
    th.start()
    th.join(60)
    assert not th.is_alive(), "a wrong sink must not be waited on forever"
    res = result["res"]
    assert res.exit_code == ExitCode.NO_DATA, res.output
    errors, fixes = error_lines(res.output)
    assert len(errors) == 1 and "nothing at" in errors[0] and "dataa" in errors[0] and len(fixes) == 1
    assert "--sink" in fixes[0]


def test_status_with_a_wrong_sink_says_so(sc, tmp_path):
    res = invoke("status", "--sink", str(tmp_path / "elsewhere"), "--event-types", sc.types,
                 "--checkpoint-root", str(tmp_path / "ck"))
    assert res.exit_code == ExitCode.NO_DATA and "nothing at" in res.output


def test_status_takes_the_checkpoint_root_under_both_names(sc, tmp_path):
    for flag in ("--checkpoint", "--checkpoint-root"):
        res = invoke("status", "--sink", sc.sink, "--event-types", sc.types, flag, str(tmp_path / "ck"), "--json")
        assert res.exit_code == 0, res.output
        assert [r["event_type"] for r in json.loads(res.output)] == ["click"]


def test_status_takes_the_type_as_every_other_command_does(sc, tmp_path):
    """``status click`` (issue 60 item 4): the named types only; an unknown one is an error naming the known ones.
    It said "Got unexpected extra argument" before."""
    res = invoke("status", "click", "--sink", sc.sink, "--event-types", sc.types, "--json")
    assert res.exit_code == 0, res.output
    assert [r["event_type"] for r in json.loads(res.output)] == ["click"]
    res = invoke("status", "clik", "--sink", sc.sink, "--event-types", sc.types)
    assert res.exit_code == 2 and "no event type 'clik'" in res.output and "known types: click" in res.output


def test_deadletter_refuses_a_reason_that_is_not_one(sc):
    """``deadletter click --reason toolate`` (issue 60 item 5) said "no dead-letter records with reason toolate",
    exit 0, as if there were none: now exit 2, the nearest reason and the list."""
    res = invoke("deadletter", "click", "--reason", "toolate", "--sink", sc.sink, "--event-types", sc.types)
    assert res.exit_code == 2, res.output
    errors, fixes = error_lines(res.output)
    assert errors == ["error: --reason toolate: not a dead-letter reason"], res.output
    assert "did you mean 'too_late'?" in fixes[0] and "invalid_protobuf" in fixes[0]


def test_the_sink_comes_from_the_environment(sc):
    res = invoke("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T15", "--json",
                 "--event-types", sc.types, env={"EVENT_ETL_SINK": sc.sink})
    assert res.exit_code == 0, res.output
    assert [r["state"] for r in json.loads(res.output)] == ["complete", "complete"]


# -- one broken type breaks only itself; no types folder at all -------------------------------------------------
def _broken_neighbour(types: str) -> None:
    d = Path(types) / "bad"
    d.mkdir()
    (d / "schema.avsc").write_text(json.dumps(CLICK_SCHEMA))
    (d / "etl.toml").write_text('time_field = "ts"\nout_of_orderness = "soon"\n')


def test_a_broken_type_elsewhere_in_the_folder_breaks_no_other_command(sc):
    _broken_neighbour(sc.types)
    for args in (["hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T14"],
                 ["verify", "click", "2026-11-21T13"], ["deadletter", "click"], ["cat", "click", "2026-11-21T13"],
                 ["schema", "list", "click"]):
        res = invoke(*args, "--sink", sc.sink, "--event-types", sc.types) if args[0] != "schema" else \
            invoke(*args, "--event-types", sc.types)
        assert res.exit_code == 0, (args, res.output)
    res = invoke("run", "bad", "--event-types", sc.types)
    assert res.exit_code == ExitCode.USAGE and "out_of_orderness" in res.output
    res = invoke("types", "--event-types", sc.types)
    assert res.exit_code == ExitCode.USAGE
    assert "click" in res.output and "BROKEN" in res.output and "out_of_orderness" in res.output


def test_commands_that_read_a_sink_need_no_event_types_folder(sc, monkeypatch):
    """As after `pip install event_etl`: the project's event_types/ does not have the type (here: no folder)."""
    monkeypatch.delenv("EVENT_ETL_EVENT_TYPES", raising=False)
    monkeypatch.setattr("event_etl.eventtypes._project_event_types", lambda: Path(sc.sink) / "no-types-here")
    base = ["--sink", sc.sink]
    assert invoke("hours", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T17", *base).exit_code == 0
    assert invoke("wait", "click", "2026-11-21T14", *base).exit_code == 0
    assert invoke("verify", "click", "2026-11-21T13", *base).exit_code == 0
    res = invoke("cat", "click", "2026-11-21T14", *base)
    assert res.exit_code == 0 and sorted(json.loads(x)["id"] for x in res.stdout.splitlines()) == ["c", "d"]
    res = invoke("audit", "click", "2026-11-21T13", "--expected", "3", *base)
    assert res.exit_code == ExitCode.USAGE and "--time-field" in res.output
    res = invoke("audit", "click", "2026-11-21T13", "--expected", "3", "--time-field", "ts", "--allowed-lateness",
                 "30m", "--json", *base)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["result"] == "match" and doc["timely_records"] == 2 and doc["late_records_found"] == 1
    assert doc["recorded"] is True


# -- --json --------------------------------------------------------------------------------------------
def test_json_answers(sc):
    base = ["--sink", sc.sink, "--event-types", sc.types, "--json"]
    res = invoke("hours", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T17", *base)
    rows = json.loads(res.output)
    assert [(r["hour"], r["state"]) for r in rows] == [
        ("2026-11-21T12:00:00Z", "never"), ("2026-11-21T13:00:00Z", "complete"), ("2026-11-21T14:00:00Z", "complete"),
        ("2026-11-21T15:00:00Z", "open"), ("2026-11-21T16:00:00Z", "not started")]
    assert rows[2]["records"] == 2 and rows[2]["late_records"] == 1 and rows[2]["marker_delay_seconds"] == 600
    res = invoke("wait", "click", "2026-11-21T14", *base)
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["state"] == "complete" and doc["records"] == 2
    assert [f["late"] for f in doc["files"]] == [True, False]
    res = invoke("verify", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T16", *base)
    assert res.exit_code == ExitCode.NOT_COMPLETE
    assert [(r["hour"], r["ok"]) for r in json.loads(res.output)] == [
        ("2026-11-21T13:00:00Z", True), ("2026-11-21T14:00:00Z", True), ("2026-11-21T15:00:00Z", False)]
    res = invoke("audit", "click", "2026-11-21T13", "--expected", "4", *base)
    assert res.exit_code == ExitCode.FAILED and json.loads(res.output)["result"] == "mismatch"


# -- missing extras ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocked, args, extra", [
    ("pyspark", ["run", "page_view"], "job"),
    ("matplotlib", ["graphs", "page_view", "--history", "h.jsonl"], "graphs"),
    ("google.cloud.pubsub_v1", ["setup", "page_view"], "job"),
])
def test_a_command_without_its_extra_names_the_extra(tmp_path, blocked, args, extra):
    """The module is made unimportable in a fresh interpreter, as in an install without the extra."""
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            f"from event_etl.cli import main; main({args!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    errors, fixes = error_lines(r.stderr)
    assert r.returncode == ExitCode.USAGE, r.stderr
    assert len(errors) == 1 and f"[{extra}]" in errors[0] and "Traceback" not in r.stderr
    assert fixes == [f"  fix: pip install 'event_etl[{extra}]'"]


def test_unreachable_gcs_is_one_error_line_not_a_traceback(tmp_path):
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "EVENT_ETL_STORAGE_RETRY_SECONDS": "1"}
    env.pop("EVENT_ETL_DEBUG", None)
    exe = str(Path(sys.executable).with_name("event-etl"))
    r = subprocess.run([exe, "hours", "page_view", "--sink", "gs://bucket/prefix"], capture_output=True, text=True,
                       env=env, timeout=120)
    errors, fixes = error_lines(r.stderr)
    assert r.returncode == ExitCode.COULD_NOT_CHECK, r.stderr
    assert len(errors) == 1 and len(fixes) == 1 and "Traceback" not in r.stderr, r.stderr


def test_duration_value_passes_through_a_command_line_unchanged():
    assert str(Duration(2.0, "2s")) == "2s" and str(to_duration(90)) == "90000ms"


@pytest.mark.parametrize("args", [["setup", "page_view"], ["publish", "page_view", "--duration", "1"]])
def test_missing_credentials_are_one_error_line_not_a_traceback(tmp_path, args):
    env = {k: v for k, v in os.environ.items() if k not in ("PUBSUB_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
                                                            "EVENT_ETL_DEBUG")}
    env.update(CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9",
               NO_GCE_CHECK="True",
               HOME=str(tmp_path))
    exe = str(Path(sys.executable).with_name("event-etl"))
    r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    errors, fixes = error_lines(r.stderr)
    assert r.returncode == ExitCode.ERROR, r.stderr
    assert len(errors) == 1 and "credentials" in errors[0] and len(fixes) == 1 and "Traceback" not in r.stderr
    assert "gcloud auth application-default login" in fixes[0]


def test_a_checkpoint_or_a_sink_that_names_a_file_is_said_so(tmp_path):
    """``--checkpoint FILE`` was "unexpected FileExistsError ... report it" (exit 1), ``--sink FILE`` "[Errno 17]
    File exists" with a fix about GCS roles (issue 60 item 3): each now an error naming the option, exit 2."""
    f = tmp_path / "afile"
    f.write_text("x")
    res = invoke("run", "page_view", "--checkpoint", str(f), "--once", "--sink", str(tmp_path / "data"))
    assert res.exit_code == 2, res.output
    errors, fixes = error_lines(res.output)
    assert errors == [f"error: --checkpoint {f}: a file is there, not a folder"] and "Traceback" not in res.output
    res = invoke("run", "page_view", "--sink", str(f), "--once", "--checkpoint", str(tmp_path / "ck"))
    errors, fixes = error_lines(res.output)
    assert errors == [f"error: the sink {f} is a file, not a folder"], res.output
    assert "roles/storage" not in res.output


def test_a_local_sink_that_cannot_be_written_gets_a_local_fix(tmp_path, monkeypatch):
    from event_etl.errors import StorageError
    from event_etl.storage import Storage

    st = Storage(str(tmp_path / "ro"))

    def refuse(rel, data):
        raise StorageError(f"cannot write {rel}: [Errno 13] Permission denied")

    monkeypatch.setattr(st, "write_atomic", refuse)
    with pytest.raises(StorageError) as err:
        st.check_writable()
    assert "chmod" in str(err.value.fix) and "roles/storage" not in str(err.value.fix)


@pytest.mark.parametrize("master", ["bogus[9]", "local[0]", "spark:/host", "local[2", "mesos://h:5050"])
def test_a_master_spark_would_refuse_is_refused_before_it_starts(tmp_path, master):
    """``run --master 'bogus[9]'`` printed 12 lines of Java stack trace, then "unexpected PySparkRuntimeError ...
    report it" (issue 60 item 3): now refused by the option, exit 2, before Spark starts."""
    res = invoke("run", "page_view", "--master", master, "--once", "--sink", str(tmp_path / "d"),
                 "--checkpoint", str(tmp_path / "ck"))
    assert res.exit_code == 2, res.output
    assert f"'{master}' is not a Spark master" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local[2,3]", "local-cluster[2,1,1024]",
                                    "spark://h:7077", "spark://a:7077,b:7077", "yarn", "k8s://https://h:6443"])
def test_every_form_of_a_master_spark_takes_is_taken(master):
    import click

    from event_etl.cli.options import check_master

    assert check_master(click.Context(click.Command("x")), None, master) == master


def test_a_jvm_that_exits_as_it_starts_is_an_error_with_the_fix():
    from event_etl.errors import UsageError
    from event_etl.job.session import _gateway_exited

    err = _gateway_exited(RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port"),
                          "spark://nohost:7077")
    assert isinstance(err, UsageError) and "spark://nohost:7077" in err.message and "--master" in str(err.fix)
    other = ValueError("something else")
    assert _gateway_exited(other, "local[2]") is other
