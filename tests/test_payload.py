"""Decoding payloads: JSON and Avro single-object encoding, and a reason for every bad input."""

from __future__ import annotations

import base64
import json

import pytest

from event_etl.rules.reasons import Reason
from event_etl.storage.avroio import encode_single_object
from event_etl.task.payload import Decoder
from tests.lib.harness import make_event_type, t


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    return Decoder(make_event_type(tmp_path_factory.mktemp("types"), max_payload_bytes=200))


def ok(decoder, payload):
    good, rec, ms = decoder.decode(payload)
    assert good, (rec, ms)
    return rec, ms


def test_json_object(decoder):
    rec, ms = ok(decoder, b'{"id": "a", "ts": 1795266600000, "extra": 1}')
    assert ms == 1795266600000 and rec["id"] == "a" and rec["page"] is None


def test_avro_single_object(decoder):
    soe = encode_single_object(decoder.schema, decoder.event_type.fingerprint, {"id": "z", "ts": t("13:00"),
                                                                                "page": "/p"})
    assert soe[:2] == b"\xc3\x01"
    rec, ms = ok(decoder, soe)
    assert (rec["id"], ms, rec["page"]) == ("z", t("13:00"), "/p")
    rec, ms = ok(decoder, base64.b64encode(soe))  # as a line of a text file
    assert rec["id"] == "z"


GOOD = {"id": "a", "ts": 1795266600000}


def soe(decoder, rec=None):
    return encode_single_object(decoder.schema, decoder.event_type.fingerprint, rec or {"id": "a", "ts": t("13:00"),
                                                                                        "page": None})


@pytest.mark.parametrize(
    "name, payload, reason, detail",
    [
        ("malformed JSON", b'{"id": "a", "ts": ', Reason.INVALID_JSON, ""),
        ("JSON of the wrong shape", b'[{"id": "a"}]', Reason.NOT_AN_OBJECT, "list"),
        ("a JSON string", b'"hello"', Reason.NOT_AN_OBJECT, "str"),
        ("wrong field type", json.dumps({**GOOD, "id": 5}).encode(), Reason.SCHEMA_MISMATCH, "'id'"),
        ("wrong type in a union", json.dumps({**GOOD, "page": 5}).encode(), Reason.SCHEMA_MISMATCH, "'page'"),
        ("missing required field", json.dumps({"ts": GOOD["ts"]}).encode(), Reason.MISSING_FIELD, "'id'"),
        ("missing event time", b'{"id": "a"}', Reason.MISSING_TIME, "'ts'"),
        ("null event time", b'{"id": "a", "ts": null}', Reason.MISSING_TIME, "'ts'"),
        ("unparseable event time", b'{"id": "a", "ts": "yesterday"}', Reason.INVALID_TIME, "yesterday"),
        ("boolean event time", b'{"id": "a", "ts": true}', Reason.INVALID_TIME, "bool"),
        ("out of range event time", b'{"id": "a", "ts": 99999999999999999}', Reason.INVALID_TIME, "years"),
        ("empty payload", b"", Reason.EMPTY_PAYLOAD, ""),
        ("blank payload", b"   ", Reason.EMPTY_PAYLOAD, ""),
        ("non-UTF-8 bytes", b'{"id": "\xff\xfe"}', Reason.INVALID_UTF8, "0xff"),
        ("oversized", b'{"id": "' + b"x" * 300 + b'", "ts": 1}', Reason.OVERSIZED, "200"),
    ],
)
def test_bad_json_inputs_get_a_specific_reason(decoder, name, payload, reason, detail):
    good, got, why = decoder.decode(payload)
    assert not good
    assert got is reason, f"{name}: {got} ({why})"
    assert detail in why


def test_avro_with_an_unknown_fingerprint(decoder):
    bad = b"\xc3\x01" + b"\x00" * 8 + soe(decoder)[10:]
    good, reason, why = decoder.decode(bad)
    assert (good, reason) == (False, Reason.UNKNOWN_SCHEMA) and "0000000000000000" in why


@pytest.mark.parametrize("cut", [10, 11, 14, -1])
def test_truncated_avro(decoder, cut):
    good, reason, why = decoder.decode(soe(decoder)[:cut])
    assert (good, reason) == (False, Reason.INVALID_AVRO), why


def test_avro_with_trailing_bytes(decoder):
    good, reason, why = decoder.decode(soe(decoder) + b"\x00\x01")
    assert (good, reason) == (False, Reason.INVALID_AVRO) and "trailing" in why


