"""A fleet's shared pullers (event_etl.sources.pubsub_pool): many subscriptions pulled in turns by a few threads,
under the spool's rules (durable, then acknowledged; what is pulled and not spooled at a stop handed back)."""

from __future__ import annotations

import threading
import time

from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from event_etl.sources.pubsub_pool import PullerPool
from event_etl.sources.spool import read_messages
from tests.lib.harness import t
from tests.lib.pubsub_service import CappedService, RealServiceLike


def _fetchers(tmp_path, services, pool, **settings):
    base = dict(streams=1, segment_messages=500, segment_age=0.1, ack_deadline=60, outage_timeout=5.0,
                pull_timeout=0.2, once_quiet=0.5)
    base.update(settings)
    return [Fetcher(f"projects/p/subscriptions/s{i}", tmp_path / f"spool{i}", settings=FetchSettings(**base),
                    client_factory=lambda s=s: s, pool=pool) for i, s in enumerate(services)]


def _spooled(tmp_path, i):
    ids = []
    for seg in sorted((tmp_path / f"spool{i}" / "segments").glob("*.seg")):
        ids.extend(mid for _, mid, _, _, _ in read_messages(seg))
    return ids


def _wait(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_forty_subscriptions_are_pulled_by_three_threads_every_message_spooled_once_and_acknowledged(tmp_path):
    services = [RealServiceLike(wait=0.01) for _ in range(40)]
    for i, s in enumerate(services):
        for k in range(3 + i % 5):
            s.publish(f"m{i}-{k}".encode(), t("13:00") + k)
    before = threading.active_count()
    pool = PullerPool(workers=3)
    fetchers = [f.start() for f in _fetchers(tmp_path, services, pool)]
    try:
        _wait(lambda: all(len(_spooled(tmp_path, i)) == len(s.acked) == 3 + i % 5 for i, s in enumerate(services)))
        assert threading.active_count() - before <= 3, "no thread per subscription: the pool's three"
        for i, s in enumerate(services):
            ids = _spooled(tmp_path, i)
            assert len(ids) == len(set(ids)), "each message spooled once"
            assert set(ids) == s.acked, "acknowledged once durable, and only then"
        services[7].publish(b"late", t("13:10"))  # a quiet subscription is pulled again, within the idle pause
        _wait(lambda: len(_spooled(tmp_path, 7)) == 3 + 7 % 5 + 1)
    finally:
        for f in fetchers:
            f.request_stop()
        for f in fetchers:
            f.stop(timeout=5)
    assert not any(r.is_alive() for f in fetchers for r in f._threads), "every stream ended at the stop"


def test_a_busy_subscription_does_not_starve_the_others(tmp_path):
    busy = CappedService(cap=50, wait=0.01)
    for k in range(3000):
        busy.publish(b"x", t("13:00") + k)
    quiet = [RealServiceLike(wait=0.01) for _ in range(5)]
    for s in quiet:
        s.publish(b"one", t("13:00"))
    pool = PullerPool(workers=1)  # one thread: turns strictly one after the other
    fetchers = [f.start() for f in _fetchers(tmp_path, [busy, *quiet], pool)]
    try:
        _wait(lambda: all(len(s.acked) == 1 for s in quiet))
        assert len(busy.acked) < 3000, "the small ones were served while the big one still had a backlog"
        _wait(lambda: len(busy.acked) == 3000)
    finally:
        for f in fetchers:
            f.stop(timeout=5)


def test_a_stop_hands_back_what_a_turn_pulled_and_could_not_spool(tmp_path):
    service = RealServiceLike(wait=0.01)
    for k in range(10):
        service.publish(b"x", t("13:00") + k)
    pool = PullerPool(workers=1)
    (f,) = _fetchers(tmp_path, [service], pool)
    f.start()
    _wait(lambda: len(service.acked) == 10)
    f.stop(timeout=5)
    assert not f._threads[0].is_alive()
    assert not service.leased, "nothing left leased at the service"


def test_the_spools_oldest_publish_time_reads_only_segments_new_or_grown_since_the_last_look(tmp_path, monkeypatch):
    """A renewal of a fleet's lease asks it every 15 s for every type: a look reads the folder, not every segment."""
    from event_etl.sources.spool import folder
    from event_etl.sources.spool.folder import Spool
    from event_etl.sources.spool.segment import SegmentName
    from tests.lib.pubsub_service import response

    spool = Spool(tmp_path / "spool")
    spool.write_segment(SegmentName("0000000a", 0, 1, 2), [response(0, 2, published=t("13:05"))])
    spool.write_segment(SegmentName("0000000a", 0, 2, 2), [response(2, 2, published=t("13:01"))])
    reads = []
    real = folder.publish_range
    monkeypatch.setattr(folder, "publish_range", lambda path: reads.append(path) or real(path))
    assert spool.oldest_publish_ms() == t("13:01")
    assert len(reads) == 2
    assert spool.oldest_publish_ms() == t("13:01") and len(reads) == 2, "nothing new: no segment read"
    (spool.segdir / SegmentName("0000000a", 0, 2, 2).name).unlink()  # its batch committed
    assert spool.oldest_publish_ms() == t("13:05") and len(reads) == 2
    spool.write_segment(SegmentName("0000000a", 0, 3, 1), [response(4, 1, published=t("12:59"))])
    assert spool.oldest_publish_ms() == t("12:59") and len(reads) == 3, "only the new one read"


def test_the_applications_bound_is_shared_fairly_among_the_types_that_hold_messages(tmp_path):
    """Over the fleet's bound, a type pulls only below its share: a backlog cannot take the room the others need."""
    pool = PullerPool(workers=1, max_held_messages=100, max_held_bytes=1 << 30)

    class Holding:
        def __init__(self, n):
            self.n = n

        def held_totals(self):
            return self.n, self.n

    big, small, idle = Holding(90), Holding(20), Holding(0)
    for h in (big, small, idle):
        pool.join(h)
    assert not pool.room_for(big), "110 held, over the bound: the big one holds more than its share (55)"
    pool._totals = (0.0, {})  # look again
    assert pool.room_for(small), "below its share"
    pool._totals = (0.0, {})
    assert pool.room_for(idle), "a type holding nothing may pull"
    pool.leave(big)
    pool._totals = (0.0, {})
    assert pool.room_for(small), "under the bound again: every type pulls"


def test_a_trickle_is_pulled_once_a_segment_age_not_a_segment_a_message(tmp_path):
    """300 types at 10 events/s each kept a fleet's pullers busy (issue 58, bench/RESULTS.md "fleet-scale-live"):
    a pooled stream pulled again at once after a pull of a few messages, each pull a segment of its own with its
    fsyncs and an acknowledgement.  Now a pull that drained the subscription waits ``segment_age`` before the next:
    a message every 20 ms for 2 s is a handful of segments, every message spooled once and soon."""
    service = RealServiceLike(wait=0.01)
    pool = PullerPool(workers=2)
    (f,) = _fetchers(tmp_path, [service], pool, segment_age=0.5)
    f.start()
    try:
        for k in range(100):
            service.publish(f"m{k}".encode(), t("13:00") + k)
            time.sleep(0.02)
        published = time.monotonic()
        _wait(lambda: len(_spooled(tmp_path, 0)) == 100, timeout=10)
        took = time.monotonic() - published
        segments = len(list((tmp_path / "spool0" / "segments").glob("*.seg")))
    finally:
        f.stop(timeout=5)
    ids = _spooled(tmp_path, 0)
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 100, "each message spooled once"
    assert segments <= 12, f"{segments} segments for 2 s of a trickle (a pull every segment_age: about 5)"
    assert f.requests["pull"] <= 20
    assert took < 3.0, f"the last message spooled {took:.1f} s after it was published"
