"""A kill before every file-system call of a scenario reaches every window (issue 38), at unit level.

The harness is :mod:`tests.sweeps.crash_sweep`: the real executor and controller without Spark, a scenario
of eight steps (a first batch that writes some splits again, producer retries, a batch that marks an
hour after a final merge, late events, merges of ``part-`` and ``late-`` files, idle ticks that
mark an hour, late events of marked hours, a drain), and a process killed just before one call
(``os.replace``, ``link``, ``unlink``, ``rmdir``, ``mkdir``, ``fsync``, ``rmtree``, an ``open`` that
writes...), restarted on its checkpoint, the killed step run again, then the rest.  Each run is
compared with a clean run of the scenario: every record once and in its place, the same dead
letters, every hour marked, every marker listing its folder and never changing, nothing left
half-written.

What runs here (the full sweep is ``python -m tests.sweeps.crash_sweep``, see its docstring): every
*window* (the last fault point reached, the function, the kind of call and a pattern of its path)
killed once, at the last call that reaches it (the shortest run), a window of an ``fsync`` at the
kill equivalent to it (the next call of the same step: a process kill cannot tell a synced file
from one not synced); a kill before Spark's commit after every batch; and, in the restarts and
replays those kills cause, every window that no single kill reaches (a restart's own: its sweep of
temporaries, its marker adoption, a replay's settling of merges...) killed again once.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter

import pytest

from event_etl.job.checkpoint import Checkpoint
from event_etl.job.merges import Merger
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.compaction import ROLLING_FILES
from event_etl.rules.manifest import Manifest
from tests.lib.harness import hour, read_deadletter, read_sink
from tests.sweeps import crash_sweep as cs

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the sweep forks a process for each kill")


@pytest.fixture(scope="module")
def swept():
    """The clean run and the quick sweep's runs (the file-system calls are tapped only while it runs)."""
    started = time.monotonic()
    with cs.Sweep() as sw:
        runs = cs.every_window(sw, replay_only=True, fsync_equivalent=True)
    elapsed = time.monotonic() - started
    print(f"\ncrash sweep: {len(runs)} runs, {len({r.window for r in runs})} windows, {elapsed:.1f} s")
    return sw, runs


def _failures(runs: list[cs.Run]) -> str:
    failed = [r for r in runs if r.failures]
    return "\n".join(f"{r.describe()}\n" + "\n".join(f"  {kind}: {d}" for kind, ds in r.failures.items() for d in ds)
                     for r in failed[:10]) + (f"\n... and {len(failed) - 10} more" if len(failed) > 10 else "")


# -- the scenario ----------------------------------------------------------------------------------------------------
WINDOWS = {
    "a temporary written, not yet renamed": r"\| _store_once: replace sink:click/dt=\*/hour=\*/part-\*$",
    "a late file's temporary, not yet renamed": r"\| _store_once: replace sink:click/dt=\*/hour=\*/late-\*$",
    "a dead-letter file's temporary, not yet renamed": r"_store_once: replace sink:click/_deadletter/dt=\*/dl-\*$",
    "the first run's files of a first batch deleted": r"^write_file \| settle_first_batch: unlink sink:.*/part-\*$",
    "their folders removed": r"^write_file \| settle_first_batch: rmdir sink:click/dt=\*/hour=\*$",
    "the first batch's reference saved": r"^first_batch_unwritten \| first batch/save_intent: replace",
    "the splits written again": r"^write_file \| first batch/_store_once: replace sink:.*/part-\*$",
    "the duplicates' drop list saved": r"^write_file \| duplicates/save_drops: replace ckpt:etl/batches/\*\.drop\.json",
    "a split rewritten without its duplicates": r"^write_file \| duplicates/_store_once: replace",
    "a file the duplicates emptied removed": r"^duplicates_rewritten \| remove_emptied: unlink sink:",
    "a ledger written": r"^files_written \| write_ledger: replace ckpt:etl/ledger/\*/\*\.json$",
    "between a marker's link and the unlink of its temporary": r"^before_marker \| _write_marker: unlink "
                                                                r"sink:click/dt=\*/hour=\*/\._COMPLETE\.\*\.tmp$",
    "a marker written, the state not": r"^after_marker \| save_state: replace ckpt:etl/state\.json$",
    "a marked hour's ledger dropped midway": r"^state_saved \| drop_ledger: unlink ckpt:etl/ledger/\*/\*\.merge$",
    "a rolling merge's file written": r"^merge_write \| rolling/merge_hour: replace .*/part-merged-\*$",
    "a rolling merge of late files": r"^merge_write \| rolling/merge_hour: replace .*/late-merged-\*$",
    "a merge recorded": r"^merged_written \| rolling/save_merge: replace ckpt:etl/ledger/\*/\*\.merge$",
    "a merge projected into the ledger": r"^merged_written \| rolling/project_merges: (unlink|replace) ckpt:etl/ledger",
    "a merge's members deleted": r"^merge_recorded \| rolling/merge_hour: unlink sink:.*/part-\*$",
    "a final merge, on the marker's path": r"^merge_write \| marker/merge_hour: replace .*/part-merged-\*$",
    "a final merge's members deleted": r"^merge_recorded \| marker/merge_hour: unlink sink:",
    "intents pruned": r"\| prune_intents: unlink ckpt:etl/batches/\*\.json$",
    "dedupe keys evicted": r"\| drop_dedupe_rows: unlink ckpt:etl/dedupe/\*\.k2$",
    "an idle tick's state": r"^idle_advance \| save_state: replace ckpt:etl/state\.json$",
}


