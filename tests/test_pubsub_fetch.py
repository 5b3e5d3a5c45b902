"""The Pub/Sub source off the trigger's path: background pulling into spool segments, flow control,
bulk acknowledgement, and what the real service does that the emulator does not.

The subscriber client here is a fake that behaves as the real service does where the
emulator differs: a pull on an empty subscription runs out with ``DeadlineExceeded``
instead of returning an empty list.  The emulator itself is used in integration/.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

from google.api_core import exceptions as ex
from google.pubsub_v1.types import PullResponse

from event_etl.sources.pubsub import ERROR_FILE, PubSubPlanner
from event_etl.sources.pubsub_fetch import DRAINED, FetchSettings
from event_etl.sources.spool import ack_ids, read_messages, segment_count
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, read_sink, t
from tests.lib.pubsub_service import SUB, RealServiceLike, fetcher, segments
from tests.lib.waiting import wait_until


def test_messages_are_pulled_in_the_background_into_durable_segments(tmp_path):
    svc = RealServiceLike()
    for i in range(1234):
        svc.publish(b'{"n": %d}' % i, t("13:00") + i)
    f = fetcher(tmp_path, svc).start()
    try:
        wait_until(lambda: sum(segment_count(p.name) for p in segments(tmp_path)) == 1234, what="every message spooled")
        got = [(mid, data) for p in segments(tmp_path) for _, mid, _, _, data in read_messages(p)]
        assert sorted(int(m) for m, _ in got) == list(range(1, 1235))
        assert f.activity().backlog == 1234 and not f.activity().retrying
        # the quiet subscription answers every pull with DeadlineExceeded, as the real service does:
        # empty, not an outage
        wait_until(lambda: svc.calls["pull"] > 10, what="pulls on the empty subscription")
        assert f.error is None and not f.activity().retrying
        assert f.ack({p.name for p in segments(tmp_path)}) is True
        assert len(svc.acked) == 1234 and f.activity().backlog == 0
    finally:
        f.stop()


def test_the_last_messages_before_a_pause_are_spooled_while_the_next_pull_waits(tmp_path):
    # a pull on a quiet subscription waits (here 3 s, as for pull_timeout on the real service): what the
    # stream pulled before it is written once it is segment_age old, not when that pull gives up
    svc = RealServiceLike(wait=3.0)
    for i in range(10):
        svc.publish(b'{"n": %d}' % i, t("13:00") + i)
    f = fetcher(tmp_path, svc, streams=1, segment_age=0.1, pull_timeout=3.0).start()
    try:
        wait_until(lambda: sum(segment_count(p.name) for p in segments(tmp_path)) == 10, timeout=1.5,
                   what="the 10 messages spooled while the next pull waits")
        assert svc.calls["pull"] == 2  # the one that brought them, and the one still waiting
    finally:
        f.stop()


def test_committed_acknowledgements_and_deadline_extensions_go_in_bulk(tmp_path):
    svc = RealServiceLike()
    for _i in range(6000):
        svc.publish(b"x", t("13:00"))
    f = fetcher(tmp_path, svc, streams=1, segment_messages=6000, segment_age=5.0, ack="committed").start()
    try:
        wait_until(lambda: len(segments(tmp_path)) == 1, what="one segment of 6000")
        assert f.ack({segments(tmp_path)[0].name})
        assert svc.ack_sizes == [2500, 2500, 1000], "at most 2,500 ids a request"
        stats = f.stats()
        assert stats["requests_per_1000"] < 5
    finally:
        f.stop()


def test_flow_control_bounds_what_is_held(tmp_path):
    svc = RealServiceLike()
    for _i in range(10_000):
        svc.publish(b"x" * 100, t("13:00"))
    f = fetcher(tmp_path, svc, max_held_messages=2_000, segment_messages=500).start()
    try:
        wait_until(lambda: sum(segment_count(p.name) for p in segments(tmp_path)) >= 2_000, what="the first 2,000")
        time.sleep(0.5)
        held = sum(segment_count(p.name) for p in segments(tmp_path))
        assert held <= 2_000 + 2 * 1_000, "a stream stops pulling once the bound is reached (one pull over at most)"
        assert len(svc.queue) > 5_000, "the rest stays in the subscription"
        waiting = len(svc.queue)
        f.ack({p.name for p in segments(tmp_path)})
        for p in segments(tmp_path):
            p.unlink()  # what the planner does once Spark committed the batch
        wait_until(lambda: len(svc.queue) <= waiting - 1_000, what="pulling again after the acknowledgement")
    finally:
        f.stop()


def test_an_outage_is_not_quiet_and_ends_with_a_clear_error(tmp_path):
    svc = RealServiceLike()
    svc.outage = True
    f = fetcher(tmp_path, svc, outage_timeout=1.0).start()
    try:
        wait_until(lambda: f.activity().retrying, what="the outage reported")
        wait_until(lambda: f.error is not None, timeout=15, what="giving up after the outage budget")
        # the error is known in memory first (event_etl.sources.live), its file written just after
        wait_until((tmp_path / "spool" / ERROR_FILE).exists, timeout=15, what="the error file")
        doc = json.loads((tmp_path / "spool" / ERROR_FILE).read_text())
        assert "unreachable" in doc["message"] and SUB in doc["message"] and "restarted" in doc["fix"]
    finally:
        f.stop()


def test_a_pull_that_runs_out_while_the_service_is_unreachable_is_an_outage(tmp_path):
    svc = RealServiceLike()
    svc.blackhole = True  # every call runs out: the subscription may not be empty at all
    f = fetcher(tmp_path, svc, outage_timeout=30.0).start()
    try:
        wait_until(lambda: f.activity().retrying, what="an outage, not a quiet subscription")
    finally:
        f.stop()


def test_once_stops_when_the_subscription_stayed_empty(tmp_path):
    svc = RealServiceLike()
    for _i in range(700):
        svc.publish(b"x", t("13:00"))
    f = fetcher(tmp_path, svc, once=True).start()
    try:
        wait_until(lambda: (tmp_path / "spool" / "segments" / DRAINED).exists(), what="DRAINED")
        assert sum(segment_count(p.name) for p in segments(tmp_path)) == 700
        pulls = svc.calls["pull"]
        time.sleep(0.3)
        assert svc.calls["pull"] == pulls, "no pulls after the subscription was found empty"
    finally:
        f.stop()


def test_the_planner_offers_what_was_spooled_and_a_replay_gets_the_same_splits(tmp_path):
    svc = RealServiceLike()
    for _i in range(1500):
        svc.publish(b"x", t("13:00"))
    f = fetcher(tmp_path, svc, once=True).start()
    try:
        p = PubSubPlanner(SUB, str(tmp_path / "spool"), max_messages=1000, clock=FakeClock(t("13:00")))
        p.prepare_available_now()
        start = p.initial_offset()
        end = p.latest_offset(start, None)
        assert end["seg"] > start["seg"]
        splits = p.splits(start, end)
        again = PubSubPlanner(SUB, str(tmp_path / "spool"), max_messages=1000, clock=FakeClock(t("13:00")))
        assert again.splits(start, end) == splits
        total = 0
        offset = start
        while True:
            nxt = p.latest_offset(offset, None)
            if nxt == offset:
                break
            total += sum(s.end for s in p.splits(offset, nxt))
            p.commit(nxt)
            offset = nxt
        assert total == 1500, "--once ends after every message, once the subscription stayed empty"
        assert not segments(tmp_path), "committed segments are deleted"
    finally:
        f.stop()


def test_through_the_job_redeliveries_are_dropped_and_saved_batches_acknowledged(tmp_path):
    """The real executor and controller over spooled segments: a message delivered twice is written once,
    and a batch's messages are acknowledged as soon as it is saved."""
    from event_etl.sources.splits import Split

    svc = RealServiceLike()
    et = make_event_type(tmp_path / "types")
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:30")))
    f = fetcher(tmp_path, svc, streams=1, segment_age=0.05)
    from event_etl.sources.face import Hooks

    p.controller.source = Hooks(on_acknowledge=f.ack)
    svc.publish(click("a", "13:10"), t("13:20"))
    svc.publish(click("b", "13:11"), t("13:20"))
    f.start()
    try:
        wait_until(lambda: len(segments(tmp_path)) == 1, what="a segment")
        first = segments(tmp_path)[0]
        ev = p.controller.run_batch(
            0, p.task_runner([Split(0, "seg", "", 0, 2, 0, json.dumps([[str(first), 0, 2, 0]]))])
        )
        assert ev.result.counts == {"timely": 2} and len(svc.acked) == 2, "acknowledged when saved"
        # the same two messages again (a redelivery after a crash before the acknowledgement)
        redelivered = tmp_path / "again.seg"
        redelivered.write_bytes(first.read_bytes())
        ev = p.controller.run_batch(
            1, p.task_runner([Split(0, "seg", "", 0, 2, 0, json.dumps([[str(redelivered), 0, 2, 0]]))])
        )
        assert ev.result.counts == {"duplicate": 2}
        assert sorted(i for hc in read_sink(p.sink, "click").values() for i in hc.timely) == ["a", "b"]
        assert ack_ids(first)
    finally:
        f.stop()


