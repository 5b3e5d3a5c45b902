"""event_etl.util.parallel: a step done for every type at once (a fleet's stop), every item tried."""

from __future__ import annotations

import threading
import time

import pytest

from event_etl.util.parallel import in_parallel


def test_every_item_is_done_at_once_and_the_call_returns_when_all_are():
    started, done = [], []
    barrier = threading.Barrier(10, timeout=5)  # only passes if all ten wait at the same time

    def slow(i: int) -> None:
        started.append(i)
        barrier.wait()
        time.sleep(0.05)
        done.append(i)

    in_parallel(slow, range(10), name="t")
    assert sorted(done) == list(range(10))


def test_every_item_is_tried_and_the_first_failure_in_order_is_raised():
    tried = []

    def fails_on_odd(i: int) -> None:
        tried.append(i)
        if i % 2:
            raise ValueError(f"item {i}")

    with pytest.raises(ValueError, match="item 1"):
        in_parallel(fails_on_odd, range(6), name="t")
    assert sorted(tried) == list(range(6))
