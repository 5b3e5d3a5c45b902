"""Few files per hour whatever the trigger (issue 14): the merge rules, the block merge, and the job around them.

A small type with a short trigger writes a file per batch; its complete hours must hold at most
``ceil(records / max_events_per_file) + 2`` data files, every record once, the marker listing
exactly the folder, and a kill at any step of a merge must lose and duplicate nothing."""

from __future__ import annotations

import io
import math

import fastavro
import pytest

from event_etl import faults
from event_etl.rules.buckets import data_file_name
from event_etl.rules.compaction import (
    ROLLING_FILES,
    apply_merges,
    closing_soon,
    file_bound,
    is_merged_name,
    merge_groups,
    merged_file_name,
)
from event_etl.rules.manifest import FileEntry
from event_etl.storage.compaction import MergeError, merge_containers
from tests.lib.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    click,
    hour,
    make_event_type,
    read_sink,
    t,
)

H13 = hour("13")


def entry(batch: int, records: int, *, late: bool = False, shard: int = 0, fp: str = "crc64avro:a") -> FileEntry:
    return FileEntry(data_file_name(H13, batch, shard, 0, late=late, writer="abcdef"), records, 100, "x" * 64, late, fp)


# -- the rules -----------------------------------------------------------------------------
def test_small_files_of_one_kind_merge_when_they_fill_a_file_or_the_hour_closes():
    files = [entry(1, 3), entry(2, 4), entry(3, 10), entry(4, 2, late=True), entry(5, 1, late=True)]
    assert merge_groups(files, 10, final=False) == []  # 7 part records, 3 late: neither fills a file of 10
    assert merge_groups(files, 7, final=False) == [(files[0], files[1])]  # 3 + 4 fill one; 10 is full already
    final = merge_groups(files, 10, final=True)
    assert final == [(files[0], files[1]), (files[3], files[4])]  # part and late apart; the full file stays
    assert merge_groups([entry(1, 3), entry(2, 4, fp="crc64avro:b")], 10, final=True) == []  # schemas apart
    assert merge_groups([entry(1, 3)], 10, final=True) == []  # one small file: nothing to merge
    # files release 0.1.0 wrote before an upgrade (no fingerprint in their entry) stay byte for byte
    assert merge_groups([entry(1, 3, fp=""), entry(2, 4, fp=""), entry(3, 2)], 10, final=True) == []


def test_an_hour_within_the_file_bound_is_marked_without_a_final_merge():
    three = [entry(1, 3), entry(2, 4), entry(3, 2)]  # 9 records: ceil(9 / 10) + 2 = 3 files allowed
    assert merge_groups(three, 10, final=True) == []
    assert merge_groups(three + [entry(4, 1)], 10, final=True) == [tuple(three + [entry(4, 1)])]
    full = [entry(b, 10) for b in range(1, 4)]  # 3 full files and 3 small ones: 36 records, 4 + 2 files allowed
    assert merge_groups(full + [entry(b, 2, shard=1) for b in range(1, 4)], 10, final=True) == []
    late = [entry(5, 1, late=True), entry(6, 1, late=True)]  # late files count in the same bound
    assert merge_groups(three[:2] + late, 10, final=True) == [tuple(three[:2]), tuple(late)]


def test_an_hour_is_closing_when_the_watermark_passes_its_end_within_two_batches_at_its_last_pace():
    end = H13 + 3_600_000
    assert closing_soon(H13, end - 10_000, 5_000)  # two batches of 5 s reach the end exactly
    assert not closing_soon(H13, end - 10_001, 5_000)
    assert closing_soon(H13, end - 1_000_000, 3_600_000)  # event time sped up: the hour closes next batch
    assert not closing_soon(H13, end - 1, 0), "a watermark that did not move says nothing"
    assert not closing_soon(H13, None, 5_000)


def test_many_small_files_merge_while_the_hour_is_open_even_if_they_do_not_fill_a_file():
    files = [entry(b, 1) for b in range(ROLLING_FILES)]
    assert merge_groups(files[:-1], 1000, final=False) == []  # one short of the count, far from a full file
    assert merge_groups(files, 1000, final=False) == [tuple(files)]
    assert merge_groups(files, 1000, final=False, max_files=ROLLING_FILES + 1) == []


