"""The spool as a write-ahead log (issue 47): once a pull is acknowledged, the spool under the checkpoint is the only
copy of its messages until their batch commits.  Short writes, torn and rotted frames, full disks, streams that die,
stops that look clean, two writers on one segment and acknowledgements that come after their lease: none may lose an
acknowledged message or let an hour be marked before its events were read.

Full disks are real: a tmpfs of a few pages (:mod:`tests.lib.disks`).  The service is the fake of the real one in
tests/lib/pubsub_service.py (a pull on an empty subscription runs out with ``DeadlineExceeded``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.pubsub_v1.types import PullResponse

from event_etl.errors import LeaseHeldError, SourceError, UsageError
from event_etl.rules.watermark import SourceActivity
from event_etl.sources.pubsub import ERROR_FILE, read_error
from event_etl.sources.pubsub_fetch import FetchSettings, RunRecord, spool_warning
from event_etl.sources.spool import (
    AppendFailed,
    OpenSegment,
    SegmentFenced,
    SegmentName,
    SpoolDamaged,
    finish_open_segments,
    oldest_publish_ms,
    read_messages,
    write_segment,
)
from event_etl.sources.spool import segment as spool
from tests.lib.disks import fill, small_disk
from tests.lib.harness import t
from tests.lib.pubsub_service import SUB, CappedService, RealServiceLike, fetcher, response, segments
from tests.lib.waiting import wait_until

RUN = "a1b2c3d4"


def leased(svc: RealServiceLike) -> list[str]:
    """The ack ids the service still holds leased (a hand-back, a deadline of 0, ends a lease at once)."""
    now = time.monotonic()
    return [a for a, (_m, _d, _p, until) in svc.leased.items() if until > now]


def ids_in(path: Path) -> list[int]:
    return [int(mid) for _, mid, _, _, _ in read_messages(path)]


def kill(seg: OpenSegment) -> None:
    """The writer dies: its file descriptor closes, nothing else happens."""
    os.close(seg.fd)


# -- 1. an append writes all of its bytes or fails, and leaves the segment as it was -------------------------------
def test_a_short_write_on_a_full_disk_fails_the_append_and_leaves_the_segment_as_it_was(tmp_path):
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        seg = OpenSegment(disk, RUN, 0, 0)
        seg.append(response(0, 10), 10)
        before = seg.path.stat().st_size
        fill(disk, leave=4096)  # room for part of the next frame only: the write is short, then ENOSPC
        with pytest.raises(AppendFailed) as failed:
            seg.append(response(10, 10, size=900), 10)  # ~9.5 KB
        assert failed.value.full and failed.value.errno == errno.ENOSPC
        assert seg.path.stat().st_size == before, "truncated back to its last whole frame"
        assert seg.count == 10
        kill(seg)
        made = finish_open_segments(disk)
        assert made == [SegmentName(RUN, 0, 0, 10).name]
        assert ids_in(disk / made[0]) == list(range(10)), "the acknowledged frame is whole and readable"


def test_a_disk_with_no_room_for_a_new_segment_fails_like_a_full_append(tmp_path):
    with small_disk(tmp_path / "disk", 32 * 1024) as disk:
        fill(disk)
        with pytest.raises(AppendFailed) as failed:
            OpenSegment(disk, RUN, 0, 0)
        assert failed.value.full
        assert not list(disk.glob("*.open")), "no empty open segment left behind"


def test_a_failed_sync_is_no_durable_append(tmp_path, monkeypatch):
    seg = OpenSegment(tmp_path, RUN, 0, 0)
    seg.append(response(0, 5), 5)
    size = seg.path.stat().st_size
    real = os.fdatasync
    calls = {"n": 0}

    def failing(fd):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(AppendFailed) as failed:
        seg.append(response(5, 5), 5)
    assert not failed.value.full
    assert seg.path.stat().st_size == size and seg.count == 5, "the unsynced frame is cut off again"


# -- 2. checksums: a torn tail is cut off with a line in the log, damage anywhere else stops the job ---------------
def _three_frames(directory: Path) -> tuple[Path, list[int]]:
    seg = OpenSegment(directory, RUN, 1, 7)
    ends = []
    for k in range(3):
        seg.append(response(10 * k, 10), 10)
        ends.append(seg.path.stat().st_size)
    kill(seg)
    return seg.path, ends


def test_a_zero_filled_last_frame_after_a_power_cut_is_cut_off_with_a_line_in_the_log(tmp_path, caplog):
    path, ends = _three_frames(tmp_path)
    data = bytearray(path.read_bytes())
    data[ends[1] + 4:] = bytes(len(data) - ends[1] - 4)  # a valid length prefix, then zeros: the size was kept
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="event_etl.sources.spool"):
        made = finish_open_segments(tmp_path)
    assert made == [SegmentName(RUN, 1, 7, 20).name]
    assert ids_in(tmp_path / made[0]) == list(range(20))
    assert any("frame 3" in r.getMessage() and "never synced" in r.getMessage() for r in caplog.records)


def test_a_tail_of_zeros_longer_than_a_frame_is_a_torn_tail_too(tmp_path):
    path, ends = _three_frames(tmp_path)
    with open(path, "r+b") as fh:
        fh.truncate(ends[1])
        fh.seek(ends[1])
        fh.write(bytes(5000))  # the file system extended the file with zeros, no frame's data at all
    assert finish_open_segments(tmp_path) == [SegmentName(RUN, 1, 7, 20).name]


def test_a_bad_frame_before_good_ones_stops_with_the_segment_the_frame_and_the_seek(tmp_path):
    path, ends = _three_frames(tmp_path)
    data = bytearray(path.read_bytes())
    data[ends[0] + 30] ^= 0x01  # one bit of frame 2 rotted; frame 3 is whole
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolDamaged) as damaged:
        finish_open_segments(tmp_path)
    msg = str(damaged.value)
    assert "frame 2" in msg and "CRC-32C" in msg and path.stem in msg and "10 messages" in msg
    assert "seek" in damaged.value.fix and "event-etl status" in damaged.value.fix
    fenced = path.with_suffix(".fenced")
    assert fenced.exists() and fenced.read_bytes() == bytes(data), "the damaged file is left as it was, for a person"


def test_bit_rot_in_a_closed_segment_stops_the_batch_that_reads_it(tmp_path):
    p = write_segment(tmp_path, SegmentName(RUN, 0, 1, 20), [response(0, 10), response(10, 10)])
    data = bytearray(p.read_bytes())
    data[-3] ^= 0x40
    p.write_bytes(bytes(data))
    with pytest.raises(SpoolDamaged, match="frame 2"):
        list(read_messages(p))
    assert [i for i, *_ in read_messages(p, 0, 10)] == list(range(10)), "the frames before it still read"


def test_a_restart_with_a_damaged_open_segment_refuses_to_start(tmp_path):
    segdir = tmp_path / "spool" / "segments"
    segdir.mkdir(parents=True)
    path, ends = _three_frames(segdir)
    data = bytearray(path.read_bytes())
    data[ends[0] + 30] ^= 0x01
    path.write_bytes(bytes(data))
    f = fetcher(tmp_path, RealServiceLike())
    with pytest.raises(SpoolDamaged):
        f.start()


def test_format_1_segments_of_earlier_releases_are_still_read_and_finished(tmp_path):
    """0.2.0 wrote ``EESEG1`` segments (a length per frame, no check): a checkpoint it left resumes."""
    import struct

    def v1(responses):
        return spool.MAGIC_V1 + b"".join(struct.pack("<I", len(r)) + r for r in responses)

    closed = tmp_path / SegmentName(RUN, 0, 0, 20).name
    closed.write_bytes(v1([response(0, 10), response(10, 10)]))
    assert ids_in(closed) == list(range(20))
    assert len(spool.ack_ids(closed)) == 20
    opened = tmp_path / f"{RUN}-01-00000003.open"
    torn = v1([response(100, 10), response(110, 10)])
    opened.write_bytes(torn[:-7])  # killed during the second append
    assert finish_open_segments(tmp_path) == [SegmentName(RUN, 1, 3, 10).name]
    assert ids_in(tmp_path / SegmentName(RUN, 1, 3, 10).name) == list(range(100, 110))


def test_the_spool_knows_the_oldest_publish_time_it_holds(tmp_path):
    write_segment(tmp_path, SegmentName(RUN, 0, 0, 10), [response(0, 10, published=t("12:10"))])
    seg = OpenSegment(tmp_path, RUN, 1, 0)
    seg.append(response(10, 5), 5, spool.oldest_of(PullResponse.pb().FromString(response(10, 5, published=t("11:55")))))
    assert oldest_publish_ms(tmp_path) == t("11:55")
    kill(seg)


# -- 3. a full disk at the fetcher: handed back, not quiet, and it goes on when room comes back --------------------
def test_a_full_spool_disk_hands_the_pull_back_is_never_quiet_and_goes_on_when_room_returns(tmp_path):
    svc = CappedService(cap=20)
    published = [svc.publish(b"%06d" % i + b"y" * 1000, t("13:00") + i) for i in range(200)]  # ~200 KB
    with small_disk(tmp_path / "disk", 128 * 1024) as disk:
        ballast = fill(disk, leave=48 * 1024)
        f = fetcher(disk, svc, streams=1, segment_age=0.05, outage_timeout=60.0)
        f.start()
        seen: list[str] = []

        def consume():  # what the planner does once a batch saved the segments: read, then delete them
            for p in segments(disk):
                f.ack({p.name})
                seen.extend(mid for _, mid, _, _, _ in read_messages(p))
                p.unlink()

        try:
            wait_until(lambda: f.activity().down is not None, what="the full disk reported")
            a = f.activity()
            assert a.retrying and "disk is full" in a.down, a
            assert set(svc.acked) <= {m for p in segments(disk) for _, m, _, _, _ in read_messages(p)} | {
                m for p in disk.glob("spool/segments/*.open") for m in _open_ids(p)}, \
                "nothing acknowledged that is not durable in the spool"
            assert not leased(svc), "the pull that did not fit was handed back, not left leased"
            ballast.unlink()  # room again
            wait_until(lambda: (consume(), len(seen) == 200)[1], timeout=30, what="every message spooled")
            assert f.activity().down is None
        finally:
            f.stop()
        consume()
    assert sorted(seen) == sorted(published), "each message once"
    assert svc.acked == set(published)
    assert f.error is None


def _open_ids(path: Path) -> list[str]:
    data = path.read_bytes()
    scan = spool._scan(data)
    out = []
    pos = len(spool.MAGIC)
    while pos < scan.good:
        n = spool._HEAD.unpack_from(data, pos)[0]
        out.extend(rm.message.message_id for rm in spool._parse(data[pos + 16:pos + 16 + n]).received_messages)
        pos += 16 + n
    return out


def test_a_full_disk_that_lasts_stops_the_job_with_the_checkpoints_disk_in_the_error(tmp_path):
    svc = CappedService(cap=20)
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        f = fetcher(disk, svc, streams=1, outage_timeout=1.0).start()
        fill(disk)
        for i in range(50):
            svc.publish(b"z" * 1000, t("13:00") + i)
        try:
            wait_until(lambda: f.error is not None, timeout=20, what="the job stopped by the full disk")
            assert "no room" in f.error.message and str(disk / "spool") in f.error.fix
            assert read_error(disk / "spool") is f.error, "known in memory though no file could be written"
            assert not (disk / "spool" / ERROR_FILE).exists()
            assert svc.acked == set(), "nothing acknowledged"
        finally:
            f.stop()


def test_a_job_that_starts_on_a_full_disk_says_so(tmp_path):
    with small_disk(tmp_path / "disk", 32 * 1024) as disk:
        (disk / "spool" / "segments").mkdir(parents=True)
        fill(disk)
        with pytest.raises(SourceError, match="no room") as err:
            fetcher(disk, RealServiceLike()).start()
        assert "free space" in err.value.fix


def test_a_stream_that_dies_is_known_in_memory_and_never_taken_for_a_quiet_source(tmp_path, monkeypatch):
    import event_etl.storage.atomic as atomic

    svc = RealServiceLike()
    f = fetcher(tmp_path, svc, streams=1).start()

    def broken(self, data):
        raise OSError(errno.EIO, "Input/output error")

    def no_room(*a, **k):  # the error file cannot be written either
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(OpenSegment, "_append", broken)
    monkeypatch.setattr(atomic, "write_json_atomic", no_room)
    for i in range(30):
        svc.publish(b"x", t("13:00") + i)
    try:
        wait_until(lambda: f.error is not None, what="the stream's death")
        a = f.activity()
        assert a.retrying and a.down.startswith("stopped:"), a
        assert read_error(tmp_path / "spool") is f.error
        assert "Input/output error" in f.error.message
        assert not (tmp_path / "spool" / ERROR_FILE).exists()
        wait_until(lambda: not leased(svc), what="its pull handed back")
        assert svc.acked == set()
    finally:
        f.stop()


# -- 4. a stop is clean only if nothing it pulled can still be leased --------------------------------------------
def test_a_stream_that_dies_between_its_pull_and_its_acknowledgement_hands_the_messages_back(tmp_path, monkeypatch):
    svc = RealServiceLike()
    for i in range(100):
        svc.publish(b"x", t("13:00") + i)
    monkeypatch.setattr(OpenSegment, "append", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    f = fetcher(tmp_path, svc, streams=1).start()
    wait_until(lambda: f.error is not None, what="the stream's death")
    f.stop()
    assert not leased(svc), "handed back: delivered again at once"


def test_a_stop_whose_hand_back_fails_is_not_clean(tmp_path, monkeypatch):
    svc = RealServiceLike()
    svc.subscription_deadline = 30
    for i in range(100):
        svc.publish(b"x", t("13:00") + i)
    monkeypatch.setattr(OpenSegment, "append", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))

    def refuse(**kw):
        raise RuntimeError("connection reset")

    svc.modify_ack_deadline = refuse
    f = fetcher(tmp_path, svc, streams=1).start()
    wait_until(lambda: f.error is not None, what="the stream's death")
    f.stop()
    doc = json.loads((tmp_path / "spool" / "run.json").read_text())
    assert doc["clean"] is False
    assert doc["leased_until"] >= doc["started_at"] + 30_000, "their pull's lease, from when it was sent"
    assert 15 < RunRecord(tmp_path / "spool").previous_lease() <= 30, "the next run waits out their lease"


def test_a_pull_that_returns_after_a_stop_gave_up_waiting_is_handed_back_not_acknowledged(tmp_path):
    svc = RealServiceLike()
    for i in range(50):
        svc.publish(b"x", t("13:00") + i)
    gate = threading.Event()
    real_pull = svc.pull

    def slow_pull(**kw):
        gate.wait(10)
        return real_pull(**kw)

    svc.pull = slow_pull
    f = fetcher(tmp_path, svc, streams=1).start()
    wait_until(lambda: svc.calls["get_subscription"] >= 1, what="the run begun")
    time.sleep(0.1)
    f.stop(timeout=0.2)  # the pull is still waiting: the stop cannot wait for it
    assert json.loads((tmp_path / "spool" / "run.json").read_text())["clean"] is False
    gate.set()
    wait_until(lambda: svc.calls["modify_ack_deadline"] >= 1 and not leased(svc), what="the late pull handed back")
    assert svc.acked == set() and not list(segments(tmp_path)), "nothing spooled or acknowledged after the stop"


# -- 5. one writer per segment -------------------------------------------------------------------------------------
def test_a_writer_never_acknowledges_an_append_to_a_segment_someone_else_finished(tmp_path):
    seg = OpenSegment(tmp_path, RUN, 0, 0)
    seg.append(response(0, 10), 10)
    assert finish_open_segments(tmp_path) == [SegmentName(RUN, 0, 0, 10).name]  # a retried attempt, say
    with pytest.raises(SegmentFenced):
        seg.append(response(10, 10), 10)
    with pytest.raises(SegmentFenced):
        seg.close()
    assert ids_in(tmp_path / SegmentName(RUN, 0, 0, 10).name) == list(range(10))


def test_frames_a_fenced_writer_appended_after_the_finish_are_never_read(tmp_path):
    seg = OpenSegment(tmp_path, RUN, 0, 0)
    seg.append(response(0, 10), 10)
    finish_open_segments(tmp_path)
    os.write(seg.fd, b"\x01\x02 torn")  # the old writer's descriptor still reaches the file
    os.close(seg.fd)
    p = tmp_path / SegmentName(RUN, 0, 0, 10).name
    assert ids_in(p) == list(range(10)) and len(spool.ack_ids(p)) == 10


def test_a_retried_fetch_partition_fences_the_attempt_still_running(tmp_path):
    from event_etl.sources.pubsub_partitions import FetchJob, PartitionFetcher, fetch_partition

    svc = CappedService(cap=10)
    for i in range(40):
        svc.publish(b"x", t("13:00") + i)
    settings = dict(streams=1, segment_messages=10_000, segment_age=60.0, ack_deadline=60, outage_timeout=5.0,
                    pull_timeout=0.2, once_quiet=0.5, ack="spooled")
    (tmp_path / "spool" / "segments").mkdir(parents=True)
    out: dict = {}
    gate = threading.Event()
    real_pull = svc.pull

    def gated_pull(**kw):
        if svc.calls["pull"] >= 2:
            gate.wait(10)  # attempt 0 holds an open segment of two acknowledged pulls, then waits in its third
        return real_pull(**kw)

    svc.pull = gated_pull

    def attempt0():
        out["status"] = fetch_partition(FetchJob(SUB, str(tmp_path / "spool"), 1, settings, RUN), 0, 0,
                                        client_factory=lambda: svc, report_every=0.05)

    th = threading.Thread(target=attempt0, daemon=True)
    th.start()
    wait_until(lambda: len(svc.acked) == 20, what="attempt 0's first two pulls acknowledged")
    # attempt 1 of the same task starts (Spark thinks attempt 0 lost): it finishes attempt 0's open segment
    retry = PartitionFetcher(FetchJob(SUB, str(tmp_path / "spool"), 1, settings, RUN), 0, attempt=1,
                             client_factory=lambda: svc)
    finished = segments(tmp_path)
    assert [p.name for p in finished] == [SegmentName(RUN, 0, 0, 20).name]
    gate.set()  # attempt 0's third pull returns: its append finds the segment fenced
    th.join(10)
    assert not th.is_alive() and out["status"]["fenced"], "attempt 0 stopped pulling"
    assert len(svc.acked) == 20, "nothing acknowledged after the fence"
    assert not leased(svc), "its last pull handed back"
    assert sorted(ids_in(finished[0])) == sorted(int(m) for m in svc.acked)
    retry.stop()


def test_fetch_partitions_refuse_spark_speculation():
    from event_etl.sources.pubsub_partitions import ExecutorFetcher

    spark = SimpleNamespace(conf=SimpleNamespace(get=lambda k, d=None: "true" if k == "spark.speculation" else d),
                            sparkContext=SimpleNamespace(defaultParallelism=8))
    with pytest.raises(UsageError, match="spark.speculation") as err:
        ExecutorFetcher(SUB, "/nonexistent/spool", spark=spark, settings=FetchSettings(fetch_partitions=2))
    assert "spark.speculation=false" in err.value.fix


def test_a_fetch_task_stops_when_its_job_no_longer_holds_the_lease(tmp_path):
    from event_etl.sources.pubsub_partitions import FetchJob, fetch_partition

    svc = RealServiceLike()
    for i in range(10):
        svc.publish(b"x", t("13:00") + i)
    looks = {"n": 0}

    def still_ours():
        looks["n"] += 1
        if looks["n"] > 3:
            raise LeaseHeldError("this job no longer holds s/click/_LEASE: pid 7 on host-b does",
                                 fix="another job took over this event type and sink; this one stops")

    (tmp_path / "spool" / "segments").mkdir(parents=True)
    settings = dict(streams=1, segment_age=0.05, pull_timeout=0.2, ack="spooled")
    with pytest.raises(SourceError, match="no longer holds"):
        fetch_partition(FetchJob(SUB, str(tmp_path / "spool"), 1, settings, RUN), 0, client_factory=lambda: svc,
                        report_every=0.05, still_ours=still_ours)
    pulls = svc.calls["pull"]
    time.sleep(0.3)
    assert svc.calls["pull"] == pulls, "no pull after the task stopped"


# -- 7. an acknowledgement that came after its lease counts as not received -----------------------------------------
def test_an_acknowledgement_after_the_lease_ran_out_counts_as_not_received(tmp_path):
    svc = RealServiceLike()
    svc.subscription_deadline = 1
    for i in range(10):
        svc.publish(b"x", t("13:00") + i)
    real_ack = svc.acknowledge

    def slow_ack(**kw):
        time.sleep(1.2)  # the service answers OK for an expired ack id on a subscription without exactly-once
        return real_ack(**kw)

    svc.acknowledge = slow_ack
    f = fetcher(tmp_path, svc, streams=1, segment_age=0.05).start()
    try:
        wait_until(lambda: segments(tmp_path), what="the segment closed")
        assert f.stats()["late_acks"] == 10
        assert f.ack({p.name for p in segments(tmp_path)}) is False, "its batch keeps the keys for the redelivery"
    finally:
        f.stop()


def test_one_streams_sync_does_not_hold_up_the_others(tmp_path, monkeypatch):
    svc = CappedService(cap=5)
    for i in range(20):
        svc.publish(b"x", t("13:00") + i)
    stuck = threading.Event()
    release = threading.Event()
    real = OpenSegment._append

    def slow_for_stream_0(self, data):
        if self.stream == 0 and self.count:
            stuck.set()
            release.wait(10)  # a sync that takes long (a slow disk, a network file system)
        return real(self, data)

    monkeypatch.setattr(OpenSegment, "_append", slow_for_stream_0)
    f = fetcher(tmp_path, svc, streams=2, segment_age=0.05).start()
    fed = iter(range(20, 10_000))

    def stream_0_stuck() -> bool:
        # stream 0 meets the slow sync at its segment's second message: which stream pulls which message is up to
        # the threads, so keep a message coming until stream 0 has had two in one segment
        if not stuck.is_set():
            svc.publish(b"x", t("13:00") + next(fed))
        return stuck.is_set()

    try:
        wait_until(stream_0_stuck, timeout=30, what="stream 0 in a slow sync")
        acked = len(svc.acked)
        for i in range(100):
            svc.publish(b"x", t("13:01") + i)
        wait_until(lambda: len(svc.acked) >= acked + 95, what="stream 1 going on meanwhile")
    finally:
        release.set()
        f.stop()


# -- 9. the warning for a spool that does not outlive the machine or the container -----------------------------
def test_an_overlay_checkpoint_gets_the_warning(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"overlay / overlay rw,relatime 0 0\n/dev/vdb {tmp_path / 'pv'} ext4 rw 0 0\n")
    (tmp_path / "pv").mkdir()
    warn = spool_warning("click", tmp_path / "ckpt", FetchSettings(), mounts=str(mounts))
    assert warn and "overlay" in warn and "container" in warn and "fix:" in warn
    assert spool_warning("click", tmp_path / "pv" / "ckpt", FetchSettings(), mounts=str(mounts)) is None


def test_each_fetch_partition_checks_its_own_hosts_mount(tmp_path):
    import socket

    from event_etl.sources.pubsub_partitions import FetchJob, PartitionFetcher

    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        (disk / "spool" / "segments").mkdir(parents=True)
        pf = PartitionFetcher(FetchJob(SUB, str(disk / "spool"), 4, {}, RUN), 3, client_factory=RealServiceLike)
        w = pf.status()["warning"]
        assert w and "fetch partition 3" in w and socket.gethostname() in w and "tmpfs" in w


# -- 3. what the job makes of a source that is down: no idle advance, a line, a metric ----------------------------
def test_a_full_spool_disk_holds_the_watermark_and_says_so_in_the_progress_line(tmp_path):
    """The real fetcher on a full disk, the real controller and progress printer: the idle rule never takes the
    stopped pulling for a quiet subscription (no hour is marked), the progress output says `source DOWN` with the
    reason once, then `source back` once room returns."""
    import io

    from event_etl.job.progress import ProgressPrinter
    from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type

    et = make_event_type(tmp_path / "types")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path / "job", et, clock)
    p.batch([click("a", "13:10")])
    out = io.StringIO()
    p.controller.listeners.append(ProgressPrinter(et.name, clock, out=out))
    svc = CappedService(cap=20)
    with small_disk(tmp_path / "disk", 64 * 1024) as disk:
        f = fetcher(disk, svc, streams=1, outage_timeout=600.0).start()
        try:
            ballast = fill(disk)
            for i in range(40):
                svc.publish(b"q" * 1000, t("13:10") + i)
            wait_until(lambda: f.activity().down is not None, what="the full disk reported")
            p.controller.idle.source_activity = lambda: SourceActivity(**{**f.activity().__dict__,
                                                                          "updated_at": clock.now})
            for minute in range(11, 60):  # far past idle_timeout
                clock.now = t(f"13:{minute:02d}")
                p.controller.tick()
            assert p.controller.state.watermark == t("13:08"), "held: the source is down, not quiet"
            lines = out.getvalue().splitlines()
            assert [ln for ln in lines if "source DOWN" in ln] == [lines[0]] and "disk is full" in lines[0], lines
            ballast.unlink()
            wait_until(lambda: f.activity().down is None, timeout=20, what="pulling again")
            p.controller.tick()
            assert "source back" in out.getvalue().splitlines()[-1]
        finally:
            f.stop()


def test_an_open_segment_killed_while_its_first_line_was_written_is_no_damage(tmp_path):
    """Found by the spool campaign: a kill in the middle of the magic line's write left ``EES``; it holds no frame,
    so nothing acknowledged: the restart deletes it instead of refusing to start."""
    (tmp_path / f"{RUN}-00-00000000.open").write_bytes(spool.MAGIC[:3])
    assert finish_open_segments(tmp_path) == [] and not list(tmp_path.iterdir())
