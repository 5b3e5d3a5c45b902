"""A fleet's shared pullers on Google's Pub/Sub emulator: many subscriptions, a few threads, pulls sent without
waiting (a quiet subscription's pull waits in the service, not in a puller), every message spooled once."""

from __future__ import annotations

import threading
import time

from google.cloud import pubsub_v1

from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from event_etl.sources.pubsub_pool import PullerPool
from event_etl.sources.spool import read_messages

PROJECT = "pool-project"


def _subscriptions(n: int, per: int) -> list[str]:
    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    names = []
    stamp = time.monotonic_ns()
    for i in range(n):
        topic = pub.topic_path(PROJECT, f"t{stamp}-{i}")
        name = sub.subscription_path(PROJECT, f"s{stamp}-{i}")
        pub.create_topic(name=topic)
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=30)
        for k in range(per):
            pub.publish(topic, f"m{i}-{k}".encode()).result()
        names.append(name)
    return names


def _spooled(folder) -> list[str]:
    return [mid for seg in sorted((folder / "segments").glob("*.seg")) for _, mid, _, _, _ in read_messages(seg)]


def test_forty_subscriptions_drain_on_four_pullers_every_message_once(tmp_path, pubsub_server):
    subs = _subscriptions(40, 5)
    settings = dict(streams=1, segment_age=0.5, pull_timeout=3.0, once_quiet=1.0)
    pool = PullerPool(workers=4)
    before = threading.active_count()
    fetchers = [Fetcher(s, tmp_path / f"spool{i}", settings=FetchSettings(**settings), once=True, pool=pool)
                for i, s in enumerate(subs)]
    started = time.monotonic()
    for f in fetchers:
        f.start()
    try:
        deadline = time.monotonic() + 120
        while not all(f.spool.drained() for f in fetchers):
            assert time.monotonic() < deadline, "not every subscription drained in 120 s"
            time.sleep(0.2)
        took = time.monotonic() - started
        grown = threading.active_count() - before
    finally:
        for f in fetchers:
            f.request_stop()
        for f in fetchers:
            f.stop(timeout=10)
    for i in range(len(fetchers)):
        ids = _spooled(tmp_path / f"spool{i}")
        assert len(ids) == 5 == len(set(ids)), f"subscription {i}: {ids}"
    # the quiet pulls that end a drain wait in the emulator, not in the four pullers: forty of them at once
    assert took < 25, f"drained in {took:.1f} s (four pullers waiting on eighty quiet pulls of 2 s would take 40)"
    assert grown <= 4 + 4 + 8, f"{grown} threads more: the pool's four, its drained-markers, gRPC's"


def test_a_stop_cancels_the_pulls_in_flight_and_returns_at_once(tmp_path, pubsub_server):
    subs = _subscriptions(10, 0)  # quiet: every stream's pull waits in the service
    pool = PullerPool(workers=2)
    fetchers = [Fetcher(s, tmp_path / f"spool{i}", settings=FetchSettings(streams=1, pull_timeout=10.0), pool=pool)
                for i, s in enumerate(subs)]
    for f in fetchers:
        f.start()
    time.sleep(2.0)  # every stream sent its long pull
    t0 = time.monotonic()
    for f in fetchers:
        f.request_stop()
    for f in fetchers:
        f.stop(timeout=10)
    took = time.monotonic() - t0
    assert took < 5, f"stopped in {took:.1f} s: the pulls in flight were waited for"
    assert not any(r.is_alive() for f in fetchers for r in f._threads)
