"""Power loss, not only SIGKILL: what a job reported durable survives, and a restart resumes.

A SIGKILL leaves every rename the process made; a power cut keeps only what reached the disk.
A file's bytes reach it with the file's ``fsync``, but a rename (link, unlink, a new folder)
changes its *folder*, and reaches the disk only when that folder is synced: until then a
power cut can undo it while later renames, in folders that were synced, survive.

:class:`tests.lib.power_loss.Disk` simulates that.  It wraps the calls that change folders (``os.replace``,
``os.rename``, ``os.link``, ``os.unlink``/``os.remove``, ``os.rmdir``, ``os.mkdir``: ``Path``'s
methods, ``os.makedirs`` and ``shutil.rmtree`` go through them) and ``os.fsync`` of folders,
and keeps a journal of the changes no sync of their folder has made durable yet.
:meth:`Disk.power_cut` undoes them, newest first (a replaced or deleted file gets its old bytes
back, a new folder goes with all it holds), except those a test says reached the disk anyway
(with no sync, a file system may write one folder's changes and not another's).  A file's own
bytes are taken as durable: the code syncs every file it renames (a file it does not sync,
format 1's ``.keys``, is never read while the file it stands beside exists).

The scenario drives the real executor and controller (:class:`tests.lib.harness.LocalPipeline`)
through batches that write, merge, drop duplicates, dead-letter, mark hours, and a drain; the
power is cut before each folder change or folder sync in turn; the job restarts on the same
checkpoint and sink and Spark replays the batch it had not committed (Spark's own commit log
is not part of LocalPipeline: it is taken as durable, and a batch as committed once
``run_batch`` returned, after its state was saved).  Every cut must end with the sink of a run
without one: nothing lost, nothing twice, every marker listing exactly its folder's files, and
no restart that fails.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from event_etl.storage.atomic import write_json_atomic
from event_etl.task.executor import process_split
from tests.lib.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    click,
    make_event_type,
    read_deadletter,
    read_sink,
    t,
)
from tests.lib.power_loss import Change, Disk, PowerCut


@pytest.fixture
def disk(monkeypatch, tmp_path):
    """A simulated disk, in memory when the machine has a tmpfs (nothing real is synced: ~5x faster)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="event_etl-power-loss-", dir=shm))
    else:
        root = tmp_path / "disk"
        root.mkdir()
    yield Disk(monkeypatch, root)
    shutil.rmtree(root, ignore_errors=True)


# -- write_json_atomic and a new folder ------------------------------------------------------------
def write_json_text(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True)


def test_a_json_file_written_durably_survives_a_power_cut_with_its_new_folders(disk):
    path = Path(disk.root) / "ckpt" / "etl" / "ledger" / "1764680400000" / "0000000001.json"
    write_json_atomic(path, {"n": 1})
    calls = len(disk.kinds)
    write_json_atomic(path, {"n": 2})
    assert disk.kinds[calls:] == ["put", "sync"], "a rename and one folder sync, no more"
    assert disk.journal == [], f"changes left unsynced: {disk.unsynced()}"
    disk.power_cut()
    assert path.read_text() == write_json_text({"n": 2})


def test_a_json_write_cut_at_any_point_leaves_what_was_written_before(disk):
    path = Path(disk.root) / "etl" / "state.json"
    write_json_atomic(path, {"n": 1})
    calls = disk.calls
    write_json_atomic(path, {"n": 2})
    for k in range(1, disk.calls - calls + 1):
        disk.cut_at = disk.calls + k
        with pytest.raises(PowerCut):
            write_json_atomic(path, {"n": 3})
        disk.power_cut()
        assert path.read_text() == write_json_text({"n": 2}), f"cut before call {k} of a write"


def test_a_status_file_written_not_durably_is_only_atomic(disk):
    path = Path(disk.root) / "etl" / "status.json"
    write_json_atomic(path, {"n": 1}, durable=False)
    assert disk.unsynced(), "durable=False syncs nothing (a status file rewritten every few seconds)"


# -- the Pub/Sub spool -------------------------------------------------------------------------------
def _spool(disk: Disk) -> Path:
    """The spool folder of a checkpoint that has run for a while (its folders are durable)."""
    spool = Path(disk.root) / "etl" / "source" / "pubsub"
    with disk.untracked():
        for d in ("segments", "log"):
            (spool / d).mkdir(parents=True)
    return spool


