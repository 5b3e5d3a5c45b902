"""The shared engine's own parts, without Spark: its offset log, a type's lane, a round's phases, the tasks."""

from __future__ import annotations

import json
from collections import deque
from types import SimpleNamespace

import pytest

from event_etl.errors import LeaseHeldError
from event_etl.job.engine import Engine, Lane, Round, SparkLog, _balance, round_summary
from event_etl.sources.directory import DirectoryPlanner
from event_etl.sources.face import PlannedSession
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t


def _planner(tmp_path, src):
    """A folder's session, as the engine's lane holds it."""
    return PlannedSession(DirectoryPlanner(str(src), str(tmp_path / "ck" / "etl" / "source" / "dir"),
                                           split_bytes=1 << 20, max_files=2, clock=lambda: 1_000, tasks_per_batch=2))


def _files(src, *names):
    src.mkdir(exist_ok=True)
    for n in names:
        (src / n).write_text(f'{{"id": "{n}"}}\n')


def test_offsets_and_commits_are_written_in_sparks_own_format(tmp_path):
    log = SparkLog(tmp_path / "spark")
    log.write_offset(0, {"files": 2}, now=123, conf={"spark.sql.shuffle.partitions": "4"})
    lines = (tmp_path / "spark" / "offsets" / "0").read_text().splitlines()
    assert lines[0] == "v1"
    assert json.loads(lines[1]) == {"batchWatermarkMs": 0, "batchTimestampMs": 123,
                                    "conf": {"spark.sql.shuffle.partitions": "4"}}
    assert json.loads(lines[2]) == {"files": 2}
    assert log.end_offset(0) == {"files": 2} and log.latest_offset_batch() == 0 and log.latest_commit() is None
    log.write_commit(0)
    assert (tmp_path / "spark" / "commits" / "0").read_text().splitlines() == ["v1", '{"nextBatchWatermarkMs":0}']
    assert log.latest_commit() == 0


def test_old_offsets_and_commits_are_forgotten_after_a_hundred_batches(tmp_path):
    log = SparkLog(tmp_path / "spark")
    for b in range(105):
        log.write_offset(b, {"files": b + 1}, now=0, conf={})
        log.write_commit(b)
    assert sorted(int(p.name) for p in (tmp_path / "spark" / "offsets").iterdir()) == list(range(5, 105))
    assert sorted(int(p.name) for p in (tmp_path / "spark" / "commits").iterdir()) == list(range(5, 105))


