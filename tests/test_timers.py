"""The process's one scheduler of periodic duties (event_etl.util.timers): many types' renewals, no thread each."""

from __future__ import annotations

import threading
import time

from event_etl.util.timers import Timers, spread


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
