"""The `_COMPLETE` contract under real conditions: kills in ticks, drains and the duplicate rewrite,
jumps of event time, settings changed between a crash and its replay, sources that are not quiet.

Each test drives the real executor and controller (:class:`tests.lib.harness.LocalPipeline`); a
kill is an exception raised at one of the fault points (:mod:`event_etl.faults`): the
process stops there, nothing after it runs, and a new controller starts on the same
checkpoint, as after a restart.
"""

from __future__ import annotations

import json

import pytest

from event_etl import faults
from event_etl.errors import CheckpointFormatError, CheckpointMismatchError, IntegrityError, StorageError
from event_etl.job.checkpoint import Checkpoint
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.watermark import SourceActivity
from event_etl.storage import Storage
from event_etl.timeutil import HOUR_MS, to_millis
from tests.lib.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    click,
    hour,
    make_event_type,
    read_deadletter,
    read_sink,
    t,
)
from tests.lib.kills import Killed

SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}


@pytest.fixture
def kill_at(monkeypatch):
    """``kill_at("after_marker", nth=2)``: the job dies the 2nd time it reaches that fault point."""
    real = faults.point

    def arm(name: str, nth: int = 1):
        seen = {"n": 0}

        def point(point_name: str, detail: str = "") -> None:
            if point_name == name:
                seen["n"] += 1
                if seen["n"] == nth:
                    monkeypatch.setattr(faults, "point", real)  # one kill per arming
                    raise Killed(f"killed at {name} #{nth}")
            real(point_name, detail)

        monkeypatch.setattr(faults, "point", point)

    return arm


def pipeline(tmp_path, **settings) -> LocalPipeline:
    et = make_event_type(tmp_path / "types", **{**SETTINGS, **settings})
    return LocalPipeline(tmp_path, et, FakeClock(t("13:00")))


def ids_by_hour(p: LocalPipeline) -> dict[int, tuple[list[str], list[str]]]:
    return {h: (sorted(hc.timely), sorted(hc.late)) for h, hc in read_sink(p.sink, p.et.name).items()}


def marked(p: LocalPipeline) -> list[int]:
    return sorted(h for h, hc in read_sink(p.sink, p.et.name).items() if hc.marker is not None)


# -- kills between markers and the saved state ----------------------------------------------------
def _killed_in_a_tick_or_drain(p: LocalPipeline, kill_at, step: str, point: str) -> None:
    """Events of hours 13 and 14, then a drain (or an idle tick after 2h40m of quiet) killed at ``point``'s second
    occurrence: the step had decided both hours were complete."""
    p.clock.now = t("13:40")
    p.batch([click("a", "13:10"), click("b", "13:39")])
    p.clock.now = t("14:01:30")
    p.batch([click("c", "14:01")])
    assert marked(p) == []
    kill_at(point, nth=2)
    with pytest.raises(Killed):
        if step == "drain":
            p.controller.drain()
        else:
            p.clock.now = t("17:00")  # quiet for 2h40m
            p.controller.tick()


@pytest.mark.parametrize("step", ["drain", "idle"])
def test_a_kill_after_markers_of_a_drain_or_tick_leaves_a_job_that_goes_on(tmp_path, kill_at, step):
    """Kubernetes' grace-period kill during a SIGTERM drain: markers are written, the state is not.
    The restarted job adopts them, and the next event of a marked hour is late, not an error."""
    p = pipeline(tmp_path)
    _killed_in_a_tick_or_drain(p, kill_at, step, "after_marker")  # hours 13 and 14 marked, the state not saved
    assert marked(p) == [hour("13"), hour("14")]
    assert p.ckpt.load_state().marked_through is None, "the kill came before the state was saved"
    p.restart()
    wm = p.controller.state.watermark
    assert wm >= hour("15"), "the watermark those markers were written at"
    # and the hours it completes that the killed step had not marked yet (see the test below)
    assert p.controller.state.marked_through == wm - wm % HOUR_MS - HOUR_MS >= hour("14")
    p.clock.now = t("17:01")
    ev = p.batch([click("d", "14:30"), click("e", "17:00")])  # d: its hour is marked
    assert ev.result.counts == {"late": 1, "timely": 1}
    p.controller.drain()
    content = ids_by_hour(p)
    assert content[hour("13")] == (["a", "b"], [])
    assert content[hour("14")] == (["c"], [])
    assert {h: late for h, (_, late) in content.items() if late} == {wm - wm % HOUR_MS: ["d"]}, "into the open hour"
    for h in marked(p):
        check_manifest_matches_folder(p.sink, p.et.name, h)
    assert sorted(i for tl in content.values() for part in tl for i in part) == ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize("step", ["drain", "idle"])
