"""Finding duplicates: earlier batches (within the window) and earlier records of the same batch."""

from __future__ import annotations

import numpy as np

from event_etl.task.dedupe import (
    ID_KEY,
    KEY_DTYPE,
    MESSAGE_KEY,
    DedupeState,
    find_duplicates,
    key_hash,
    may_hold_duplicates,
    rows_of,
    stored,
    stored_of,
)


def rows(*items, kind=ID_KEY):
    return np.array([(*it, kind) if len(it) == 5 else it for it in items], dtype=KEY_DTYPE)


K = {name: key_hash("i", name) for name in "abcd"}


def test_first_occurrence_in_record_order_is_kept():
    r = rows((K["a"], 0, 1, 0, 0), (K["a"], 0, 0, 0, 5), (K["b"], 0, 0, 0, 1), (K["a"], 0, 0, 0, 9))
    assert find_duplicates(r, np.zeros(0, np.uint64)).tolist() == [True, False, False, True]


def test_seen_keys_are_duplicates_and_all_rows_of_a_record_go():
    m = key_hash("m", "msg-1")
    r = rows((K["a"], 0, 0, 0, 0), (m, 0, 0, 0, 0), (K["c"], 0, 0, 0, 1))
    assert find_duplicates(r, np.array([m], np.uint64)).tolist() == [True, True, False]


def test_state_forgets_what_is_older_than_the_window_and_a_replay_does_not_see_itself():
    st = DedupeState.empty(10)
    st.add(1, rows((K["a"], 100, 0, 0, 0)))
    st.add(2, rows((K["b"], 115, 0, 0, 0)))
    assert set(st.seen_before(2).tolist()) == {K["a"]}
    assert set(st.seen_before(3).tolist()) == {K["a"], K["b"]}
    assert st.known_before(2)(np.array([K["a"], K["b"]], np.uint64)).tolist() == [True, False]
    assert st.evict(112) == [1]
    assert set(st.keys.tolist()) == {K["b"]}


def test_message_keys_are_forgotten_by_the_publish_time_clock_in_a_backfill():
    """Events of weeks ago published now: the event clock would never forget their message keys."""
    week = 7 * 24 * 3600 * 1000
    st = DedupeState.empty(600_000)
    for b in range(10):
        published = 1_000_000_000 + b * 120_000  # 2 minutes of publish time per batch
        st.add(b, rows((key_hash("m", f"{b}@{published}"), published, 0, 0, 0), kind=MESSAGE_KEY), acked=True)
        st.evict(event_clock=1_000_000_000 - 3 * week)
    assert len(st.keys) < 7, "older than 10 minutes of publish time: forgotten"


def test_keys_of_an_unacknowledged_batch_wait_for_their_redelivery_even_out_of_order():
    """The job died between saving a batch and acknowledging it; after a downtime, the backlog comes
    back with newer messages first: the redelivered copies must still be found."""
    st = DedupeState.empty(600_000)
    late = [(key_hash("m", f"m{i}@1000"), 1000, 0, 0, i) for i in range(3)]
    st.add(0, rows(*late, kind=MESSAGE_KEY), acked=False)
    hour = 3_600_000
    st.add(1, rows((key_hash("m", "new@5000000"), 5 * hour, 0, 0, 0), kind=MESSAGE_KEY), acked=True)
    st.evict(event_clock=5 * hour)
    st.add(2, rows((key_hash("m", "newer@6000000"), 6 * hour, 0, 0, 0), kind=MESSAGE_KEY), acked=True)
    assert st.evict(event_clock=6 * hour) == [1]
    known = st.known_before(3)
    again = np.array([k for k, *_ in late], np.uint64)
    assert known(again).all(), "hours of publish time later, the unacknowledged keys are still known"
    st.seen_again(again[:2])
    st.evict(event_clock=6 * hour)
    assert st.known_before(3)(again).all(), "seen again: kept for the window from now (a message may come thrice)"
    st.seen_again(again[2:])
    st.add(3, rows((key_hash("m", "x@7000000"), 7 * hour, 0, 0, 0), kind=MESSAGE_KEY), acked=True)
    assert 0 in st.evict(event_clock=7 * hour), "every key seen again: the batch's stored keys may go"
    assert not st.known_before(4)(again).any(), "an hour of publish time later they are forgotten"


def test_rows_of_and_hash_are_stable():
    blob = rows((K["a"], 1, 2, 3, 4)).tobytes()
    assert rows_of([blob, b"", blob]).shape == (2,)
    assert key_hash("i", "a") == key_hash("i", "a") != key_hash("m", "a")