def _planner(spool: Path):
    from event_etl.sources.pubsub import PubSubPlanner

    return PubSubPlanner("projects/p/subscriptions/s", str(spool), max_messages=10_000, clock=lambda: 0)


def _segment(spool: Path, seq: int, *, synced: bool = True) -> str:
    """A segment of 3 messages.  ``synced=False``: renamed into place but not yet synced (a fetcher running beside
    the planner, between its rename and its folder's sync)."""
    from event_etl.sources.spool import SegmentName, write_segment

    name = SegmentName("0badcafe", 0, seq, 3)
    if synced:
        write_segment(spool / "segments", name, [b""])
    else:
        tmp = spool / "segments" / f".{name.name}.tmp"
        tmp.write_bytes(b"EESEG1\n")
        os.replace(tmp, spool / "segments" / name.name)
    return name.name


def test_a_segment_whose_rename_was_not_synced_is_not_named_by_the_log_after_a_cut(disk):
    """The planner lists a segment the fetcher has renamed but not yet synced, and logs it.  The power goes; the
    log's folder reached the disk, the segments' did not.  The log must not name a segment that is gone."""
    spool = _spool(disk)
    planner = _planner(spool)
    first = _segment(spool, 1)
    second = _segment(spool, 2, synced=False)
    assert planner.latest_offset({"spool": 0, "seg": 0}, None)["seg"] == 2  # logs both, and offers them
    logdir = os.path.realpath(spool / "log")
    disk.power_cut(reached_disk=lambda c: c.folder == logdir)
    again = _planner(spool)
    missing = [n for n in again.log.entries if not (spool / "segments" / n).exists()]
    assert not missing, f"the log names segments the power cut took back: {missing}"
    assert again.log.entries == [first, second]
    assert len(again.splits({"spool": 0, "seg": 0}, {"spool": 0, "seg": 2})) == 1


def test_a_committed_segment_is_not_offered_again_after_a_cut(disk):
    """Spark committed both segments: the planner deletes them, then the log file that named the first.  The power
    goes; the log's folder reached the disk, the segments' did not.  No segment may come back unnamed."""
    spool = _spool(disk)
    planner = _planner(spool)
    _segment(spool, 1)
    assert planner.latest_offset({"spool": 0, "seg": 0}, None)["seg"] == 1
    _segment(spool, 2)
    assert planner.latest_offset({"spool": 0, "seg": 1}, None)["seg"] == 2
    disk.settle()  # the batches ran meanwhile
    planner.commit({"spool": 0, "seg": 2})
    assert len(list((spool / "log").glob("*.json"))) == 1, "the first log file was forgotten"
    logdir = os.path.realpath(spool / "log")
    disk.power_cut(reached_disk=lambda c: c.folder == logdir)
    again = _planner(spool)
    assert again.latest_offset({"spool": 0, "seg": 2}, None)["seg"] == 2, (
        f"a committed segment is offered again (log: {again.log.entries}, segments: "
        f"{sorted(os.listdir(spool / 'segments'))})")


def test_a_log_file_forgotten_before_a_later_one_cannot_leave_a_gap(disk):
    """Two log files forgotten in one commit: a cut that keeps the second's unlink keeps the first's."""
    spool = _spool(disk)
    planner = _planner(spool)
    for seq in (1, 2, 3):
        _segment(spool, seq)
        assert planner.latest_offset({"spool": 0, "seg": seq - 1}, None)["seg"] == seq
    disk.settle()
    planner.commit({"spool": 0, "seg": 3})
    first = os.path.realpath(spool / "log" / f"{0:012d}.json")
    disk.power_cut(reached_disk=lambda c: c.op == "del" and c.path != first)  # the second's unlink only
    _planner(spool)  # loads: no gap


# -- the whole job ------------------------------------------------------------------------------------
SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "1h", "idle_timeout": "5m", "max_future_skew": "10m",
            "dedupe_window": "1h", "max_events_per_file": 2}