def test_the_scenario_reaches_the_windows_of_issue_38(swept):
    sw, _ = swept
    labels = list(sw.windows())
    missing = {what: rx for what, rx in WINDOWS.items() if not any(re.search(rx, w) for w in labels)}
    assert not missing, f"not reached: {missing}"
    assert set(sw.points) == {"write_file", "first_batch_unwritten", "duplicates_rewritten", "files_written",
                              "before_marker", "after_marker", "state_saved", "merge_write", "merged_written",
                              "merge_recorded", "idle_advance", "drain"}
    assert len(sw.calls) > 500 and len(labels) > 150


def test_what_the_scenario_writes(tmp_path, monkeypatch):
    """The clean run: late records in the open hour's late- files, retries once, hours closed by the watermark, the
    idle ticks and the drain, and every kind of merge."""
    merges = []
    real = Merger.merge_hour

    def spy(self, h, listing, *, final, per_file=None, max_files=ROLLING_FILES):
        changed = real(self, h, listing, final=final, per_file=per_file, max_files=max_files)
        if changed:
            merges.append("final" if final else "closing" if max_files == 2 else "rolling")
        return changed

    monkeypatch.setattr(Merger, "merge_hour", spy)
    work = cs._Workdir(str(tmp_path))
    p = cs.make_pipeline(work.fresh(), work.et)
    for step in cs.STEPS:
        step.run(p)
    assert {"rolling", "closing", "final"} <= set(merges), merges
    content = read_sink(p.sink, "click")
    assert sorted(content) == [hour("13"), hour("14"), hour("15")]
    closed = {h: Manifest.from_bytes((p.sink / hour_dir("click", h) / MARKER_NAME).read_bytes()).extra["closed_by"]
              for h in content}
    assert closed == {hour("13"): "watermark", hour("14"): "idle", hour("15"): "drain"}
    timely = Counter(i for hc in content.values() for i in hc.timely)
    late = {h: sorted(hc.late) for h, hc in content.items() if hc.late}
    assert late == {hour("14"): ["L1", "L2", "L3", "L4", "L5"], hour("15"): ["L6", "L7"]}
    assert set(timely.values()) == {1}, "the producer retries (c, d, f2, h7) are written once"
    assert len(timely) == 26
    assert Counter(r["reason"] for r in read_deadletter(p.sink, "click")) == \
        {"too_late": 2, "invalid_json": 1, "future": 1}
    assert Checkpoint(p.ckpt.root).load_state().marked_through == hour("15")


# -- the sweep -------------------------------------------------------------------------------------------------------
def test_a_kill_before_any_call_loses_duplicates_and_misplaces_nothing(swept):
    sw, runs = swept
    singles = [r for r in runs if not r.double and r.first is not None]
    killed = {r.first for r in singles}
    assert {w for w, calls in sw.windows().items() if cs.equivalent_kill(sw.calls, calls[-1].k) not in killed} \
        == set(), "every window is killed once (an fsync's at the kill equivalent to it)"
    assert not [r for r in singles if r.failures], _failures(singles)


