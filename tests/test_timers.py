"""The process's one scheduler of periodic duties (event_etl.util.timers): many types' renewals, no thread each."""

from __future__ import annotations

import threading
import time

from event_etl.util.timers import Timers, spread, workers_for


def test_duties_run_on_their_period_from_one_thread_until_they_end_or_are_cancelled():
    before = threading.active_count()
    timers = Timers(workers=2)
    runs: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    threads = set()

    def duty(name, stop_after=None):
        def run():
            runs[name].append(time.monotonic())
            threads.add(threading.current_thread().name)
            return None if stop_after is None else len(runs[name]) < stop_after
        return run

    a = timers.every(0.05, duty("a"), name="a", first_in=0)
    timers.every(0.05, duty("b", stop_after=3), name="b", first_in=0)
    c = timers.every(0.05, duty("c"), name="c", first_in=0)
    time.sleep(0.6)
    c.cancel()
    assert c.join(1)
    n_c = len(runs["c"])
    time.sleep(0.2)
    a.cancel()
    assert len(runs["b"]) == 3, "a duty that answers False runs no more"
    assert len(runs["c"]) == n_c, "a cancelled duty runs no more"
    assert len(runs["a"]) >= 8, runs["a"]
    gaps = [y - x for x, y in zip(runs["a"], runs["a"][1:])]
    assert min(gaps) >= 0.045, gaps
    assert all(name.startswith("event_etl-timer") for name in threads), threads
    assert threading.active_count() - before <= 3, "one scheduling thread and its two workers, however many duties"


def test_a_failing_duty_runs_again_and_does_not_stop_the_others():
    timers = Timers(workers=1)
    calls, others = [], []

    def failing():
        calls.append(1)
        raise OSError("the sink is unreachable")

    f = timers.every(0.02, failing, name="f", first_in=0)
    o = timers.every(0.02, lambda: others.append(1), name="o", first_in=0)
    time.sleep(0.3)
    f.cancel()
    o.cancel()
    assert len(calls) >= 3 and len(others) >= 3


def test_first_turns_spread_over_the_period_by_name():
    points = [spread(f"lease pv_{i:04d}/_LEASE", 15.0) for i in range(1000)]
    assert all(0 <= p < 15.0 for p in points)
    per_second = [sum(1 for p in points if s <= p < s + 1) for s in range(15)]
    assert max(per_second) < 120, per_second  # about 67 a second, not a thousand at once
    assert spread("lease x/_LEASE", 15.0) == spread("lease x/_LEASE", 15.0)


def _starts(runs: list[float]) -> list[float]:
    return [y - x for x, y in zip(runs, runs[1:])]


def test_a_turn_is_due_a_period_after_the_last_one_began_even_when_it_takes_most_of_it():
    """Fixed rate (issue 58): a renewal that takes 60 % of its period still comes every period.  Scheduled a period
    after the last turn *ended*, it came every 1.6 periods, and on a slow sink every type's lease aged past its TTL."""
    timers = Timers(workers=3)
    runs: dict[str, list[float]] = {n: [] for n in ("a", "b", "c")}

    def duty(name):
        def run():
            runs[name].append(time.monotonic())
            time.sleep(0.12)  # the sink answers slowly
        return run

    ts = [timers.every(0.2, duty(n), name=f"lease {n}") for n in runs]  # first turns spread over the period
    time.sleep(2.1)
    for tm in ts:
        tm.cancel()
    for tm in ts:
        assert tm.join(2)
    for name, starts in runs.items():
        gaps = sorted(_starts(starts))
        assert len(starts) >= 8, (name, starts)  # ended after the fact: 10 a duty in 2.1 s, 6 after its end
        assert gaps[0] >= 0.195, (name, gaps)  # never before its time
        assert gaps[len(gaps) // 2] < 0.26, (name, gaps)  # a period apart, not 0.32 (the period and the turn)


def test_an_overdue_turn_runs_at_once_and_once_not_a_burst_of_the_missed_ones():
    """A turn that took three and a half periods: the next begins as soon as it ends (it is overdue), and the one
    after a period later; the three periods missed meanwhile are not made up in a burst."""
    timers = Timers(workers=2)
    starts: list[float] = []

    def duty():
        starts.append(time.monotonic())
        if len(starts) == 1:
            time.sleep(0.7)

    tm = timers.every(0.2, duty, name="slow once", first_in=0)
    time.sleep(1.35)
    tm.cancel()
    assert tm.join(2)
    gaps = _starts(starts)
    assert len(gaps) >= 2, starts
    assert 0.7 <= gaps[0] < 0.8, gaps  # at once after the long turn, not a period after its end (0.9)
    assert all(g >= 0.195 for g in gaps[1:]), gaps  # then a period apart: no catch-up of the periods it missed


def _timer_threads() -> set[threading.Thread]:
    return {th for th in threading.enumerate() if th.name.startswith("event_etl-timer")}


def _run_blocked(n: int) -> tuple[int, int]:
    """``n`` duties due at once on a scheduler of default size, each waiting on the sink (an event) until released:
    (the most that ran at once, the scheduler's threads added)."""
    before = _timer_threads()
    timers = Timers()
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most

    def duty():
        with lock:
            running[0] += 1
            running[1] = max(running)
        release.wait(10)
        with lock:
            running[0] -= 1
        return False

    for i in range(n):
        timers.every(60, duty, name=f"lease pv_{i:04d}/_LEASE", first_in=0)
    expected = min(n, workers_for(n))
    deadline = time.monotonic() + 10
    while running[1] < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # anything more would have started by now
    added = len(_timer_threads() - before)
    most = running[1]
    release.set()
    return most, added


def test_the_workers_grow_with_the_duties_and_stay_few_for_a_few():
    """A renewal waits on the sink, not on a core: the workers grow with the leases (one for every five, 4 to 32),
    and are made only when turns overlap (a type or three: as many, not four or thirty-two)."""
    assert [workers_for(n) for n in (0, 1, 20, 21, 60, 100, 160, 1000)] == [4, 4, 4, 5, 12, 20, 32, 32]
    assert _run_blocked(60) == (12, 13), "12 workers for 60 leases (and the scheduling thread)"
    assert _run_blocked(200) == (32, 33), "at most 32 workers"
    assert _run_blocked(3) == (3, 4), "three workers for three leases at once"
    assert _run_blocked(1) == (1, 2), "one type: one worker and the scheduling thread"


def test_a_scheduler_given_its_workers_keeps_to_them():
    timers = Timers(workers=2)
    for i in range(50):
        timers.every(60, lambda: False, name=f"d{i}", first_in=60)
    assert timers.max_workers() == 2 and timers.pending() == 50
    assert Timers().max_workers() == 4
