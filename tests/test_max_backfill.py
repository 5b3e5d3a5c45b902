"""``max_backfill``: while a job has no watermark, an event more than this before its arrival is ``before_backfill``
(dead-lettered with that reason; ``too_late`` keeps its meaning: behind the watermark by more than allowed_lateness).

Issue 38: a job's first batch holding only an event stamped 1970 (``ts: 0``) used to set the job's first
hour to 1970-01-01, and the next real batch then had ~498,000 empty hours to mark before any real one.
The pure rule (:mod:`event_etl.rules.judge`), then the real executor and controller without Spark
(:class:`tests.lib.harness.LocalPipeline`): a stray event opens no hour, a backfill weeks old still does,
and a replay judges with what its intent froze (no bound for an intent of an earlier release).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from event_etl import faults
from event_etl.job.checkpoint import FROZEN_SETTINGS, BatchIntent
from event_etl.rules.judge import (
    OUTCOME_CODES,
    Outcome,
    beyond_backfill,
    judge,
    judge_array,
    make_judge,
    too_late_in_first_batch,
)
from event_etl.timeutil import DAY_MS, HOUR_MS, MINUTE_MS
from tests.lib.harness import FakeClock, LocalPipeline, click, hour, make_event_type, read_deadletter, read_sink, t

J = dict(allowed_lateness=DAY_MS, max_future_skew=10 * MINUTE_MS)
BOUND = 30 * DAY_MS
NOW = t("13:30")
SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}


# -- the pure rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("age, outcome", [
    (0, Outcome.TIMELY),
    (BOUND, Outcome.TIMELY),             # exactly max_backfill before its arrival: still accepted
    (BOUND + 1, Outcome.BEFORE_BACKFILL),  # one ms more: before the backfill bound
    (NOW, Outcome.BEFORE_BACKFILL),        # ts: 0, stamped 1970-01-01T00:00Z
    (-10 * MINUTE_MS, Outcome.TIMELY),   # early, within max_future_skew
    (-10 * MINUTE_MS - 1, Outcome.FUTURE),
])
def test_without_a_watermark_an_event_more_than_max_backfill_before_its_arrival_is_before_backfill(age, outcome):
    event = NOW - age
    v = judge(event, NOW, None, **J, max_backfill=BOUND)
    assert v.outcome is outcome
    assert v.hour == (event - event % HOUR_MS if outcome is Outcome.TIMELY else None)
    assert make_judge(None, **J, max_backfill=BOUND)(event, NOW) == (v.outcome, v.hour)
    for arrival in (NOW, np.full(3, NOW, dtype=np.int64)):  # one arrival for all, or one per event
        codes, hours = judge_array(np.full(3, event, dtype=np.int64), arrival, None, **J, max_backfill=BOUND)
        assert [OUTCOME_CODES[c] for c in codes.tolist()] == [outcome] * 3
        if outcome is Outcome.TIMELY:
            assert hours.tolist() == [v.hour] * 3


@pytest.mark.parametrize("no_bound", [0, None])
def test_max_backfill_0_or_none_is_no_bound(no_bound):
    assert judge(0, NOW, None, **J, max_backfill=no_bound).outcome is Outcome.TIMELY
    assert judge(0, NOW, None, **J).outcome is Outcome.TIMELY, "callers that do not pass it: no bound"
    codes, hours = judge_array(np.array([0], dtype=np.int64), NOW, None, **J, max_backfill=no_bound)
    assert codes.tolist() == [0] and hours.tolist() == [0]
    assert not beyond_backfill(0, NOW, no_bound)


def test_each_event_is_measured_from_its_own_arrival():
    """Pub/Sub: every message its publish time.  The same event time is within the bound for one arrival and
    beyond it for another."""
    event = NOW - BOUND
    times = np.array([event, event, event], dtype=np.int64)
    arrivals = np.array([NOW, NOW + 1, NOW - DAY_MS], dtype=np.int64)
    codes, _ = judge_array(times, arrivals, None, **J, max_backfill=BOUND)
    assert [OUTCOME_CODES[c] for c in codes.tolist()] == [Outcome.TIMELY, Outcome.BEFORE_BACKFILL, Outcome.TIMELY]


def test_the_first_batch_rule_takes_the_bound_when_it_knows_the_arrival():
    assert too_late_in_first_batch(0, None, DAY_MS, arrival=NOW, max_backfill=BOUND)
    assert not too_late_in_first_batch(0, None, DAY_MS, arrival=NOW, max_backfill=0)
    assert not too_late_in_first_batch(0, None, DAY_MS, max_backfill=BOUND), "no arrival: the reference alone"
    assert not too_late_in_first_batch(NOW - BOUND, None, DAY_MS, arrival=NOW, max_backfill=BOUND)
    assert too_late_in_first_batch(NOW - 2 * DAY_MS, NOW, DAY_MS, arrival=NOW, max_backfill=BOUND), \
        "the reference still applies within the bound"


TIMES = st.integers(min_value=0, max_value=t("2027-01-01T00:00"))
ARRIVALS = st.integers(min_value=t("2026-01-01T00:00"), max_value=t("2027-01-01T00:00"))


@given(TIMES, ARRIVALS, TIMES, st.integers(0, 60 * DAY_MS), st.integers(0, 3 * DAY_MS))
def test_once_there_is_a_watermark_max_backfill_plays_no_part(event, arrival, wm, bound, lateness):
    kw = dict(allowed_lateness=lateness, max_future_skew=10 * MINUTE_MS)
    want = make_judge(wm, **kw)(event, arrival)
    assert make_judge(wm, **kw, max_backfill=bound)(event, arrival) == want
    assert judge(event, arrival, wm, **kw, max_backfill=bound).outcome is want[0]
    codes, hours = judge_array(np.array([event], dtype=np.int64), arrival, wm, **kw, max_backfill=bound)
    assert OUTCOME_CODES[int(codes[0])] is want[0]


@given(st.lists(TIMES, min_size=1, max_size=20), ARRIVALS, st.integers(0, 60 * DAY_MS),
       st.one_of(st.none(), ARRIVALS), st.booleans())
def test_the_array_judge_is_the_scalar_judge_without_a_watermark(times, arrival, bound, reference, per_event):
    kw = dict(allowed_lateness=DAY_MS, max_future_skew=10 * MINUTE_MS, too_late_reference=reference,
              max_backfill=bound)
    arrivals = [arrival + k * MINUTE_MS for k in range(len(times))] if per_event else [arrival] * len(times)
    codes, hours = judge_array(np.array(times, dtype=np.int64),
                               np.array(arrivals, dtype=np.int64) if per_event else arrival, None, **kw)
    one = make_judge(None, **kw)
    for e, a, c, h in zip(times, arrivals, codes.tolist(), hours.tolist()):
        outcome, hour_ = one(e, a)
        assert OUTCOME_CODES[c] is outcome
        if outcome is Outcome.TIMELY:
            assert h == hour_
        if outcome is Outcome.TOO_LATE:
            assert bound == 0 or a - e <= bound, "beyond the bound it is before_backfill"
            assert too_late_in_first_batch(e, reference, DAY_MS), "within the bound: only the reference rejects"
        if outcome is Outcome.BEFORE_BACKFILL:
            assert beyond_backfill(e, a, bound)


# -- through the real executor and controller ------------------------------------------------------
class Killed(BaseException):
    """The process died here."""


@pytest.fixture
def kill_at(monkeypatch):
    real = faults.point

    def arm(name: str):
        def point(point_name: str, detail: str = "") -> None:
            if point_name == name:
                monkeypatch.setattr(faults, "point", real)
                raise Killed(f"killed at {name}")
            real(point_name, detail)

        monkeypatch.setattr(faults, "point", point)

    return arm


def pipeline(tmp_path, **settings) -> LocalPipeline:
    et = make_event_type(tmp_path / "types", **{**SETTINGS, **settings})
    return LocalPipeline(tmp_path, et, FakeClock(NOW))


def hour_folders(p: LocalPipeline) -> list[str]:
    base = p.sink / p.et.name
    return sorted(str(d.relative_to(base)) for d in base.glob("dt=*/hour=*")) if base.is_dir() else []


def marked(p: LocalPipeline) -> list[int]:
    return sorted(h for h, hc in read_sink(p.sink, p.et.name).items() if hc.marker is not None)


def test_a_first_batch_of_only_a_stray_event_opens_no_hour(tmp_path):
    """Issue 38: ``ts: 0`` alone in the first batch is dead-lettered (before_backfill); the job keeps no watermark
    and no first hour, and the real events that follow open it: a handful of markers, not 498,000."""
    p = pipeline(tmp_path)
    ev = p.batch([click("stray", 0)])
    assert ev.result.counts == {"before_backfill": 1}
    dl = read_deadletter(p.sink, "click")
    assert [(r["reason"], json.loads(r["payload"])["id"], r["event_time"].year) for r in dl] == \
        [("before_backfill", "stray", 1970)]
    assert "max_backfill 30d" in dl[0]["detail"]
    assert hour_folders(p) == [], "no hour folder"
    assert marked(p) == []
    for st_ in (p.controller.state, p.ckpt.load_state()):
        assert (st_.watermark, st_.first_hour, st_.marked_through, st_.last_hour) == (None, None, None, None)
        assert st_.last_batch_id == 0
    assert p.ckpt.load_intent(0).reference is None

    p.clock.now = t("13:40")
    ev = p.batch([click("late_stray", 1_000), click("a", "13:10"), click("b", "13:35")])  # no watermark yet either
    assert ev.result.counts == {"before_backfill": 1, "timely": 2}
    assert p.controller.state.first_hour == hour("13"), "the real hour is the first hour"
    assert p.controller.state.watermark == t("13:33")
    p.clock.now = t("16:10")
    ev = p.batch([click("c", "16:05")])
    assert [m.hour for m in ev.marked] == [hour("13"), hour("14"), hour("15")]
    p.controller.drain()
    assert marked(p) == [hour("13"), hour("14"), hour("15"), hour("16")], "a handful of markers"
    assert hour_folders(p) == ["dt=2026-11-21/hour=13", "dt=2026-11-21/hour=14", "dt=2026-11-21/hour=15",
                               "dt=2026-11-21/hour=16"]
    assert sorted(json.loads(r["payload"])["id"] for r in read_deadletter(p.sink, "click")) == ["late_stray", "stray"]


def test_a_stray_event_among_real_ones_is_rejected_in_the_batch_s_one_run(tmp_path):
    """Beside real events the reference rule rejected it too, at the cost of writing its split again; the bound
    rejects it in the first run: no second pass, no reference in the intent, the same sink."""
    p = pipeline(tmp_path)
    calls: list = []
    real = p.task_runner

    def task_runner(splits):
        run = real(splits)

        def run_tasks(ctx, shards):
            calls.append(None if shards is None else sorted(shards))
            return run(ctx, shards)

        return run_tasks

    p.task_runner = task_runner
    ev = p.batch([click("stray", 0), click("a", "13:10"), click("b", "13:20"), click("c", "13:25")], shards=3)
    assert ev.result.counts == {"before_backfill": 1, "timely": 3}
    assert calls == [None]
    assert p.ckpt.load_intent(0).reference is None
    assert p.controller.state.first_hour == hour("13")
    assert hour_folders(p) == ["dt=2026-11-21/hour=13"]


@pytest.mark.parametrize("max_backfill, accepted", [(None, True), ("30d", True), ("7d", False), ("0", True)])
def test_a_backfill_weeks_old_opens_its_first_hour_weeks_back(tmp_path, max_backfill, accepted):
    """A first batch of events 3 weeks old, listed now: written to their own hours (within max_backfill), and
    marked from 3 weeks ago as the watermark passes them."""
    p = pipeline(tmp_path, **({} if max_backfill is None else {"max_backfill": max_backfill}))
    ev = p.batch([click("b1", "2026-10-31T10:10"), click("b2", "2026-10-31T10:50"), click("b3", "2026-10-31T11:20")])
    if not accepted:
        assert ev.result.counts == {"before_backfill": 3}
        assert hour_folders(p) == [] and p.controller.state.first_hour is None
        return
    assert ev.result.counts == {"timely": 3}
    st_ = p.controller.state
    assert st_.first_hour == t("2026-10-31T10:00") and st_.watermark == t("2026-10-31T11:18")
    assert marked(p) == [t("2026-10-31T10:00")]
    p.clock.now = t("13:31")
    p.batch([click("b4", "2026-10-31T13:05")])
    assert marked(p) == [t("2026-10-31T10:00"), t("2026-10-31T11:00"), t("2026-10-31T12:00")]
    p.controller.drain()
    assert marked(p) == [t(f"2026-10-31T{h}:00") for h in (10, 11, 12, 13)]
    content = read_sink(p.sink, "click")
    assert sorted(content[t("2026-10-31T10:00")].timely) == ["b1", "b2"]
    assert content[t("2026-10-31T11:00")].marker.records == 1


def test_once_there_is_a_watermark_old_events_are_judged_by_allowed_lateness_only(tmp_path):
    p = pipeline(tmp_path, max_backfill="7d", allowed_lateness="30d")
    p.batch([click("a", "13:20")])
    p.clock.now = t("13:31")
    ev = p.batch([click("old", "2026-11-11T13:00")])  # 10 days before its arrival, 10 days behind the watermark
    assert ev.result.counts == {"late": 1}
    assert read_sink(p.sink, "click")[hour("13")].late == ["old"]


def test_max_backfill_is_frozen_in_a_batch_s_intent(tmp_path, kill_at):
    """Set to 7d when the batch began; "0" in etl.toml by its replay: the replay judges with 7d, as its first
    attempt; the next new batch with no bound."""
    p = pipeline(tmp_path, max_backfill="7d")
    assert "max_backfill" in FROZEN_SETTINGS
    kill_at("files_written")
    with pytest.raises(Killed):
        p.batch([click("old", "2026-11-11T13:00")])
    assert p.ckpt.load_intent(0).settings["max_backfill"] == 7 * DAY_MS
    before = sorted(f.name for f in p.sink.rglob("*") if f.is_file())
    p.et = make_event_type(tmp_path / "types", **{**SETTINGS, "max_backfill": "0"})
    p.restart()
    ev = p.batch([], batch_id=0)
    assert ev.result.counts == {"before_backfill": 1}
    assert sorted(f.name for f in p.sink.rglob("*") if f.is_file()) == before
    assert p.controller.state.first_hour is None
    ev = p.batch([click("old2", "2026-11-11T13:00")])
    assert ev.result.counts == {"timely": 1}, "no bound from the next new batch on"
    assert p.controller.state.first_hour == t("2026-11-11T13:00")


def test_a_replay_of_an_intent_without_max_backfill_judges_with_no_bound(tmp_path):
    """An intent written by a release before max_backfill: its first attempt had no bound, so its replay has none
    (the stray event goes to its 1970 hour, as it did), whatever today's etl.toml says."""
    p = pipeline(tmp_path)
    assert p.et.max_backfill == BOUND
    old = {k: getattr(p.et, k) for k in FROZEN_SETTINGS if k != "max_backfill"}
    p.ckpt.save_intent(BatchIntent(0, None, p.clock(), json.loads(json.dumps(old))))
    ev = p.batch([click("stray", 0)], batch_id=0)
    assert ev.replayed
    assert ev.result.counts == {"timely": 1}
    assert read_sink(p.sink, "click")[0].timely == ["stray"]
    assert p.controller.state.first_hour == 0
    assert p.controller.event_type_of(p.ckpt.load_intent(0)).max_backfill == 0