# -- fetch partitions (pulling on executors): the task's side, with the real service's behaviour --------------
def _run_partition(tmp_path, svc, *, partitions=2, max_held=2000, once=False, run="a1b2c3d4", partition=1,
                   ack="committed"):
    from event_etl.sources.pubsub_partitions import FetchJob, fetch_partition

    (tmp_path / "spool" / "segments").mkdir(parents=True, exist_ok=True)
    settings = dict(streams=1, max_held_messages=max_held, segment_messages=200, segment_age=0.05, ack_deadline=60,
                    outage_timeout=5.0, pull_timeout=0.2, once_quiet=0.5, ack=ack)
    out: dict = {}

    def body():
        out["status"] = fetch_partition(FetchJob(SUB, str(tmp_path / "spool"), partitions, settings, run, once=once),
                                        partition, client_factory=lambda: svc, report_every=0.05)

    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th, out


def _spooled(tmp_path):
    return sum(segment_count(p.name) for p in segments(tmp_path))


def test_a_fetch_partition_holds_at_most_its_share_until_the_driver_acknowledges(tmp_path):
    from event_etl.sources.pubsub_partitions import STOP, acknowledge_segments

    svc = RealServiceLike()
    for i in range(3000):
        svc.publish(b'{"n": %d}' % i, t("13:00") + i)
    th, out = _run_partition(tmp_path, svc, partitions=2, max_held=1000)  # its share: 500
    try:
        wait_until(lambda: _spooled(tmp_path) >= 500, what="the partition's share spooled")
        time.sleep(0.5)
        held = _spooled(tmp_path)
        assert 500 <= held < 500 + 200 + 1000, "a partition stops pulling at its share (plus one pull in flight)"
        assert svc.acked == set(), "nothing acknowledged before a batch saved it"
        # segments carry stream numbers of their partition: partition 1 of streams=1 writes stream 01
        assert {SegmentName_stream(p.name) for p in segments(tmp_path)} == {1}
        acked_total = 0
        deadline = time.monotonic() + 20
        while len(svc.acked) < 3000 and time.monotonic() < deadline:  # the driver: batch saved -> acknowledge
            names = [p.name for p in segments(tmp_path)]
            n, ok = acknowledge_segments(svc, SUB, tmp_path / "spool" / "segments", names, Counter())
            assert ok
            acked_total += n
            time.sleep(0.1)
        assert len(svc.acked) == 3000, "once acknowledged, the partition pulls the rest"
        assert acked_total == 3000, "a segment marked acknowledged is not acknowledged twice"
        assert max(svc.ack_sizes) <= 2500 and len(svc.ack_sizes) < 3000 / 100, "acknowledged in bulk"
    finally:
        (tmp_path / "spool" / "segments" / STOP).write_text("stop")
        th.join(10)
    assert not th.is_alive(), "STOP ends the partition"
    status = out["status"]
    assert status["pulled"] == 3000 and status["partition"] == 1 and status["error"] is None
    saved = json.loads((tmp_path / "spool" / "status" / "0001.json").read_text())
    assert saved["pulled"] == 3000, "the partition reports to the driver through its status file"


