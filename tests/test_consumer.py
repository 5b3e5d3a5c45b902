"""The consumer API on local disk, over sinks written by the real executor and controller."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest

from event_etl.consumer import (
    AuditConflictError,
    AuditResult,
    CorruptHourError,
    CouldNotCheckError,
    HourNeverCompleteError,
    HourNotCompleteError,
    HourState,
    WaitTimeoutError,
    audit_hour,
    hour_status,
    hour_statuses,
    poke_hour,
    read_count_file,
    read_records,
    read_table,
    verify_hour,
    verify_hours,
    wait_for_hour,
    wait_for_hours,
    write_avro,
)
from event_etl.errors import StorageError
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from tests.lib.consumer_scenario import build_hours, complete_hour_15
from tests.lib.harness import hour

UTC = dt.UTC


@pytest.fixture
def sc(tmp_path):
    return build_hours(tmp_path)


def folder(sc, h: str) -> Path:
    return Path(sc.sink) / hour_dir("click", hour(h))


def ids(records) -> list[str]:
    return sorted(r["id"] for r in records)


def snapshot(sc, h: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder(sc, h).iterdir()}


class NoSleep:
    """A clock that only moves when the waiter sleeps: a timeout without waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def must_not_sleep(_s: float) -> None:
    raise AssertionError("the waiter slept although it had its answer")


# -- status --------------------------------------------------------------------------------
def test_status_of_every_kind_of_hour(sc):
    got = {s.hour: s for s in hour_statuses(sc.sink, "click", "2026-11-21T12", "2026-11-21T17")}
    assert [s.state for s in got.values()] == [HourState.NEVER, HourState.COMPLETE, HourState.COMPLETE,
                                               HourState.OPEN, HourState.NOT_STARTED]
    s14 = got[dt.datetime(2026, 11, 21, 14, tzinfo=UTC)]
    assert (s14.records, s14.late_records, s14.data_files) == (2, 1, 2)
    assert s14.completed_at == dt.datetime(2026, 11, 21, 15, 10, tzinfo=UTC)
    assert s14.marker_delay == dt.timedelta(minutes=10)
    assert s14.completed_at.tzinfo is not None and s14.hour.tzinfo is not None
    s15 = got[dt.datetime(2026, 11, 21, 15, tzinfo=UTC)]
    assert (s15.data_files, s15.records, s15.completed_at) == (1, None, None)


def test_single_hour_status_matches_the_range(sc):
    for h, want in (("12", HourState.NEVER), ("13", HourState.COMPLETE), ("15", HourState.OPEN),
                    ("16", HourState.NOT_STARTED)):
        assert hour_status(sc.sink, "click", f"2026-11-21T{h}").state is want


def test_before_any_marker_nothing_is_never(tmp_path):
    from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types"), FakeClock(t("13:10")))
    p.batch([click("a", "13:05")])
    assert hour_status(str(p.sink), "click", "2026-11-21T12").state is HourState.NOT_STARTED
    assert hour_status(str(p.sink), "click", "2026-11-21T13").state is HourState.OPEN


def test_an_empty_or_missing_sink_is_no_data_not_not_started(tmp_path):
    """A mistyped sink must not read as "not yet": nothing at <sink>/<type>/ is its own answer (exit code 6)."""
    from event_etl.errors import NoDataError

    for sink in (tmp_path / "nothing here", tmp_path):
        with pytest.raises(NoDataError) as err:
            hour_status(sink, "click", "2026-11-21T13")
        assert err.value.exit_code == 6 and "nothing at" in err.value.message and "--sink" in err.value.fix
    (tmp_path / "other_type").mkdir()
    with pytest.raises(NoDataError, match="it holds other_type"):
        hour_status(tmp_path, "click", "2026-11-21T13")
    # a job that has started (its lease is there) but marked nothing yet: really "not started"
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "_LEASE").write_text("{}")
    assert hour_status(tmp_path, "click", "2026-11-21T13").state is HourState.NOT_STARTED


def test_could_not_check_is_not_absent(tmp_path):
    """A sink that is a file where a folder should be: storage cannot tell, so neither can the status."""
    sink = tmp_path / "sink"
    sink.write_text("I am a file")
    with pytest.raises(CouldNotCheckError) as err:
        hour_status(sink, "click", "2026-11-21T13")
    assert isinstance(err.value, StorageError) and err.value.exit_code == 4
    assert "Not a directory" in err.value.message


def test_a_marker_from_another_hour_is_damage_not_completeness(sc):
    (folder(sc, "15") / MARKER_NAME).write_bytes((folder(sc, "13") / MARKER_NAME).read_bytes())
    with pytest.raises(CorruptHourError, match="manifest of click 2026-11-21T13:00:00Z"):
        hour_status(sc.sink, "click", "2026-11-21T15")
    (folder(sc, "15") / MARKER_NAME).write_text("{half a manifest")
    with pytest.raises(CorruptHourError, match="not a valid manifest"):
        hour_status(sc.sink, "click", "2026-11-21T15")