def test_a_restart_finishes_the_marking_a_killed_tick_or_drain_began_before_any_batch(tmp_path, kill_at, step):
    """A tick (or drain) decided that hours 13 and 14 are complete and was killed after 13's marker: the restart
    adopts that marker and its watermark, and marks 14 at once, before a batch judges anything by that watermark.
    (Before, 14 stayed unmarked while the next batch sent its late events to the open hour: a late record of an
    hour with no marker yet, which the Pub/Sub campaign reported as misplaced.)"""
    p = pipeline(tmp_path)
    _killed_in_a_tick_or_drain(p, kill_at, step, "before_marker")  # hour 13 marked, killed before hour 14's marker
    assert marked(p) == [hour("13")]
    p.restart()
    wm = p.controller.state.watermark
    assert wm >= hour("15"), "the watermark hour 13's marker was written at"
    assert marked(p) == list(range(hour("13"), wm - wm % HOUR_MS, HOUR_MS)), "every hour that watermark completes"
    assert p.ckpt.load_state().marked_through == wm - wm % HOUR_MS - HOUR_MS, "and saved"
    for h in marked(p):
        check_manifest_matches_folder(p.sink, p.et.name, h)
    p.clock.now = t("17:01")
    ev = p.batch([click("d", "14:30")])
    assert ev.result.counts == {"late": 1}
    assert ids_by_hour(p)[hour("14")] == (["c"], []), "hour 14 as its marker lists it"


def test_a_killed_drain_restarted_drains_again_to_the_end(tmp_path, kill_at):
    p = pipeline(tmp_path)
    p.clock.now = t("13:59")
    p.batch([click("a", "13:10"), click("b", "14:05")])  # b: a clock 6 minutes fast
    kill_at("before_marker", nth=2)
    with pytest.raises(Killed):
        p.controller.drain()
    assert marked(p) == [hour("13")]
    p.restart()
    p.controller.drain()
    assert marked(p) == [hour("13"), hour("14")]


# -- a kill during the duplicate rewrite ----------------------------------------------------------
def test_a_kill_during_the_duplicate_rewrite_leaves_no_stray_file(tmp_path, kill_at):
    """Drops saved, splits rewritten, the file they emptied not yet deleted: the replay removes it."""
    p = pipeline(tmp_path)
    p.clock.now = t("13:30")
    p.batch([click("a", "13:10"), click("b", "13:12")])
    kill_at("duplicates_rewritten")
    p.clock.now = t("13:31")
    # shard 1 holds only copies of a and b: its file is emptied by the rewrite
    with pytest.raises(Killed):
        p.batch([click("c", "13:20"), click("d", "13:21"), click("a", "13:10"), click("b", "13:12")], shards=2)
    p.restart()
    ev = p.batch([], batch_id=1, shards=2)  # Spark replays batch 1
    assert ev.result.counts.get("duplicate") == 2
    p.clock.now = t("14:10")
    p.batch([click("e", "14:09")])
    assert marked(p) == [hour("13")]
    check_manifest_matches_folder(p.sink, p.et.name, hour("13"))
    assert ids_by_hour(p)[hour("13")] == (["a", "b", "c", "d"], [])


# -- a jump of event time by more than a year ----------------------------------------------------
def test_an_archive_then_live_data_marks_every_hour_and_never_sticks(tmp_path):
    """Last year's archive, then live data: more than a year of hours completes at once.  The batch
    is not refused after its files are durable (a replay would refuse again, forever); the hours are
    marked a step at a time, and a drain marks them all."""
    p = pipeline(tmp_path)
    p.clock.now = t("2025-10-01T10:30")
    p.batch([click("old", "2025-10-01T10:20")])
    p.clock.now = t("13:30")
    p.batch([click("live", "13:25")])  # 13 months later
    st = p.controller.state
    assert st.watermark == t("13:23")
    assert st.marked_through is not None and st.marked_through < t("12:00"), "marked a step at a time"
    p.restart()
    p.batch([click("live2", "13:26")], batch_id=1)  # a replay of the same batch goes through as well
    p.controller.drain()
    hours = marked(p)
    assert hours[0] == t("2025-10-01T10:00") and hours[-1] == hour("13")
    assert len(hours) == (hour("13") - t("2025-10-01T10:00")) // HOUR_MS + 1


