"""Bucket folders and file names: one function each, a table of cases, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from event_etl.rules.buckets import (
    data_file_name,
    deadletter_file_path,
    hour_dir,
    parse_data_file_name,
    parse_hour_dir,
    validate_event_type_name,
)
from event_etl.timeutil import HOUR_MS
from tests.lib.harness import t

HOURS = st.integers(min_value=0, max_value=(253402300799999 // HOUR_MS) - 1).map(lambda h: h * HOUR_MS)


@pytest.mark.parametrize(
    "event_type, when, expected",
    [
        ("page_view", "13:00", "page_view/dt=2026-11-21/hour=13"),
        ("page_view", "00:00", "page_view/dt=2026-11-21/hour=00"),
        ("db_change", "2026-12-31T23:00", "db_change/dt=2026-12-31/hour=23"),
        ("x1", "1970-01-01T00:00", "x1/dt=1970-01-01/hour=00"),
    ],
)
def test_hour_dir_table(event_type, when, expected):
    assert hour_dir(event_type, t(when)) == expected
    assert parse_hour_dir(expected) == (event_type, t(when))


@pytest.mark.parametrize(
    "hour, batch, shard, seq, late, expected",
    [
        ("13:00", 0, 0, 0, False, "part-2026112113-b0000000000-s0000-0000.avro"),
        ("13:00", 42, 3, 1, True, "late-2026112113-b0000000042-s0003-0001.avro"),
        ("2026-01-02T05:00", 9999999999, 9999, 9999, False, "part-2026010205-b9999999999-s9999-9999.avro"),
    ],
)
def test_data_file_name_table(hour, batch, shard, seq, late, expected):
    name = data_file_name(t(hour), batch, shard, seq, late=late)
    assert name == expected
    parsed = parse_data_file_name(name)
    got = (parsed.hour_start, parsed.batch_id, parsed.shard, parsed.seq, parsed.late)
    assert got == (t(hour), batch, shard, seq, late)


def test_only_late_files_contain_late():
    assert "late" not in data_file_name(t("13:00"), 7, 1, 0, late=False)
    assert "late" in data_file_name(t("13:00"), 7, 1, 0, late=True)


@given(HOURS, st.integers(0, 9999999999), st.integers(0, 9999), st.integers(0, 9999), st.booleans())
def test_file_name_round_trips(hour, batch, shard, seq, late):
    name = data_file_name(hour, batch, shard, seq, late=late)
    p = parse_data_file_name(name)
    assert p.name == name
    assert (p.hour_start, p.batch_id, p.shard, p.seq, p.late) == (hour, batch, shard, seq, late)
    assert name.endswith(".avro") and "/" not in name


@given(HOURS)
def test_hour_dir_round_trips(hour):
    assert parse_hour_dir(hour_dir("page_view", hour)) == ("page_view", hour)


@pytest.mark.parametrize("bad", ["", "../etc", "Page", "page-view", "a/b", "_x", "9lives", "x" * 64, "a.b", "/abs"])
def test_event_type_names_that_could_leave_the_sink_are_refused(bad):
    with pytest.raises(ValueError):
        validate_event_type_name(bad)
    with pytest.raises(ValueError):
        hour_dir(bad, t("13:00"))


@pytest.mark.parametrize("bad", ["page_view/dt=2026-11-21/hour=24", "page_view/dt=2026-02-30/hour=01",
                                 "../x/dt=2026-11-21/hour=01",
                                 "page_view/dt=2026-11-21"])
def test_parse_hour_dir_refuses_non_hours(bad):
    with pytest.raises(ValueError):
        parse_hour_dir(bad)


def test_refuses_a_time_that_is_not_an_hour_start():
    with pytest.raises(ValueError):
        hour_dir("page_view", t("13:01"))


def test_deadletter_path_is_deterministic():
    assert deadletter_file_path("page_view", t("13:17"), 12, 3) == \
        "page_view/_deadletter/dt=2026-11-21/dl-b0000000012-s0003.avro"
