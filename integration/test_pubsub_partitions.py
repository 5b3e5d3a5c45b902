"""Pulling Pub/Sub on the executors (``EVENT_ETL_PUBSUB_FETCH_PARTITIONS``), against the emulator.

The job runs as users run it (a separate ``event-etl run`` process, local Spark with two
cores, the GCS emulator as sink); one fetch partition takes one of the cores for the whole
run, and the batches run on the other.  The result must be what the driver's puller gives:
every event once in its hour, every hour marked on a drain, nothing left unacknowledged.
"""

from __future__ import annotations

from collections import Counter

from event_etl.timeutil import HOUR_MS, now_millis


def test_pulling_on_an_executor_delivers_every_message_once_and_acknowledges_them(scenario):
    s = scenario
    s.env["EVENT_ETL_PUBSUB_FETCH_PARTITIONS"] = "1"
    s.env["EVENT_ETL_PUBSUB_STREAMS"] = "1"  # the emulator's delivery order: hours published in order stay timely
    now = now_millis()
    h0 = now - now % HOUR_MS - 3 * HOUR_MS
    events = [s.event(h0 + i * 3_000, "timely") for i in range(2400)]  # two hours, in order
    retries = [dict(e, kind="duplicate") for e in events[-5:]]
    s.publish(events + retries)
    r = s.run("--once", "--drain")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 fetch partitions on executors" in r.stdout, r.stdout
    assert "acknowledged 2,405" in r.stdout, "every message pulled is acknowledged, the retries too"

    content = s.sink_content()
    s.check_manifests(content)
    ids = Counter(i for e in content.values() for i in e["timely"] + e["late"])
    assert set(ids) == {e["id"] for e in events} and max(ids.values()) == 1, "every event once"
    assert all(e["marker"] is not None for e in content.values()), "drained: every hour marked"

    again = s.run("--once")  # nothing is delivered again: everything was acknowledged
    assert again.returncode == 0, again.stdout + again.stderr
    assert "pulled 0," in again.stdout, again.stdout


def test_fetch_partitions_that_would_take_every_core_are_refused_with_the_fix(scenario):
    s = scenario
    s.env["EVENT_ETL_PUBSUB_FETCH_PARTITIONS"] = "2"  # local[2]: no core left for the batches
    r = s.run("--once")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "EVENT_ETL_PUBSUB_FETCH_PARTITIONS=2" in r.stderr and "set it below 2" in r.stderr, r.stderr


def test_the_fetch_partitions_of_a_fleet_count_together_against_the_cores(spark, tmp_path):
    # two Pub/Sub types of one application (a fleet), one fetch partition each, on local[2]: the second would
    # take the last core and the batches of every type would wait for ever
    import pytest

    from event_etl.errors import UsageError
    from event_etl.sources.pubsub_fetch import FetchSettings
    from event_etl.sources.pubsub_partitions import ExecutorFetcher

    def fetcher(name):
        return ExecutorFetcher(f"projects/p/subscriptions/{name}", tmp_path / name, spark=spark,
                               settings=FetchSettings(fetch_partitions=1))

    first = fetcher("a")
    try:
        with pytest.raises(UsageError) as e:
            fetcher("b")
        assert "other event types of this application take 1 more" in e.value.message
        assert "set it to 0 (pull in the driver)" in e.value.fix
    finally:
        first.stop()
    fetcher("c").stop()  # the first one's core is free again once it stopped
