"""The consumer's rules as plain functions: hour arguments, states, audit verdicts, count files, comparisons."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import uuid

import fastavro
import pyarrow as pa
import pytest

from event_etl.consumer import (
    AuditResult,
    CountFileError,
    HourState,
    UnsupportedSchemaError,
    audit_verdict,
    classify_hour,
    compare_hour,
    lateness_horizon,
    parse_count_file,
    record_json,
)
from event_etl.consumer.arrow import ArrowConverter
from event_etl.consumer.errors import EXIT_CODE_MEANINGS, ExitCode
from event_etl.consumer.hours import hour_ms, hour_range, window
from event_etl.consumer.verify import file_facts
from event_etl.errors import UsageError
from event_etl.rules.manifest import FileEntry, build_manifest
from tests.lib.harness import hour, t

UTC = dt.UTC


# -- hours ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "2026-11-21T13", "2026-11-21T13:00Z", "2026-11-21T13:00:00Z", "2026-11-21T13:00:00+00:00",
    "2026-11-21 13:00:00+00:00",  # Airflow's {{ data_interval_start }}
    dt.datetime(2026, 11, 21, 13, tzinfo=UTC),
    dt.datetime(2026, 11, 21, 14, tzinfo=dt.timezone(dt.timedelta(hours=1))),  # the same instant, elsewhere
])
def test_an_hour_is_accepted_in_every_form_users_have(text):
    assert hour_ms(text) == hour("13")


@pytest.mark.parametrize("bad", [
    "2026-11-21T13:30", "2026-11-21", "13", "2026-11-21T13:00+01:00", "2026-02-30T13", "",
    dt.datetime(2026, 11, 21, 13),  # naive
    dt.datetime(2026, 11, 21, 13, 5, tzinfo=UTC),
    1795266000000,
])
def test_anything_else_is_a_usage_error_that_shows_the_form(bad):
    with pytest.raises(UsageError) as err:
        hour_ms(bad)
    assert err.value.exit_code == ExitCode.USAGE
    assert err.value.fix


def test_ranges_are_half_open_and_bounded():
    assert hour_range("2026-11-21T13", "2026-11-21T16") == [hour("13"), hour("14"), hour("15")]
    with pytest.raises(UsageError, match="not after"):
        hour_range("2026-11-21T13", "2026-11-21T13")
    with pytest.raises(UsageError, match="more than a year"):
        hour_range("2024-01-01T00", "2026-01-01T00")


def test_window_defaults_come_from_now_passed_in():
    now = t("13:25")
    assert window(None, None, now=now) == (hour("13") - 23 * 3600_000, hour("14"))
    assert window(None, None, now=now, include_current=False) == (hour("13") - 24 * 3600_000, hour("13"))
    assert window(hour("10"), None, now=now) == (hour("10"), hour("14"))
    assert window(None, hour("12"), now=now, hours=2) == (hour("10"), hour("12"))


# -- states --------------------------------------------------------------------------------
@pytest.mark.parametrize("has_marker, data_files, audit, first, want", [
    (True, 3, None, None, HourState.COMPLETE),
    (True, 0, None, hour("13"), HourState.COMPLETE),  # a quiet hour still gets its marker
    (True, 3, True, None, HourState.AUDITED),
    (True, 3, False, None, HourState.MISMATCH),
    (False, 2, None, None, HourState.OPEN),
    (False, 0, None, None, HourState.NOT_STARTED),
    (False, 0, None, hour("12"), HourState.NOT_STARTED),  # after the first marked hour: its marker will come
    (False, 2, None, hour("12"), HourState.OPEN),
    (False, 0, None, hour("14"), HourState.NEVER),  # before the first marked hour: markers come in order
    (False, 1, None, hour("14"), HourState.NEVER),
])
def test_classify_hour(has_marker, data_files, audit, first, want):
    got = classify_hour(hour("13"), has_marker=has_marker, data_files=data_files, audit_matched=audit,
                        first_complete=first)
    assert got is want
    assert got.is_complete == has_marker


# -- audit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("expected, counted, final, want", [
    (10, 10, False, AuditResult.MATCH),
    (10, 10, True, AuditResult.MATCH),
    (10, 11, False, AuditResult.MISMATCH),  # records are only ever added: more is final
    (10, 9, True, AuditResult.MISMATCH),
    (10, 9, False, AuditResult.INCONCLUSIVE),  # late records of the hour may still come
])
def test_audit_verdict(expected, counted, final, want):
    assert audit_verdict(expected=expected, counted=counted, final=final) is want


def test_lateness_horizon_is_the_last_hour_that_can_hold_late_records():
    assert lateness_horizon(hour("13"), 24 * 3600_000) == hour("2026-11-22T14")
    assert lateness_horizon(hour("13"), 30 * 60_000) == hour("14")
    assert lateness_horizon(hour("13"), 0) == hour("14")


def _counts(doc) -> bytes:
    return json.dumps(doc).encode()


def test_count_file_gives_the_hour_count():
    data = _counts({"event_type": "click", "counts": {"2026-11-21T13:00:00Z": 1234, "2026-11-21T14:00:00Z": 7}})
    assert parse_count_file(data, event_type="click", hour=hour("13"), path="c.json") == 1234
    assert parse_count_file(data, event_type="click", hour=hour("14"), path="c.json") == 7


@pytest.mark.parametrize("data, what", [
    (b"{not json", "not JSON"),
    (_counts({"event_type": "click"}), "no \"counts\""),
    (_counts({"event_type": "page_view", "counts": {"2026-11-21T13:00:00Z": 1}}), "not 'click'"),
    (_counts({"event_type": "click", "counts": {"2026-11-21T12:00:00Z": 1}}), "no count for 2026-11-21T13"),
    (_counts({"event_type": "click", "counts": {"2026-11-21T13:00:00Z": -1}}), "not a whole number"),
    (_counts({"event_type": "click", "counts": {"2026-11-21T13:00:00Z": True}}), "not a whole number"),
    (_counts({"event_type": "click", "counts": {"yesterday": 1}}), "not an hour"),
])
def test_a_bad_count_file_says_what_is_wrong(data, what):
    with pytest.raises(CountFileError, match=what) as err:
        parse_count_file(data, event_type="click", hour=hour("13"), path="c.json")
    assert err.value.exit_code == ExitCode.USAGE and err.value.path == "c.json"


# -- verification --------------------------------------------------------------------------
def _avro(n: int) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(
        buf,
        fastavro.parse_schema({"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}),
        [{"x": i} for i in range(n)],
    )
    return buf.getvalue()


def _entry(name: str, data: bytes, *, late: bool = False) -> FileEntry:
    facts = file_facts(data)
    return FileEntry(name, facts.records, facts.bytes, facts.sha256, late)


def test_file_facts_recomputes_size_sha_and_records():
    data = _avro(3)
    f = file_facts(data)
    assert (f.bytes, f.records, f.error) == (len(data), 3, None)
    bad = file_facts(b"not avro at all")
    assert bad.records is None and bad.error


def test_compare_hour_names_missing_extra_and_corrupted_files():
    a, b, c = "part-2026112113-b0000000000-s0000-0000.avro", "part-2026112113-b0000000000-s0000-0001.avro", \
        "late-2026112113-b0000000001-s0000-0000.avro"
    da, db, dc = _avro(1), _avro(2), _avro(3)
    m = build_manifest(
        event_type="click",
        hour=hour("13"),
        files=[_entry(a, da), _entry(b, db), _entry(c, dc, late=True)],
        watermark=t("14:03"),
        completed_at=t("14:10"),
    )
    intact = {a: file_facts(da), b: file_facts(db), c: file_facts(dc)}
    listing = {a: len(da), b: len(db), c: len(dc), "_COMPLETE": 100}
    assert compare_hour(m, listing, intact) == ((), (), ())

    corrupt = bytearray(db)
    corrupt[-3] ^= 0xFF  # same size, other bytes
    extra = "part-2026112113-b0000000099-s0000-0000.avro"
    missing, extras, corrupted = compare_hour(
        m, {b: len(db), c: len(dc), extra: 10, ".part.tmp": 3},
        {a: None, b: file_facts(bytes(corrupt)), c: file_facts(dc + b"x")},
    )
    assert missing == (a,)
    assert extras == (extra,)
    assert {(p.name, p.what) for p in corrupted} >= {(b, "sha256"), (c, "bytes"), (c, "sha256")}


def test_compare_hour_catches_entries_that_contradict_their_names():
    name = "part-2026112113-b0000000000-s0000-0000.avro"
    data = _avro(1)
    m = build_manifest(event_type="click", hour=hour("13"), files=[_entry(name, data, late=True)],
                       watermark=t("14:03"), completed_at=t("14:10"))
    _, _, corrupted = compare_hour(m, {name: len(data)}, {name: file_facts(data)})
    assert [(p.what, p.expected, p.found) for p in corrupted] == [("late flag", False, True)]


# -- output forms --------------------------------------------------------------------------
def test_record_json_writes_what_json_has_no_type_for_as_text():
    rec = {"t": dt.datetime(2026, 11, 21, 13, 5, 0, 250000, tzinfo=UTC), "u": uuid.UUID(int=1),
           "d": decimal.Decimal("1.50"), "b": b"\x00\xff", "day": dt.date(2026, 11, 21), "n": None, "s": "ü"}
    assert json.loads(record_json(rec)) == {
        "t": "2026-11-21T13:05:00.250Z", "u": "00000000-0000-0000-0000-000000000001", "d": "1.50", "b": "AP8=",
        "day": "2026-11-21", "n": None, "s": "ü"}


def test_arrow_types_come_from_the_avro_schema():
    schema = {"type": "record", "name": "R", "namespace": "x", "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "again", "type": "Kind"},
        {"name": "tags", "type": {"type": "map", "values": ["null", "string"]}},
        {"name": "ids", "type": {"type": "array", "items": {"type": "string", "logicalType": "uuid"}}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [{"name": "n", "type": "int"}]}},
    ]}
    conv = ArrowConverter(schema)
    assert conv.schema.field("id").type == pa.string() and not conv.schema.field("id").nullable
    assert conv.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert conv.schema.field("us").type == pa.timestamp("us", tz="UTC") and conv.schema.field("us").nullable
    assert conv.schema.field("again").type == pa.string()
    assert conv.schema.field("tags").type == pa.map_(pa.string(), pa.string())
    assert conv.schema.field("price").type == pa.decimal128(9, 2)
    assert conv.schema.field("inner").type == pa.struct([pa.field("n", pa.int32(), nullable=False)])
    rec = {"id": uuid.UUID(int=5), "ts": dt.datetime(2026, 11, 21, 13, tzinfo=UTC), "us": None, "kind": "A",
           "again": "B", "tags": {"k": None}, "ids": [uuid.UUID(int=6)], "price": decimal.Decimal("1.25"),
           "inner": {"n": 1}}
    table = conv.table([rec])
    assert table.num_rows == 1 and table.column("id")[0].as_py() == str(uuid.UUID(int=5))
    assert table.column("ids")[0].as_py() == [str(uuid.UUID(int=6))]
    assert conv.table([]).schema == conv.schema


def test_a_union_of_several_types_has_no_arrow_column():
    with pytest.raises(UnsupportedSchemaError, match="union"):
        ArrowConverter({"type": "record", "name": "R", "fields": [{"name": "v", "type": ["null", "string", "long"]}]})


def test_every_exit_code_is_explained():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 6, 7, 129, 130, 143]
    assert set(EXIT_CODE_MEANINGS) == set(ExitCode)