def SegmentName_stream(name):
    from event_etl.sources.spool import SegmentName

    return SegmentName.parse(name).stream


def test_a_fetch_partition_with_once_ends_only_after_everything_it_pulled_was_acknowledged(tmp_path):
    from event_etl.sources.pubsub_partitions import acknowledge_segments

    svc = RealServiceLike()
    for i in range(700):
        svc.publish(b'{"n": %d}' % i, t("13:00") + i)
    th, out = _run_partition(tmp_path, svc, once=True)
    wait_until(lambda: _spooled(tmp_path) == 700, what="everything spooled")
    time.sleep(1.5)  # the subscription has been quiet for longer than once_quiet (0.5 s)
    assert th.is_alive(), "its messages are not acknowledged yet: it keeps extending their deadlines"
    assert svc.calls["modify_ack_deadline"] >= 1
    acknowledge_segments(svc, SUB, tmp_path / "spool" / "segments", [p.name for p in segments(tmp_path)], Counter())
    th.join(10)
    assert not th.is_alive() and out["status"]["pulled"] == 700 and len(svc.acked) == 700
    assert not (tmp_path / "spool" / "segments" / DRAINED).exists(), "DRAINED is the driver's, once all partitions end"


def test_a_fetch_partition_that_cannot_reach_the_spool_says_so_with_the_fix(tmp_path):
    import pytest

    from event_etl.errors import SourceError
    from event_etl.sources.pubsub_partitions import FetchJob, fetch_partition

    with pytest.raises(SourceError) as e:
        fetch_partition(FetchJob(SUB, str(tmp_path / "not-mounted"), 1, {}, "a1b2c3d4"), 0,
                        client_factory=RealServiceLike)
    assert "cannot reach the spool" in e.value.message and "shares at the same path" in e.value.fix