# -- what a replay depends on is frozen in the intent --------------------------------------------
def test_settings_changed_between_a_crash_and_its_replay_do_not_change_the_batch(tmp_path, kill_at):
    """max_events_per_file, allowed_lateness and max_future_skew edited before the restart: the
    replayed batch is judged and written exactly as its first attempt; new batches use the new ones."""
    lines = [click(f"e{i}", "13:10") for i in range(5)] + [click("f", "13:35"), click("old", "2026-11-20T11:00")]
    reference = pipeline(tmp_path / "ref", max_events_per_file=2)
    reference.clock.now = t("13:30")
    reference.batch([click("x", "13:29")])
    reference.batch(lines)
    want = {h: dict(hc.files) for h, hc in read_sink(reference.sink, "click").items()}

    p = pipeline(tmp_path / "run", max_events_per_file=2)
    p.clock.now = t("13:30")
    p.batch([click("x", "13:29")])
    kill_at("files_written")
    with pytest.raises(Killed):
        p.batch(lines)
    p.et = make_event_type(tmp_path / "run" / "types", **{**SETTINGS, "max_events_per_file": 3,
                                                          "allowed_lateness": "1h", "max_future_skew": "1m"})
    p.restart()
    p.batch(lines, batch_id=1)
    got = {h: dict(hc.files) for h, hc in read_sink(p.sink, "click").items()}
    assert got == want, "the replay wrote the same files, byte for byte"
    p.clock.now = t("13:40")
    ev = p.batch([click("g", "13:45"), click("h", "13:39"), click("i", "13:39"), click("j", "13:39"),
                  click("k", "13:39")])
    assert ev.result.counts.get("future") == 1, "max_future_skew 1m applies from the next batch"
    assert [n for n in read_sink(p.sink, "click")[hour("13")].files if "-b0000000002-" in n] == \
        ["part-2026112113-b0000000002-s0000-0000.avro", "part-2026112113-b0000000002-s0000-0001.avro"], \
        "max_events_per_file 3 applies from the next batch"


def test_a_schema_edited_between_a_crash_and_its_replay_does_not_change_the_batch(tmp_path, kill_at):
    from tests.lib.harness import CLICK_SCHEMA

    p = pipeline(tmp_path)
    p.clock.now = t("13:30")
    kill_at("files_written")
    with pytest.raises(Killed):
        p.batch([click("a", "13:10", page="/x")])
    before = dict(read_sink(p.sink, "click")[hour("13")].files)
    schema = json.loads(json.dumps(CLICK_SCHEMA))
    schema["fields"].append({"name": "country", "type": "string", "default": "SE"})
    p.et = make_event_type(tmp_path / "types", schema=schema, **SETTINGS)
    p.restart()
    p.batch([], batch_id=0)
    assert dict(read_sink(p.sink, "click")[hour("13")].files) == before


def test_another_source_on_the_same_checkpoint_is_refused(tmp_path):
    ck = Checkpoint(tmp_path / "ck")
    ck.bind({"event_type": "click", "sink": "/s", "source": "dir:/in/a"})
    with pytest.raises(CheckpointMismatchError) as info:
        ck.bind({"event_type": "click", "sink": "/s", "source": "dir:/in/b"})
    assert "source='dir:/in/a'" in str(info.value) and "--checkpoint" in info.value.fix


