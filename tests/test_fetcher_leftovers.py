"""Issue 57 item 8: two reliability leftovers of the Pub/Sub fetcher's spool path.

1. A stream that dies with a pull in hand, from *any* exception (a bug, an answer that does not parse, a
   ``RuntimeError`` between the pull and the spool), hands the pull's messages back (a deadline of 0, as on a full
   disk) when it knows their ids, and otherwise records the run as not clean until that pull's lease has run out (as
   for a pull whose answer was lost), so that the next run settles.  A pull that was made durable and then not
   acknowledged is handed back too, and its segment does not claim to be all acknowledged: the batch that reads it
   waits for the copy Pub/Sub delivers again.
2. ``Fetcher.stop(timeout)`` returns within about its timeout when a segment's close hangs (a folder sync on a sick
   disk); what it leaves is the next start's, and nothing acknowledged is lost.

The service is the fake of the real one in tests/test_pubsub_fetch.py.
"""

from __future__ import annotations

import json
import threading
import time

from event_etl.sources import pubsub_stream, pubsub_wire
from event_etl.sources.pubsub_fetch import RunRecord
from event_etl.sources.spool import OpenSegment, read_messages
from tests.lib.harness import t
from tests.lib.pubsub_service import RealServiceLike, fetcher, segments
from tests.lib.waiting import wait_until


class RecordingService(RealServiceLike):
    """The real service's fake, remembering each pull's ack ids and each deadline of 0 (a hand-back)."""

    def __init__(self) -> None:
        super().__init__()
        self.pulled_ids: list[list[str]] = []
        self.handed_back: list[str] = []

    def pull(self, subscription, max_messages, timeout=None):
        resp = super().pull(subscription, min(max_messages, 100), timeout)
        self.pulled_ids.append([rm.ack_id for rm in resp.received_messages])
        return resp

    def modify_ack_deadline(self, subscription, ack_ids, ack_deadline_seconds, timeout=None):
        if ack_deadline_seconds == 0:
            self.handed_back.extend(ack_ids)
        return super().modify_ack_deadline(subscription, ack_ids, ack_deadline_seconds, timeout)


def spooled_ids(tmp_path) -> set[str]:
    """Message ids durable in the spool: closed segments, and open ones (whole frames) a next start would finish."""
    d = tmp_path / "spool" / "segments"
    out = {mid for p in segments(tmp_path) for _, mid, _, _, _ in read_messages(p)}
    for p in list(d.glob("*.open")) + list(d.glob("*.fenced")):
        try:
            out |= {mid for _, mid, _, _, _ in read_messages(p)}
        except Exception:  # noqa: BLE001 - a torn tail: only whole frames count
            pass
    return out