def test_a_kill_after_a_batch_before_spark_commits_it(swept):
    sw, runs = swept
    commits = [r for r in runs if not r.double and r.first is None]
    assert sorted(r.killed_step for r in commits) == list(sw.commit_steps)
    assert not [r for r in commits if r.failures], _failures(commits)


def test_a_second_kill_during_the_restart_and_the_replay(swept):
    sw, runs = swept
    doubles = [r for r in runs if r.double]
    windows = {r.second_label for r in doubles}
    assert not windows & set(sw.windows()), "only the windows a single kill does not reach"
    for rx in (r"^restart \| sweep_temporaries: unlink ", r"^restart \| adopt/save_state: replace ",
               r"^state_saved \| adopt/drop_ledger: ", r"_settle_merges: unlink sink:", r"^restart \| remove_emptied"):
        assert any(re.search(rx, w) for w in windows), f"{rx} was not killed again"
    assert not [r for r in doubles if r.failures], _failures(doubles)


def test_a_forked_branch_is_the_run_a_kill_from_scratch_makes(swept):
    """The sweep forks a killed branch off one clean run; killed directly, in a run from scratch, the same call gives
    the same run (both go on in a copy of the run's folder)."""
    sw, runs = swept
    forked = {r.first: r for r in runs if not r.double and r.first is not None}
    with cs.Sweep() as again:  # on the same file system: the order of an rmtree's unlinks is its listing's
        assert again.calls == sw.calls, "the scenario makes the same calls every time"
        for rx in (r"^before_marker \| _write_marker: unlink", r"^merged_written \| rolling/project_merges: replace",
                   r"^idle_advance \| save_state: replace"):
            k = max(k for k, r in forked.items() if re.search(rx, r.first_label))
            direct, branch = again.single(k), forked[k]
            assert (direct.first_label, direct.killed_step, direct.replay_calls, direct.sink, direct.failures) == \
                (branch.first_label, branch.killed_step, branch.replay_calls, branch.sink, branch.failures)


# -- the checks find what they look for --------------------------------------------------------------------------------
def _first(sw: cs.Sweep, rx: str) -> int:
    return next(c.k for c in sw.calls if re.search(rx, c.label))


def test_a_temporary_a_restart_does_not_remove_is_found(monkeypatch, tmp_path):
    import event_etl.job.controller
    import event_etl.storage.temporaries

    monkeypatch.setattr(event_etl.job.controller, "sweep_temporaries", lambda *a, **k: [])
    monkeypatch.setattr(event_etl.storage.temporaries, "sweep_temporaries", lambda *a, **k: [])
    with cs.Sweep(str(tmp_path)) as sw:
        run = sw.single(_first(sw, r"^files_written \| save_state: replace ckpt:etl/state\.json$"))
    assert set(run.failures) == {"temporaries left"}, run.failures
    assert "ckpt/etl/.state.json." in run.failures["temporaries left"][0]


def test_a_replay_that_forgets_its_duplicates_is_found(monkeypatch, tmp_path):
    """A replay that does not read the drop list its first attempt saved writes the producer retries again."""
    monkeypatch.setattr(Checkpoint, "load_drops", lambda self, batch_id: {})
    with cs.Sweep(str(tmp_path)) as sw:
        run = sw.single(_first(sw, r"^duplicates_rewritten \| remove_emptied: unlink"))
    assert "duplicated" in run.failures and "c x2" in run.failures["duplicated"][0], run.failures


def test_the_comparison_names_each_difference():
    h13, h14 = hour("13"), hour("14")
    ref = cs.Run(sink={"places": {"a": [(h13, False)], "b": [(h13, False)], "L": [(h14, True)]},
                       "deadletters": Counter({("too_late", b"x"): 1}), "marked": [h13, h14]})
    run = cs.Run(sink={"places": {"a": [(h13, False), (h14, True)], "L": [(h14, False)], "z": [(h13, False)]},
                       "deadletters": Counter({("invalid_json", b"x"): 1}), "marked": [h13]})
    cs.check_run(run, ref)
    assert run.failures == {
        "lost": ["b"],
        "duplicated": ["a x2 (2026-11-21T13, 2026-11-21T14 late)"],
        "misplaced": ["not in the clean run: z", "L: 2026-11-21T14 instead of 2026-11-21T14 late"],
        "deadletter": ["missing {('too_late', b'x'): 1}, extra {('invalid_json', b'x'): 1}"],
        "unmarked": ["2026-11-21T14"],
    }