def test_time_formats(tmp_path):
    sec = make_event_type(tmp_path / "a", schema={"type": "record", "name": "S", "fields": [
        {"name": "id", "type": "string"}, {"name": "at", "type": "double"}]}, time_field="at",
        time_format="epoch_seconds")
    assert Decoder(sec).decode(b'{"id": "a", "at": 1795266600.25}')[2] == 1795266600250
    iso = make_event_type(tmp_path / "b", schema={"type": "record", "name": "S", "fields": [
        {"name": "id", "type": "string"}, {"name": "at", "type": "string"}]}, time_field="at", time_format="iso8601")
    d = Decoder(iso)
    assert d.decode(b'{"id": "a", "at": "2026-11-21T14:00:00+01:00"}')[2] == t("13:00")
    assert d.decode(b'{"id": "a", "at": "2026-11-21T13:00:00.5Z"}')[2] == t("13:00:00.500")
    good, reason, why = d.decode(b'{"id": "a", "at": "2026-11-21T13:00:00"}')
    assert (good, reason) == (False, Reason.INVALID_TIME) and "UTC offset" in why
    micros = make_event_type(tmp_path / "c", schema={"type": "record", "name": "S", "fields": [
        {"name": "id", "type": "string"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}}]},
        time_field="at")
    assert Decoder(micros).decode(b'{"id": "a", "at": 1795266600000123}')[2] == 1795266600000


@pytest.mark.parametrize("text, want", [
    ("2026-11-21T13:05:00z", "13:05"),                    # RFC 3339 allows a lower-case z
    ("2026-11-21t13:05:00Z", "13:05"),                    # and a lower-case t
    ("2026-11-21T13:59:60Z", "13:59:59.999"),             # a leap second stays in its minute and hour
    ("2026-11-21T14:59:60.5+01:00", "13:59:59.999"),
    ("2026-11-21T13:59:59.9999999Z", "13:59:59.999"),     # digits past microseconds are floored, not rounded
])
def test_rfc3339_times_that_fromisoformat_refuses(tmp_path, text, want):
    iso = make_event_type(tmp_path / "b", schema={"type": "record", "name": "S", "fields": [
        {"name": "id", "type": "string"}, {"name": "at", "type": "string"}]}, time_field="at", time_format="iso8601")
    ok, _, ms = Decoder(iso).decode(json.dumps({"id": "a", "at": text}).encode())
    assert ok and ms == t(want)


@pytest.mark.parametrize("value, want", [
    ("1795269599.9996", "13:59:59.999"),  # rounding would put it into hour 14
    ("1795269599.9999", "13:59:59.999"),
    ("1700000000.123", "2023-11-14T22:13:20.123"),  # not ...122 from binary floating point
    ("1795266600", "13:10"),
])
def test_epoch_seconds_floor_to_the_millisecond(tmp_path, value, want):
    sec = make_event_type(tmp_path / "a", schema={"type": "record", "name": "S", "fields": [
        {"name": "id", "type": "string"}, {"name": "at", "type": "double"}]}, time_field="at",
        time_format="epoch_seconds")
    ok, _, ms = Decoder(sec).decode(b'{"id": "a", "at": %s}' % value.encode())
    assert ok and ms == t(want)


def test_event_time_from_a_message_attribute_or_the_publish_time(tmp_path):
    et = make_event_type(tmp_path / "attr", time_attribute="event_time", publish_time_fallback=True)
    d = Decoder(et)
    good, rec, ms = d.decode_message(b'{"id": "a", "ts": 1}', {"event_time": str(t("13:00"))}, t("13:05"))
    assert good and ms == t("13:00"), "the attribute wins over the payload"
    assert d.decode_message(b'{"id": "a", "ts": 1}', {}, t("13:05"))[2] == t("13:05"), "publish time as fallback"
    good, reason, why = d.decode_message(b'{"id": "a", "ts": 1}', {"event_time": "soon"}, t("13:05"))
    assert (good, reason) == (False, Reason.INVALID_TIME) and "event_time" in why
    strict = Decoder(make_event_type(tmp_path / "strict", time_attribute="event_time"))
    good, reason, why = strict.decode_message(b'{"id": "a", "ts": 1}', {}, t("13:05"))
    assert (good, reason) == (False, Reason.MISSING_TIME) and "attribute" in why


def test_publish_time_fallback_only_when_the_type_says_so(tmp_path):
    fb = Decoder(make_event_type(tmp_path / "fb", publish_time_fallback=True))
    assert fb.decode_message(b'{"id": "a"}', {}, t("13:05"))[2] == t("13:05")
    assert fb.decode_message(b'{"id": "a", "ts": 1795266600000}', {}, t("13:05"))[2] == 1795266600000
    plain = Decoder(make_event_type(tmp_path / "plain"))
    assert plain.decode_message(b'{"id": "a"}', {}, t("13:05"))[1] is Reason.MISSING_TIME