# -- spooled acknowledgements: what the real service does ------------------------------------------------------
def test_spooled_each_pull_is_durable_and_acknowledged_before_the_next_pull(tmp_path, monkeypatch):
    """Pull, make durable, acknowledge, pull again: when a pull is sent, every message pulled before it is in a
    segment on disk and acknowledged; no deadline is ever extended."""
    from event_etl.sources.spool import OpenSegment

    svc = RealServiceLike()
    for i in range(2500):
        svc.publish(b'{"n": %d}' % i, t("13:00") + i)
    order = []
    real_append = OpenSegment.append

    def append(self, response, messages, *rest):
        real_append(self, response, messages, *rest)  # written and synced when it returns
        order.append(("write", messages))

    monkeypatch.setattr(OpenSegment, "append", append)
    real_pull, real_ack = svc.pull, svc.acknowledge
    svc.pull = lambda **kw: (order.append(("pull", len(svc.acked))), real_pull(**kw))[1]
    svc.acknowledge = lambda **kw: (real_ack(**kw), order.append(("ack", len(kw["ack_ids"]))))[0]
    f = fetcher(tmp_path, svc, streams=1, max_held_messages=10_000).start()
    try:
        wait_until(lambda: len(svc.acked) == 2500, what="every message acknowledged")
        # the last segment is closed (offered) once it is 0.5 s old
        wait_until(lambda: sum(segment_count(p.name) for p in segments(tmp_path)) == 2500, what="segments closed")
        assert svc.calls["modify_ack_deadline"] == 0
        pulls = [k for k, (what, _) in enumerate(order[:]) if what == "pull"]
        for a, b in zip(pulls, pulls[1:]):
            between = [what for what, _ in order[a + 1:b]]
            assert between in ([], ["write", "ack"]), order[a:b + 1]
        assert f.stats()["acked"] == 2500
        assert not svc.leased, "nothing left leased"
    finally:
        f.stop()


def test_spooled_flow_control_counts_what_no_batch_has_saved(tmp_path):
    svc = RealServiceLike()
    for _i in range(10_000):
        svc.publish(b"x" * 100, t("13:00"))
    f = fetcher(tmp_path, svc, max_held_messages=2_000).start()
    try:
        wait_until(lambda: _spooled(tmp_path) >= 2_000, what="the first 2,000")
        time.sleep(0.5)
        assert _spooled(tmp_path) <= 2_000 + 2 * 1_000, "acknowledged, but not yet saved: they still count"
        assert len(svc.acked) == _spooled(tmp_path) and not svc.leased
        assert len(svc.queue) > 5_000, "the rest stays in the subscription"
        names = [p.name for p in segments(tmp_path)]
        assert f.ack(names) is True  # a batch saved them
        for n in names:
            (tmp_path / "spool" / "segments" / n).unlink()
        wait_until(lambda: len(svc.acked) > len(names), what="pulling again once a batch saved them")
    finally:
        f.stop()


