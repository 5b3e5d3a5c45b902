"""The watermark per partition (issue 40): a source read in partitions (Kafka) holds the hours its slowest live
partition still has data for; a partition quiet for ``idle_timeout`` stops holding them; one that wakes up, or is
new, is judged against the watermark as it then stands.  The pure rules, then the real executor and controller
without Spark (``tests.lib.harness.LocalPipeline.batch_parts``: one split per part, as Kafka's)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from event_etl.rules.watermark import BatchTimes, WatermarkState, merge_parts, parts_watermark, watermark_after_batch
from tests.lib.harness import FakeClock, LocalPipeline, click, hour, make_event_type, read_deadletter, read_sink, t

MINUTE = 60_000
OOO = 2 * MINUTE
IDLE = 5 * MINUTE


# -- the pure rules ---------------------------------------------------------------------------------
def test_the_least_over_live_parts():
    parts = {"0": t("14:30"), "1": t("13:40")}
    assert parts_watermark(parts, {}, out_of_orderness=OOO, idle_timeout=IDLE) == t("13:38")
    assert parts_watermark(parts, {"0": 0, "1": IDLE - 1}, out_of_orderness=OOO, idle_timeout=IDLE) == t("13:38")


def test_a_part_quiet_for_the_idle_timeout_stops_holding():
    parts = {"0": t("14:30"), "1": t("13:40")}
    assert parts_watermark(parts, {"0": 0, "1": IDLE}, out_of_orderness=OOO, idle_timeout=IDLE) == t("14:28")


def test_no_live_part_gives_the_largest_and_no_parts_gives_nothing():
    parts = {"0": t("14:30"), "1": t("13:40")}
    assert parts_watermark(parts, {"0": IDLE, "1": 2 * IDLE}, out_of_orderness=OOO, idle_timeout=IDLE) == t("14:28")
    assert parts_watermark({}, {}, out_of_orderness=OOO, idle_timeout=IDLE) is None


def test_merge_parts_keeps_each_parts_largest_and_adds_new_ones():
    assert merge_parts({"0": 5, "1": 9}, {"1": 7, "0": 6, "2": None, "3": 1}) == {"0": 6, "1": 9, "3": 1}


def _after(state, batch_id, parts, quiet, *, wm_start=None):
    counted = max((v for v in parts.values() if v is not None), default=None)
    return state.after_batch(batch_id=batch_id, wm_start=wm_start if wm_start is not None else state.watermark,
                             times=BatchTimes(max_event_time=counted, max_counted=counted, parts=parts),
                             out_of_orderness=OOO, parts_quiet_for=quiet, idle_timeout=IDLE)


def test_a_slow_part_holds_and_a_waking_part_never_moves_the_watermark_back():
    s = _after(WatermarkState(), 0, {"0": t("14:30"), "1": t("13:40")}, {})
    assert s.watermark == t("13:38") and s.parts == {"0": t("14:30"), "1": t("13:40")}
    s = _after(s, 1, {"0": t("14:40")}, {"0": 0, "1": IDLE})  # part 1 quiet: it no longer holds
    assert s.watermark == t("14:38")
    s = _after(s, 2, {"1": t("13:50")}, {"0": MINUTE, "1": 0})  # part 1 wakes with old events
    assert s.watermark == t("14:38"), "never back"
    assert s.parts == {"0": t("14:40"), "1": t("13:50")}


@given(st.lists(st.tuples(st.sampled_from("012"), st.integers(0, 10**7), st.integers(0, 2 * IDLE)), max_size=30))
def test_the_watermark_of_parts_never_goes_back(steps):
    s, seen = WatermarkState(), []
    for i, (part, time, quiet) in enumerate(steps):
        s = _after(s, i, {part: time}, {p: (0 if p == part else quiet) for p in "012"})
        seen.append(s.watermark)
    assert seen == sorted(seen)


@given(st.lists(st.one_of(st.none(), st.integers(0, 10**9)), max_size=20), st.integers(0, 10**6))
def test_without_parts_the_rule_and_the_saved_state_are_as_before(maxima, ooo):
    s, wm = WatermarkState(), None
    for i, m in enumerate(maxima):
        s = s.after_batch(batch_id=i, wm_start=s.watermark, times=BatchTimes(max_event_time=m, max_counted=m),
                          out_of_orderness=ooo, parts_quiet_for={}, idle_timeout=IDLE)
        wm = watermark_after_batch(wm, m, out_of_orderness=ooo)
        assert s.watermark == wm
    # what a source without parts saves: the keys it always saved, no "parts"
    assert list(s.to_json()) == ["watermark", "max_event_time", "first_hour", "marked_through", "last_batch_id",
                                 "max_counted_time", "last_hour"]
    assert WatermarkState.from_json(json.loads(json.dumps(s.to_json()))) == s


def test_a_state_with_parts_round_trips_and_one_without_loads_as_none():
    s = WatermarkState(watermark=5, parts={"0": 9, "1": 7})
    assert s.to_json()["parts"] == {"0": 9, "1": 7}
    assert WatermarkState.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert WatermarkState.from_json({"watermark": 5}).parts == {}


# -- what a split reports ---------------------------------------------------------------------------
def test_a_kafka_split_names_its_partition_and_other_splits_name_none():
    from event_etl.sources.read import FilesReader, KafkaReader
    from event_etl.sources.splits import Split

    split = Split(0, "kafka", "t", 5, 9, 0, json.dumps({"partition": 3, "topic_id": "x"}))
    assert KafkaReader().part(split) == "3"
    assert FilesReader().part(Split.of_files(0, [("/f", 0, 10, 0)])) is None


def test_reports_carry_their_part_and_a_batch_keeps_each_parts_largest():
    from event_etl.task.report import SplitReport, summarize

    rep = SplitReport(shard=0, max_event_time=5, max_counted_time=5, part="1")
    assert rep.to_json()["part"] == "1" and SplitReport.from_json(rep.to_json()).part == "1"
    assert "part" not in SplitReport(shard=0).to_json(), "a source without parts reports what it always did"
    docs = [{"counts": {"timely": 1}, "reasons": {}, "files": [], "max_event_time": 5, "max_counted_time": 5,
             "part": "0"},
            {"counts": {"timely": 1}, "reasons": {}, "files": [], "max_event_time": 9, "max_counted_time": 8,
             "part": "0"},
            {"counts": {"invalid": 1}, "reasons": {"bad": 1}, "files": [], "max_event_time": None,
             "max_counted_time": None, "part": "1"},
            {"counts": {"timely": 1}, "reasons": {}, "files": [], "max_event_time": 3, "max_counted_time": 3}]
    r = summarize(docs)
    assert r.parts == {"0": 8, "1": None} and r.max_counted_time == 8
    assert summarize(docs[3:]).parts == {}


# -- through the executor and controller ------------------------------------------------------------
def _pipeline(tmp_path, **settings) -> LocalPipeline:
    et = make_event_type(tmp_path / "types", out_of_orderness="2m", idle_timeout="5m", **settings)
    return LocalPipeline(tmp_path, et, FakeClock(t("14:31")))


def _marked(p) -> list[int]:
    return sorted(h for h, hc in read_sink(p.sink, "click").items() if hc.marker)


def test_a_slow_partition_holds_the_hour_it_still_has_data_for(tmp_path):
    p = _pipeline(tmp_path)
    ev = p.batch_parts({"0": [click("a", "13:50"), click("b", "14:30")], "1": [click("c", "13:40")]})
    assert ev.result.parts == {"0": t("14:30"), "1": t("13:40")}
    assert p.controller.state.watermark == t("13:38"), "the slow partition's, not the fast one's"
    assert _marked(p) == []
    p.clock.now = t("14:33")
    p.batch_parts({"1": [click("d", "13:55")]})  # the rest of hour 13 from the slow partition: timely
    assert p.controller.state.watermark == t("13:53") and _marked(p) == []
    p.clock.now = t("14:34")
    p.batch_parts({"1": [click("e", "14:05")]})
    assert p.controller.state.watermark == t("14:03") and _marked(p) == [hour("13")]
    hc = read_sink(p.sink, "click")[hour("13")]
    assert sorted(hc.timely) == ["a", "c", "d"] and not hc.late


def test_a_first_batch_measures_too_late_against_its_slowest_partition(tmp_path):
    """A job's first batch (no watermark yet) measures "too late" against the watermark its own events give:
    for a partitioned source, its slowest partition's, so a partition two days behind is not thrown away."""
    p = _pipeline(tmp_path)
    ev = p.batch_parts({"0": [click("a", "14:30")], "1": [click("b", "2026-11-19T10:00")]})
    assert ev.result.counts == {"timely": 2}
    assert p.controller.state.watermark == t("2026-11-19T09:58")