# (clock, lines, shards): batches 0..5, then a drain
SCENARIO: list[tuple[str, list[bytes], int]] = [
    # a job's first batch: "old" is too late against the batch's own reference, so its split is written again
    ("13:40", [click("a", "13:10"), click("b", "13:39"), b"{not json", click("c", "13:20"), click("old", "11:00")], 2),
    # shard 1 holds only copies of a and b: its file is emptied by the duplicates' rewrite and deleted
    ("13:50", [click("e", "13:46"), click("f", "13:47"), click("a", "13:10"), click("b", "13:39")], 2),
    ("14:01:30", [click("g", "14:01"), click("h", "13:58"), click("i", "13:59")], 1),  # small files merge
    ("14:10", [click("j", "14:05"), click("k", "13:20"), click("l", "14:08")], 1),  # hour 13 marked
    ("14:20", [click("m", "13:30"), click("n", "14:15"), click("p", "12:00"), b""], 1),  # late, too late, empty
    ("15:10", [click("q", "15:05"), click("r", "14:50")], 1),  # hour 14 marked
]


@pytest.fixture(scope="module")
def event_type(tmp_path_factory):
    return make_event_type(tmp_path_factory.mktemp("types"), **SETTINGS)


class _Pipeline(LocalPipeline):
    """The harness's pipeline, its tasks on the record path (the columnar one costs ~7 ms a split to set up, and
    writes the same files: tests/test_fastpath.py)."""

    def task_runner(self, splits):
        def run_tasks(ctx, shards):
            return [process_split(sp, ctx, self.storage, fast=False) for sp in splits
                    if shards is None or sp.shard in shards]

        return run_tasks


def _pipeline(root: Path, et, disk: Disk) -> LocalPipeline:
    with disk.untracked():  # the folder and the source's files (Spark's input) are durable
        root.mkdir()
        return _Pipeline(root, et, FakeClock(t(SCENARIO[0][0])))


def _run(p: LocalPipeline, disk: Disk, steps: range) -> None:
    for i in steps:
        if i < len(SCENARIO):
            clock, lines, shards = SCENARIO[i]
            p.clock.now = t(clock)
            p.batch(lines, batch_id=i, shards=shards)
            p.next_batch = i + 1
        else:
            p.controller.drain()


def _outcome(root: Path, et) -> dict[str, Any]:
    """What a consumer can see: each hour's ids (timely, late), whether it is marked; the dead letters."""
    sink = root / "sink"
    hours = {h: (sorted(hc.timely), sorted(hc.late), hc.marker is not None)
             for h, hc in read_sink(sink, et.name).items()}
    dead = sorted((r["reason"], bytes(r["payload"])) for r in read_deadletter(sink, et.name))
    return {"hours": hours, "deadletter": dead}


def _check(root: Path, et) -> None:
    """After the drain every hour folder (an empty one too) has a marker listing exactly its files."""
    sink = root / "sink"
    for h, hc in read_sink(sink, et.name).items():
        assert hc.marker is not None, f"hour {h} has no marker after the drain"
        check_manifest_matches_folder(sink, et.name, h)


def _scenario_with_cut(root: Path, et, disk: Disk, cut_at: int | None,
                       reached_disk: Callable[[Change], bool], info: dict[str, Any]) -> None:
    """Run the scenario, the power cut before call ``cut_at``; restart, replay, finish (``info["cut"]``: the step
    cut, ``info["undone"]``: what the cut undid)."""
    p = _pipeline(root, et, disk)
    disk.cut_at = cut_at
    step = 0
    try:
        for step in range(len(SCENARIO) + 1):
            _run(p, disk, range(step, step + 1))
    except PowerCut:
        info["cut"] = f"batch {step}" if step < len(SCENARIO) else "drain"
        info["undone"] = disk.power_cut(reached_disk)
        p.restart()  # the job starts again on the same checkpoint and sink
        _run(p, disk, range(step, len(SCENARIO) + 1))  # Spark replays the batch it had not committed, then on
    finally:
        disk.cut_at = None


def _reference(disk: Disk, et) -> tuple[dict[str, Any], list[str]]:
    """The outcome of the scenario without a cut, and the kinds of its calls."""
    root = Path(disk.root) / "reference"
    start = disk.calls
    _scenario_with_cut(root, et, disk, None, lambda c: False, {})
    disk.settle()
    _check(root, et)
    return _outcome(root, et), disk.kinds[start:]