def test_spooled_a_failed_acknowledgement_tells_the_batch_and_the_next_run(tmp_path):
    """An acknowledgement that fails leaves its messages leased: they come again.  The batch that saved that
    segment reports it (its dedupe keys wait for the redelivery), and the run does not count as a clean stop."""
    from event_etl.sources.pubsub_fetch import RunRecord

    svc = RealServiceLike()
    for _i in range(50):
        svc.publish(b"x", t("13:00"))
    real_ack = svc.acknowledge
    failing = {"on": True}

    def ack(**kw):
        if failing["on"]:
            svc.calls["acknowledge"] += 1
            raise ex.ServiceUnavailable("unavailable")
        return real_ack(**kw)

    svc.acknowledge = ack
    f = fetcher(tmp_path, svc, streams=1).start()
    try:
        wait_until(lambda: _spooled(tmp_path) == 50, what="spooled")
        assert f.ack([p.name for p in segments(tmp_path)]) is False, "not acknowledged: they come again"
    finally:
        f.stop()
    assert RunRecord(tmp_path / "spool").previous_lease() == 10.0, "unclean: the next run settles for the lease"


def test_an_expired_lease_delivers_again_and_the_copy_is_dropped_by_message_id(tmp_path):
    """The real service delivers again what was not acknowledged within its lease (a slow disk, a pause): the copy
    is spooled again and dropped from the buckets as a duplicate of the same message."""
    from event_etl.sources.splits import Split

    svc = RealServiceLike()
    svc.deadline_s = 0.0  # every lease runs out at once: the acknowledgement comes too late
    real_ack = svc.acknowledge
    late = {"n": 0}

    def ack(**kw):
        if late["n"] == 0:
            late["n"] += 1
            time.sleep(0.05)  # too late: the service already handed the message out again
            svc.calls["acknowledge"] += 1
            return None
        svc.deadline_s = 60.0
        return real_ack(**kw)

    svc.acknowledge = ack
    svc.publish(click("a", "13:10"), t("13:20"))
    et = make_event_type(tmp_path / "types")
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:30")))
    f = fetcher(tmp_path, svc, streams=1).start()
    try:
        wait_until(lambda: _spooled(tmp_path) >= 2, what="the message spooled twice")
    finally:
        f.stop()
    spans = [[str(s), 0, segment_count(s.name), 0] for s in segments(tmp_path)]
    ev = p.controller.run_batch(0, p.task_runner([Split(0, "seg", "", 0, 2, 0, json.dumps(spans))]))
    assert ev.result.counts == {"timely": 1, "duplicate": 1}
    assert [i for hc in read_sink(p.sink, "click").values() for i in hc.timely] == ["a"]


def test_a_restart_after_an_unclean_stop_settles_for_the_killed_runs_leases(tmp_path):
    """A killed run leaves its last pull leased; until that lease has run out, the next run says it is settling
    (the watermark holds, no hour is marked, quiet time does not run) and ``once`` does not end."""
    from event_etl.sources.pubsub_fetch import RunRecord

    svc = RealServiceLike()
    svc.subscription_deadline = 1  # a lease of 1 s: the next run settles for 1 + 2 s
    first = fetcher(tmp_path, svc).start()
    time.sleep(0.3)
    first.stop()
    # its last pull ran out (the real service's answer on a quiet subscription): that answer may have been lost after
    # the service leased messages, so the stop says until when they may stay leased, and no longer
    doc = json.loads((tmp_path / "spool" / "run.json").read_text())
    assert doc["clean"] is False and doc["started_at"] < doc["leased_until"] <= doc["stopped_at"] + 1000, doc
    assert RunRecord(tmp_path / "spool").previous_lease() <= 1.0, "the last pull's lease, what is left of it"
    time.sleep(1.05)
    assert RunRecord(tmp_path / "spool").previous_lease() == 0.0, "once that lease ran out, nothing to wait for"
    killed = fetcher(tmp_path, svc).start()  # and never stopped: its record says unclean
    killed._stop.set()
    assert RunRecord(tmp_path / "spool").previous_lease() == 1.0, "the subscription's ack deadline"
    again = fetcher(tmp_path, svc, once=True).start()
    try:
        assert again.activity().settling and 2.5 < again.settle_seconds < 3.5
        time.sleep(2.0)
        assert not (tmp_path / "spool" / "segments" / DRAINED).exists(), "--once does not end while settling"
        wait_until(lambda: (tmp_path / "spool" / "segments" / DRAINED).exists(), what="DRAINED once settled")
        assert not again.activity().settling
    finally:
        again.stop()