def test_an_idle_partition_stops_holding_after_the_idle_timeout(tmp_path):
    p = _pipeline(tmp_path)
    p.batch_parts({"0": [click("a", "14:30")], "1": [click("c", "13:40")]})  # at 14:31
    for now, at in (("14:33", "14:32"), ("14:35", "14:34")):  # part 1 quiet for 2, then 4 minutes
        p.clock.now = t(now)
        p.batch_parts({"0": [click(f"x{at}", at)]})
        assert p.controller.state.watermark == t("13:38") and _marked(p) == [], now
    p.clock.now = t("14:36")  # part 1 quiet for 5 minutes, the idle timeout
    p.batch_parts({"0": [click("y", "14:35")]})
    assert p.controller.state.watermark == t("14:33") and _marked(p) == [hour("13")]


def test_a_tick_lets_a_partition_fall_quiet_while_another_is_heard_from(tmp_path):
    p = _pipeline(tmp_path)
    p.batch_parts({"0": [click("a", "14:30")], "1": [click("c", "13:40")]})  # at 14:31
    p.clock.now = t("14:35")
    p.batch_parts({"0": [click("b", "14:34")]})
    p.clock.now = t("14:35:59")
    assert p.controller.tick() == [] and p.controller.state.watermark == t("13:38")
    p.clock.now = t("14:36")  # part 1 quiet for the idle timeout; the source heard from a minute ago
    marked = p.controller.tick()
    assert [m.hour for m in marked] == [hour("13")] and p.controller.state.watermark == t("14:32")