# -- waiting -------------------------------------------------------------------------------
def test_wait_returns_the_manifest_of_a_complete_hour_at_once(sc):
    m = wait_for_hour(sc.sink, "click", "2026-11-21T14", timeout=60, sleep=must_not_sleep)
    assert m.hour == hour("14") and m.records == 2 and m.late_records == 1


def test_wait_times_out_on_an_open_hour_with_its_last_status(sc):
    fake = NoSleep()
    with pytest.raises(WaitTimeoutError) as err:
        wait_for_hour(
            sc.sink, "click", "2026-11-21T15", timeout=10, poll_interval=3, clock=fake.clock, sleep=fake.sleep
        )
    assert fake.sleeps == [3, 3, 3, 1], "polls every 3s and once more at the deadline"
    assert err.value.exit_code == 3 and err.value.status.state is HourState.OPEN
    assert "still not complete after 10s" in err.value.message


def test_timeout_zero_looks_once(sc):
    with pytest.raises(WaitTimeoutError):
        wait_for_hour(sc.sink, "click", "2026-11-21T16", timeout=0, sleep=must_not_sleep)


def test_wait_for_an_hour_before_the_first_one_fails_at_once(sc):
    with pytest.raises(HourNeverCompleteError) as err:
        wait_for_hour(sc.sink, "click", "2026-11-21T12", timeout=60, sleep=must_not_sleep)
    assert err.value.first_complete == dt.datetime(2026, 11, 21, 13, tzinfo=UTC) and err.value.exit_code == 2


def test_wait_raises_could_not_check_instead_of_timing_out(tmp_path):
    sink = tmp_path / "sink"
    sink.write_text("I am a file")
    with pytest.raises(CouldNotCheckError):
        wait_for_hour(sink, "click", "2026-11-21T13", timeout=60, sleep=must_not_sleep)


def test_wait_for_a_range_returns_the_manifests_in_order(sc):
    ms = wait_for_hours(sc.sink, "click", "2026-11-21T13", "2026-11-21T15", timeout=0)
    assert [m.hour for m in ms] == [hour("13"), hour("14")]
    fake = NoSleep()
    with pytest.raises(WaitTimeoutError) as err:
        wait_for_hours(sc.sink, "click", "2026-11-21T13", "2026-11-21T17", timeout=4, poll_interval=2,
                       clock=fake.clock, sleep=fake.sleep)
    assert err.value.status.hour == dt.datetime(2026, 11, 21, 15, tzinfo=UTC), "the first hour still missing"


def test_a_waiter_started_before_the_marker_wakes_when_it_appears(sc):
    looked_at_open_hour = threading.Event()
    outcome: dict = {}

    def on_status(status):
        if status.state is HourState.OPEN:
            looked_at_open_hour.set()

    def waiter():
        try:
            outcome["manifest"] = wait_for_hour(sc.sink, "click", "2026-11-21T15", timeout=60, poll_interval=0.01,
                                                on_status=on_status)
        except BaseException as err:  # noqa: BLE001 - any outcome: reported by the main thread
            outcome["error"] = err
        outcome["returned_at"] = time.monotonic()

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    assert looked_at_open_hour.wait(10), "the waiter saw the hour open, before its marker existed"
    assert th.is_alive() and not (folder(sc, "15") / MARKER_NAME).exists()
    complete_hour_15(sc)
    marked_at = time.monotonic()
    th.join(10)
    assert not th.is_alive(), "the waiter woke up once the marker appeared"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["manifest"].hour == hour("15") and outcome["manifest"].records == 1
    assert outcome["returned_at"] - marked_at < 5


def test_poke_is_one_look(sc):
    assert poke_hour(sc.sink, "click", "2026-11-21T14") is True
    assert poke_hour(sc.sink, "click", "2026-11-21T15") is False
    assert poke_hour(sc.sink, "click", "2026-11-21 16:00:00+00:00") is False
    with pytest.raises(HourNeverCompleteError):
        poke_hour(sc.sink, "click", "2026-11-21T12")


# -- reading -------------------------------------------------------------------------------
def test_read_records_with_and_without_late(sc):
    assert ids(read_records(sc.sink, "click", "2026-11-21T14")) == ["c", "d"]
    assert ids(read_records(sc.sink, "click", "2026-11-21T14", include_late=False)) == ["c"]
    recs = list(read_records(sc.sink, "click", dt.datetime(2026, 11, 21, 13, tzinfo=UTC)))
    assert ids(recs) == ["a", "b"] and recs[0]["ts"].tzinfo is not None