def test_the_settling_counts_from_when_the_job_took_its_checkpoint_not_from_when_pulling_starts(tmp_path):
    """The killed run was gone when the restart took the checkpoint's lease, so its leases have run out by then +
    their length: the time Spark takes to start counts toward the settling."""
    svc = RealServiceLike()
    svc.subscription_deadline = 10  # settles for 10 + 2 s from the lease
    killed = fetcher(tmp_path, svc).start()
    killed._stop.set()
    again = fetcher(tmp_path, svc)
    again.leased_at = time.monotonic() - 9.0  # the lease taken 9 s ago (Spark's start since)
    again.start()
    try:
        left = again.settle_until - time.monotonic()
        assert again.activity().settling and 2.0 < left < 3.5, left
    finally:
        again.stop()
    late = fetcher(tmp_path, svc)
    late.leased_at = time.monotonic() - 30.0  # longer ago than the lease: nothing left to wait for
    late.start()
    try:
        assert not late.activity().settling
    finally:
        late.stop()


def test_committed_mode_keeps_the_old_behaviour(tmp_path):
    svc = RealServiceLike()
    for _i in range(300):
        svc.publish(b"x", t("13:00"))
    f = fetcher(tmp_path, svc, ack="committed", ack_deadline=4).start()
    try:
        wait_until(lambda: _spooled(tmp_path) == 300, what="spooled")
        assert svc.acked == set(), "nothing acknowledged before a batch saved it"
        wait_until(lambda: svc.calls["modify_ack_deadline"] >= 2, what="deadlines extended")
        assert f.ack([p.name for p in segments(tmp_path)]) is True and len(svc.acked) == 300
    finally:
        f.stop()


def test_the_ack_setting_is_checked_with_its_fix():
    import pytest

    from event_etl.errors import UsageError

    assert FetchSettings.from_env({"EVENT_ETL_PUBSUB_ACK": "committed"}).ack == "committed"
    assert FetchSettings.from_env({}).ack == "spooled"
    assert FetchSettings.from_env({}, emulator=True).streams == 1 and FetchSettings.from_env({}).streams == 4
    with pytest.raises(UsageError) as e:
        FetchSettings.from_env({"EVENT_ETL_PUBSUB_ACK": "later"})
    assert "spooled" in e.value.fix and "committed" in e.value.fix


def test_a_tmpfs_checkpoint_with_spooled_acknowledgements_is_named_at_start(tmp_path):
    from event_etl.sources.pubsub_fetch import spool_warning

    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs rw 0 0\n")
    line = spool_warning("page_view", tmp_path / "ck", FetchSettings(), mounts=str(mounts))
    assert line.startswith("[page_view] warning: the checkpoint is on tmpfs") and "fix:" in line
    assert spool_warning("page_view", tmp_path / "ck", FetchSettings(ack="committed"), mounts=str(mounts)) is None
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\n/dev/vdb {tmp_path} xfs rw 0 0\n")
    assert spool_warning("page_view", tmp_path / "ck", FetchSettings(), mounts=str(mounts)) is None


def test_an_open_segment_a_killed_run_left_is_finished_not_thrown_away(tmp_path):
    """With spooled acknowledgements the pulls in an open segment were acknowledged: they exist nowhere else.  The
    next run makes its whole frames a segment (a torn last frame was never synced, so never acknowledged)."""
    from event_etl.sources.spool import OpenSegment, finish_open_segments, read_messages

    svc = RealServiceLike()
    for i in range(250):
        svc.publish(b'{"n": %d}' % i, t("13:00") + i)
    segdir = tmp_path / "spool" / "segments"
    segdir.mkdir(parents=True)
    seg = OpenSegment(segdir, "0badcafe", 0, 7)
    for _ in range(3):
        resp = svc.pull(subscription=SUB, max_messages=100)
        seg.append(PullResponse.pb(resp).SerializeToString(), len(resp.received_messages))
    os.write(seg.fd, b"\x10\x27\x00\x00half a frame")  # the kill came in the middle of a fourth write
    assert finish_open_segments(segdir) == ["0badcafe-00-00000007-n250.seg"]
    assert [m for _, m, _, _, _ in read_messages(segdir / "0badcafe-00-00000007-n250.seg")] == [
        str(i) for i in range(1, 251)]
    assert not list(segdir.glob("*.open"))


