"""A sample of the spool sweep (:mod:`tests.sweeps.spool_sweep`, issue 47): the spool as a write-ahead log, broken at
the steps :data:`~tests.sweeps.spool_sweep.SAMPLE` names (full disks, real and injected; torn tails through the
power-loss model; kills before and after an acknowledgement; a stream dead between its pull and its acknowledgement;
rot; a second writer), restarted, and checked by message id: nothing acknowledged lost, no redelivery the dedupe was not
told to expect, no restart that fails, no look that would let an hour be marked before its events were read.

The sweep's checks must be able to fail: the last tests plant a bug in the fetcher and see the sweep find it.  The
bugs the sweep found in event_etl have a test each (all five fixed: the tests keep them fixed).
"""

from __future__ import annotations

import threading
import time

from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from event_etl.sources.spool import OpenSegment
from event_etl.sources.spool import segment as spool
from tests.lib.harness import t
from tests.lib.pubsub_service import CappedService, fetcher
from tests.lib.waiting import wait_until
from tests.sweeps.spool_sweep import (
    LEASE,
    PART_SETTINGS,
    RUN,
    SAMPLE,
    SUB,
    Case,
    Outcome,
    Service,
    _fake_spark,
    run_case,
    sweep,
    sweeping,
    table,
)


def test_a_sample_of_the_spool_sweep_loses_nothing_and_marks_nothing_early(tmp_path):
    outcomes = sweep(quick=True, workroot=tmp_path)
    report = table(outcomes) + "\n" + "\n".join(str(o) for o in outcomes if not o.ok)
    clean, clean_partition, *cases = outcomes
    assert clean.ok and clean_partition.ok and not clean.restarts and not clean.duplicated, report
    assert len(cases) == len(SAMPLE)
    assert all(o.reached for o in cases), "every sampled window was reached:\n" + report
    bad = [o for o in cases if not o.ok]  # lost, unexpected redeliveries, failed restarts, premature, missing
    assert not bad, report
    # looks torn by a driver's roll (ROLL_RACE) or a partition's rename (LISTING_RACE), a backlog the spool does not
    # hold (STUCK_BACKLOG), a stop that overran its timeout (STOP_LOCK): all fixed, none
    assert not any(o.torn_looks for o in outcomes), "ROLL_RACE or LISTING_RACE is back:\n" + report
    assert not any(o.stuck_backlog for o in outcomes), "STUCK_BACKLOG is back:\n" + report
    assert not any(o.stop_hung for o in outcomes), "STOP_LOCK is back:\n" + report
    by = {(o.case.fault, o.case.window, o.case.nth): o for o in cases}

    def one(fault: str, part: str) -> Outcome:
        return next(o for (f, w, _n), o in by.items() if f == fault and part in w)

    # the faults did what they are said to do
    assert sum(o.real_disk for o in cases) >= 4, "full disks on a real (tmpfs) disk"
    assert one("short", "write").saw_down, "a short write on the real full disk: the fetcher said it was down"
    assert one("full-lasting", "write").stopped, "a full disk that lasts stops the job; it restarts once room is back"
    assert one("rot", "pulled").refused and one("rot", "pulled").restarts == 2, "rot refused, then the runbook"
    assert any("clean=False" in n for n in one("hang", "fdatasync").notes), "a stop with a stream stuck is unclean"
    assert any(o.case.fault.startswith("cut") and any("after its sync" in n for n in o.notes) for o in cases), \
        "a power cut tore a tail"
    assert sum(o.duplicated for o in cases) > 0, "redeliveries the dedupe was told to expect came, and were counted"