def test_read_uses_the_manifest_not_the_folder(sc):
    stray = folder(sc, "14") / "part-2026112114-b0000000099-s0000-0000.avro"
    stray.write_bytes((folder(sc, "13") / sorted(p.name for p in folder(sc, "13").glob("*.avro"))[0]).read_bytes())
    assert ids(read_records(sc.sink, "click", "2026-11-21T14")) == ["c", "d"]


def test_reading_a_damaged_hour_fails_instead_of_returning_less(sc):
    victim = sorted(folder(sc, "13").glob("part-*.avro"))[0]
    data = bytearray(victim.read_bytes())
    data[-2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptHourError, match="differs from the manifest") as err:
        list(read_records(sc.sink, "click", "2026-11-21T13"))
    assert err.value.exit_code == 5 and victim.name in err.value.path
    victim.unlink()
    with pytest.raises(CorruptHourError, match="missing"):
        list(read_records(sc.sink, "click", "2026-11-21T13"))


def test_an_hour_that_is_not_complete_is_not_read(sc):
    with pytest.raises(HourNotCompleteError) as err:
        read_records(sc.sink, "click", "2026-11-21T15")  # raised at the call, not at the first record
    assert err.value.exit_code == 3 and "event-etl wait click 2026-11-21T15:00:00Z" in err.value.fix
    with pytest.raises(HourNeverCompleteError):
        read_records(sc.sink, "click", "2026-11-21T12")


def test_read_table(sc):
    table = read_table(sc.sink, sc.et, "2026-11-21T14")
    assert table.num_rows == 2 and sorted(table.column("id").to_pylist()) == ["c", "d"]
    assert table.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert read_table(sc.sink, sc.et, "2026-11-21T14", include_late=False).column("id").to_pylist() == ["c"]


def test_a_quiet_hour_reads_as_an_empty_table_with_the_type_columns(tmp_path):
    from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types"), clock)
    p.batch([click("a", "13:05")])
    clock.now = t("15:10")
    p.batch([click("b", "15:05")])  # 14 had no events; it is complete all the same
    assert hour_status(str(p.sink), "click", "2026-11-21T14").state is HourState.COMPLETE
    table = read_table(str(p.sink), p.et, "2026-11-21T14")
    assert table.num_rows == 0 and table.column_names == ["id", "ts", "page"]
    assert read_table(str(p.sink), p.et, "2026-11-21T13").schema == table.schema


def test_write_avro_is_one_container_with_every_record(sc):
    out = io.BytesIO()
    assert write_avro(sc.sink, sc.et, "2026-11-21T14", out) == 2
    back = list(fastavro.reader(io.BytesIO(out.getvalue())))
    assert ids(back) == ["c", "d"] and back[0]["ts"].tzinfo is not None


# -- verifying -----------------------------------------------------------------------------
def test_verify_an_intact_hour(sc):
    r = verify_hour(sc.sink, "click", "2026-11-21T14")
    assert r.ok and (r.files, r.records) == (2, 2) and r.problems() == []


def test_verify_catches_a_deleted_an_added_and_a_corrupted_file(sc):
    before = snapshot(sc, "13")
    first, second = sorted(folder(sc, "13").glob("part-*.avro"))
    first.unlink()
    data = bytearray(second.read_bytes())
    data[-5] ^= 0x01
    second.write_bytes(bytes(data))
    added = folder(sc, "13") / "part-2026112113-b0000000077-s0000-0000.avro"
    added.write_bytes(before[first.name])
    r = verify_hour(sc.sink, "click", "2026-11-21T13")
    assert not r.ok
    assert r.missing == (first.name,)
    assert r.extra == (added.name,)
    assert [(p.name, p.what) for p in r.corrupted if p.what == "sha256"] == [(second.name, "sha256")]
    assert first.name in r.describe() and added.name in r.describe() and "FAILED" in r.describe()


def test_verify_catches_a_truncated_file(sc):
    victim = sorted(folder(sc, "14").glob("late-*.avro"))[0]
    victim.write_bytes(victim.read_bytes()[:40])
    r = verify_hour(sc.sink, "click", "2026-11-21T14")
    assert {p.what for p in r.corrupted} >= {"bytes", "sha256", "unreadable"}


def test_verify_a_range_reports_hours_that_are_not_complete_unchecked(sc):
    reports = verify_hours(sc.sink, "click", "2026-11-21T12", "2026-11-21T16")
    assert [(r.state, r.checked, r.ok) for r in reports] == [
        (HourState.NEVER, False, False), (HourState.COMPLETE, True, True), (HourState.COMPLETE, True, True),
        (HourState.OPEN, False, False)]
    with pytest.raises(HourNotCompleteError):
        verify_hour(sc.sink, "click", "2026-11-21T15")


# -- auditing ------------------------------------------------------------------------------
NOW = dt.datetime(2026, 11, 21, 16, 30, tzinfo=UTC)