def test_a_redelivered_message_is_dropped_from_the_buckets_and_from_the_dead_letter_area(tmp_path):
    """Pub/Sub redelivers a message (same id, same publish time) after a crash before its ack."""
    import json

    import fastavro

    from event_etl.sources.pubsub import SPOOL_SCHEMA
    from event_etl.sources.splits import Split
    from tests.lib.harness import FakeClock, LocalPipeline, make_event_type, read_deadletter, read_sink, t

    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types"), FakeClock(t("13:30")))

    def msg(mid, data, at):
        return {"message_id": mid, "publish_time": t(at), "attributes": {}, "data": data, "ordering_key": "",
                "delivery_attempt": 0}

    def spool(name, msgs):
        path = tmp_path / name
        with open(path, "wb") as fh:
            fastavro.writer(fh, SPOOL_SCHEMA, msgs)
        return Split(0, "spool", str(path), 0, len(msgs), 0)

    bad = msg("153", b"{broken", "13:20")
    ok = msg("154", json.dumps({"id": "a", "ts": t("13:10")}).encode(), "13:20")
    p.controller.run_batch(0, p.task_runner([spool("s1.avro", [bad, ok])]))
    again = p.controller.run_batch(1, p.task_runner([spool("s2.avro", [bad, msg("155", json.dumps(
        {"id": "b", "ts": t("13:11")}).encode(), "13:21"), ok])]))
    assert again.result.counts["duplicate"] == 2
    assert [r["source"] for r in read_deadletter(p.sink, "click")] == ["msg:153"]
    ids = sorted(i for hc in read_sink(p.sink, "click").values() for i in hc.timely)
    assert ids == ["a", "b"]
    # a message id the emulator reuses after a restart, with another publish time, is a new message
    p.controller.run_batch(2, p.task_runner([spool("s3.avro", [msg("153", b"{other", "13:25")])]))
    assert sorted(r["payload"] for r in read_deadletter(p.sink, "click")) == [b"{broken", b"{other"]


def _reference_find_duplicates(rows, seen):
    """The rule spelled out record by record: first occurrence (shard, file, record order) kept."""
    recs = {}
    for r in rows.tolist():
        recs.setdefault((r[2], r[3], r[4]), []).append(r[0])
    known = set(seen.tolist())
    bad = set()
    for rec in sorted(recs):
        ks = recs[rec]
        if any(k in known for k in ks):
            bad.add(rec)
        known.update(ks)
    return np.array([(r[2], r[3], r[4]) in bad for r in rows.tolist()], dtype=bool)


def test_find_duplicates_agrees_with_the_rule_spelled_out():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.tuples(st.integers(0, 12), st.integers(0, 2), st.integers(0, 3), st.integers(0, 5)), max_size=30),
        st.lists(st.integers(0, 12), max_size=5),
    )
    def check(items, seen_list):
        uniq = {}
        for key, shard, file, rec in items:
            uniq[(key, shard, file, rec)] = None  # one row per (key, record)
        rows = np.array([(k, 0, s, f, r, 0) for (k, s, f, r) in uniq], dtype=KEY_DTYPE)
        seen = np.unique(np.array(seen_list, dtype=np.uint64))
        assert find_duplicates(rows, seen).tolist() == _reference_find_duplicates(rows, seen).tolist()

    check()