# -- the first batch's "too late" is one verdict for the batch ------------------------------------
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_the_first_batch_measures_too_late_against_the_whole_batch(tmp_path, shards):
    """An event 2 days old in a first batch is too late whichever split it falls in; before, a split
    holding only old events measured it against itself and opened its hours."""
    p = pipeline(tmp_path)
    p.clock.now = t("13:30")
    ev = p.batch([click("old", "2026-11-19T10:00"), click("old2", "2026-11-19T10:05"),
                  click("a", "13:10"), click("b", "13:20")], shards=shards)
    assert ev.result.counts == {"too_late": 2, "timely": 2}
    assert sorted(to_millis(r["event_time"]) for r in read_deadletter(p.sink, "click")) == \
        [t("2026-11-19T10:00"), t("2026-11-19T10:05")]
    assert p.ckpt.load_intent(0).reference == t("13:18")


def _counting(p: LocalPipeline, calls: list):
    """The pipeline's task runner, noting which shards each call runs (None: all)."""
    real = p.task_runner

    def task_runner(splits):
        run = real(splits)

        def run_tasks(ctx, shards):
            calls.append(None if shards is None else sorted(shards))
            return run(ctx, shards)

        return run_tasks

    p.task_runner = task_runner


def _sink_bytes(p: LocalPipeline) -> dict[str, bytes | None]:
    """Every file of the sink with its bytes, and every folder (None): an hour folder left empty reads as open."""
    return {str(f.relative_to(p.sink)): f.read_bytes() if f.is_file() else None for f in sorted(p.sink.rglob("*"))}


def _judged_with_reference_first(tmp_path, lines, shards: int, reference: int) -> dict[str, bytes]:
    """The sink of the same first batch judged against ``reference`` from the start (a replay of an intent that
    holds it: what a first batch was before it learned its reference from its own run)."""
    from event_etl.job.checkpoint import FROZEN_SETTINGS, BatchIntent

    q = pipeline(tmp_path)
    q.clock.now = t("13:30")
    q.ckpt.save_intent(BatchIntent(0, None, q.clock(), {k: getattr(q.et, k) for k in FROZEN_SETTINGS}, reference))
    q.batch(lines, batch_id=0, shards=shards)
    return _sink_bytes(q)


FIRST_LINES = [click("old", "2026-11-19T10:00"), click("a", "13:10"), click("old2", "2026-11-19T10:05"),
               click("b", "13:20"), click("c", "13:25"), click("d", "13:26")]


def test_a_first_batch_with_no_event_that_old_reads_its_input_once(tmp_path):
    """The common first batch: no event is too late against the batch's reference, so the one run that wrote it
    stands, and its files are the bytes a run judged against the reference from the start writes."""
    lines = [click(f"e{k}", f"13:{k:02d}") for k in range(6)] + [click("x", "2026-11-20T14:10")]
    p = pipeline(tmp_path / "p")
    calls: list = []
    _counting(p, calls)
    p.clock.now = t("13:30")
    ev = p.batch(lines, shards=3)
    assert calls == [None], "one run over the input, no separate reference pass"
    assert ev.result.counts == {"timely": 7}
    assert p.ckpt.load_intent(0).reference is None
    assert _sink_bytes(p) == _judged_with_reference_first(tmp_path / "q", lines, 3, t("13:03"))


def test_a_first_batch_writes_again_only_the_splits_holding_events_too_late_for_it(tmp_path):
    p = pipeline(tmp_path / "p")
    calls: list = []
    _counting(p, calls)
    p.clock.now = t("13:30")
    ev = p.batch(FIRST_LINES, shards=3)  # the old events are in the first two splits
    assert calls == [None, [0, 1]]
    assert ev.result.counts == {"too_late": 2, "timely": 4}
    assert p.ckpt.load_intent(0).reference == t("13:24")
    assert _sink_bytes(p) == _judged_with_reference_first(tmp_path / "q", FIRST_LINES, 3, t("13:24"))


@pytest.mark.parametrize("point,nth", [("first_batch_unwritten", 1), ("write_file", 6), ("write_file", 8)])
def test_a_kill_while_a_first_batch_is_written_again_is_replayed_to_the_same_sink(tmp_path, kill_at, point, nth):
    """Killed after the first run's files of the splits to write again were deleted (their reference not yet in
    the intent), or while those splits were written again: the replay ends with the same sink, nothing stray."""
    p = pipeline(tmp_path / "p")
    p.clock.now = t("13:30")
    kill_at(point, nth)  # write_file #6 and #8: in the second run (the first writes 5 files)
    with pytest.raises(Killed):
        p.batch(FIRST_LINES, shards=3)
    p.restart()
    ev = p.batch(FIRST_LINES, batch_id=0, shards=3)
    assert ev.result.counts == {"too_late": 2, "timely": 4}
    assert _sink_bytes(p) == _judged_with_reference_first(tmp_path / "q", FIRST_LINES, 3, t("13:24"))
    for h in marked(p):
        check_manifest_matches_folder(p.sink, p.et.name, h)