# -- the bugs the sweep found --------------------------------------------------------------------------------------
def test_a_look_while_a_segment_is_rolled_sees_its_acknowledged_messages(tmp_path, monkeypatch):
    """:data:`tests.sweeps.spool_sweep.ROLL_RACE`, fixed: a look during a roll still counts the segment."""
    svc = CappedService(cap=20)
    for i in range(60):
        svc.publish(b"x", t("13:00") + i)
    in_close, release = threading.Event(), threading.Event()
    real_close = OpenSegment.close

    def slow_close(self):  # the rename and folder sync of a segment's close take a while (a busy disk, NFS)
        in_close.set()
        release.wait(10)
        return real_close(self)

    monkeypatch.setattr(OpenSegment, "close", slow_close)
    f = fetcher(tmp_path, svc, streams=1, segment_messages=60, segment_age=60.0).start()
    try:
        wait_until(in_close.is_set, what="the full segment being closed")
        assert len(svc.acked) == 60
        a = f.activity()
        assert a.backlog == 60 or a.retrying or a.settling, f"quiet, with 60 acknowledged messages unread: {a}"
    finally:
        release.set()
        f.stop()


def test_the_driver_counts_what_a_fetch_partition_acknowledged_into_its_open_segment(tmp_path):
    """:data:`tests.sweeps.spool_sweep.EXECUTOR_BACKLOG`, fixed: the driver counts a partition's open segment."""
    from event_etl.sources.pubsub_partitions import STOP, ExecutorFetcher, FetchJob, fetch_partition

    svc = Service()
    svc.publish_all(40)
    spool_dir = tmp_path / "spool"
    (spool_dir / "segments").mkdir(parents=True)
    gate = threading.Event()
    real_pull = svc.pull

    def gated(**kw):
        if svc.calls["pull"] >= 1:
            gate.wait(10)  # the task is slow to pull again (or its executor hangs) after its first pull
        return real_pull(**kw)

    svc.pull = gated
    settings = dict(PART_SETTINGS)
    job = FetchJob(SUB, str(spool_dir), 1, settings, RUN, lease_seconds=LEASE)
    th = threading.Thread(target=fetch_partition, args=(job, 0, 0),
                          kwargs=dict(client_factory=lambda: svc, report_every=0.05), daemon=True)
    th.start()
    ex = ExecutorFetcher(SUB, spool_dir, spark=_fake_spark(), settings=FetchSettings(**settings, fetch_partitions=1))
    ex.run = RUN
    try:
        wait_until(lambda: len(svc.acked) == 20 and (spool_dir / "status" / "0000.json").exists(),
                   what="the first pull acknowledged into the open segment")
        time.sleep(0.2)  # a status report or two
        a = ex.activity()
        assert a.backlog >= 20 or a.retrying or a.settling, f"quiet, with 20 acknowledged messages unread: {a}"
    finally:
        gate.set()
        (spool_dir / "segments" / STOP).write_text("stop\n")
        th.join(10)
        ex._release_cores()


def test_a_stop_returns_in_its_time_while_a_segments_close_hangs(tmp_path, monkeypatch):
    """:data:`tests.sweeps.spool_sweep.STOP_LOCK`, fixed: a stop waits for the fetcher's lock at most its timeout."""
    svc = CappedService(cap=20)
    for i in range(60):
        svc.publish(b"x", t("13:00") + i)
    in_close, release = threading.Event(), threading.Event()
    real_close = OpenSegment.close

    def hung_close(self):  # the close's rename and folder sync hang (a hung NFS server, a failing disk)
        in_close.set()
        release.wait(10)
        return real_close(self)

    monkeypatch.setattr(OpenSegment, "close", hung_close)
    f = fetcher(tmp_path, svc, streams=1, segment_messages=60, segment_age=60.0).start()
    stopping = threading.Thread(target=f.stop, kwargs=dict(timeout=0.5), daemon=True)
    try:
        wait_until(in_close.is_set, what="the full segment being closed")
        stopping.start()
        stopping.join(3.0)
        assert not stopping.is_alive(), "stop(timeout=0.5) did not return within 3 s"
    finally:
        release.set()
        stopping.join(10)
        f.stop()


