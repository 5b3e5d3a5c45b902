"""The directory source: a durable file log, name order, line-aligned splits."""

from __future__ import annotations

import os

import pytest

from event_etl.errors import UsageError
from event_etl.sources import parse_source
from event_etl.sources.directory import DirectoryPlanner, align_ranges
from tests.lib.harness import FakeClock, t


def planner(tmp_path, clock=None, **kw):
    kw.setdefault("split_bytes", 1 << 20)
    kw.setdefault("max_files", 100)
    return DirectoryPlanner(str(tmp_path / "in"), str(tmp_path / "log"), clock=clock or FakeClock(t("13:00")), **kw)


def test_files_in_name_order_new_ones_picked_up_and_hidden_ignored(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "b.jsonl").write_bytes(b"1\n")
    (tmp_path / "in" / "a.jsonl").write_bytes(b"2\n")
    (tmp_path / "in" / ".writing").write_bytes(b"x\n")
    (tmp_path / "in" / "_tmp").write_bytes(b"x\n")
    p = planner(tmp_path)
    start = p.initial_offset()
    end = p.latest_offset(start, None)
    assert [r[0].rsplit("/", 1)[1] for s in p.splits(start, end) for r in s.ranges()] == ["a.jsonl", "b.jsonl"]
    (tmp_path / "in" / "0-earlier-name.jsonl").write_bytes(b"3\n")
    end2 = p.latest_offset(end, None)
    assert [r[0].rsplit("/", 1)[1] for s in p.splits(end, end2) for r in s.ranges()] == ["0-earlier-name.jsonl"]
    assert p.latest_offset(end2, None) == end2, "no new file, same offset"


def test_max_files_per_batch(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(5):
        (tmp_path / "in" / f"{i}.jsonl").write_bytes(b"x\n")
    p = planner(tmp_path)
    o = p.initial_offset()
    seen = []
    while True:
        n = p.latest_offset(o, 2)
        if n == o:
            break
        seen.append(sum(len(s.ranges()) for s in p.splits(o, n)))
        o = n
    assert seen == [2, 2, 1]


def test_the_log_survives_a_restart_and_replays_identically(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"1\n2\n")
    os.utime(tmp_path / "in" / "a.jsonl", (t("12:59") / 1000, t("12:59") / 1000))
    clock = FakeClock(t("13:00"))
    p = planner(tmp_path, clock)
    s, e = p.initial_offset(), None
    e = p.latest_offset(s, None)
    first = p.splits(s, e)
    (tmp_path / "in" / "0.jsonl").write_bytes(b"new\n")  # appears later, sorts first
    clock.now = t("14:00")
    p2 = planner(tmp_path, clock)
    assert p2.splits(s, e) == first, "a replayed batch reads the same files with the same arrival time"
    assert first[0].ranges()[0][3] == t("13:00"), "payloads of a file arrive when the job first listed it"


def test_available_now_stops_at_what_was_there(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"1\n")
    p = planner(tmp_path)
    p.prepare_available_now()
    (tmp_path / "in" / "b.jsonl").write_bytes(b"2\n")
    o = p.latest_offset(p.initial_offset(), None)
    e = p.latest_offset(o, None)
    assert o == {"files": 1} and e == o
    assert p.latest_offset(e, None) == e


@pytest.mark.parametrize("split", [1, 3, 7, 10, 64, 1000])
def test_align_ranges_cover_every_line_once(tmp_path, split):
    data = b"".join(f"line-{i:03d}-{'x' * (i % 7)}\n".encode() for i in range(50)) + b"last-no-newline"
    f = tmp_path / "f"
    f.write_bytes(data)
    ranges = align_ranges(str(f), len(data), split)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a < b for a, b in ranges) and all(r1[1] == r2[0] for r1, r2 in zip(ranges, ranges[1:]))
    lines = [ln for a, b in ranges for ln in data[a:b].split(b"\n") if ln]
    assert lines == [ln for ln in data.split(b"\n") if ln]
    for a, _ in ranges[1:]:
        assert data[a - 1 : a] == b"\n"


def test_parse_source(tmp_path):
    (tmp_path / "in").mkdir()
    assert parse_source(f"dir:{tmp_path}/in", now=0).params["path"] == str(tmp_path / "in")
    assert parse_source(str(tmp_path / "in"), now=0).kind == "dir"
    assert parse_source("generate:rate=10", now=t("13:00")).kind == "generate"
    for bad in (f"dir:{tmp_path}/missing", "kafka://x", "", "generate:rate=-1"):
        with pytest.raises(UsageError) as info:
            parse_source(bad, now=0)
        assert info.value.fix