# -- sources that are not quiet --------------------------------------------------------------------
@pytest.mark.parametrize("activity", [
    SourceActivity(updated_at=0, backlog=120),   # files wait in the input after a downtime
    SourceActivity(updated_at=0, retrying=True),  # an outage: Pub/Sub unreachable
])
def test_no_idle_advance_while_the_source_has_a_backlog_or_an_outage(tmp_path, activity):
    p = pipeline(tmp_path)
    p.clock.now = t("13:10")
    p.batch([click("a", "13:10")])
    report = {"now": activity}
    p.controller.idle.source_activity = lambda: SourceActivity(p.clock.now, report["now"].backlog,
                                                               report["now"].retrying, None)
    for minute in range(11, 60):
        p.clock.now = t(f"13:{minute:02d}")
        p.controller.tick()
    assert p.controller.state.watermark == t("13:08"), "held while input waits or the source is down"
    report["now"] = SourceActivity(0)  # caught up at 13:59, reachable
    p.clock.now = t("14:04")
    p.controller.tick()
    assert p.controller.state.watermark == t("13:08"), "quiet only since 13:59"
    p.clock.now = t("14:06")
    p.controller.tick()
    assert p.controller.state.watermark == t("13:10"), "quiet since the last report of work, 2m past the timeout"


def test_a_source_that_stopped_reporting_is_not_quiet(tmp_path):
    p = pipeline(tmp_path)
    p.clock.now = t("13:10")
    p.batch([click("a", "13:10")])
    p.controller.idle.source_activity = lambda: SourceActivity(updated_at=t("13:10"))
    p.controller.idle.activity_stale_ms = 60_000
    p.clock.now = t("13:30")
    p.controller.tick()
    assert p.controller.state.watermark == t("13:08")


# -- replays compare content, not size --------------------------------------------------------------
def test_a_replay_that_makes_other_bytes_of_the_same_size_is_caught(tmp_path, kill_at):
    p = pipeline(tmp_path)
    p.clock.now = t("13:30")
    p.batch([click("a", "13:10")])
    p.clock.now = t("14:10")
    p.batch([click("b", "14:05")])
    assert marked(p) == [hour("13")]
    # batch 0 replayed with input of the same size but other content, into its marked hour
    path = p.inputs / "batch-000000.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"a"', b'"z"'))
    with pytest.raises(IntegrityError, match="other bytes"):
        p.batch([], batch_id=0)


# -- sinks whose writes cannot be made create-only -------------------------------------------------
@pytest.mark.parametrize("url", ["s3://bucket/events", "hdfs://nn/events", "az://c/events", "memory://x"])
def test_sinks_without_create_only_writes_are_refused(url):
    with pytest.raises(StorageError) as info:
        Storage(url)
    assert "not supported" in info.value.message and "gs://" in info.value.fix


# -- checkpoint formats ------------------------------------------------------------------------------
def test_a_checkpoint_of_a_newer_format_is_refused_untouched(tmp_path):
    ck = Checkpoint(tmp_path / "ck")
    (ck.etl).mkdir(parents=True)
    (ck.etl / "format.json").write_text(json.dumps({"format": 99, "written_by": "event_etl 9.0.0"}))
    with pytest.raises(CheckpointFormatError) as info:
        ck.open_format(release="event_etl 0.2.0")
    assert "format 99" in info.value.message and "event_etl 9.0.0" in info.value.message
    assert "0.2.0" in info.value.message and "event_etl 9.0.0" in info.value.fix
    assert json.loads((ck.etl / "format.json").read_text())["format"] == 99


