"""The stop protocol's parts without Spark: real signals to this process, a real controller for the fleet's drain."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from event_etl.job.stopping import (
    DRAIN_SIGNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    SAME_SIGNAL_S,
    Escalated,
    StopSignals,
    run_watched,
    wait_for,
)
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t


def _signal(sig: int, stops: StopSignals) -> None:
    before = len(stops.received)
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 5
    while len(stops.received) == before:  # the handler runs in the main thread at the next bytecode
        assert time.monotonic() < deadline, "the signal was not recorded"
        time.sleep(0.001)


def _apart() -> None:
    """Let the window in which the same signal again is the same request (through another path) pass."""
    time.sleep(SAME_SIGNAL_S + 0.1)


def test_handlers_only_record_and_the_first_signal_says_how_to_stop():
    old = signal.getsignal(signal.SIGINT)
    with StopSignals() as stops:
        assert stops.installed()
        _signal(signal.SIGINT, stops)  # no KeyboardInterrupt: recorded only
        assert stops.requested and stops.first == signal.SIGINT and not stops.drain and stops.escalation is None
        _signal(signal.SIGHUP, stops)  # a closing terminal may hang up more than once: never "at once"
        assert stops.escalation is None
        _apart()
        _signal(signal.SIGINT, stops)
        assert stops.escalation == signal.SIGINT and 128 + stops.escalation == EXIT_INTERRUPTED
    assert signal.getsignal(signal.SIGINT) == old, "the previous handlers are back"


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_plain_stop_does_not_drain_and_a_second_sigterm_stops_at_once(first):
    """Ctrl-C, SIGTERM and SIGHUP stop: the batch in flight finishes, no hour the watermark has not passed is marked
    (issue 50: a drain at every deploy marked the open hour early and its later events came late)."""
    with StopSignals() as stops:
        _signal(first, stops)
        assert stops.requested and not stops.drain and stops.escalation is None
        _apart()
        _signal(signal.SIGTERM, stops)
        assert stops.escalation == signal.SIGTERM and 128 + stops.escalation == EXIT_TERMINATED


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGHUP])
def test_drain_on_stop_makes_sigterm_and_sighup_drain_as_before_but_not_ctrl_c(first):
    with StopSignals(drain_on_stop=True) as stops:
        _signal(first, stops)
        assert stops.drain and stops.escalation is None
    with StopSignals(drain_on_stop=True) as stops:
        _signal(signal.SIGINT, stops)
        assert not stops.drain


def test_a_drain_request_drains_never_escalates_and_a_late_one_does_not_kill_the_process():
    before = signal.getsignal(DRAIN_SIGNAL)
    with StopSignals() as stops:
        stops.accept_drain_requests()
        assert stops.installed() and signal.getsignal(DRAIN_SIGNAL) == stops._record
        _signal(DRAIN_SIGNAL, stops)
        assert stops.requested and stops.drain and stops.escalation is None
        _apart()
        _signal(DRAIN_SIGNAL, stops)  # asked twice: still one drain, never "at once"
        assert stops.escalation is None
        _signal(signal.SIGTERM, stops)  # a stop after it: at once, the drain cut short
        assert stops.escalation == signal.SIGTERM
    with StopSignals() as stops:  # a plain stop first, a drain asked for before the job stopped reading: it drains
        stops.accept_drain_requests()
        _signal(signal.SIGTERM, stops)
        assert not stops.drain
        _signal(DRAIN_SIGNAL, stops)
        assert stops.drain and stops.escalation is None
    after = signal.getsignal(DRAIN_SIGNAL)
    assert after == (signal.SIG_IGN if before in (None, signal.SIG_DFL) else before), \
        "SIGUSR1's default ends a process: a drain asked of a job that is ending is ignored instead"
    os.kill(os.getpid(), DRAIN_SIGNAL)  # this process goes on
    if before not in (None, signal.SIG_DFL):
        signal.signal(DRAIN_SIGNAL, before)


def test_a_drain_request_is_heard_when_the_caller_installed_the_handlers_before_the_job():
    """A submitted driver installs its StopSignals itself, then runs the job (install_signals=False)."""
    stops = StopSignals().install()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as PySpark does when its SparkContext starts
        stops.accept_drain_requests()
        assert signal.getsignal(DRAIN_SIGNAL) == stops._record, "heard: SIGUSR1's default would end the driver"
    finally:
        stops.restore()


def test_one_signal_through_two_paths_at_once_is_one_request_and_a_later_one_is_a_second():
    """``timeout -s INT`` signals the process, then its group: one Ctrl-C, not "Ctrl-C twice" (which stopped the job
    without finishing the batch in flight, exit 130)."""
    with StopSignals() as stops:
        _signal(signal.SIGINT, stops)
        os.kill(os.getpid(), signal.SIGINT)  # the group's copy, a moment after
        time.sleep(0.05)
        assert stops.received == [signal.SIGINT] and stops.escalation is None, "one request"
        _apart()
        _signal(signal.SIGINT, stops)  # a person pressing Ctrl-C again
        assert stops.escalation == signal.SIGINT
    stops = StopSignals()
    stops.request(signal.SIGTERM)
    stops.request(signal.SIGTERM)
    assert stops.escalation == signal.SIGTERM, "a stop asked for in code is never merged"


def test_a_step_watched_by_the_main_loop_goes_on_after_one_signal_and_gives_way_to_a_second():
    release = threading.Event()
    with StopSignals() as stops:
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        threading.Timer(0.4, release.set).start()
        assert run_watched(lambda: release.wait(10) and "drained", stops) == "drained"  # one signal: it finishes
        assert stops.requested
        threading.Timer(0.7, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        with pytest.raises(Escalated) as err:
            run_watched(lambda: time.sleep(30), stops)  # the second: the main loop stops waiting at once
        assert err.value.signum == signal.SIGTERM and time.monotonic() - started < 5
        with pytest.raises(ValueError):
            run_watched(lambda: int("x"), StopSignals())  # the step's own error reaches the caller
    assert not wait_for(lambda: False, None, timeout=0.2)


def test_a_fleet_drains_every_type_it_can_and_reports_the_one_it_cannot(tmp_path, capsys):
    from event_etl.job.engine import FleetMember
    from event_etl.job.fleet import drain_all, summary_lines
    from event_etl.job.setup import Job

    clock = FakeClock(t("13:30"))
    members = []
    for name in ("stuck", "fine"):
        et = make_event_type(tmp_path / "types", name)
        pipe = LocalPipeline(tmp_path / name, et, clock)
        pipe.batch([click(f"{name}-{i}", "13:05") for i in range(3)])
        if name == "stuck":  # a batch begun and never finished (the job was killed in it)
            pipe.controller.begin_batch(1)
            pipe.restart()
            assert pipe.controller.pending_batch == 1
        m = FleetMember(et, prepared=None, job=Job(None, pipe.controller, None, ""), state="stopped")
        members.append((m, pipe))
    drain_all([m for m, _ in members], None, clock)
    (stuck, _), (fine, fine_pipe) = members
    assert stuck.state == "drain failed" and "batch 1" in stuck.drain_error
    assert fine.state == "stopped" and fine.drain_error is None
    assert (fine_pipe.sink / "fine" / "dt=2026-11-21" / "hour=13" / "_COMPLETE").exists(), "the other type drained"
    err = capsys.readouterr().err
    assert "[stuck] not drained:" in err and "fix:" in err
    status = stuck.status(clock)
    assert status["state"] == "drain failed" and status["last_error"] == stuck.drain_error
    line = summary_lines({"stuck": {**status, "stopped_by": "SIGTERM", "drained": False}})[0]
    assert line.endswith(f"stopped by SIGTERM, {stuck.drain_error}"), line
    json.dumps(status)  # what status.json holds


def _late_step(lease, proceed: threading.Event, outcome: dict, hold: float = 0.0):
    """A batch's driver side that goes on after a stop at once: its next write is a marker (guarded)."""
    from event_etl.errors import LeaseHeldError

    def step():
        proceed.wait(10)
        try:
            lease.guard()
            outcome["wrote"] = True
        except LeaseHeldError:
            outcome["refused"] = True
        time.sleep(hold)

    return step