def test_a_waking_partition_is_judged_against_the_watermark_as_it_stands(tmp_path):
    p = _pipeline(tmp_path)
    p.batch_parts({"0": [click("a", "14:30")], "1": [click("c", "13:40")]})  # at 14:31
    p.clock.now = t("14:36")
    p.batch_parts({"0": [click("b", "14:35")]})  # part 1 quiet for 5 minutes: hour 13 is marked
    assert _marked(p) == [hour("13")] and p.controller.state.watermark == t("14:33")
    before = read_sink(p.sink, "click")[hour("13")]
    p.clock.now = t("14:40")
    # part 1 wakes up with what it held back: an event of marked hour 13, one a day old, one of hour 14
    ev = p.batch_parts({"1": [click("d", "13:45"), click("e", "2026-11-20T10:00"), click("f", "14:10")]})
    assert ev.result.counts == {"late": 1, "too_late": 1, "timely": 1}
    after = read_sink(p.sink, "click")
    assert after[hour("13")] == before, "nothing written into a marked hour"
    assert after[hour("14")].late == ["d"] and sorted(after[hour("14")].timely) == ["a", "b", "f"]
    assert [r["reason"] for r in read_deadletter(p.sink, "click")] == ["too_late"]
    # live again and behind: it holds the watermark where it was (never back) until it catches up
    assert p.controller.state.watermark == t("14:33")
    p.clock.now = t("14:41")
    p.batch_parts({"0": [click("g", "14:40")]})
    assert p.controller.state.watermark == t("14:33")
    p.batch_parts({"1": [click("h", "14:39")]})
    assert p.controller.state.watermark == t("14:37")


def test_a_new_partition_is_picked_up_and_holds_as_the_others(tmp_path):
    p = _pipeline(tmp_path)
    p.batch_parts({"0": [click("a", "14:30")], "1": [click("b", "14:20")]})  # at 14:31
    assert p.controller.state.watermark == t("14:18")
    p.clock.now = t("14:32")
    p.batch_parts({"2": [click("c", "14:05")]})  # a partition added to the topic
    assert set(p.controller.state.parts) == {"0", "1", "2"} and p.controller.state.watermark == t("14:18")
    p.clock.now = t("14:33")
    p.batch_parts({"0": [click("d", "14:32")], "1": [click("e", "14:31")]})
    assert p.controller.state.watermark == t("14:18"), "the new partition holds it"
    p.batch_parts({"2": [click("f", "14:30")]})
    assert p.controller.state.watermark == t("14:28")


def test_parts_are_saved_and_count_as_heard_from_at_a_restart(tmp_path):
    p = _pipeline(tmp_path)
    p.batch_parts({"0": [click("a", "14:30")], "1": [click("c", "13:40")]})  # at 14:31
    saved = json.loads((p.ckpt.etl / "state.json").read_text())
    assert saved["parts"] == {"0": t("14:30"), "1": t("13:40")}
    p.clock.now = t("14:35")
    p.restart()  # part 1 was quiet for 4 minutes: its quiet before the restart is not trusted
    p.clock.now = t("14:39")
    assert p.controller.tick() == [] and p.controller.state.watermark == t("13:38")
    p.clock.now = t("14:40")
    assert [m.hour for m in p.controller.tick()] == [hour("13")]


def test_a_source_without_parts_keeps_the_rule_and_saves_no_parts(tmp_path):
    p = _pipeline(tmp_path)
    p.batch([click("a", "13:50"), click("b", "14:30")], shards=2)
    assert p.controller.state.watermark == t("14:28") and _marked(p) == [hour("13")]
    assert "parts" not in json.loads((p.ckpt.etl / "state.json").read_text())


def test_a_producer_retry_on_a_partition_behind_the_others_is_still_dropped(tmp_path):
    """Partitions are read by count, each at its own pace in event time: a key is kept until every live partition
    has passed it, not only the fastest one (the Kafka kill campaign on noida-db found a retry written twice: its
    original read from a partition 50 minutes ahead of the retry's, whose key was forgotten by then)."""
    p = _pipeline(tmp_path, dedupe_window="10m")
    p.batch_parts({"0": [click("a", "13:40")], "1": [click("z", "14:30")]})  # at 14:31
    p.clock.now = t("14:32")
    p.batch_parts({"0": [click("b", "13:41")], "1": [click("y", "14:31")]})
    p.clock.now = t("14:33")
    ev = p.batch_parts({"0": [click("a", "13:40"), click("c", "13:42")], "1": [click("x", "14:32")]})
    assert ev.result.counts.get("duplicate") == 1
    assert sorted(read_sink(p.sink, "click")[hour("13")].timely) == ["a", "b", "c"]
