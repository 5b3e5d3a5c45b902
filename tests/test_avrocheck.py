"""The compiled checker agrees with fastavro's own validation, and is strict where fastavro's writer is lax."""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path

import pytest
from fastavro import parse_schema
from fastavro.validation import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from event_etl.eventtypes import load_event_types
from event_etl.task.avrocheck import compile_checker

TYPES = load_event_types(Path(__file__).resolve().parent.parent / "event_types")

ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def mutate(record: dict, field: str, value) -> dict:
    r = dict(record)
    r[field] = value
    return r


@pytest.mark.parametrize("name", sorted(TYPES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_agrees_with_fastavro_validate_on_random_values(name, data):
    from event_etl.sources.generator import Generator, GeneratorParams

    et = TYPES[name]
    schema = parse_schema(et.schema)
    check = compile_checker(schema)
    gen = Generator(et, GeneratorParams(start=1_795_266_000_000, invalid=0, future=0, too_late=0, late=0))
    import json

    base = json.loads(gen.one(data.draw(st.integers(0, 10_000))).payload)
    assert check(base) is None
    field = data.draw(st.sampled_from([f["name"] for f in et.schema["fields"]]))
    value = data.draw(ANY)
    rec = mutate(base, field, value)
    ours = check(rec) is None
    theirs = validate(rec, schema, raise_errors=False)
    assert ours == theirs, (field, value)


def test_strict_where_the_writer_is_lax():
    check = compile_checker(parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "l", "type": "long"}, {"name": "i", "type": "int"}, {"name": "d", "type": "double"}]}))
    assert check({"l": 1, "i": 2, "d": 3}) is None
    for bad in ({"l": 1.5, "i": 2, "d": 3.0}, {"l": True, "i": 2, "d": 3.0}, {"l": 1, "i": 2**31, "d": 3.0},
                {"l": 1, "i": 2, "d": "1"}, {"l": 1, "i": 2, "d": True}):
        assert check(bad) is not None


def test_values_fastavro_decodes_logical_types_to():
    check = compile_checker(parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}}]}))
    assert check({"t": datetime.datetime(2026, 11, 21, tzinfo=datetime.UTC), "u": uuid.uuid4(),
                  "d": datetime.date(2026, 11, 21)}) is None
    assert check({"t": 5, "u": "x", "d": 3}) is None


def test_explains_which_field():
    check = compile_checker(parse_schema(TYPES["db_change"].schema))
    why = check({"change_id": "c", "source_db": "s", "table": "t", "operation": "MERGE", "primary_key": {},
                 "commit_time_ms": 1, "log_position": 1, "transaction_id": 1})
    assert why.startswith("'operation'") and "MERGE" in why
    why = check({"change_id": "c", "source_db": "s", "table": "t", "operation": "INSERT", "primary_key": {"id": 5},
                 "commit_time_ms": 1, "log_position": 1, "transaction_id": 1})
    assert why.startswith("'primary_key'['id']")