def _stopped_at_once(step) -> StopSignals:
    stops = StopSignals()
    stops.request(signal.SIGTERM)
    stops.request(signal.SIGTERM)  # the second: stop at once
    with pytest.raises(Escalated):
        run_watched(step, stops)
    return stops


def test_a_stop_at_once_fences_the_step_it_left_running_before_releasing_the_locks(tmp_path):
    """A second SIGTERM leaves the batch's thread running; releasing the lease and the checkpoint lock at once let a
    restart write beside it.  Now its next write is refused, and the locks go once it has ended."""
    from event_etl.errors import LeaseHeldError
    from event_etl.job.setup import release_lease
    from event_etl.storage import Storage
    from event_etl.storage.lease import Lease
    from event_etl.timeutil import now_millis

    storage = Storage(str(tmp_path / "sink"))
    lease = Lease(storage, "click", tmp_path / "ck", now_millis).acquire()
    proceed, outcome = threading.Event(), {}
    stops = _stopped_at_once(_late_step(lease, proceed, outcome))
    with pytest.raises(LeaseHeldError):
        Lease(storage, "click", tmp_path / "ck", now_millis).acquire()  # the step still runs: the job holds on
    threading.Timer(0.3, proceed.set).start()
    release_lease(lease, stops)
    assert outcome == {"refused": True}, "the step's write after the stop is refused"
    Lease(storage, "click", tmp_path / "ck", now_millis).acquire().release()  # and now a restart may start