def test_the_drivers_quick_check_on_the_tasks_key_blobs_agrees_with_find_duplicates():
    """The driver settles a batch without duplicates from the tasks' key blobs alone (no copy of every row):
    its answer, and the rows it keeps, must be those of the full path."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    row = st.tuples(st.integers(0, 40), st.integers(-5, 5), st.integers(0, 3), st.integers(0, 3), st.integers(0, 9),
                    st.sampled_from([ID_KEY, MESSAGE_KEY]))

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.lists(row, max_size=8), max_size=4), st.lists(st.integers(0, 40), max_size=5),
           st.booleans())
    def check(tasks, seen_list, as_function):
        blobs = [np.array(t, dtype=KEY_DTYPE).tobytes() for t in tasks]
        seen = np.unique(np.array(seen_list, dtype=np.uint64))
        known = (lambda k: np.isin(k, seen)) if as_function else seen
        full = rows_of(blobs)
        assert may_hold_duplicates(blobs, known) == bool(find_duplicates(full, known).any())
        assert stored_of(blobs).tobytes() == stored(full).tobytes()

    check()


def test_incremental_state_equals_a_state_rebuilt_from_its_batches():
    from event_etl.task.dedupe import stored

    rng = np.random.default_rng(3)
    st_ = DedupeState.empty(1000)
    kept: dict[int, np.ndarray] = {}
    for b in range(12):
        r = np.zeros(50, dtype=KEY_DTYPE)
        r["key"] = rng.integers(0, 200, 50, dtype=np.uint64)
        r["time"] = b * 400 + rng.integers(0, 400, 50)
        r["kind"] = rng.integers(0, 2, 50)
        st_.add(b, r, acked=bool(b % 3))
        kept[b] = stored(r)
        for gone in st_.evict(b * 400):
            del kept[gone]
        again = DedupeState.from_batches(1000, [(k, v, bool(k % 3)) for k, v in kept.items()], b * 400)
        probe = np.arange(200, dtype=np.uint64)
        assert st_.known_before(b + 1)(probe).tolist() == again.known_before(b + 1)(probe).tolist()
        # nothing within the window is forgotten
        recent = np.concatenate(
            [v["key"][(v["kind"] == ID_KEY) & (v["time"] >= b * 400 - 1000)] for v in kept.values()]
        )
        assert st_.known_before(b + 1)(recent).all()


def test_a_dropped_redelivery_delivered_once_more_after_its_id_left_the_window_is_dropped(tmp_path):
    """A message dropped as a duplicate in a batch whose acknowledgement was lost comes again, hours of event
    time later: its message key is remembered even though it was never written."""
    import json

    import fastavro

    from event_etl.sources.pubsub import SPOOL_SCHEMA
    from event_etl.sources.splits import Split
    from tests.lib.harness import FakeClock, LocalPipeline, make_event_type, read_sink, t

    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types"), FakeClock(t("13:30")))
    from event_etl.sources.face import Hooks

    p.controller.source = Hooks(on_acknowledge=lambda inputs: False)  # acknowledgements lost (the job died before them)

    def msg(mid, data, at):
        return {"message_id": mid, "publish_time": t(at), "attributes": {}, "data": data, "ordering_key": "",
                "delivery_attempt": 0}

    def spool(name, msgs):
        path = tmp_path / name
        with open(path, "wb") as fh:
            fastavro.writer(fh, SPOOL_SCHEMA, msgs)
        return Split(0, "spool", str(path), 0, len(msgs), 0)

    a = json.dumps({"id": "a", "ts": t("13:10")}).encode()
    # a producer retry: two messages with the same id; the second is dropped as a duplicate
    p.controller.run_batch(0, p.task_runner([spool("s0.avro", [msg("1", a, "13:20"), msg("2", a, "13:20")])]))
    later = json.dumps({"id": "z", "ts": t("16:40")}).encode()
    p.controller.run_batch(1, p.task_runner([spool("s1.avro", [msg("3", later, "16:41")])]))  # 3 hours on
    again = p.controller.run_batch(2, p.task_runner([spool("s2.avro", [msg("2", a, "13:20")])]))  # message 2 again
    assert again.result.counts == {"duplicate": 1}
    assert sorted(i for hc in read_sink(p.sink, "click").values() for i in hc.timely + hc.late) == ["a", "z"]


def test_a_batchs_keys_are_saved_in_both_layouts_whatever_their_number(tmp_path, monkeypatch):
    """``.k2`` (read by this release) and format 1's ``.keys`` (read by release 0.1.0 after a rollback) hold the
    same keys; the latter is written a slice at a time, so slices must join into exactly format 1's file."""
    from event_etl.job import checkpoint
    from event_etl.task.dedupe import LEGACY_KEY_DTYPE, STORED_DTYPE, legacy_rows

    monkeypatch.setattr(checkpoint, "_SLICE_ROWS", 3)
    ckpt = checkpoint.Checkpoint(tmp_path / "ckpt")
    kept = np.zeros(8, dtype=STORED_DTYPE)
    kept["key"], kept["time"], kept["kind"] = np.arange(100, 108), np.arange(8) * 1000, [ID_KEY, MESSAGE_KEY] * 4
    ckpt.save_dedupe_rows(7, kept)
    d = tmp_path / "ckpt" / "etl" / "dedupe"
    assert (d / "0000000007.k2").read_bytes() == kept.tobytes()
    old = np.frombuffer((d / "0000000007.keys").read_bytes(), dtype=LEGACY_KEY_DTYPE)
    assert old.tobytes() == legacy_rows(kept).tobytes()
    assert old["key"].tolist() == list(range(100, 108))
    [(batch, loaded, _)] = ckpt.load_dedupe_rows()
    assert batch == 7 and loaded.tobytes() == kept.tobytes()