def test_audit_counts_the_hour_late_records_found_in_later_hours(sc):
    before = {h: snapshot(sc, h) for h in ("13", "14")}
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=3, now=NOW)
    assert rec.result is AuditResult.MATCH and rec.recorded and rec.final
    assert (rec.timely_records, rec.late_records_found, rec.late_hours_checked) == (2, 1, 1)
    assert hour_status(sc.sink, "click", "2026-11-21T13").state is HourState.AUDITED
    after = snapshot(sc, "13")
    assert set(after) - set(before["13"]) == {"_AUDIT"}, "only the audit record is added"
    assert {k: v for k, v in after.items() if k != "_AUDIT"} == before["13"], "marker and data files unchanged"
    assert snapshot(sc, "14") == before["14"]
    doc = json.loads(after["_AUDIT"])
    assert doc["result"] == "match" and doc["counted"] == 3 and doc["audited_at"] == "2026-11-21T16:30:00Z"


def test_the_hour_own_late_files_hold_earlier_hours_and_do_not_count(sc):
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T14", expected=1, now=NOW)
    assert rec.result is AuditResult.MATCH and rec.timely_records == 1 and rec.late_records_found == 0


def test_late_records_are_attributed_to_their_own_event_hour(tmp_path):
    """Hour 15's late file holds records of 13 and of 14: each audit counts only its own."""
    from tests.lib.harness import click, t

    sc = build_hours(tmp_path, allowed_lateness="24h")
    sc.clock.now = t("15:11")
    sc.pipeline.batch([click("g", "13:40"), click("h", "14:40")])  # watermark 15:03: both late, into hour 15
    complete_hour_15(sc)
    r13 = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=4, now=NOW)
    r14 = audit_hour(sc.sink, sc.et, "2026-11-21T14", expected=2, now=NOW)
    assert (r13.result, r13.timely_records, r13.late_records_found, r13.late_hours_checked) == (
        AuditResult.MATCH, 2, 2, 2)
    assert (r14.result, r14.timely_records, r14.late_records_found) == (AuditResult.MATCH, 1, 1)
    assert not r13.final, "late records of 13 can arrive until 2026-11-22T14"


def test_fewer_records_while_late_ones_can_still_come_is_not_recorded(sc):
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T14", expected=2, now=NOW)
    assert rec.result is AuditResult.INCONCLUSIVE and not rec.recorded and not rec.final
    assert rec.lateness_horizon == dt.datetime(2026, 11, 21, 15, tzinfo=UTC)
    assert not (folder(sc, "14") / "_AUDIT").exists()
    assert hour_status(sc.sink, "click", "2026-11-21T14").state is HourState.COMPLETE


@pytest.mark.parametrize(
    "expected, why", [(2, "more records than the source sent"), (4, "the lateness horizon passed")]
)
def test_a_final_mismatch_is_recorded(sc, expected, why):
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=expected, now=NOW)
    assert rec.result is AuditResult.MISMATCH and rec.recorded, why
    assert rec.difference == 3 - expected
    assert hour_status(sc.sink, "click", "2026-11-21T13").state is HourState.MISMATCH


def test_an_audit_is_recorded_once(sc):
    first = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=3, now=NOW)
    again = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=3, now=NOW + dt.timedelta(hours=1))
    assert again.audited_at == first.audited_at and again.recorded
    with pytest.raises(AuditConflictError) as err:
        audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=4, now=NOW)
    assert (err.value.recorded, err.value.asked, err.value.exit_code) == (3, 4, 5)


def test_audit_needs_a_complete_hour_and_the_loaded_type(sc):
    with pytest.raises(HourNotCompleteError):
        audit_hour(sc.sink, sc.et, "2026-11-21T15", expected=1)
    from event_etl.errors import UsageError

    with pytest.raises(UsageError, match="loaded event type"):
        audit_hour(sc.sink, "click", "2026-11-21T13", expected=3)


def test_when_late_records_cannot_be_attributed_only_timely_ones_count(tmp_path):
    sc = build_hours(tmp_path, publish_time_fallback=True)
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=3, now=NOW)
    assert rec.late_records_found is None and rec.counted == 2 and rec.final
    assert rec.result is AuditResult.MISMATCH


def test_count_file_from_the_publisher(sc, tmp_path):
    counts = tmp_path / "counts" / "click.json"
    counts.parent.mkdir()
    counts.write_text(json.dumps({"event_type": "click", "counts": {"2026-11-21T13:00:00Z": 3}}))
    assert read_count_file(counts, event_type=sc.et, hour="2026-11-21T13") == 3
    from event_etl.consumer import CountFileError

    with pytest.raises(CountFileError, match="no count file"):
        read_count_file(tmp_path / "nope.json", event_type="click", hour="2026-11-21T13")