def test_a_step_that_does_not_end_keeps_the_locks_until_the_process_ends(tmp_path, monkeypatch):
    from event_etl.errors import LeaseHeldError
    from event_etl.job import stopping
    from event_etl.job.setup import release_lease
    from event_etl.storage import Storage
    from event_etl.storage.lease import Lease
    from event_etl.timeutil import now_millis

    monkeypatch.setattr(stopping, "LATE_STEP_WAIT_S", 0.3)
    storage = Storage(str(tmp_path / "sink"))
    lease = Lease(storage, "click", tmp_path / "ck", now_millis).acquire()
    proceed, outcome = threading.Event(), {}
    stops = _stopped_at_once(_late_step(lease, proceed, outcome))  # waits for `proceed`: longer than the wait
    release_lease(lease, stops)
    with pytest.raises(LeaseHeldError):
        Lease(storage, "click", tmp_path / "ck", now_millis).acquire()
    proceed.set()
    time.sleep(0.2)
    assert outcome == {"refused": True}
    lease._unlock()  # what the end of the process does


@pytest.mark.parametrize("fleet", [False, True], ids=["run", "run --all"])
def test_a_sigterm_while_the_job_takes_its_lease_is_recorded_not_fatal(tmp_path, monkeypatch, fleet):
    """After a SIGKILL on an object store, a restart waits out the dead run's lease before it starts: a SIGTERM then
    (a supervisor giving up on a slow start, ``systemctl stop``) must be obeyed as a stop (and a drain under
    ``--drain-on-stop``) once the job runs, not end the process as SIGTERM ends a program that has no handler."""
    from event_etl.job import driver
    from event_etl.job.setup import RunOptions

    seen: dict = {}

    def acquire(p, stops=None, echo=None):
        seen["installed"] = stops is not None and stops.installed()
        assert seen["installed"], "the stop handlers must be in before the lease is taken"
        _signal(signal.SIGTERM, stops)
        seen["received"] = list(stops.received)
        raise RuntimeError("the test ends the start here")

    monkeypatch.setattr(driver, "after_lease", acquire)  # once the lease is taken: its wait watches the signals
    before = signal.getsignal(signal.SIGTERM)
    stops = StopSignals()
    et = make_event_type(tmp_path / "types")
    options = RunOptions(sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck"), source=None if fleet else
                         f"dir:{tmp_path / 'in'}", drain_on_stop=True)
    (tmp_path / "in").mkdir()
    with pytest.raises(RuntimeError, match="ends the start here"):
        driver.run([et], options, fleet=fleet, stops=stops)
    assert seen["received"] == [signal.SIGTERM] and stops.drain
    assert signal.getsignal(signal.SIGTERM) == before, "a start that failed puts the previous handlers back"