def _keep(policy: str, root: Path, k: int) -> Callable[[Change], bool]:
    """Which unsynced changes reach the disk anyway: none, those of the sink's or the checkpoint's folders, or
    those of a random half of the folders (with no sync, a file system writes out one folder and not another)."""
    sink, ckpt = str(root / "sink") + os.sep, str(root / "ckpt") + os.sep
    if policy == "sink":
        return lambda c: c.folder.startswith(sink) or c.folder + os.sep == sink
    if policy == "checkpoint":
        return lambda c: c.folder.startswith(ckpt) or c.folder + os.sep == ckpt
    if policy == "random":
        rng, fate = random.Random(k), {}
        return lambda c: fate.setdefault(c.folder, rng.random() < 0.5)
    return lambda c: False


def _sweep(disk: Disk, et, cuts: list[tuple[int, str]], want: dict[str, Any]) -> None:
    """Cut the power before each call ``k`` of ``cuts`` in turn (keeping what ``policy`` says reached the disk)."""
    failures, steps = [], Counter()
    for k, policy in cuts:
        root = Path(disk.root) / f"cut{k}"
        info: dict[str, Any] = {}
        try:
            _scenario_with_cut(root, et, disk, disk.calls + k, _keep(policy, root, k), info)
            assert info, f"no cut at call {k}"
            _check(root, et)
            got = _outcome(root, et)
            assert got == want, _differences(got, want)
        except Exception as err:  # noqa: BLE001 - collected, reported together
            undone = [f"{c.op} {os.path.relpath(c.path, root)}" for c in info.get("undone", [])]
            failures.append((info.get("cut", "?"), f"cut before call {k} ({info.get('cut', '?')}, kept: {policy}): "
                             f"{type(err).__name__}: {str(err)[:240]} [undone: {', '.join(undone[:6])}]"))
        finally:
            steps[info.get("cut", "?")] += 1
            disk.settle()
            with disk.untracked():
                shutil.rmtree(root)
    failed = Counter(step for step, _ in failures)
    summary = ", ".join(f"{step}: {failed[step]} of {n}" for step, n in steps.items())
    assert not failures, (f"{len(failures)} of {len(cuts)} cuts failed ({summary}):\n"
                          + "\n".join(line for _, line in failures[:20]))


def test_a_power_cut_before_any_call_of_a_run_loses_and_duplicates_nothing(disk, event_type):
    """The power cut before each folder change or folder sync of the run in turn; nothing unsynced survives.

    Left out: a cut between an unlink, rmdir or mkdir and the sync of its folder right after it, which leaves the
    disk as a cut before that change (the change is undone, and nothing is written between)."""
    want, kinds = _reference(disk, event_type)
    assert len(kinds) > 100, "the scenario makes many folder changes"
    assert want["hours"] and all(marked for _, _, marked in want["hours"].values())
    cuts = [(k, "none") for k in range(1, len(kinds) + 1)
            if not (k > 1 and kinds[k - 2] in ("del", "rmdir", "mkdir") and kinds[k - 1] == "sync")]
    _sweep(disk, event_type, cuts, want)


def test_a_power_cut_that_some_folders_survive_loses_and_duplicates_nothing(disk, event_type):
    """The power cut right after each rename, link or unlink (before the sync of its folder, if any): the changes
    of some folders reached the disk anyway, those of the others did not (the sink's, the checkpoint's, or a
    random half of the folders', in turn)."""
    want, kinds = _reference(disk, event_type)
    policies = ("checkpoint", "sink", "random")
    after = [k for k in range(2, len(kinds) + 1) if kinds[k - 2] in ("put", "del")]
    cuts = [(k, policies[i % len(policies)]) for i, k in enumerate(after)]
    _sweep(disk, event_type, cuts, want)


def _differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    out = []
    for h in sorted(set(got["hours"]) | set(want["hours"])):
        if got["hours"].get(h) != want["hours"].get(h):
            out.append(f"hour {h}: {got['hours'].get(h)} != {want['hours'].get(h)}")
    if got["deadletter"] != want["deadletter"]:
        out.append(f"dead letters {got['deadletter']} != {want['deadletter']}")
    return "; ".join(out)