@pytest.mark.parametrize("whole_rounds", [False, True])
@pytest.mark.parametrize("tasks, max_bytes", [(1, 1 << 30), (2, 1 << 30), (3, 1 << 30), (2, 100), (7, 333)])
def test_plan_tasks_cover_every_line_once_in_order(tmp_path, tasks, max_bytes, whole_rounds):
    from event_etl.sources.directory import plan_tasks

    files = []
    expected = []
    for k, n in enumerate((5, 40, 1, 0, 17)):
        data = b"".join(f"f{k}-line-{i:03d}{'y' * (i % 5)}\n".encode() for i in range(n))
        f = tmp_path / f"{k}.jsonl"
        f.write_bytes(data)
        files.append((str(f), len(data), 1000 + k))
        expected += [ln for ln in data.split(b"\n") if ln]
    plan = plan_tasks(files, tasks=tasks, max_bytes=max_bytes, min_bytes=1, whole_rounds=whole_rounds)
    got = []
    for ranges in plan:
        for path, s, e, arrival in ranges:
            data = open(path, "rb").read()
            assert arrival == dict((p, a) for p, _, a in files)[path]
            assert s == 0 or data[s - 1 : s] == b"\n"
            got += [ln for ln in data[s:e].split(b"\n") if ln]
    assert got == expected
    if max_bytes >= 1 << 30:
        assert len(plan) == tasks
    else:
        assert all(sum(e - s for _, s, e, _ in r) <= max_bytes + 40 for r in plan)
    assert plan_tasks(files, tasks=tasks, max_bytes=max_bytes, min_bytes=1, whole_rounds=whole_rounds) == plan, \
        "a pure function"


def test_a_new_checkpoints_batches_are_cut_into_whole_rounds_of_tasks_an_older_ones_as_before(tmp_path):
    """11 equal tasks on 2 cores leave one core idle for the last; a new checkpoint's plan (split_plan 2) cuts
    12.  A checkpoint without split_plan (event_etl 0.2.0 and before) keeps its cut: a batch it left pending
    must be replayed into the same files."""
    from event_etl.sources.directory import DirectoryPlanner

    src = tmp_path / "in"
    src.mkdir()
    for k in range(11):
        (src / f"f{k:02d}.jsonl").write_bytes(b"".join(b'{"n": %d}\n' % i for i in range(1000)))
    size = (src / "f00.jsonl").stat().st_size
    counts = {}
    for plan in (1, 2):
        p = DirectoryPlanner(str(src), str(tmp_path / f"log{plan}"), split_bytes=size, max_files=64,
                             clock=lambda: 1_000, tasks_per_batch=2, split_plan=plan)
        end = p.latest_offset(p.initial_offset(), None)
        counts[plan] = len(p.splits(p.initial_offset(), end))
    assert counts == {1: 11, 2: 12}


@pytest.mark.parametrize("mtime", ["12:20", "13:30", "2026-11-24T00:00"])
def test_arrival_is_when_the_job_listed_the_file_not_what_its_mtime_says(tmp_path, mtime):
    """A producer controls mtimes (``cp -p`` keeps an old one, a host with a fast clock writes one in
    the future): events must not be judged by them."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"1\n")
    os.utime(tmp_path / "in" / "a.jsonl", (t(mtime) / 1000, t(mtime) / 1000))
    p = planner(tmp_path, FakeClock(t("13:00")))
    s = p.initial_offset()
    assert p.splits(s, p.latest_offset(s, None))[0].ranges()[0][3] == t("13:00")


def test_a_file_logged_by_release_0_1_keeps_the_arrival_it_was_judged_with(tmp_path):
    """Entries of a format-1 log carry no ``arrival``: a batch replayed across the upgrade keeps its mtime."""
    import json

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"1\n")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "000000000000.json").write_text(json.dumps(
        [{"name": "a.jsonl", "size": 2, "found": t("12:59"), "listed": t("13:00")}]))
    p = planner(tmp_path, FakeClock(t("14:00")))
    assert p.splits({"files": 0}, {"files": 1})[0].ranges()[0][3] == t("12:59")



@pytest.mark.parametrize("kind", ["dir", "generate", "pubsub"])
def test_every_source_kind_reads_the_job_clock_not_the_wall_clock(tmp_path, kind):
    """A job run on a test's clock must see its files arrive at that clock's time: a planner that read the wall
    clock made a test depend on the date it ran on (its ``future`` events were no longer in the future)."""
    from event_etl.sources.face import OpenRequest
    from event_etl.sources.generator import GeneratorParams
    from event_etl.sources.pubsub_session import PubSubSource
    from event_etl.sources.registry import open_source

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(b"1\n")
    params = {"dir": {"path": str(tmp_path / "in")},
              "generate": GeneratorParams(start=t("12:00"), rate=1, speedup=1.0, seed=1).to_json(),
              "pubsub": {"subscription": "projects/p/subscriptions/s"}}[kind]
    clock = FakeClock(t("13:00"))
    request = OpenRequest(kind, {"kind": kind, "params": params, "log_dir": str(tmp_path / "log"),
                                 "split_bytes": 1 << 20, "max_files_per_batch": 10, "max_events_per_batch": 10}, clock)
    # Pub/Sub's session would start pulling: its planner, as the session makes it
    p = PubSubSource.planner(request) if kind == "pubsub" else open_source(request).planner
    assert p.clock is clock
    if kind == "dir":
        p.discover()
        assert [e["arrival"] for e in p.entries] == [t("13:00")]
