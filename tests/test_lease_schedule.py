"""A fleet's leases on a slow sink (issue 58): renewed at a fixed rate by enough workers, and a late one said."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from event_etl.errors import LeaseHeldError, StorageError
from event_etl.storage import Storage
from event_etl.storage.lease import LATE_LINE_EVERY_MS, Lease
from event_etl.timeutil import now_millis
from event_etl.util.timers import Timers
from tests.lib.harness import FakeClock, t


def by_hand(tmp_path, clock, ttl=20_000):
    """A lease taken, its turns in the schedule cancelled: the test takes them (``_renew_turn``) on its clock."""
    ls = Lease(Storage(str(tmp_path / "sink")), "click", tmp_path / "ck", clock, ttl_ms=ttl).acquire()
    assert ls._timer is not None
    ls._timer.cancel()
    assert ls._timer.join(5)
    return ls


def test_a_late_renewal_prints_one_warning_naming_the_type_how_late_and_the_fix(tmp_path):
    clock = FakeClock(t("13:00"))
    ls = by_hand(tmp_path, clock)  # TTL 20 s: renewed every 5 s, a margin of 5 s, lost at 15 s without a renewal
    said: list[str] = []
    ls.say = said.append  # the job's echo
    try:
        for step in (5_000, 5_000, 7_400):  # on time, then 2.4 s late: not half the margin
            clock.now += step
            assert ls._renew_turn()
        assert said == []
        clock.now += 8_600  # 3.6 s late
        assert ls._renew_turn()
        assert len(said) == 1, said
        line = said[0]
        assert line.startswith("[click] warning: its lease "), line
        assert "renewed 3.6s late: 8.6s after its last renewal, where one is due every 5s" in line, line
        assert "past 15s the lease is lost" in line, line
        assert "a faster sink, or a longer lease (EVENT_ETL_LEASE_TTL, now 20s" in line, line
        for _ in range(5):  # late again and again: still that one line
            clock.now += 9_000
            assert ls._renew_turn()
        assert len(said) == 1, said
        for _ in range(LATE_LINE_EVERY_MS // 5_000):  # on time for as long
            clock.now += 5_000
            assert ls._renew_turn()
        clock.now += 9_000  # late again, the window past: a line again, with what it did not say
        assert ls._renew_turn()
        assert len(said) == 2 and said[1].startswith("[click] warning: ") and "5 more late renewals of it" in said[1]
    finally:
        ls.release()


def test_given_no_echo_a_late_renewal_is_logged_as_a_warning(tmp_path, caplog):
    """A library caller that gives no ``say``: the line is a warning of the lease's logger (with no logging set up,
    Python prints it on stderr)."""
    clock = FakeClock(t("13:00"))
    ls = by_hand(tmp_path, clock)
    try:
        with caplog.at_level(logging.WARNING, logger="event_etl.storage.lease"):
            clock.now += 9_000
            assert ls._renew_turn()
        lines = [r.getMessage() for r in caplog.records if r.name == "event_etl.storage.lease"]
        assert len(lines) == 1 and lines[0].startswith("[click] warning: its lease ") and "4.0s late" in lines[0]
    finally:
        ls.release()


def test_a_renewal_late_after_failed_ones_says_they_failed(tmp_path, monkeypatch):
    clock = FakeClock(t("13:00"))
    ls = by_hand(tmp_path, clock)
    said: list[str] = []
    ls.say = said.append
    real = ls.storage.read_versioned
    try:
        def unreachable(rel):
            raise StorageError("the sink is unreachable")

        monkeypatch.setattr(ls.storage, "read_versioned", unreachable)
        clock.now += 5_000
        assert ls._renew_turn()  # failed: retried at the next turn
        monkeypatch.setattr(ls.storage, "read_versioned", real)
        clock.now += 5_000
        assert ls._renew_turn()
        assert len(said) == 1 and "renewed 5.0s late" in said[0], said
        assert "1 renewal failed in between (is the sink reachable?)" in said[0], said
    finally:
        ls.release()


class SlowSink:
    """The part of a sink a lease uses, in memory, each renewal's read taking ``slow`` seconds (a sink answering
    slowly: the GCS emulator while it lists, issue 58)."""

    local = False

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.lock = threading.Lock()
        self.slow = 0.0
        self.versions = 0

    def display(self, rel: str) -> str:
        return f"slow://{rel}"

    def read_versioned(self, rel: str) -> tuple[bytes, str] | None:
        time.sleep(self.slow)
        with self.lock:
            return self.objects.get(rel)

    def write_if(self, rel: str, data: bytes, version: str | None) -> bool:
        with self.lock:
            current = self.objects.get(rel)
            if (current[1] if current else None) != version:
                return False
            self.versions += 1
            self.objects[rel] = (data, str(self.versions))
            return True

    def delete(self, rel: str) -> None:
        with self.lock:
            self.objects.pop(rel, None)


def test_a_hundred_types_on_a_slow_sink_keep_their_leases(tmp_path, monkeypatch):
    """100 leases of a 2 s TTL (renewed every 0.5 s, lost past 1.5 s), each renewal 70 ms: 14 renewals under way
    at any time.  Four workers renewed each lease every 100 x 0.07 / 4 = 1.75 s at best, and every lease was lost
    (the campaign's run 17 at a quarter of the scale); 20 workers, at a fixed rate, keep every one."""
    timers = Timers()
    monkeypatch.setattr("event_etl.storage.lease.shared_timers", lambda: timers)
    sink = SlowSink()
    said: list[str] = []
    leases = []
    for i in range(100):
        ls = Lease(sink, f"pv_{i:04d}", tmp_path / f"ck{i}", now_millis, ttl_ms=2_000)  # type: ignore[arg-type]
        ls.say = said.append
        leases.append(ls.acquire())
    sink.slow = 0.07
    lost = []
    try:
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            for ls in leases:
                try:
                    ls.guard()
                except LeaseHeldError:
                    lost.append(ls.event_type)
            time.sleep(0.05)
    finally:
        sink.slow = 0.0
        for ls in leases:
            ls.release()
    assert timers.max_workers() == 4, "the leases released, the workers go back to four"
    assert not lost, f"{len(set(lost))} leases lost: {sorted(set(lost))[:5]}..."
    types = [line.split("]")[0] for line in said]  # late ones only on a loaded machine, and no flood:
    assert len(types) == len(set(types)), said  # at most a line a type


@pytest.mark.parametrize("n,workers", [(1, 4), (100, 20), (200, 32)])
def test_the_process_scheduler_is_sized_by_its_leases(tmp_path, monkeypatch, n, workers):
    timers = Timers()
    monkeypatch.setattr("event_etl.storage.lease.shared_timers", lambda: timers)
    sink = SlowSink()
    leases = [Lease(sink, f"pv_{i:04d}", tmp_path / f"ck{i}", now_millis).acquire()  # type: ignore[arg-type]
              for i in range(n)]
    try:
        assert timers.max_workers() == workers
    finally:
        for ls in leases:
            ls.release()