def test_merged_names_are_data_file_names_in_the_hour_with_a_reserved_shard():
    members = (entry(7, 3), entry(9, 4))
    name = merged_file_name(members, 2, 1, "abcdef")
    assert name == data_file_name(H13, 9, 9002, 1, late=False, writer="abcdef")
    assert is_merged_name(name) and not is_merged_name(members[0].name) and not is_merged_name("_COMPLETE")
    with pytest.raises(ValueError):
        merged_file_name((entry(1, 3), entry(2, 3, late=True)), 0, 0)


def test_recorded_merges_replace_their_members_in_order():
    a, b, c = entry(1, 3), entry(2, 4), entry(3, 5)
    m1 = FileEntry("part-m1.avro", 7, 1, "y" * 64)
    m2 = FileEntry("part-m2.avro", 12, 1, "z" * 64)
    assert apply_merges([a, b, c], [([a.name, b.name], [m1])]) == [c, m1] or \
        apply_merges([a, b, c], [([a.name, b.name], [m1])]) == sorted([c, m1], key=lambda e: e.name)
    assert apply_merges([a, b, c], [([a.name, b.name], [m1]), ([m1.name, c.name], [m2])]) == [m2]
    # the bound: ceil(records / max_events_per_file) + 2, late files counted
    assert file_bound(0, 10) == 2 and file_bound(10, 10) == 3 and file_bound(11, 10) == 4


# -- the block merge -------------------------------------------------------------------------
SCHEMA = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
    {"name": "i", "type": "long"}, {"name": "s", "type": "string"}]})


def container(name: str, start: int, n: int, codec: str = "snappy", *, block: int = 3) -> bytes:
    buf = io.BytesIO()
    recs = [{"i": i, "s": "x" * (i % 5)} for i in range(start, start + n)]
    fastavro.writer(buf, SCHEMA, recs, codec=codec, sync_interval=block * 8, sync_marker=b"\x01" * 16)
    return buf.getvalue()


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy"])
def test_a_merge_keeps_every_record_in_order_in_files_of_exactly_max_records(codec):
    sizes = [5, 1, 9, 4, 13, 2]
    members, start = [], 0
    for k, n in enumerate(sizes):
        members.append((f"m{k}", container(f"m{k}", start, n, codec)))
        start += n
    out = merge_containers(members, 7, lambda seq: f"out-{seq}.avro")
    assert [n for _, _, n in out] == [7, 7, 7, 7, 6]
    assert [name for name, _, _ in out] == [f"out-{k}.avro" for k in range(5)]
    got = [r["i"] for _, data, _ in out for r in fastavro.reader(io.BytesIO(data))]
    assert got == list(range(sum(sizes)))
    for _, data, n in out:
        r = fastavro.reader(io.BytesIO(data))
        assert r.codec == codec and len(list(r)) == n
    assert out == merge_containers(members, 7, lambda seq: f"out-{seq}.avro"), "the same bytes every time"


def test_members_of_another_schema_or_codec_are_not_merged():
    other = fastavro.parse_schema({"type": "record", "name": "R", "fields": [{"name": "i", "type": "long"}]})
    buf = io.BytesIO()
    fastavro.writer(buf, other, [{"i": 1}])
    with pytest.raises(MergeError, match="another schema or codec"):
        merge_containers([("a", container("a", 0, 3)), ("b", buf.getvalue())], 10, str)
    with pytest.raises(MergeError, match="another schema or codec"):
        merge_containers([("a", container("a", 0, 3)), ("b", container("b", 3, 3, "null"))], 10, str)
    with pytest.raises(MergeError, match="not a readable Avro"):
        merge_containers([("a", b"garbage")], 10, str)