def test_a_killed_fetchers_open_segment_is_offered_by_the_next_run(tmp_path):
    svc = RealServiceLike()
    for _i in range(300):
        svc.publish(b"x", t("13:00"))
    killed = fetcher(tmp_path, svc, streams=1, segment_age=60.0, segment_messages=10_000).start()
    wait_until(lambda: len(svc.acked) == 300, what="acknowledged once spooled")
    killed._stop.set()  # killed: its open segment stays open
    assert not segments(tmp_path) and list((tmp_path / "spool" / "segments").glob("*.open"))
    again = fetcher(tmp_path, svc, streams=1)
    again.begin_run()
    assert _spooled(tmp_path) == 300, "finished: the acknowledged messages are offered"


def _spool_files(tmp_path, pattern):
    return sorted((tmp_path / "spool" / "segments").glob(pattern))


def test_a_close_whose_rename_finds_no_room_pauses_as_a_full_disk_and_goes_on_when_room_returns(tmp_path,
                                                                                                 monkeypatch):
    """ENOSPC (ext4: a folder that needs another block for the longer name) or EDQUOT (a quota) on the rename of a
    segment's close: nothing is lost (its pulls are durable and acknowledged), so the job does not stop; it pauses
    as on a full disk at an append (down, never quiet), keeps the segment open and counted, and closes it once there
    is room."""
    import errno

    from event_etl.sources.spool import segment as spool

    for code in (errno.ENOSPC, errno.EDQUOT):
        work = tmp_path / errno.errorcode[code]
        full = threading.Event()
        full.set()
        real_replace = os.replace

        def replace(src, dst, *a, code=code, full=full, real_replace=real_replace, **k):
            if full.is_set() and str(src).endswith(spool.OPEN_SUFFIX):
                raise OSError(code, os.strerror(code))
            return real_replace(src, dst, *a, **k)

        monkeypatch.setattr(os, "replace", replace)
        svc = RealServiceLike()
        published = {svc.publish(b"x", t("13:00") + i) for i in range(30)}
        f = fetcher(work, svc, streams=1, segment_messages=20, segment_age=60.0, outage_timeout=60.0).start()
        try:
            wait_until(lambda f=f: "disk is full" in (f.activity().down or ""), what="the close's full disk reported")
            a = f.activity()
            assert f.error is None, f"the job stopped: {f.error}"
            assert a.retrying and a.backlog == 30, a
            assert svc.acked == published and not _spool_files(work, "*.seg") and _spool_files(work, "*.open")
            full.clear()  # room again
            wait_until(lambda f=f, w=work: _spooled(w) == 30 and f.activity().down is None,
                       what="the segment closed once there was room")
        finally:
            f.stop()
        assert f.error is None and not _spool_files(work, "*.open")
        monkeypatch.undo()


def test_a_close_whose_folder_sync_finds_no_room_goes_on(tmp_path, monkeypatch):
    """ENOSPC on the folder's sync after a close's rename: the segment is closed (its data synced, its name made
    durable by the next sync of the folder: the planner's before it offers it, the next append's), the job goes
    on."""
    import errno

    from event_etl.sources.spool import segment as spool

    failed = []
    real_replace, real_sync = os.replace, spool.fsync_dir
    closing = threading.local()

    def replace(src, dst, *a, **k):
        closing.now = str(dst).endswith(".seg")
        return real_replace(src, dst, *a, **k)

    def fsync_dir(path):
        if getattr(closing, "now", False) and len(failed) < 3:
            closing.now = False
            failed.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_sync(path)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(spool, "fsync_dir", fsync_dir)
    svc = RealServiceLike()
    published = {svc.publish(b"x", t("13:00") + i) for i in range(100)}
    f = fetcher(tmp_path, svc, streams=1, segment_messages=20, segment_age=60.0).start()
    try:
        wait_until(lambda: len(svc.acked) == 100, what="every message acknowledged")
    finally:
        f.stop()
    assert len(failed) >= 1 and f.error is None, f.error
    assert _spooled(tmp_path) == 100 and svc.acked == published and not _spool_files(tmp_path, "*.open")


def test_the_wait_in_an_outage_doubles_with_its_age_not_with_a_count_of_tries():
    """Issue 49 item 4: the outage's seconds were passed to ``exponential_backoff`` as an attempt number (the wait
    was 0.5 * 2**seconds: 8 s after 4 s).  The wait is the outage's age so far (0.5 s to 10 s): tries come about
    0.5, 1, 2, 4 and 8 s into the outage, then every 10 s."""
    from event_etl.sources.pubsub_fetch import waited_since

    at, tries = 0.0, []
    while at < 40:
        tries.append(at)
        at += waited_since(0.0, at)
    assert tries == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 26.0, 36.0]
