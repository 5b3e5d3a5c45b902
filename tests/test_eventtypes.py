"""Event types as data: the shipped ones load; broken ones fail fast naming file, field and fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from event_etl.errors import ConfigError
from event_etl.eventtypes import load_event_type, load_event_types, resolve_event_types_dir
from tests.lib.harness import CLICK_SCHEMA, make_event_type

SHIPPED = Path(__file__).resolve().parent.parent / "event_types"


def test_shipped_types_load_with_their_settings():
    types = load_event_types(SHIPPED)
    assert {"page_view", "payment_authorization", "db_change"} <= set(types)
    pv = types["page_view"]
    assert pv.time_field == "event_time" and pv.id_field == "event_id"
    assert pv.out_of_orderness == 120_000 and pv.allowed_lateness == 86_400_000
    assert pv.time_logical_divisor == 1
    pay = types["payment_authorization"]
    assert pay.time_format == "iso8601"
    fields = {f["name"] for f in pay.schema["fields"]}
    assert {"amount_minor", "currency", "status", "gateway", "instrument_type"} <= fields
    cdc = {f["name"] for f in types["db_change"].schema["fields"]}
    assert {"table", "operation", "primary_key", "before", "after", "commit_time_ms"} <= cdc


def test_defaults_apply(tmp_path):
    et = make_event_type(tmp_path)
    assert (et.out_of_orderness, et.allowed_lateness) == (120_000, 86_400_000)
    assert et.max_events_per_file == 500_000
    assert et.max_backfill == 30 * 86_400_000


@pytest.mark.parametrize("text, ms, shown", [("45d", 45 * 86_400_000, "45d"), ("36h", 36 * 3_600_000, "1d12h"),
                                             ("0", 0, "0")])
def test_max_backfill_is_a_duration_and_0_is_no_bound(tmp_path, text, ms, shown):
    et = make_event_type(tmp_path, max_backfill=text)
    assert et.max_backfill == ms
    assert et.settings_summary()["max_backfill"] == shown
    assert make_event_type(tmp_path / "d").settings_summary()["max_backfill"] == "30d"


def test_event_types_dir_from_option_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EVENT_ETL_EVENT_TYPES", str(tmp_path / "env"))
    assert resolve_event_types_dir(str(tmp_path / "opt")) == tmp_path / "opt"
    assert resolve_event_types_dir(None) == tmp_path / "env"
    monkeypatch.delenv("EVENT_ETL_EVENT_TYPES")
    assert resolve_event_types_dir(None) == SHIPPED


def _write(tmp_path, schema, toml):
    d = tmp_path / "click"
    d.mkdir(exist_ok=True)
    (d / "schema.avsc").write_text(schema if isinstance(schema, str) else json.dumps(schema))
    (d / "etl.toml").write_text(toml)
    return d


@pytest.mark.parametrize(
    "schema, toml, file, field, fix",
    [
        ("{not json", 'time_field = "ts"', "schema.avsc", None, "JSON"),
        ({"type": "string"}, 'time_field = "ts"', "schema.avsc", "type", "record"),
        ({"type": "record", "name": "X", "fields": [{"name": "a", "type": "strng"}]}, 'time_field = "a"',
         "schema.avsc", None,
         "Avro"),
        (CLICK_SCHEMA, 'time_field = "when"', "etl.toml", "time_field", "ts"),
        (CLICK_SCHEMA, "", "etl.toml", "time_field", "time_field ="),
        (CLICK_SCHEMA, 'time_field = "ts"\nout_of_orderness = "2 minutes"', "etl.toml", "out_of_orderness", "2m"),
        (CLICK_SCHEMA, 'time_field = "ts"\nalowed_lateness = "1h"', "etl.toml", "alowed_lateness", "allowed_lateness"),
        (CLICK_SCHEMA, 'time_field = "id"\ntime_format = "iso8601"\nid_field = "nope"', "etl.toml", "id_field",
         "fields are"),
        (CLICK_SCHEMA, 'time_field = "id"\ntime_format = "epoch_millis"', "etl.toml", "time_format",
         "change time_format"),
        (CLICK_SCHEMA, 'time_field = "ts"\ntime_format = "unix"', "etl.toml", "time_format", "epoch_millis"),
        (CLICK_SCHEMA, 'time_field = "ts"\nmax_events_per_file = 0', "etl.toml", "max_events_per_file", "500000"),
        (CLICK_SCHEMA, 'time_field = "ts"\nmax_backfill = "off"', "etl.toml", "max_backfill", 'max_backfill = "0"'),
        (CLICK_SCHEMA, 'time_field = "ts"\nmax_backfill = 30', "etl.toml", "max_backfill", 'max_backfill = "30d"'),
        (CLICK_SCHEMA, 'time_field = "ts"\nmax_backfill = "3 weeks"', "etl.toml", "max_backfill", "no bound"),
        (CLICK_SCHEMA, 'time_field = "ts"\ncodec = "zstd"', "etl.toml", "codec", "deflate"),
        (CLICK_SCHEMA, 'time_field = "ts" oops', "etl.toml", None, "toml"),
    ],
)
def test_broken_types_fail_with_file_field_and_fix(tmp_path, schema, toml, file, field, fix):
    d = _write(tmp_path, schema, toml)
    with pytest.raises(ConfigError) as info:
        load_event_type(d)
    err = info.value
    assert err.file.endswith(file)
    assert err.field == field
    assert fix.lower() in (err.fix or "").lower() + str(err).lower()
    assert str(d / file) in str(err)


def test_missing_files_are_named(tmp_path):
    d = tmp_path / "click"
    d.mkdir()
    with pytest.raises(ConfigError, match="schema.avsc"):
        load_event_type(d)


def test_bad_folder_name(tmp_path):
    d = tmp_path / "Bad-Name"
    d.mkdir()
    with pytest.raises(ConfigError, match="not a valid event type name"):
        load_event_type(d)