def test_a_format_1_checkpoint_is_migrated_and_a_new_one_gets_the_current_format(tmp_path):
    from event_etl.job.checkpoint import CHECKPOINT_FORMAT

    old = Checkpoint(tmp_path / "old")
    old.etl.mkdir(parents=True)
    (old.etl / "job.json").write_text(json.dumps({"event_type": "click", "sink": "/s"}))
    assert old.open_format() == 1
    doc = json.loads((old.etl / "format.json").read_text())
    # to format 2, which release 0.1.0 still opens; 3 would change how its pending batch is cut on a replay
    assert doc["format"] == 2 and doc["migrated_from"] == 1 and old.format == 2
    assert old.open_format() == 2 and old.format == 2, "a format 2 checkpoint stays format 2"
    new = Checkpoint(tmp_path / "new")
    assert new.open_format() == 0 and new.format == CHECKPOINT_FORMAT == 3
    assert json.loads((new.etl / "format.json").read_text()) == {"format": CHECKPOINT_FORMAT, "written_by": ""}


def test_a_state_without_parts_loads_as_none_and_is_saved_as_before(tmp_path):
    """The watermark per partition (``parts``, Kafka only) changes nothing for a state saved without it: release
    0.1.0's (format 1) loads with no parts, and a state of format 3 as saved before is saved back byte for byte."""
    from tests.fixtures.release_fixtures import materialize

    old = Checkpoint(materialize("165ca81", "dir", tmp_path / "fx") / "ck")
    st = old.load_state()
    assert st.parts == {} and st.watermark is not None
    ck = Checkpoint(tmp_path / "ck")
    assert ck.open_format() == 0
    before = {"first_hour": 1795168800000, "last_batch_id": 3, "last_hour": 1795179600000,
              "marked_through": 1795176000000, "max_counted_time": 1795181637525, "max_event_time": 1795181637525,
              "watermark": 1795181517525}
    (ck.etl / "state.json").write_text(json.dumps(before, indent=1, sort_keys=True))
    saved = (ck.etl / "state.json").read_bytes()
    ck.save_state(ck.load_state())
    assert (ck.etl / "state.json").read_bytes() == saved


def test_a_kafka_checkpoints_parts_survive_a_save_and_keep_format_3(tmp_path):
    """``parts`` needs no format of its own: only a Kafka checkpoint has it, and every Kafka checkpoint is of
    format 3 (0.2.0 refuses it; no earlier release reads a ``kafka:`` source): see event_etl.job.checkpoint."""
    from event_etl.rules.watermark import WatermarkState

    ck = Checkpoint(tmp_path / "ck")
    ck.open_format(release="event_etl 0.3.0")
    ck.save_state(WatermarkState(watermark=7, parts={"0": 9, "1": 12}))
    assert ck.load_state().parts == {"0": 9, "1": 12}
    assert json.loads((ck.etl / "state.json").read_text())["parts"] == {"0": 9, "1": 12}
    assert ck.open_format() == 3 and ck.format == 3


def test_markers_of_other_writers_are_not_adopted(tmp_path):
    p = pipeline(tmp_path)
    p.clock.now = t("13:30")
    p.batch([click("a", "13:10")])
    folder = p.sink / hour_dir("click", hour("13"))
    other = {"manifest_version": 1, "event_type": "click", "hour": "2026-11-21T13:00:00Z",
             "hour_end": "2026-11-21T14:00:00Z", "watermark": "2026-11-21T14:00:00Z",
             "completed_at": "2026-11-21T14:00:00Z", "records": 0, "late_records": 0, "bytes": 0,
             "schema_fingerprint": "", "files": []}
    (folder / MARKER_NAME).write_text(json.dumps(other))
    with pytest.raises(IntegrityError, match="other files than this job wrote"):
        p.restart()


def test_a_restart_holds_the_watermark_until_the_source_reports_again(tmp_path):
    """After a downtime longer than the idle timeout, the last report of the run before says "no backlog";
    the input that piled up meanwhile is unknown until the restarted source reports."""
    p = pipeline(tmp_path)
    p.clock.now = t("13:10")
    p.batch([click("a", "13:10")])
    old_report = SourceActivity(updated_at=t("13:10"))
    p.clock.now = t("13:40")  # restarted after 30 minutes down
    p.restart()
    report = {"now": old_report}
    p.controller.idle.source_activity = lambda: report["now"]
    p.controller.idle.activity_stale_ms = 3_600_000
    p.clock.now = t("13:50")
    p.controller.tick()
    assert p.controller.state.watermark == t("13:08"), "the report is older than this run: it cannot tell"
    report["now"] = SourceActivity(updated_at=t("13:50"), backlog=40)
    p.controller.tick()
    assert p.controller.state.watermark == t("13:08")


