"""The pure rules: judging, watermark, completeness, manifests."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from event_etl.rules import (
    Outcome,
    WatermarkState,
    build_manifest,
    compare_listing,
    drain_watermark,
    hours_to_mark,
    idle_watermark,
    is_complete,
    judge,
    make_judge,
    watermark_after_batch,
)
from event_etl.rules.completeness import MAX_HOURS_PER_STEP
from event_etl.rules.manifest import FileEntry, Manifest
from event_etl.rules.watermark import BatchTimes, SourceActivity, counted_time, quiet_since
from event_etl.timeutil import HOUR_MS, MINUTE_MS, parse_duration
from tests.lib.harness import t

DAY = 24 * HOUR_MS
J = dict(allowed_lateness=DAY, max_future_skew=10 * MINUTE_MS)


@pytest.mark.parametrize(
    "event, arrival, wm, outcome, hour",
    [
        ("13:05", "13:06", None, Outcome.TIMELY, "13:00"),
        ("13:05", "13:06", "12:59:59.999", Outcome.TIMELY, "13:00"),
        ("13:05", "13:06", "13:59:59.999", Outcome.TIMELY, "13:00"),
        ("13:05", "14:06", "14:00", Outcome.LATE, "14:00"),
        ("13:05", "16:06", "16:30", Outcome.LATE, "16:00"),
        ("2026-11-20T13:59", "14:06", "14:00", Outcome.LATE, "14:00"),  # exactly 24h past its hour's end
        ("2026-11-20T13:59", "14:06", "14:00:00.001", Outcome.TOO_LATE, None),
        ("13:20:00.001", "13:10", "13:00", Outcome.FUTURE, None),
        ("13:20", "13:10", "13:00", Outcome.TIMELY, "13:00"),
    ],
)
def test_judge_table(event, arrival, wm, outcome, hour):
    v = judge(t(event), t(arrival), None if wm is None else t(wm), **J)
    assert v.outcome is outcome
    assert v.hour == (None if hour is None else t(hour))


def test_first_batch_measures_too_late_against_its_own_watermark():
    assert (
        judge(t("1970-01-01T00:00"), t("13:00"), None, **J, too_late_reference=t("12:58")).outcome is Outcome.TOO_LATE
    )
    assert judge(t("12:10"), t("13:00"), None, **J, too_late_reference=t("12:58")).outcome is Outcome.TIMELY


TIMES = st.integers(min_value=t("2026-01-01T00:00"), max_value=t("2027-01-01T00:00"))


@given(TIMES, TIMES, st.one_of(st.none(), TIMES), st.integers(0, 3 * DAY), st.integers(0, DAY))
def test_timely_and_late_go_to_an_open_hour_and_nothing_else_does(event, arrival, wm, lateness, skew):
    outcome, hour = make_judge(wm, allowed_lateness=lateness, max_future_skew=skew)(event, arrival)
    assert judge(event, arrival, wm, allowed_lateness=lateness, max_future_skew=skew).outcome is outcome
    if outcome in (Outcome.TIMELY, Outcome.LATE):
        assert hour % HOUR_MS == 0
        assert not is_complete(hour, wm), "never write into a complete hour"
        if outcome is Outcome.TIMELY:
            assert hour <= event < hour + HOUR_MS
        else:
            assert hour <= wm < hour + HOUR_MS
            assert is_complete(event - event % HOUR_MS, wm)
    else:
        assert hour is None
    if outcome is Outcome.TOO_LATE:
        assert wm - (event - event % HOUR_MS + HOUR_MS) > lateness


@given(st.lists(st.one_of(st.none(), TIMES), max_size=20), st.integers(0, HOUR_MS))
def test_watermark_never_goes_back(maxima, ooo):
    state = WatermarkState()
    last = None
    for i, m in enumerate(maxima):
        times = BatchTimes(max_event_time=m, max_counted=m)
        state = state.after_batch(batch_id=i, wm_start=state.watermark, times=times, out_of_orderness=ooo)
        if last is not None:
            assert state.watermark >= last
        last = state.watermark
    valid = [m for m in maxima if m is not None]
    assert state.watermark == (max(valid) - ooo if valid else None)


def test_watermark_after_batch():
    assert watermark_after_batch(None, None, out_of_orderness=0) is None
    assert watermark_after_batch(None, t("13:10"), out_of_orderness=2 * MINUTE_MS) == t("13:08")
    assert watermark_after_batch(t("13:20"), t("13:10"), out_of_orderness=2 * MINUTE_MS) == t("13:20")


def test_idle_watermark_follows_the_clock_only_after_the_timeout():
    kw = dict(quiet_since=t("14:00"), watermark_when_quiet=t("10:00"), idle_timeout=5 * MINUTE_MS)
    assert idle_watermark(t("10:00"), now=t("14:05"), **kw) == t("10:00")
    assert idle_watermark(t("10:00"), now=t("14:06"), **kw) == t("10:01")
    assert idle_watermark(t("10:30"), now=t("14:06"), **kw) == t("10:30"), "never back"
    assert idle_watermark(None, now=t("18:00"), quiet_since=t("14:00"), watermark_when_quiet=None,
                          idle_timeout=0) is None


def test_drain_goes_to_the_end_of_the_last_hour_with_data():
    assert drain_watermark(t("13:58"), t("14:00")) == t("15:00")
    assert drain_watermark(t("13:58"), t("13:59:59.999")) == t("14:00")
    assert drain_watermark(t("16:00"), t("13:10")) == t("16:00")
    assert drain_watermark(None, None) is None


@pytest.mark.parametrize(
    "first, marked, wm, expected",
    [
        (None, None, "13:00", []),
        ("13:00", None, None, []),
        ("13:00", None, "13:59:59.999", []),
        ("13:00", None, "14:00", ["13:00"]),
        ("13:00", None, "16:30", ["13:00", "14:00", "15:00"]),
        ("13:00", "14:00", "16:30", ["15:00"]),
        ("13:00", "15:00", "16:30", []),
    ],
)
def test_hours_to_mark(first, marked, wm, expected):
    conv = lambda x: None if x is None else t(x)  # noqa: E731
    assert hours_to_mark(conv(first), conv(marked), conv(wm)) == [t(h) for h in expected]


def test_a_jump_of_years_is_marked_a_step_at_a_time_oldest_first():
    """An archive of last year's events, then live data: thousands of hours complete at once.
    Each step marks at most a week of them, the rest follow, nothing raises."""
    first, wm = t("2025-11-21T13:00"), t("13:30")
    marked, steps = None, 0
    while True:
        hours = hours_to_mark(first, marked, wm)
        if not hours:
            break
        assert len(hours) <= MAX_HOURS_PER_STEP
        assert hours[0] == (first if marked is None else marked + HOUR_MS), "in order, none skipped"
        marked = hours[-1]
        steps += 1
    assert marked == t("12:00")
    assert steps == -(-((t("13:00") - first) // HOUR_MS) // MAX_HOURS_PER_STEP)
    assert hours_to_mark(t("12:00"), None, t("16:30"), limit=2) == [t("12:00"), t("13:00")]


def test_an_event_counts_toward_the_watermark_at_most_up_to_its_arrival():
    """A producer clock 8 minutes fast: its event at 13:52 says 14:00; it must not complete hour 13."""
    assert counted_time(t("14:00"), t("13:52")) == t("13:52")
    assert counted_time(t("13:40"), t("13:52")) == t("13:40")
    times = BatchTimes(max_event_time=t("14:00"), max_counted=counted_time(t("14:00"), t("13:52")),
                       min_hour=t("13:00"), max_hour=t("14:00"))
    state = WatermarkState().after_batch(batch_id=0, wm_start=None, times=times, out_of_orderness=2 * MINUTE_MS)
    assert state.watermark == t("13:50")
    assert not is_complete(t("13:00"), state.watermark)
    assert state.max_event_time == t("14:00"), "the event itself still lies in hour 14"
    assert drain_watermark(state.watermark, state.max_event_time, state.last_hour) == t("15:00")


def test_a_state_of_format_1_reads_with_the_meaning_it_had():
    old = {"watermark": t("13:58"), "max_event_time": t("14:00"), "first_hour": t("12:00"),
           "marked_through": t("12:00"), "last_batch_id": 7}
    st_ = WatermarkState.from_json(old)
    assert st_.max_counted_time == t("14:00") and st_.last_hour == t("14:00")
    assert WatermarkState.from_json(st_.to_json()) == st_


def test_drain_closes_an_open_hour_that_holds_only_late_records():
    """The watermark idled to 15:30; late records went to hour 15: a drain must mark hour 15 too."""
    assert drain_watermark(t("15:30"), t("13:50"), last_hour=t("15:00")) == t("16:00")
    assert drain_watermark(t("15:30"), t("13:50"), last_hour=t("13:00")) == t("15:30")


@pytest.mark.parametrize(
    "activity, expected",
    [
        (None, "14:10"),  # no report yet (a job starting after a downtime): cannot tell
        (SourceActivity(updated_at=t("14:09")), "14:00"),
        (SourceActivity(updated_at=t("14:09"), delivered_at=t("14:03")), "14:03"),
        (SourceActivity(updated_at=t("14:09"), backlog=3), "14:10"),
        (SourceActivity(updated_at=t("14:09"), retrying=True), "14:10"),
        (SourceActivity(updated_at=t("14:05")), "14:10"),  # no report for 5 minutes: cannot tell
    ],
)
def test_quiet_means_nothing_waiting_nothing_failing_nothing_delivered(activity, expected):
    assert quiet_since(t("14:00"), activity, now=t("14:10"), stale_after=60_000) == t(expected)


def test_manifest_contents_and_round_trip():
    files = [FileEntry("part-b.avro", 10, 100, "aa"), FileEntry("late-a.avro", 2, 20, "bb", late=True)]
    m = build_manifest(event_type="click", hour=t("13:00"), files=files, watermark=t("14:02"), completed_at=t("14:03"))
    doc = m.to_json()
    for key in ("event_type", "hour", "watermark", "completed_at", "records", "late_records", "files"):
        assert key in doc
    assert doc["hour"] == "2026-11-21T13:00:00Z"
    assert (doc["records"], doc["late_records"]) == (12, 2)
    assert [f["name"] for f in doc["files"]] == ["late-a.avro", "part-b.avro"]
    assert {"name", "records", "bytes", "sha256"} <= set(doc["files"][0])
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert m.marker_delay_ms == 3 * MINUTE_MS


def test_manifest_refuses_an_open_hour():
    with pytest.raises(ValueError, match="not complete"):
        build_manifest(event_type="click", hour=t("13:00"), files=[], watermark=t("13:59"), completed_at=t("14:00"))


def test_compare_listing():
    files = [FileEntry("a.avro", 1, 10, "x"), FileEntry("b.avro", 1, 10, "y")]
    assert compare_listing(files, {"a.avro": 10, "b.avro": 10, "_COMPLETE": 5, ".tmp": 3}).ok
    d = compare_listing(files, {"a.avro": 11, "c.avro": 1})
    assert (d.missing, d.extra, d.wrong_size) == (("b.avro",), ("c.avro",), ("a.avro",))


@pytest.mark.parametrize("text, ms", [("90s", 90_000), ("5m", 300_000), ("24h", DAY), ("1d", DAY), ("1h30m", 5_400_000),
                                      ("250ms", 250), ("0", 0), (" 2m ", 120_000)])
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["", "5", "5 minutes", "m5", "1h-", 5, None, "1.5.2h"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_a_manifest_says_which_event_hours_its_late_records_belong_to():
    """Version 3: the late files' records by event hour, summed over the hour (merged files included), published as
    `late_event_hours` and read back; an older manifest says it does not know (None), not that there were none."""
    files = [FileEntry("part-b.avro", 10, 100, "aa"),
             FileEntry("late-a.avro", 3, 20, "bb", late=True, event_hours=((t("11:00"), 1), (t("12:00"), 2))),
             FileEntry("late-c.avro", 4, 20, "cc", late=True, event_hours=((t("12:00"), 4),))]
    m = build_manifest(event_type="click", hour=t("13:00"), files=files, watermark=t("14:02"), completed_at=t("14:03"))
    doc = m.to_json()
    assert doc["manifest_version"] == 3
    assert doc["late_event_hours"] == {"2026-11-21T11:00:00Z": 1, "2026-11-21T12:00:00Z": 6}
    assert all("event_hours" not in f for f in doc["files"]), "the manifest publishes the hour's sum only"
    back = Manifest.from_bytes(m.to_bytes())
    assert back.late_event_hours == {t("11:00"): 1, t("12:00"): 6} and back.version == 3
    v2 = {**doc, "manifest_version": 2}
    del v2["late_event_hours"]
    assert Manifest.from_json(v2).late_event_hours is None
    ledger = FileEntry.from_json(files[1].to_json())
    assert ledger.event_hours == files[1].event_hours, "the checkpoint's ledger keeps each late file's counts"
