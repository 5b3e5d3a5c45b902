"""event_etl.util.retry (on tenacity) does what the hand-written backoff loops it replaced did: the same waits, the
same deadline, the same errors retried, logged and raised."""

from __future__ import annotations

import logging

import pytest

from event_etl.errors import StorageError
from event_etl.util.retry import exponential_backoff, retry_call


@pytest.mark.parametrize("first, cap", [(0.25, 8.0), (0.5, 10.0), (5.0, 300.0), (2.0, 300.0), (0.0, 300.0),
                                        (0.1, 1.0)])
def test_the_backoff_doubles_from_first_up_to_cap(first, cap):
    assert [exponential_backoff(n, first=first, cap=cap) for n in range(1, 40)] == \
        [min(cap, first * 2 ** (n - 1)) for n in range(1, 40)]
    assert exponential_backoff(10_000, first=first, cap=cap) == (cap if first else 0.0)  # no overflow


def test_the_loops_schedules_are_kept():
    """The formulas the loops had: the storage's (0.25 s doubled up to 8 s), a schedule of 0.5 s doubled up to 10 s
    (the Pub/Sub fetcher's before it waited by the failure's age), the fleet's (from its failures)."""
    from event_etl.job.fleet import backoff_seconds

    delay, storage = 0.25, []
    for _ in range(12):
        storage.append(delay)
        delay = min(delay * 2, 8.0)
    assert [exponential_backoff(n, first=0.25, cap=8.0) for n in range(1, 13)] == storage
    assert [exponential_backoff(k + 1, first=0.5, cap=10.0) for k in range(60)] == \
        [min(10.0, 0.5 * 2 ** min(5, k)) for k in range(60)]
    for first in (None, 0.0, 1.5, 5.0):
        base = 5.0 if first is None else first
        assert [backoff_seconds(f, first) for f in range(0, 30)] == \
            [min(300.0, base * 2 ** max(0, f - 1)) for f in range(0, 30)]


class FakeClock:
    """time.monotonic and time.sleep: sleeping moves the clock; each call costs ``cost`` seconds."""

    def __init__(self, monkeypatch, cost: float = 0.0):
        import time

        self.now, self.cost, self.slept = 1000.0, cost, []
        monkeypatch.setattr(time, "monotonic", lambda: self.now)
        monkeypatch.setattr(time, "sleep", self.sleep)

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def call(self, outcomes):
        """A function failing with each exception of ``outcomes`` in turn, then returning "ok"."""
        it = iter(outcomes)

        def fn():
            self.now += self.cost
            err = next(it, None)
            if err is not None:
                raise err
            return "ok"

        return fn


def _reference(fn, *, retryable, deadline, what, log):
    """The storage's loop as it was written by hand (before tenacity), for comparison."""
    import time

    delay = 0.25
    while True:
        try:
            return fn()
        except Exception as err:
            if not retryable(err):
                raise
            if time.monotonic() + delay > deadline:
                raise StorageError(f"{what}: unreachable ({err})") from err
            log.append(f"{what} failed ({err}); retrying in {delay:.1f}s")
            time.sleep(delay)
            delay = min(delay * 2, 8.0)


def _helper(fn, *, retryable, deadline, what, log):
    def give_up(err):
        raise StorageError(f"{what}: unreachable ({err})") from err

    return retry_call(fn, retryable=retryable, first=0.25, cap=8.0, deadline=deadline,
                      on_retry=lambda err, d: log.append(f"{what} failed ({err}); retrying in {d:.1f}s"),
                      on_give_up=give_up)


def _run(impl, monkeypatch, outcomes, budget, cost):
    clock = FakeClock(monkeypatch, cost)
    log: list[str] = []
    try:
        got = impl(clock.call(outcomes), retryable=lambda e: isinstance(e, ConnectionError),
                   deadline=clock.now + budget, what="reading x", log=log)
    except BaseException as err:  # noqa: BLE001 - compared
        cause = err.__cause__
        got = (type(err).__name__, str(err), type(cause).__name__ if cause else None)
    return got, clock.slept, log, clock.now


@pytest.mark.parametrize("failures", [0, 1, 3, 7, 40])
@pytest.mark.parametrize("budget", [0.0, 0.2, 1.0, 7.75, 120.0])
@pytest.mark.parametrize("cost", [0.0, 0.3])
def test_retry_call_waits_logs_and_gives_up_as_the_storage_loop_did(monkeypatch, failures, budget, cost):
    outcomes = [ConnectionError(f"refused {i}") for i in range(failures)]
    assert _run(_helper, monkeypatch, outcomes, budget, cost) == _run(_reference, monkeypatch, outcomes, budget, cost)


@pytest.mark.parametrize("err", [KeyError("refused by retryable"), KeyboardInterrupt()])
def test_an_error_not_retried_is_raised_at_once_as_it_is(monkeypatch, err):
    clock = FakeClock(monkeypatch)
    with pytest.raises(type(err)) as info:
        retry_call(clock.call([ConnectionError("a"), err]), retryable=lambda e: not isinstance(e, LookupError),
                   first=0.25, cap=8.0, deadline=clock.now + 100)
    assert info.value is err and clock.slept == [0.25]


def test_without_on_give_up_the_last_error_is_raised(monkeypatch):
    clock = FakeClock(monkeypatch)
    last = ConnectionError("last")
    with pytest.raises(ConnectionError) as info:
        retry_call(clock.call([ConnectionError("first"), last]), retryable=lambda e: True, first=1.0, cap=8.0,
                   deadline=clock.now + 2.5)
    assert info.value is last and clock.slept == [1.0]


def test_the_storage_retries_transient_errors_logs_each_and_then_says_unreachable(tmp_path, monkeypatch, caplog):
    """Storage._retry through the helper: a gs:// sink's waits, its log lines (logger ``event_etl.storage``),
    its StorageError after the budget; a permanent error at once."""
    from event_etl.storage import Storage

    monkeypatch.setenv("EVENT_ETL_STORAGE_RETRY_SECONDS", "4")
    st = Storage(str(tmp_path / "sink"))
    st.local = False  # as on gs://
    clock = FakeClock(monkeypatch)
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageError, match=r"reading x: the storage was unreachable for 4s \(ConnectionError: no"):
        st._retry("reading x", clock.call([ConnectionError("no")] * 10))
    assert clock.slept == [0.25, 0.5, 1.0, 2.0]  # the next, 4 s, would end after the budget
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("event_etl.storage", f"reading x failed (no); retrying in {d}s") for d in ("0.2", "0.5", "1.0", "2.0")]
    assert st._retry("reading y", clock.call([ConnectionError("once")])) == "ok"
    with pytest.raises(FileNotFoundError):
        st._retry("reading z", clock.call([FileNotFoundError("z")]))