@pytest.mark.parametrize("codec", ["deflate", "snappy"])
def test_a_merge_copies_the_blocks_that_fit_as_they_are_stored(codec):
    """Every block of a member that fits whole is in the output byte for byte (its compressed bytes: copied, not
    decompressed), and only the block that straddles a file's end is stored anew; so a merge redone after a kill
    by another release (which copied instead of recompressing, or the other way) writes the same file."""
    from event_etl.storage.compaction import _raw_blocks

    members = [("a", container("a", 0, 9, codec)), ("b", container("b", 9, 9, codec))]

    def blocks(data: bytes) -> list[tuple[int, bytes]]:
        r = fastavro.block_reader(io.BytesIO(data))
        sync = r._header["sync"]
        return list(_raw_blocks(data, data.find(sync) + 16, sync))

    whole, at = [], 0  # the members' blocks that lie within one output file of 12 records
    for _, data in members:
        for n, b in blocks(data):
            if at // 12 == (at + n - 1) // 12:
                whole.append(b)
            at += n
    out = merge_containers(members, 12, lambda seq: f"out-{seq}.avro")
    assert [n for _, _, n in out] == [12, 6]
    copied = [b for _, data, _ in out for _, b in blocks(data)]
    assert len(whole) >= 3 and all(b in copied for b in whole), "every block that fits, as it was stored"
    assert len(copied) <= len(whole) + 2, "only the block that straddles the end is stored anew (in two)"
    # a block cut in two: stored anew, and the records still every one in order
    out = merge_containers(members, 10, lambda seq: f"out-{seq}.avro")
    assert [n for _, _, n in out] == [10, 8]
    assert [r["i"] for _, data, _ in out for r in fastavro.reader(io.BytesIO(data))] == list(range(18))


def test_a_member_whose_blocks_do_not_end_with_its_sync_marker_is_not_merged():
    data = bytearray(container("a", 0, 9))
    data[-1] ^= 0xFF  # the last block's sync marker
    with pytest.raises(MergeError, match="a: cannot be read to the end .*sync marker"):
        merge_containers([("a", bytes(data))], 100, str)


# -- the job -----------------------------------------------------------------------------------
def small_type(tmp_path, per_file=10):
    return make_event_type(tmp_path / "types", out_of_orderness="2m", idle_timeout="1h", max_events_per_file=per_file)


def trickle(p: LocalPipeline, clock: FakeClock, batches: int, per_batch: int, *, first: int = 0, minute0: int = 0):
    """``batches`` batches of ``per_batch`` events of hour 13, a batch every 20 s of hour 13's clock."""
    for b in range(batches):
        now = t("13:00:10") + (minute0 * 60 + 20 * b) * 1000
        clock.now = now + 500
        p.batch([click(f"e{first + b * per_batch + i}", now - i) for i in range(per_batch)])


def assert_hour_whole(p: LocalPipeline, ids: set[str], per_file: int):
    content = read_sink(p.sink, p.et.name)[H13]
    assert content.marker is not None
    check_manifest_matches_folder(p.sink, p.et.name, H13)
    got = content.timely + content.late
    assert sorted(got) == sorted(ids), "every record once"
    assert len(content.files) <= math.ceil(len(ids) / per_file) + 2, sorted(content.files)
    return content


def close_hour(p: LocalPipeline, clock: FakeClock, first: int):
    clock.now = t("14:03")
    p.batch([click(f"x{first}", t("14:02:30"))])


def test_a_trickling_type_ends_its_hour_with_a_handful_of_files(tmp_path):
    et = small_type(tmp_path)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    trickle(p, clock, 60, 3)  # 60 batches of 3 events: 60 files without merging
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    assert len(list(folder.glob("*.avro"))) <= 60 * 3 // 10 + 2, "rolling merges keep an open hour small too"
    close_hour(p, clock, 0)
    content = assert_hour_whole(p, {f"e{i}" for i in range(180)}, 10)
    assert len(content.files) == 18
    assert all(is_merged_name(n) for n in content.files)
    assert p.controller.merges >= 1