def once(real, exc):
    """``real``, raising ``exc`` on its first call only."""
    calls = {"n": 0}

    def wrapper(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise exc
        return real(*a, **k)

    return wrapper


def test_a_pull_whose_answer_fails_to_be_read_leaves_the_run_unclean(tmp_path, monkeypatch):
    """A ``RuntimeError`` between the service's answer and the spool (here: reading the answer) kills the stream with
    100 messages leased and no id of them known to hand back.  The stop must not say ``clean``: the next run settles
    for that pull's lease, as after a pull whose answer was lost.  Before the fix: ``clean: true``."""
    svc = RecordingService()
    svc.subscription_deadline = 30
    for i in range(100):
        svc.publish(b"x", t("13:00") + i)
    monkeypatch.setattr(pubsub_wire, "pull_bytes", once(pubsub_wire.pull_bytes, RuntimeError("a bug")))
    f = fetcher(tmp_path, svc, streams=1).start()
    wait_until(lambda: f.error is not None, what="the stream's death")
    f.stop()
    assert "RuntimeError: a bug" in f.error.message
    assert len(svc.pulled_ids) == 1 and len(svc.pulled_ids[0]) == 100
    leased = [a for a in svc.pulled_ids[0] if a in svc.leased]
    assert leased and not svc.handed_back, "no id known to hand back: they stay leased"
    doc = json.loads((tmp_path / "spool" / "run.json").read_text())
    assert doc["clean"] is False, doc
    assert doc["leased_until"] >= doc["started_at"] + 30_000, "the pull's lease, from when it was sent"
    assert 15 < RunRecord(tmp_path / "spool").previous_lease() <= 30, "the next run waits out that lease"
    again = fetcher(tmp_path, svc, streams=1)
    again.begin_run()
    assert again.settling(), "the next run settles before it reads"
    assert not svc.acked and not spooled_ids(tmp_path), "nothing acknowledged, nothing spooled"


def test_a_stream_that_dies_in_the_append_hands_its_pull_back(tmp_path, monkeypatch):
    """The brief's own example: a ``RuntimeError`` while the pull is appended to the spool.  The stream's ``finally``
    hands it back (deadline 0 for exactly its ids), so the stop may be clean; nothing is acknowledged.  (This one
    passed before the fix too: kept as a guard of the hand-back that item 1 relies on.)"""
    svc = RecordingService()
    for i in range(100):
        svc.publish(b"x", t("13:00") + i)
    monkeypatch.setattr(OpenSegment, "append", once(OpenSegment.append, RuntimeError("boom")))
    f = fetcher(tmp_path, svc, streams=1).start()
    wait_until(lambda: f.error is not None, what="the stream's death")
    f.stop()
    assert len(svc.pulled_ids) == 1 and sorted(svc.handed_back) == sorted(svc.pulled_ids[0])
    assert not [a for a in svc.pulled_ids[0] if a in svc.leased and svc.leased[a][3] > time.monotonic()]
    assert not svc.acked and not spooled_ids(tmp_path)
    doc = json.loads((tmp_path / "spool" / "run.json").read_text())
    assert doc["clean"] is True or RunRecord(tmp_path / "spool").previous_lease() > 0, doc


def test_a_durable_pull_whose_acknowledgement_raises_is_handed_back_and_its_segment_says_so(tmp_path, monkeypatch):
    """A ``RuntimeError`` after the pull is durable in the open segment and before it is acknowledged: its messages
    are handed back (they come again), and the segment holding the first copy must not claim to be all acknowledged
    (``ack()`` False), or the batch that reads it drops the dedupe keys the redelivery needs.  Before the fix: the
    stop closed the segment as all acknowledged."""
    svc = RecordingService()
    for i in range(100):
        svc.publish(b"x", t("13:00") + i)
    monkeypatch.setattr(pubsub_stream, "acknowledge_in_bulk",  # what a stream acknowledges its pulls with
                        once(pubsub_stream.acknowledge_in_bulk, RuntimeError("a bug")))
    f = fetcher(tmp_path, svc, streams=1, segment_age=60.0, segment_messages=10_000).start()
    wait_until(lambda: f.error is not None, what="the stream's death")
    f.stop()
    assert len(svc.pulled_ids) == 1 and sorted(svc.handed_back) == sorted(svc.pulled_ids[0]), "handed back"
    assert not svc.acked
    names = [p.name for p in segments(tmp_path)]
    assert len(names) == 1 and len(spooled_ids(tmp_path)) == 100, "the durable copy is in the spool"
    assert f.ack(names) is False, "its messages come again: the batch must wait for them"


def test_stop_returns_within_its_timeout_when_a_segments_close_hangs(tmp_path, monkeypatch):
    """A segment's close that hangs (its folder sync on a sick disk) must not hold ``stop(timeout=1)`` for ever: it
    returns within ~2 s, the record still says the run did not stop cleanly, and nothing acknowledged is lost (the
    open segment is durable and acknowledged: the next start finishes it).  Before the fix: the stop waited for the
    close."""
    svc = RecordingService()
    published = {svc.publish(b"x", t("13:00") + i) for i in range(100)}
    gate = threading.Event()
    entered = threading.Event()
    real_close = OpenSegment.close

    def hanging_close(self):
        entered.set()
        gate.wait(30)
        return real_close(self)

    f = fetcher(tmp_path, svc, streams=1, segment_age=60.0, segment_messages=10_000).start()
    try:
        wait_until(lambda: svc.acked == published, what="every message durable and acknowledged")
        monkeypatch.setattr(OpenSegment, "close", hanging_close)
        done = threading.Event()
        took: list[float] = []

        def stop() -> None:
            t0 = time.monotonic()
            f.stop(timeout=1)
            took.append(time.monotonic() - t0)
            done.set()

        threading.Thread(target=stop, name="test-stop", daemon=True).start()
        returned = done.wait(4)
        assert entered.is_set(), "the stop tried to close the open segment"
        assert returned and took[0] < 2.0, f"stop(timeout=1) still waiting after 4 s ({took})"
        doc = json.loads((tmp_path / "spool" / "run.json").read_text())
        assert doc["clean"] is False, "a stop that did not finish is recorded as not clean (the next run settles)"
        # the next start (the old close still hung) finishes the open segment: every acknowledged message is there
        again = fetcher(tmp_path, svc, streams=1)
        again.begin_run()
        assert svc.acked <= spooled_ids(tmp_path) and len(spooled_ids(tmp_path)) == 100
        assert again.settling()
    finally:
        gate.set()
    wait_until(lambda: not any(th.name.startswith("spool-stop-") and th.is_alive() for th in threading.enumerate()),
               what="the abandoned close ended once the disk answered")
    assert svc.acked <= spooled_ids(tmp_path), "the late close took nothing away"