def test_a_batch_tells_its_engine_when_its_markers_are_written_before_its_state_is_saved(tmp_path):
    """The shared engine holds each type's bookkeeping until the round's markers are out: a batch's phases say
    MARKED after the batch's markers and before its state, and before its ledger when it completes no hour."""
    p = pipeline(tmp_path)
    seen = []

    def hook():
        c = p.controller
        seen.append((marked(p), c.ckpt.load_state().last_batch_id, c.ckpt.ledger_hours()))

    p.clock.now = t("13:10")
    p.batch([click("a", "13:05")], at_marked=hook)  # completes nothing: told before its ledger
    p.clock.now = t("14:10")
    p.batch([click("b", "14:05")], at_marked=hook)  # completes 13:00
    assert seen == [([], -1, []), ([hour("13")], 0, [hour("13"), hour("14")])]
    assert p.controller.ckpt.load_state().last_batch_id == 1 and marked(p) == [hour("13")]


def test_while_the_source_settles_the_watermark_holds_and_no_hour_is_marked_then_it_catches_up(tmp_path):
    """A restart after a kill settles for the killed run's Pub/Sub leases: messages it held come back meanwhile,
    maybe older than what newer batches bring.  They must be judged against a watermark that did not move."""
    p = pipeline(tmp_path)
    p.clock.now = t("13:10")
    p.batch([click("a", "13:05")])
    settling = {"on": True}
    p.controller.idle.source_activity = lambda: SourceActivity(p.clock.now, settling=settling["on"])
    p.clock.now = t("14:20")
    p.batch([click("b", "14:15")])  # would close hour 13
    assert p.controller.state.watermark == t("13:03") and not marked(p)
    p.clock.now = t("14:40")
    p.controller.tick()  # long past idle_timeout: still nothing moves
    ev = p.batch([click("c", "13:50")])  # the killed run's message, back after its lease ran out
    assert ev.result.counts == {"timely": 1}, "judged against the held watermark: timely, in its own hour"
    settling["on"] = False
    p.controller.tick()  # settled: the watermark catches up with what the batches brought
    assert p.controller.state.watermark == t("14:13")
    assert marked(p) == [hour("13")]
    assert sorted(read_sink(p.sink, p.et.name)[hour("13")].timely) == ["a", "c"]


def test_a_replay_while_the_source_settles_holds_no_lower_than_the_markers_its_first_attempt_wrote(tmp_path, kill_at):
    """Found by the bus campaign (issue 59): a batch wrote hour 13's marker and was killed before its state was saved;
    the restart settles for the killed run's Pub/Sub leases and replays the batch meanwhile.  Held at the state's old
    watermark, the replay left hour 13 unmarked in the state although its marker is out, and the next batch's event
    of hour 13 was written to the marked hour: refused ("already complete") at every retry, the type stuck for good.
    The hold goes no lower than what the first attempt marked: the hour stays complete, the event is late."""
    p = pipeline(tmp_path)
    p.clock.now = t("13:10")
    p.batch([click("a", "13:05")])
    kill_at("after_marker")
    p.clock.now = t("14:20")
    with pytest.raises(Killed):
        p.batch([click("b", "14:15")])  # completes hour 13: its marker written, the state not saved
    assert marked(p) == [hour("13")] and p.ckpt.load_state().marked_through is None
    p.restart()
    p.controller.idle.source_activity = lambda: SourceActivity(p.clock.now, settling=True)
    p.batch([click("b", "14:15")], batch_id=1)  # the replay, while the source settles
    assert p.controller.state.marked_through == hour("13"), "the hour its first attempt marked stays marked"
    ev = p.batch([click("c", "13:50")])  # a message the killed run held, back after its lease ran out
    assert ev.result.counts == {"late": 1}, "late for the hour already complete, in the open hour"
    assert sorted(read_sink(p.sink, p.et.name)[hour("13")].timely) == ["a"]
    check_manifest_matches_folder(p.sink, p.et.name, hour("13"))