def test_event_etl_drain_signals_the_job_holding_the_checkpoint_lock_and_says_what_to_do_without_one(tmp_path):
    """`event-etl drain TYPE` finds the running job as a second job and `status` do: by the checkpoint lock it holds
    (its host and pid written in it); SIGUSR1 makes that job drain and stop."""
    from click.testing import CliRunner

    from event_etl.cli import main
    from event_etl.job.drainrequest import lock_holder
    from event_etl.storage import Storage
    from event_etl.storage.lease import Lease
    from event_etl.timeutil import now_millis

    root = tmp_path / "checkpoints"
    r = CliRunner().invoke(main, ["drain", "click", "--checkpoint-root", str(root)])
    assert r.exit_code == 1 and "error: no job of click runs on checkpoint" in r.output and "fix:" in r.output, r.output
    lease = Lease(Storage(str(tmp_path / "sink")), "click", root / "click", now_millis).acquire()
    try:
        assert lock_holder(root / "click")["pid"] == os.getpid()
        with StopSignals() as stops:
            stops.accept_drain_requests()
            r = CliRunner().invoke(main, ["drain", "click", "--checkpoint-root", str(root)])
            assert r.exit_code == 0, r.output
            assert f"[click] asked pid {os.getpid()}" in r.output and "to drain and stop" in r.output
            deadline = time.monotonic() + 5
            while not stops.requested:
                assert time.monotonic() < deadline, "the drain request was not recorded"
                time.sleep(0.01)
            assert stops.drain and stops.first == DRAIN_SIGNAL
        r = CliRunner().invoke(main, ["drain", "click", "--checkpoint", str(root)])  # a fleet's --checkpoint ROOT
        assert r.exit_code == 0 and f"{root / 'click'}" in r.output, r.output
    finally:
        lease.release()
    assert lock_holder(root / "click") is None
    r = CliRunner().invoke(main, ["drain", "click", "--checkpoint", str(root / "click")])
    assert r.exit_code == 1 and "(it is stopped)" in r.output and "--once --drain" in r.output, r.output


@pytest.mark.parametrize("stopped_by, drained, how", [
    (None, False, "end of input"),
    ("end of input", True, "end of input, drained: every hour holding data is complete"),
    ("time limit", False, "time limit"),
    ("SIGINT", False, "stopped by Ctrl-C, not drained: the open hours stay open for the next run"),
    ("SIGTERM", False, "stopped by SIGTERM, not drained: the open hours stay open for the next run"),
    ("SIGTERM", True, "stopped by SIGTERM, drained: every hour holding data is complete"),
    ("SIGUSR1", True, "stopped by a drain request, drained: every hour holding data is complete"),
])
def test_the_last_line_of_a_run_says_its_exit_code_and_how_it_ended(stopped_by, drained, how):
    """The README promised the exit code in the last line, `run finished`; that line was the summary's first."""
    from event_etl.job.stopping import at_once_line, run_finished_line

    assert run_finished_line("page_view", stopped_by, drained) == f"[page_view] run finished: exit 0 ({how})"
    assert at_once_line("page_view", signal.SIGINT, [("page_view", 7)]).endswith("(exit 130)")
    assert at_once_line("fleet", signal.SIGTERM, []).endswith("continue (exit 143)")