def test_a_committed_segment_of_a_killed_run_is_no_backlog_once_deleted(tmp_path):
    """:data:`tests.sweeps.spool_sweep.STUCK_BACKLOG`, fixed: a look counts an earlier run's segments again."""
    from event_etl.sources.pubsub import PubSubPlanner
    from event_etl.sources.spool import SegmentName, write_segment
    from tests.lib.pubsub_service import response

    segdir = tmp_path / "spool" / "segments"
    segdir.mkdir(parents=True)
    # a batch of the last run read this segment and Spark committed it; the run died before the source's commit
    write_segment(segdir, SegmentName("0badc0de", 0, 0, 60), [response(0, 60)])
    planner = PubSubPlanner(SUB, str(tmp_path / "spool"), max_messages=1000, clock=lambda: t("14:00"))
    end = planner.latest_offset(planner.initial_offset(), None)
    f = fetcher(tmp_path, CappedService(cap=20), streams=1).start()  # the restart
    try:
        PubSubPlanner(SUB, str(tmp_path / "spool"), max_messages=1000, clock=lambda: t("14:00")).commit(end)
        assert not list(segdir.glob("*.seg"))
        wait_until(lambda: f.activity().backlog == 0, timeout=2.0, what="no backlog once the spool holds nothing")
    finally:
        f.stop()


def test_a_look_while_a_partitions_segment_is_renamed_counts_it_once(tmp_path):
    """:data:`tests.sweeps.spool_sweep.LISTING_RACE`, fixed: one listing, each segment counted once whatever its
    name."""
    import os

    from event_etl.sources.pubsub_partitions import ExecutorFetcher
    from tests.lib.pubsub_service import response

    segdir = tmp_path / "spool" / "segments"
    segdir.mkdir(parents=True)
    seg = OpenSegment(segdir, RUN, 0, 0)
    seg.append(response(0, 20), 20)  # acknowledged once this returns (spooled)
    os.close(seg.fd)
    ex = ExecutorFetcher(SUB, tmp_path / "spool", spark=_fake_spark(),
                         settings=FetchSettings(fetch_partitions=1, ack="spooled"))
    stop = threading.Event()

    def closing() -> None:  # the rename of a close (.open -> .seg), back and forth to hit the looks
        a, b = segdir / f"{RUN}-00-00000000.open", segdir / f"{RUN}-00-00000000-n20.seg"
        while not stop.is_set():
            os.replace(a, b)
            os.replace(b, a)

    th = threading.Thread(target=closing, daemon=True)
    th.start()
    try:
        looks = [ex.held_totals()[0] for _ in range(3000)]
    finally:
        stop.set()
        th.join(5)
        ex._release_cores()
    assert set(looks) == {20}, f"of {len(looks)} looks, {looks.count(0)} saw 0 and {looks.count(40)} saw 40"


# -- the sweep's checks can fail: a bug planted in the fetcher is found ----------------------------------------------
def _one(tmp_path, fault: str, window: str, nth: int) -> Outcome:
    with sweeping():
        return run_case(Case(fault, window, nth), tmp_path / "case", seconds=5.0)


def test_the_sweep_finds_an_acknowledgement_of_what_was_never_synced(tmp_path, monkeypatch):
    def unsynced(self, data):  # writes, never syncs: the bug the write-ahead log rules out
        spool._write_all(self.fd, data)

    monkeypatch.setattr(OpenSegment, "_append", unsynced)
    o = _one(tmp_path, "cut-lost", "_spool_pull > acknowledge_in_bulk: acknowledge", 2)
    assert o.reached and o.lost >= 20, o


def test_the_sweep_finds_a_redelivery_the_dedupe_was_not_told_to_expect(tmp_path, monkeypatch):
    # says: all acknowledged
    monkeypatch.setattr(Fetcher, "ack", lambda self, names: (self.acks.release(names), True)[1])
    o = _one(tmp_path, "kill", "_spool_pull > acknowledge_in_bulk: acknowledge", 2)
    assert o.reached and o.unexpected >= 20, o


def test_the_sweep_finds_a_look_that_would_mark_an_hour_before_its_events_were_read(tmp_path, monkeypatch):
    def closed_only(self):  # the backlog of closed segments only, as EXECUTOR_BACKLOG
        return self.acks.totals()

    monkeypatch.setattr(Fetcher, "held_totals", closed_only)
    o = _one(tmp_path, "hang", "_spool_pull > acknowledge_in_bulk: acknowledge", 2)
    assert o.reached and o.premature >= 20, o
