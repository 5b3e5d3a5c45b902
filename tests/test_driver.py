"""The one driver (event_etl.job.driver) without Spark: what a run of one type and a fleet decide differently, that
the command line goes through it, and that it refuses --engine queries (removed in 0.4)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from event_etl.errors import EventEtlError, UsageError
from event_etl.job import driver
from event_etl.job.engine import FleetMember
from event_etl.job.setup import RunOptions
from event_etl.job.stopping import StopSignals
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t


class _StopHere(Exception):
    pass


def _stop_at_the_lease(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ends where it would take its first lease; returns the names it got that far with."""
    leased: list[str] = []

    def acquire(p, stops=None, echo=None):
        leased.append(p.event_type.name)
        raise _StopHere

    monkeypatch.setattr(driver, "take_lease", acquire)
    return leased


def test_a_fleet_takes_a_checkpoint_per_type_and_refuses_one_source(tmp_path, monkeypatch):
    leased = _stop_at_the_lease(monkeypatch)
    types = [make_event_type(tmp_path / "types", name) for name in ("a", "b")]
    with pytest.raises(UsageError, match="--source names one source"):
        driver.run(types, RunOptions(source="dir:x", sink=str(tmp_path / "sink")), install_signals=False)
    with pytest.raises(UsageError, match="named twice"):
        driver.run([types[0], types[0]], RunOptions(sink=str(tmp_path / "sink")), install_signals=False)
    assert leased == []
    seen: list[str] = []
    real_prepare = driver.prepare_job

    def prepare(et, options, *, clock, checkpoint=None):
        seen.append(str(checkpoint))
        return real_prepare(et, options, clock=clock, checkpoint=checkpoint)

    monkeypatch.setattr(driver, "prepare_job", prepare)
    with pytest.raises(_StopHere):  # `run --all` with one type is a fleet: ROOT/<type>
        driver.run(types[:1], RunOptions(source=None, sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck")),
                   fleet=True, install_signals=False)
    assert seen == [str(tmp_path / "ck" / "a")]


def test_runs_keyword_arguments_are_hostings_fields():
    """``run(types, options, clock=..., echo=...)``: each keyword beside ``fleet`` and ``spark`` is a field of
    :class:`driver.Hosting`, with Hosting's default."""
    assert list(driver.HostingArgs.__annotations__) == [f.name for f in dataclasses.fields(driver.Hosting)]


def _driver(tmp_path, *, fleet: bool, clock) -> tuple[driver._Driver, FleetMember, LocalPipeline, list]:
    """A driver of one type whose job is a real controller on local disk (no Spark); the lines it echoes."""
    et = make_event_type(tmp_path / "types")
    pipe = LocalPipeline(tmp_path / "p", et, clock)
    lines: list[tuple[str, bool]] = []
    d = driver._Driver([et], RunOptions(sink=str(pipe.sink)), fleet=fleet,
                       hosting=driver.Hosting(clock=clock, install_signals=False, stops=StopSignals(),
                                              echo=lambda line, err=False: lines.append((line, err))))
    m = FleetMember(et, prepared=_Prepared(pipe), job=_Job(pipe), state="running")
    d.members.append(m)
    return d, m, pipe, lines


class _Prepared:
    def __init__(self, pipe: LocalPipeline) -> None:
        self.ckpt = pipe.controller.ckpt


class _Job:
    def __init__(self, pipe: LocalPipeline) -> None:
        self.controller = pipe.controller
        self.printer = None


def test_a_single_type_is_not_quarantined_its_failure_ends_the_run(tmp_path):
    """One type is a fleet of one but for this decision: the error ends the run (exit 1), as it always did."""
    clock = FakeClock(t("13:30"))
    d, m, _, lines = _driver(tmp_path, fleet=False, clock=clock)
    with pytest.raises(EventEtlError, match="the sink refused"):
        d.on_failure(m, EventEtlError("the sink refused", fix="x"))
    assert m.state == "running" and m.failures == 0 and lines == []


def test_a_fleet_quarantines_the_type_that_failed_and_says_so_through_the_echo_it_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("EVENT_ETL_FLEET_BACKOFF", "5")
    clock = FakeClock(t("13:30"))
    d, m, pipe, lines = _driver(tmp_path, fleet=True, clock=clock)
    pipe.batch([click("a", "13:05")])
    d.on_failure(m, EventEtlError("the sink refused", fix="make it writable"))
    assert m.state == "quarantined" and m.failures == 1 and m.restart_at is not None
    assert lines == [("[click] quarantined (1 so far): the sink refused (fix: make it writable); the others go on; "
                      "tried again in 5s", True)]
    status = (pipe.controller.ckpt.etl / "status.json").read_text()
    assert '"quarantined"' in status and "the sink refused" in status


def test_run_goes_through_the_one_driver_for_one_type_and_a_fleet(tmp_path, monkeypatch):
    from event_etl.cli import main

    calls: list[tuple[list[str], bool]] = []

    def run(types, options, *, fleet, echo, **_):
        calls.append(([et.name for et in types], fleet))
        return {et.name: {"state": "stopped", "batches": 0, "totals": {}, "hours_marked": []} for et in types}

    monkeypatch.setattr(driver, "run", run)
    monkeypatch.setattr("event_etl.cli.job.require_extra", lambda *a: None)
    for name in ("a", "b"):
        make_event_type(tmp_path / "types", name)
    base = ["run", "--event-types", str(tmp_path / "types"), "--sink", str(tmp_path / "sink")]
    r = CliRunner().invoke(main, [*base, "a"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, [*base, "a", "b"])
    assert r.exit_code == 0 and "[fleet] run finished: exit 0" in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--all"])
    assert r.exit_code == 0, r.output
    assert calls == [(["a"], False), (["a", "b"], True), (["a", "b"], True)]


def test_engine_queries_is_refused_with_exit_2_and_engine_shared_changes_nothing(tmp_path, monkeypatch):
    """0.4 removed ``--engine queries``: ``run``, ``submit`` and the submitted driver refuse it before anything starts
    (an error line and a fix line, exit 2, no traceback); ``--engine shared``, the one engine, is taken silently."""
    from event_etl.cli import main
    from event_etl.cli.submitted import main as submitted_driver

    calls: list[RunOptions] = []

    def run(types, options, *, fleet, echo, **_):
        calls.append(options)
        return {et.name: {"state": "stopped", "batches": 0, "totals": {}, "hours_marked": []} for et in types}

    monkeypatch.setattr(driver, "run", run)
    monkeypatch.setattr("event_etl.cli.job.require_extra", lambda *a: None)
    make_event_type(tmp_path / "types", "page_view")
    types = ["--event-types", str(tmp_path / "types"), "--sink", str(tmp_path / "sink")]
    refused = [(main, ["run", "page_view", *types, "--engine", "queries"]),
               (main, ["submit", "page_view", *types, "--master", "local[1]", "--dry-run", "--engine", "queries"]),
               (submitted_driver, ["page_view", "--engine", "queries"])]
    for cmd, args in refused:
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 2, r.output
        assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output, r.output
        assert r.output.splitlines() == [
            "error: --engine queries was removed in 0.4: every job runs through the shared engine, which goes on "
            "from the checkpoint a query left (docs/upgrading.md)",
            "  fix: drop --engine (the shared engine is the one engine)"], r.output
    assert calls == [], "nothing ran"
    r = CliRunner().invoke(main, ["run", "page_view", *types, "--engine", "shared", "--quiet"])
    assert r.exit_code == 0 and r.output == "", r.output
    r = CliRunner().invoke(main, ["run", "page_view", *types, "--quiet"])
    assert r.exit_code == 0 and r.output == "", r.output
    assert len(calls) == 2 and calls[0] == calls[1] and not hasattr(calls[0], "engine")
