"""How far back a seek of a Pub/Sub subscription must go (issue 47, item 8): ``event-etl status`` says it.

The runbook's recovery (a lost checkpoint, a damaged spool segment) seeks the subscription back so that Pub/Sub
delivers again what the job had acknowledged and not committed.  The start of the oldest open hour minus
``out_of_orderness`` is not enough: the spool can hold acknowledged messages published earlier (late events on
their way to ``late-`` files, a backlog delivered out of order).  The spool's frames record their oldest publish
time; the job writes the answer into its lease too, so that it outlives a lost checkpoint.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner
from google.protobuf import timestamp_pb2
from google.pubsub_v1.types import PubsubMessage, PullResponse, ReceivedMessage

from event_etl.cli import main
from event_etl.job.status import job_status, seek_time
from event_etl.sources.spool import SegmentName, write_segment
from event_etl.timeutil import HOUR_MS, iso, now_millis
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

MINUTE = 60_000


def _segment(directory, published: list[int]) -> None:
    msgs = []
    for i, pub in enumerate(published):
        ts = timestamp_pb2.Timestamp(seconds=pub // 1000, nanos=(pub % 1000) * 1_000_000)
        msgs.append(ReceivedMessage(ack_id=f"a{i}", message=PubsubMessage(data=b"{}", message_id=str(i),
                                                                          publish_time=ts)))
    directory.mkdir(parents=True, exist_ok=True)
    write_segment(directory, SegmentName("a1b2c3d4", 0, 0, len(msgs)),
                  [PullResponse.serialize(PullResponse(received_messages=msgs))])


def test_the_earlier_of_the_oldest_open_hour_and_the_oldest_spooled_message():
    assert seek_time(t("13:00"), 2 * MINUTE, None) == (t("12:58"), "the oldest open hour's start minus "
                                                       "out_of_orderness")
    assert seek_time(t("13:00"), 2 * MINUTE, t("12:40")) == (t("12:40"), "the oldest message the spool holds")
    assert seek_time(t("13:00"), 2 * MINUTE, t("13:30"))[0] == t("12:58")
    assert seek_time(None, None, t("12:40")) == (t("12:40"), "the oldest message the spool holds")
    assert seek_time(None, None, None) is None
    at, by = seek_time(t("13:00"), None, None)  # the type's settings unreadable: no guess of 0
    assert at == t("13:00") and "out_of_orderness unknown" in by and "seek earlier" in by


def _job(tmp_path):
    et = make_event_type(tmp_path / "types")
    clock = FakeClock(t("14:10"))
    p = LocalPipeline(tmp_path / "job", et, clock)
    p.batch([click("a", "12:30"), click("b", "13:20"), click("c", "14:05")])
    assert p.controller.state.marked_through == t("13:00")  # 12:00 and 13:00 marked; 14:00 open
    return et, clock, p


def test_status_says_how_far_back_a_seek_must_go_from_the_spool_of_a_stopped_job(tmp_path):
    et, clock, p = _job(tmp_path)
    spool = p.ckpt.root / "etl" / "source" / "pubsub" / "segments"
    _segment(spool, [t("14:08"), t("13:31"), t("14:09")])  # a late event on its way: published 13:31
    st = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=clock(),
                    out_of_orderness=et.out_of_orderness)
    assert st["seek_to"] == iso(t("13:31")) and st["seek_to_by"] == "the oldest message the spool holds"
    assert st["seek_to_from"] == "the checkpoint"
    for seg in spool.iterdir():
        seg.unlink()
    st = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=clock(),
                    out_of_orderness=et.out_of_orderness)
    assert st["seek_to"] == iso(t("14:00") - et.out_of_orderness), "nothing spooled: the oldest open hour's start"

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "click").symlink_to(p.ckpt.root)
    _segment(spool, [t("13:31")])
    res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                                    "--checkpoint-root", str(tmp_path / "root")])
    assert res.exit_code == 0, res.output
    assert (f"  Pub/Sub: a seek must go back to {iso(t('13:31'))} (the oldest message the spool holds; from the "
            f"checkpoint): gcloud pubsub subscriptions seek SUBSCRIPTION --time={iso(t('13:31'))}"
            in res.output.splitlines()), res.output
    res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                                    "--checkpoint-root", str(tmp_path / "root"), "--json"])
    assert json.loads(res.output)[0]["seek_to"] == iso(t("13:31"))


def test_a_running_job_writes_it_into_its_lease_and_it_outlives_a_lost_checkpoint(tmp_path):
    from event_etl.job.status import seek_fields_at
    from event_etl.sources.spool import Spool
    from event_etl.storage.lease import LEASE_NAME, Lease

    et, clock, p = _job(tmp_path)
    spool = p.ckpt.root / "etl" / "source" / "pubsub" / "segments"
    _segment(spool, [t("13:45")])
    lease = Lease(p.storage, "click", p.ckpt.root, now_millis)  # the lease runs on the real clock, as status reads it
    down = {"now": None}
    lease.extra = lambda: {**seek_fields_at(p.controller.state, et.out_of_orderness,
                                            Spool.of_segments(spool).oldest_publish_ms()),
                           **({"source_down": down["now"]} if down["now"] else {})}
    lease.acquire()
    try:
        doc = json.loads((p.sink / "click" / LEASE_NAME).read_text())
        assert doc["seek_to"] == iso(t("13:45")) and doc["seek_to_ms"] == t("13:45")
        st = job_status("click", storage=p.storage, checkpoint_dir=p.ckpt.root, now=now_millis())
        assert st["state"] == "running" and st["seek_to"] == iso(t("13:45"))
        assert st["seek_to_from"].startswith("the running job") and st["source_down"] is None
        down["now"] = "the spool's disk is full (No space left on device) for 12s: pulling waits for room"
        lease.renew()
        (tmp_path / "root").mkdir()
        (tmp_path / "root" / "click").symlink_to(p.ckpt.root)
        res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                                        "--checkpoint-root", str(tmp_path / "root")])
        assert f"  source DOWN: {down['now']}" in res.output.splitlines(), res.output
    finally:
        lease._stop.set()  # the job dies: its lease stays, expired in time
    st = job_status("click", storage=p.storage, checkpoint_dir=tmp_path / "lost-disk", now=now_millis() + HOUR_MS)
    assert st["seek_to"] == iso(t("13:45")), "no checkpoint: what the job last wrote"
    assert "no checkpoint here" in st["seek_to_from"]


def _response(published: list[int], first_id: int = 0) -> bytes:
    msgs = []
    for i, pub in enumerate(published, start=first_id):
        ts = timestamp_pb2.Timestamp(seconds=pub // 1000, nanos=(pub % 1000) * 1_000_000)
        msgs.append(ReceivedMessage(ack_id=f"a{i}", message=PubsubMessage(data=b"{}", message_id=str(i),
                                                                          publish_time=ts)))
    return PullResponse.serialize(PullResponse(received_messages=msgs))


def _status_lines(tmp_path, p, *extra: str) -> list[str]:
    root = tmp_path / "root"
    if not root.exists():
        root.mkdir()
        (root / "click").symlink_to(p.ckpt.root)
    res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                                    "--checkpoint-root", str(root), *extra])
    assert res.exit_code == 0, res.output
    return res.output.splitlines()


def test_a_late_event_older_than_the_oldest_open_hour_decides_the_seek_to_the_millisecond(tmp_path):
    """The issue's case: the oldest open hour is 14:00 (out_of_orderness 2 m: 13:58), the spool holds an
    acknowledged late event published at 13:07:41.250 (on its way to a ``late-`` file of 13:00): a seek to 13:58
    would lose it.  Status prints the earlier time, with what decided it, in the table and in --json."""
    et, clock, p = _job(tmp_path)
    spool = p.ckpt.root / "etl" / "source" / "pubsub" / "segments"
    late = t("13:07") + 41_250
    spool.mkdir(parents=True)
    write_segment(spool, SegmentName("a1b2c3d4", 0, 0, 2), [_response([t("14:09")]), _response([late], 1)])
    lines = _status_lines(tmp_path, p)
    assert ("  Pub/Sub: a seek must go back to 2026-11-21T13:07:41.250Z (the oldest message the spool holds; from "
            "the checkpoint): gcloud pubsub subscriptions seek SUBSCRIPTION --time=2026-11-21T13:07:41.250Z"
            in lines), lines
    row = json.loads("\n".join(_status_lines(tmp_path, p, "--json")))[0]
    assert row["seek_to"] == iso(late) == "2026-11-21T13:07:41.250Z" and row["seek_to_ms"] == late
    assert row["seek_to_by"] == "the oldest message the spool holds" and row["seek_to_from"] == "the checkpoint"
    assert row["seek_to_ms"] < t("14:00") - et.out_of_orderness  # what the runbook said before


def test_the_spool_of_an_open_segment_counts_and_an_empty_spool_leaves_the_open_hours(tmp_path):
    from event_etl.sources.spool import OpenSegment

    et, clock, p = _job(tmp_path)
    spool = p.ckpt.root / "etl" / "source" / "pubsub" / "segments"
    spool.mkdir(parents=True)
    lines = _status_lines(tmp_path, p)
    want = iso(t("14:00") - et.out_of_orderness)
    assert (f"  Pub/Sub: a seek must go back to {want} (the oldest open hour's start minus out_of_orderness; from the "
            f"checkpoint): gcloud pubsub subscriptions seek SUBSCRIPTION --time={want}" in lines), lines

    seg = OpenSegment(spool, "a1b2c3d4", 0, 0)  # a killed job's open segment: acknowledged, not yet finished
    seg.append(_response([t("12:51")]), 1, t("12:51"))
    os.close(seg.fd)  # its writer dies: the file stays open-named
    lines = _status_lines(tmp_path, p)
    assert any(line.startswith(f"  Pub/Sub: a seek must go back to {iso(t('12:51'))} (the oldest message the spool "
                               "holds") for line in lines), lines


def test_a_type_with_another_source_says_nothing_of_a_seek(tmp_path):
    _et, _clock, p = _job(tmp_path)  # a directory source: no spool in its checkpoint
    lines = _status_lines(tmp_path, p)
    assert not any("seek" in line for line in lines), lines
    row = json.loads("\n".join(_status_lines(tmp_path, p, "--json")))[0]
    assert "seek_to" not in row and row["state"] == "stopped"


def test_a_damaged_segment_counts_only_while_it_is_still_in_the_spool(tmp_path):
    """The runbook's order for a damaged segment: status first (its frames' headers still count), then move it out.
    Moved out first, status no longer sees its messages and prints a time that would lose them."""
    from event_etl.sources.spool import MAGIC, SpoolDamaged, read_messages

    et, clock, p = _job(tmp_path)
    spool = p.ckpt.root / "etl" / "source" / "pubsub" / "segments"
    spool.mkdir(parents=True)
    name = SegmentName("a1b2c3d4", 0, 0, 2)
    write_segment(spool, name, [_response([t("13:12")]), _response([t("14:09")], 1)])
    path = spool / name.name
    data = bytearray(path.read_bytes())
    data[len(MAGIC) + 16 + 3] ^= 0xFF  # bit rot in the first frame's response
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolDamaged):
        list(read_messages(path))
    lines = _status_lines(tmp_path, p)
    assert any(line.startswith(f"  Pub/Sub: a seek must go back to {iso(t('13:12'))} (the oldest message the spool "
                               "holds; from the checkpoint)") for line in lines), lines

    path.rename(tmp_path / name.name)  # kept aside, as the runbook says, but only after status
    lines = _status_lines(tmp_path, p)
    assert any(line.startswith(f"  Pub/Sub: a seek must go back to {iso(t('14:00') - et.out_of_orderness)} ")
               for line in lines), lines


def test_after_a_lost_checkpoint_the_runbook_command_prints_what_the_job_last_wrote(tmp_path):
    """docs/runbook.md, 'A lost checkpoint': ``event-etl status --checkpoint-root`` of a folder that is gone."""
    from event_etl.job.status import seek_fields_at
    from event_etl.sources.spool import Spool
    from event_etl.storage.lease import LEASE_NAME, Lease

    et, clock, p = _job(tmp_path)
    spool = p.ckpt.root / "etl" / "source" / "pubsub" / "segments"
    _segment(spool, [t("13:22")])
    lease = Lease(p.storage, "click", p.ckpt.root, now_millis, ttl_ms=400)
    lease.extra = lambda: seek_fields_at(p.controller.state, et.out_of_orderness,
                                         Spool.of_segments(spool).oldest_publish_ms())
    lease.acquire()
    lease.stop_renewing(timeout=10)  # killed with its disk: the lease stays in the sink until it expires
    doc = json.loads((p.sink / "click" / LEASE_NAME).read_text())
    assert doc["seek_to"] == iso(t("13:22"))
    time.sleep(max(0, doc["expires_at_ms"] - now_millis() + 50) / 1000)
    res = CliRunner().invoke(main, ["status", "--sink", str(p.sink), "--event-types", str(tmp_path / "types"),
                                    "--checkpoint-root", str(tmp_path / "lost-disk")])
    assert res.exit_code == 0, res.output
    line = next((x for x in res.output.splitlines() if x.startswith("  Pub/Sub: ")), None)
    assert line is not None, res.output
    assert line.startswith(f"  Pub/Sub: a seek must go back to {iso(t('13:22'))} (the oldest message the spool "
                           "holds; from the job's lease, last renewed at "), line
    assert line.endswith(f"(no checkpoint here)): gcloud pubsub subscriptions seek SUBSCRIPTION "
                         f"--time={iso(t('13:22'))}"), line