def test_a_lane_forgets_what_a_longer_log_kept_when_it_opens(tmp_path):
    """A log written by another keeper (an older release, a query with other retention) is cut to the last hundred
    batches when the type opens; from then on each commit forgets one."""
    src = tmp_path / "in"
    src.mkdir()
    log = SparkLog(tmp_path / "spark")
    for b in range(150):
        log.write_offset(b, {"files": 0}, now=0, conf={})
        (log.commits).mkdir(parents=True, exist_ok=True)
        (log.commits / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    Lane.open(_planner(tmp_path, src), log, cap=None, once=False)
    assert sorted(int(p.name) for p in log.offsets.iterdir()) == list(range(50, 150))
    assert sorted(int(p.name) for p in log.commits.iterdir()) == list(range(50, 150))


def test_a_lane_offers_new_input_durably_then_goes_on_after_its_commit(tmp_path):
    src = tmp_path / "in"
    _files(src, "a", "b", "c")
    log = SparkLog(tmp_path / "ck" / "spark")
    lane = Lane.open(_planner(tmp_path, src), log, cap=2, once=False)
    assert lane.offer(now=5, conf={}) == (0, {"files": 0}, {"files": 2})
    assert log.end_offset(0) == {"files": 2}  # durable before any split is read
    assert lane.offer(now=6, conf={}) == (0, {"files": 0}, {"files": 2})  # pending: the same batch again
    lane.committed()
    assert lane.offer(now=7, conf={}) == (1, {"files": 2}, {"files": 3})
    lane.committed()
    assert lane.offer(now=8, conf={}) is None and lane.exhausted
    assert lane.session.activity().updated_at == 8 and lane.session.activity().backlog == 0


def test_a_batch_offered_and_not_committed_is_replayed_over_the_same_range_whatever_arrived_since(tmp_path):
    src = tmp_path / "in"
    _files(src, "a")
    log = SparkLog(tmp_path / "ck" / "spark")
    first = Lane.open(_planner(tmp_path, src), log, cap=2, once=False)
    assert first.offer(now=5, conf={}) == (0, {"files": 0}, {"files": 1})
    # the process dies here; more input arrives; the type runs again
    _files(src, "b", "c")
    again = Lane.open(_planner(tmp_path, src), log, cap=2, once=False)
    assert again.offer(now=9, conf={}) == (0, {"files": 0}, {"files": 1})
    again.committed()
    assert again.offer(now=10, conf={}) == (1, {"files": 1}, {"files": 3})


def test_a_lane_goes_on_from_a_log_that_a_query_of_the_types_own_wrote(tmp_path):
    src = tmp_path / "in"
    _files(src, "a", "b", "c")
    spark_dir = tmp_path / "ck" / "spark"
    (spark_dir / "offsets").mkdir(parents=True)
    (spark_dir / "commits").mkdir()
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
    (spark_dir / "offsets" / "6").write_text(f'v1\n{meta}\n{{"files": 1}}')
    (spark_dir / "offsets" / "7").write_text(f'v1\n{meta}\n{{"files": 2}}')
    (spark_dir / "commits" / "7").write_text('v1\n{"nextBatchWatermarkMs":0}')
    lane = Lane.open(_planner(tmp_path, src), SparkLog(spark_dir), cap=5, once=False)
    assert lane.offer(now=5, conf={}) == (8, {"files": 2}, {"files": 3})


def test_a_log_that_is_not_one_sources_is_refused_with_the_fix(tmp_path):
    (tmp_path / "spark" / "offsets").mkdir(parents=True)
    (tmp_path / "spark" / "offsets" / "0").write_text("v1\n{}\n-")
    with pytest.raises(Exception, match="restore it"):
        SparkLog(tmp_path / "spark").end_offset(0)


def test_once_ends_a_lane_at_what_was_there_when_it_started(tmp_path):
    src = tmp_path / "in"
    _files(src, "a")
    lane = Lane.open(_planner(tmp_path, src), SparkLog(tmp_path / "ck" / "spark"), cap=5, once=True)
    _files(src, "b")  # arrives after the start: left for the next run
    assert lane.offer(now=1, conf={}) == (0, {"files": 0}, {"files": 1})
    lane.committed()
    assert lane.offer(now=2, conf={}) is None and lane.exhausted


class _Engine(Engine):
    """The shared engine with its Spark job played by the real executor in this process (each call recorded)."""

    def __init__(self, pipes: dict[str, LocalPipeline], failing_tasks: set[str] = frozenset()) -> None:
        self.members = {n: SimpleNamespace(name=n, opened=SimpleNamespace(controller=p.controller))
                        for n, p in pipes.items()}
        self.lanes = {n: SimpleNamespace(committed=lambda n=n: self.commits.append(n)) for n in pipes}
        self.pipes, self.failing_tasks = pipes, failing_tasks
        self.rounds, self.history, self.jobs, self.commits = 0, deque(), [], []

    def _run_splits(self, work, rnd):
        self.jobs.append({n: sorted(s.shard for s in splits) for n, (_, splits) in work.items()})
        return {n: ValueError(f"a task of {n} failed") if n in self.failing_tasks
                else self.pipes[n].task_runner(splits)(ctx, None) for n, (ctx, splits) in work.items()}


def _pipes(tmp_path, *names):
    clock = FakeClock(t("13:10"))
    return {n: LocalPipeline(tmp_path / n, make_event_type(tmp_path / "types", n, out_of_orderness="2m"), clock)
            for n in names}, clock


def _round(pipes, lines):
    rnd = Round()
    for n, p in pipes.items():
        batch, splits = p.prepare(lines[n])
        rnd.work[n] = (batch, {}, {}, splits)
    return rnd


def test_the_round_runs_once_every_type_began_and_a_failed_type_leaves_it(tmp_path):
    """One Spark job for every type that began its batch; a type that failed before (its lease lost) is not waited
    for; a type whose tasks failed fails alone (its error raised in its batch, not handed to another), and only
    the batches that finished commit."""
    pipes, _ = _pipes(tmp_path, "a", "b", "c")

    def lost():
        raise LeaseHeldError("another job took the lease", fix="run one job per type")

    pipes["c"].controller.guard = lost
    engine = _Engine(pipes, failing_tasks={"b"})
    rnd = engine.run(_round(pipes, {n: [click(n, "13:05")] for n in pipes}))
    assert engine.jobs == [{"a": [0], "b": [0]}]  # c failed at its start: not in the job, not waited for
    assert rnd.finished == {"a"} and engine.commits == ["a"]
    assert isinstance(rnd.failed["b"], ValueError) and "of b" in str(rnd.failed["b"])
    assert isinstance(rnd.failed["c"], LeaseHeldError)
    assert pipes["a"].controller.state.last_batch_id == 0 and pipes["b"].controller.state.last_batch_id == -1
    assert pipes["b"].controller.failure is rnd.failed["b"]  # the job reports the real cause
    assert not any(p.controller.busy for p in pipes.values()) and all(
        p.controller.lock.acquire(blocking=False) for p in pipes.values())  # every turn ended


def test_a_rounds_bookkeeping_waits_until_every_type_wrote_its_markers(tmp_path):
    """Markers first: no type saves its state (nor writes the ledgers of a batch that completes nothing) before
    every batch of the round has written its markers."""
    pipes, clock = _pipes(tmp_path, "a", "b", "c")
    engine = _Engine(pipes)
    engine.run(_round(pipes, {n: [click(n, "13:05")] for n in pipes}))  # first hours: 13:00
    order = []
    for n, p in pipes.items():
        save_state, create_only = p.ckpt.save_state, p.storage.create_only
        p.ckpt.save_state = lambda st, n=n, f=save_state: (order.append(f"state {n}"), f(st))[1]
        p.storage.create_only = lambda rel, data, n=n, f=create_only: (order.append(f"marker {n}"), f(rel, data))[1]
    clock.now = t("14:10")
    lines = {"a": [click("a2", "14:05")], "b": [click("b2", "13:30")], "c": [click("c2", "14:06")]}  # b marks none
    rnd = engine.run(_round(pipes, lines))
    assert rnd.finished == {"a", "b", "c"} and not rnd.failed
    assert sorted(order[:2]) == ["marker a", "marker c"], order
    assert sorted(order[2:]) == ["state a", "state b", "state c"], order


def _row(name, shard, size):
    return (name, (shard, "files", "", 0, size, 0, "[]"))


def test_splits_are_dealt_into_tasks_of_about_equal_size_whatever_the_types():
    rows = [_row("big", s, 64 << 20) for s in range(4)] + [_row(f"t{k:03d}", 0, 1000) for k in range(100)]
    bins = _balance(rows, 2)
    assert len(bins) == 4  # 2 x the cores
    assert sorted(r[1][0] for b in bins for r in b if r[0] == "big") == [0, 1, 2, 3]
    assert all(sum(1 for r in b if r[0] == "big") == 1 for b in bins)  # one big split per task
    assert sorted(r for b in bins for r in b) == sorted(rows)  # every split once
    assert _balance(list(reversed(rows)), 2) == bins  # the same tasks whatever order the types came in
    assert _balance(rows[:1], 2) == [rows[:1]]


def test_a_lane_tells_the_backlog_metric_what_waits(tmp_path):
    from event_etl.metrics.job import backlog_from_progress

    src = tmp_path / "in"
    _files(src, "a", "b", "c")
    lane = Lane.open(_planner(tmp_path, src), SparkLog(tmp_path / "ck" / "spark"), cap=1, once=False)
    lane.offer(now=1, conf={})
    lane.committed()
    assert backlog_from_progress(lane.progress()) == {"files": 2}


def test_the_round_summary_says_where_the_rounds_time_went():
    history = [{"plan": 0.1, "begin": 0.2, "job": 0.5 + i / 100, "end": 0.3} for i in range(101)]
    history.append({"plan": 0.05})  # a round without input: no job, not counted
    line = round_summary(history)
    assert line.startswith("[fleet] 101 rounds with input took 1.60/2.09 s (p50/p99), max 2.10 s")
    assert "planning 0.10/0.10" in line and "Spark job 1.00/1.49" in line and "batches ending 0.30/0.30" in line
    assert round_summary([{"plan": 0.05}]) is None


class _Pulling:
    """A spooled session whose stop takes a while (a pull in flight): records when it was asked and when it ran."""

    def __init__(self, log: list[tuple[str, str]], lock, active: list[int]) -> None:
        self.log, self.lock, self.active = log, lock, active

    def settling(self) -> float:
        return 0.0

    def stop_soon(self) -> None:
        with self.lock:
            self.log.append(("asked", str(id(self))))

    def drained(self) -> None:
        import time

        with self.lock:
            self.log.append(("stopping", str(id(self))))
            self.active[0] += 1
            self.active[1] = max(self.active[1], self.active[0])
        time.sleep(0.3)
        with self.lock:
            self.active[0] -= 1


def test_a_fleets_drain_stops_every_types_pulling_at_once_not_one_after_the_other():
    """A hundred types' pulling stopped one after the other held a fleet's drain for ten minutes (RELIABILITY.md):
    every session is asked to stop first, then their stops are waited for side by side."""
    import threading

    from event_etl.job.engine import stop_pulling_for_drain
    from event_etl.job.stopping import StopSignals

    log: list[tuple[str, str]] = []
    active = [0, 0]  # running now, most at once
    sessions = [(f"t{i}", _Pulling(log, threading.Lock(), active)) for i in range(8)]
    lock = threading.Lock()
    for _, s in sessions:
        s.lock = lock
    stop_pulling_for_drain(sessions, StopSignals(signals=()), quiet=True)
    kinds = [k for k, _ in log]
    assert kinds.count("stopping") == 8, "every type's pulling stopped"
    assert kinds[:8] == ["asked"] * 8, "every session asked to stop before any is waited for"
    assert active[1] > 1, "the stops are waited for side by side"