def test_a_quiet_type_keeps_its_open_hour_under_the_rolling_count_so_the_final_merge_stays_short(tmp_path):
    # 5 events a batch never fill a file of 1,000: without merging by count the hour would reach its marker with
    # 100 files for the final merge to read and delete, one request each on an object store
    et = small_type(tmp_path, per_file=1000)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    most = 0
    for b in range(100):
        trickle(p, clock, 1, 5, first=5 * b, minute0=b // 3)
        most = max(most, len(list(folder.glob("*.avro"))))
    assert most <= ROLLING_FILES + 1, f"the open hour held {most} files"
    close_hour(p, clock, 0)
    content = assert_hour_whole(p, {f"e{i}" for i in range(500)}, 1000)
    assert len(content.files) == 1 and all(is_merged_name(n) for n in content.files)


def test_an_hour_closing_within_a_few_batches_is_merged_before_so_its_marker_waits_on_no_merge(tmp_path):
    # event time runs fast (a backfill, or a benchmark's sped-up clock): 20 minutes of it a batch, two splits each.
    # Once the watermark's pace says the hour closes within two batches, its small files are merged after each batch,
    # off the marker's path; the batch that closes it only lists and marks
    et = small_type(tmp_path, per_file=1000)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    ids = set()
    for b, minute in enumerate((10, 30, 50)):
        clock.now = t(f"13:{minute}:30")
        lines = [click(f"e{b}-{i}", t(f"13:{minute}") + i) for i in range(4)]
        ids |= {f"e{b}-{i}" for i in range(4)}
        p.batch(lines, shards=2)
    assert len(list(folder.glob("*.avro"))) == 1, "the closing hour's files were merged after each batch"
    merges = p.controller.merges
    clock.now = t("14:03")
    p.batch([click("x", t("14:02:30")), click("last", t("13:59:59"))], shards=2)
    ids.add("last")
    content = assert_hour_whole(p, ids, 1000)
    assert len(content.files) == 2, "the merged file and the closing batch's own"
    assert p.controller.merges == merges, "no merge before the marker"


def test_late_records_merge_apart_in_the_open_hour(tmp_path):
    et = small_type(tmp_path)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    trickle(p, clock, 4, 2)
    close_hour(p, clock, 0)  # hour 13 is complete; its stragglers go to hour 14 as late records
    for k in range(12):
        clock.now = t("14:05") + k * 20_000
        p.batch([click(f"late{k}", t("13:30")), click(f"on{k}", clock.now - 1000)])
    clock.now = t("15:03")
    p.batch([click("y", t("15:02:30"))])
    h14 = read_sink(p.sink, "click")[hour("14")]
    check_manifest_matches_folder(p.sink, "click", hour("14"))
    assert sorted(h14.late) == sorted(f"late{k}" for k in range(12))
    assert sorted(h14.timely) == sorted(["x0"] + [f"on{k}" for k in range(12)])
    assert len(h14.files) <= math.ceil(25 / 10) + 2


KILLS = [(point, nth) for point in ("merge_write", "merged_written", "merge_recorded") for nth in (1, 2, "final")] + \
    [(point, "final") for point in ("before_marker", "after_marker", "state_saved")]


@pytest.mark.parametrize("point,nth", KILLS)
def test_a_kill_at_any_step_of_a_merge_loses_and_duplicates_nothing(tmp_path, monkeypatch, point, nth):
    """Killed at the ``nth`` time a step is reached, or (``final``) in the merge just before the hour's marker."""
    from tests.lib.kills import Killed

    et = small_type(tmp_path)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    real = faults.point
    seen = {"n": 0}

    def kill(name, detail=""):
        if name == point:
            seen["n"] += 1
            if seen["n"] == nth or (nth == "final" and clock.now >= t("14:03")):
                raise Killed(f"{name} #{nth}")
        return real(name, detail)

    monkeypatch.setattr(faults, "point", kill)
    ids, killed = set(), False
    for b in range(40):
        now = t("13:00:10") + 20_000 * b
        clock.now = now + 500
        lines = [click(f"e{b}-{i}", now - i) for i in range(4)]
        ids |= {f"e{b}-{i}" for i in range(4)}
        try:
            p.batch(lines)
        except Killed:
            killed = True
            monkeypatch.setattr(faults, "point", real)
            p.restart()
            p.batch(lines, batch_id=p.next_batch - 1)  # Spark replays the batch
    clock.now = t("14:03")
    # the closing batch also brings six files of hour 13 (a split each): more than the file bound allows, so the
    # hour's small files are merged before its marker
    closing = [click(f"c{k}", t("13:59:30") + k) for k in range(6)] + [click("x", t("14:02:30"))]
    ids |= {f"c{k}" for k in range(6)}
    try:
        p.batch(closing, shards=7)
    except Killed:
        killed = True
        monkeypatch.setattr(faults, "point", real)
        p.restart()
        p.batch(closing, batch_id=p.next_batch - 1, shards=7)
    assert killed, f"{point} #{nth} was not reached"
    monkeypatch.setattr(faults, "point", real)
    assert_hour_whole(p, ids, 10)
    # nothing left behind: no temporary file, no merged file without a record, no member still there
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    assert not [f for f in folder.iterdir() if f.name.startswith(".")]


def test_a_replay_after_its_files_were_merged_and_marked_writes_nothing_again(tmp_path, monkeypatch):
    """Spark replays a batch whose state was saved (its commit was not): its hour is marked and merged since."""
    et = small_type(tmp_path)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    trickle(p, clock, 10, 3)
    clock.now = t("14:03")
    lines = [click("x", t("14:02:30")), click("e-last", t("13:59:30"))]
    p.batch(lines)
    before = {f.name: f.read_bytes() for f in (p.sink / "click").rglob("*.avro")}
    p.restart()
    p.batch(lines, batch_id=p.next_batch - 1)  # the replay
    after = {f.name: f.read_bytes() for f in (p.sink / "click").rglob("*.avro")}
    assert before == after
    assert_hour_whole(p, {f"e{i}" for i in range(30)} | {"e-last"}, 10)


def test_a_replay_after_its_files_were_merged_in_the_open_hour_does_not_bring_them_back(tmp_path):
    et = small_type(tmp_path)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    trickle(p, clock, 4, 3)  # 12 small records after batch 3: merged into a full file and one of 2
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    names = sorted(f.name for f in folder.glob("*.avro"))
    assert len(names) == 2 and all(is_merged_name(n) for n in names)
    p.restart()
    p.batch([], batch_id=3)  # Spark replays batch 3 (its commit was not recorded)
    assert sorted(f.name for f in folder.glob("*.avro")) == names


def test_release_0_1_0_reads_the_merged_hour_from_the_ledger(tmp_path):
    """0.1.0 reads every ``*.json`` of an hour's ledger and knows no merge: after a rollback it must find the
    files the hour holds (the merged ones), not the deleted members."""
    import json as _json

    from event_etl.rules.manifest import FileEntry as FE

    et = small_type(tmp_path)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    trickle(p, clock, 9, 3)
    ledger = p.ckpt.etl / "ledger" / str(H13)
    as_0_1_0 = sorted(FE.from_json(e).name for f in sorted(ledger.glob("*.json")) for e in _json.loads(f.read_text()))
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    assert as_0_1_0 == sorted(f.name for f in folder.glob("*.avro"))
    assert any(is_merged_name(n) for n in as_0_1_0)
    # a batch whose files were all merged away leaves no ledger file behind (not one rewritten empty)
    assert all(_json.loads(f.read_text()) for f in ledger.glob("*.json"))


def test_merged_files_keep_their_members_header_so_they_merge_again():
    """fastavro writes a schema's text its own way: a merged file must keep the members' header text, or a
    later merge would find 'another schema' in it."""
    members = [(f"m{k}", container(f"m{k}", 10 * k, 4)) for k in range(3)]
    out = merge_containers(members, 5, lambda seq: f"a-{seq}.avro")
    head = members[0][1][:members[0][1].find(b"\x01" * 16)]
    assert all(data.startswith(head) for _, data, _ in out)
    again = merge_containers([(n, d) for n, d, _ in out] + [("m9", container("m9", 90, 2))], 100, lambda s: f"b-{s}")
    assert [r["i"] for r in fastavro.reader(io.BytesIO(again[0][1]))] == \
        [*range(0, 4), *range(10, 14), *range(20, 24), 90, 91]


def test_the_shipped_page_view_type_merges_its_merged_files_again(tmp_path):
    """A rich schema (docs, logical types): merged files merge again, so a trickling hour still ends merged."""
    import json as _json
    import random
    import shutil
    from pathlib import Path

    from bench.datagen import make_record
    from event_etl.eventtypes import load_event_type

    root = Path(__file__).resolve().parent.parent / "event_types" / "page_view"
    shutil.copytree(root, tmp_path / "types" / "page_view")
    toml = tmp_path / "types" / "page_view" / "etl.toml"
    toml.write_text(toml.read_text().replace("max_events_per_file = 500000", "max_events_per_file = 10"))
    et = load_event_type(tmp_path / "types" / "page_view")
    assert et.max_events_per_file == 10
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    rng = random.Random(5)
    for b in range(12):
        clock.now = t("13:01") + 60_000 * b
        records = [make_record("page_view", 4 * b + i, clock.now - 1000 - i, rng) for i in range(4)]
        p.batch([_json.dumps(r).encode() for r in records])
    clock.now = t("14:10")
    p.batch([_json.dumps(make_record("page_view", 999, t("14:09"), rng)).encode()])
    check_manifest_matches_folder(p.sink, "page_view", H13)
    names = sorted(f.name for f in (p.sink / "page_view" / "dt=2026-11-21" / "hour=13").glob("*.avro"))
    assert len(names) == 5 and all(is_merged_name(n) for n in names), names