def test_keys_sorted_in_two_halves_at_once_are_sorted_as_one(monkeypatch):
    """A large batch's keys are sorted as two halves in two threads and then merged: the same array as one sort,
    repeated keys (the duplicates the driver looks for) included; and the driver's checks agree with it."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    import event_etl.task.dedupe as dedupe

    monkeypatch.setattr(dedupe, "PARALLEL_SORT_KEYS", 2)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(0, 2**64 - 1), max_size=60), st.integers(0, 20))
    def check(keys, repeats):
        arr = np.array(keys + keys[:repeats], dtype=np.uint64)
        got = dedupe.sort_keys(arr)
        assert got.dtype == np.uint64 and got.tolist() == sorted(arr.tolist())
        rows = np.zeros(len(arr), dtype=KEY_DTYPE)
        rows["key"], rows["rec"] = arr, np.arange(len(arr))
        repeated = len(set(arr.tolist())) < len(arr)
        assert dedupe.may_hold_duplicates([rows.tobytes()], np.zeros(0, dtype=np.uint64)) == repeated
        assert dedupe.find_duplicates(rows, np.zeros(0, dtype=np.uint64)).any() == repeated

    check()


def test_a_replay_decides_its_duplicates_as_its_first_attempt_did(tmp_path, monkeypatch):
    """A message delivered a third time, after its key left the window in memory, is written; the job dies between
    the marker listing its file and the state.  The dedupe state reloaded from disk still holds the key (its first
    batch was never acknowledged): the replay must still write the same file, not drop the record a marker lists."""
    import json

    import fastavro

    from event_etl.job.checkpoint import Checkpoint
    from event_etl.sources.pubsub import SPOOL_SCHEMA
    from event_etl.sources.splits import Split
    from tests.lib.harness import FakeClock, LocalPipeline, check_manifest_matches_folder, hour, make_event_type, t

    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types", out_of_orderness="5m", dedupe_window="10m"),
                      FakeClock(t("14:40")))
    acks = iter([False, True, True, True, True, True])
    from event_etl.sources.face import Hooks

    p.controller.source = Hooks(on_acknowledge=lambda inputs: next(acks))  # batch 0 acknowledgement lost: sent again

    def msg(mid, id_, ts, at):
        return {"message_id": mid, "publish_time": t(at), "attributes": {}, "ordering_key": "", "delivery_attempt": 0,
                "data": json.dumps({"id": id_, "ts": t(ts)}).encode()}

    def batch(b, *msgs):
        path = tmp_path / f"s{b}.avro"
        with open(path, "wb") as fh:
            fastavro.writer(fh, SPOOL_SCHEMA, list(msgs))
        return p.controller.run_batch(b, p.task_runner([Split(0, "spool", str(path), 0, len(msgs), 0)]))

    x = msg("1", "x", "13:10", "13:20")
    batch(0, x, msg("9", "v", "13:11", "13:20"))  # v never comes again: batch 0's keys stay in the checkpoint
    batch(1, msg("8", "u", "13:12", "13:21"))
    assert batch(2, x).result.counts == {"duplicate": 1}  # its redelivery: dropped, its key kept for the window
    batch(3, msg("2", "y", "13:59", "14:00"))  # both clocks move on: x's keys leave the window
    real_save = Checkpoint.save_state

    def die_before_saving(self, state):
        if state.last_batch_id == 4:
            raise KeyboardInterrupt("killed between the markers and the state")
        real_save(self, state)

    monkeypatch.setattr(Checkpoint, "save_state", die_before_saving)
    import pytest

    with pytest.raises(KeyboardInterrupt):
        batch(4, x, msg("3", "w", "14:30", "14:31"))  # x a third time: written; hour 13 marked with it
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    from event_etl.rules.manifest import Manifest

    assert Manifest.from_bytes(before["_COMPLETE"]).records == 5  # x (twice: after its window), v, u, y
    monkeypatch.setattr(Checkpoint, "save_state", real_save)
    p.restart()
    batch(4, x, msg("3", "w", "14:30", "14:31"))  # Spark replays the batch
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before, "a marked hour never changes"
    check_manifest_matches_folder(p.sink, "click", hour("13"))
