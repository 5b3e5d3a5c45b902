"""The columnar fast path gives exactly what the record path gives: same files (byte for byte), counts, dead-letter, keys."""

from __future__ import annotations

import io
import json
import os

import fastavro
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from event_etl import executor
from event_etl.executor import BatchContext, process_split
from event_etl.fastpath import _varints, _zigzag, plan_for
from event_etl.rules.judge import OUTCOME_CODES, judge_array, make_judge
from event_etl.sources.splits import Split
from event_etl.storage import open_storage
from tests.harness import make_event_type

HOUR = 3_600_000
BASE = 1_795_225_200_000  # 2026-11-20T00:00Z
ARRIVAL = BASE + 6 * HOUR

SCHEMA = {
    "type": "record", "name": "Mixed", "namespace": "t",
    "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "n", "type": "long"},
        {"name": "small", "type": "int"},
        {"name": "flag", "type": "boolean"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}},
        {"name": "text", "type": "string"},
        {"name": "opt_s", "type": ["null", "string"], "default": None},
        {"name": "opt_l", "type": ["null", "long"], "default": None},
        {"name": "opt_b", "type": ["boolean", "null"]},
        {"name": "opt_e", "type": ["null", "Kind"], "default": None},
        {"name": "opt_i", "type": ["int", "null"]},
    ],
}

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)


@st.composite
def records(draw):
    rec = {
        "id": draw(st.uuids()).hex if draw(st.booleans()) else str(draw(st.uuids())),
        "ts": BASE + draw(st.integers(-30 * HOUR, 7 * HOUR)),
        "n": draw(longs),
        "small": draw(ints),
        "flag": draw(st.booleans()),
        "kind": draw(st.sampled_from("ABC")),
        "text": draw(texts),
        "opt_s": draw(st.none() | texts),
        "opt_l": draw(st.none() | longs),
        "opt_b": draw(st.none() | st.booleans()),
        "opt_e": draw(st.none() | st.sampled_from("ABC")),
        "opt_i": draw(st.none() | ints),
    }
    for name in ("opt_s", "opt_l", "opt_b", "opt_e", "opt_i"):
        if draw(st.integers(0, 3)) == 0:
            del rec[name]  # missing nullable field: null
    if draw(st.integers(0, 4)) == 0:
        rec["extra"] = draw(st.none() | texts | st.lists(st.integers(), max_size=3))
    keys = draw(st.permutations(list(rec)))
    return {k: rec[k] for k in keys}


BAD = [
    b"", b"   ", b"null", b"[1, 2]", b"5", b'"s"', b"{", b"not json", b"\xff\xfe{}",
    b'{"id": "x", "ts": 1, "ts": 2}',
]


def dump(rec, ascii_only=False) -> bytes:
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=ascii_only).encode("utf-8")


@st.composite
def lines(draw):
    rec = draw(records())
    kind = draw(st.integers(0, 14))
    if kind <= 9:
        return dump(rec, ascii_only=kind == 9)
    if kind == 10:
        return draw(st.sampled_from(BAD))
    if kind == 11:  # a wrong type somewhere
        field = draw(st.sampled_from(["n", "small", "flag", "kind", "text", "ts", "opt_l", "id"]))
        rec[field] = draw(st.sampled_from([True, 1.5, "7", None, 2**40, {"a": 1}, "Z", 10**20]))
        return dump(rec)
    if kind == 12:  # a required field missing
        del rec[draw(st.sampled_from(["id", "ts", "n", "kind", "text"]))]
        return dump(rec)
    if kind == 13:  # escapes, \r\n endings, leading blanks, two objects on a line
        return draw(st.sampled_from([
            dump(rec).replace(b'"id"', b'"\\u0069d"'),
            dump(rec) + b"\r",
            b" " + dump(rec),
            dump(rec) + dump(rec),
            dump(rec).replace(b'"text":', b'"text":"\\ud800","t2":', 1),  # a lone surrogate
        ]))
    rec["ts"] = draw(st.sampled_from([BASE + 400 * HOUR, -(2**62), 2**62, BASE - 900 * HOUR]))  # future, out of range, too late
    return dump(rec)


@pytest.fixture(scope="module")
def event_type(tmp_path_factory):
    return make_event_type(tmp_path_factory.mktemp("types"), "mixed", SCHEMA, time_field="ts", id_field="id",
                           dedupe_window="10m", max_events_per_file=7, allowed_lateness="1d")


def run_both(tmp_path, et, data: bytes, wm_start, drop=None, *, batch_id=3):
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "in.jsonl"
    src.write_bytes(data)
    os.utime(src, (ARRIVAL / 1000, ARRIVAL / 1000))
    split = Split.of_files(2, [(str(src), 0, len(data), ARRIVAL)])
    out = {}
    for fast in (False, True):
        sink = tmp_path / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), batch_id, wm_start, ARRIVAL + 5, drop=drop or {}, writer="abc123")
        report, keys = process_split(split, ctx, open_storage(str(sink)), fast=fast)
        files = {}
        for root, _, names in os.walk(sink):
            for name in names:
                p = os.path.join(root, name)
                files[os.path.relpath(p, sink)] = open(p, "rb").read()
        out[fast] = (report, keys, files)
    return out


def assert_same(out):
    (r0, k0, f0), (r1, k1, f1) = out[False], out[True]
    assert r1 == r0
    assert sorted(np.frombuffer(k1, dtype=executor_key_dtype()).tolist()) == \
        sorted(np.frombuffer(k0, dtype=executor_key_dtype()).tolist())
    assert f1.keys() == f0.keys()
    for name in f0:
        assert f1[name] == f0[name], name


def executor_key_dtype():
    from event_etl.dedupe import KEY_DTYPE

    return KEY_DTYPE


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(lines(), min_size=1, max_size=60), wm=st.sampled_from([None, BASE + 2 * HOUR + 60_000]),
       chunk=st.sampled_from([256, 1 << 20]), last_newline=st.booleans())
def test_fast_and_record_paths_write_the_same_bytes(tmp_path_factory, event_type, monkeypatch, body, wm, chunk, last_newline):
    monkeypatch.setattr(executor, "_READ_BYTES", chunk)  # small chunks: some fast, some not, in one split
    data = b"\n".join(body) + (b"\n" if last_newline else b"")
    assert_same(run_both(tmp_path_factory.mktemp("run"), event_type, data, wm))


def test_valid_lines_take_the_fast_path_and_match_fastavro(event_type):
    """The fast path is really taken for clean input, and each row is fastavro's encoding of the record."""
    from event_etl.executor import _decoder

    recs = [
        {"id": "a", "ts": BASE, "n": -(2**63), "small": -(2**31), "flag": True, "kind": "C", "text": "héllo\n\"x\"",
         "opt_s": None, "opt_l": 2**63 - 1, "opt_b": False, "opt_e": "B", "opt_i": None},
        {"id": "b", "ts": BASE + 1, "n": 0, "small": 2**31 - 1, "flag": False, "kind": "A", "text": "",
         "opt_s": "🙂", "opt_l": -1, "opt_b": None, "opt_e": None, "opt_i": 63},
    ]
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    decoder = _decoder(event_type)
    plan = plan_for(decoder)
    assert plan is not None
    fc = plan.decode(data)
    assert fc is not None and fc.n == 2
    for rec, row in zip(recs, fc.rows.to_pylist()):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, decoder.schema, rec)
        assert row == buf.getvalue()
    assert plan.decode(data + b"null\n") is None  # one bad line: the record path explains it


def test_a_rerun_with_known_duplicates_skips_the_same_records(tmp_path, event_type):
    recs = [{"id": f"id{i}", "ts": BASE + 3 * HOUR + i, "n": i, "small": i, "flag": True, "kind": "A", "text": "t" * i,
             "opt_i": None, "opt_b": None} for i in range(40)]
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    first = run_both(tmp_path / "first", event_type, data, BASE)
    assert_same(first)
    names = [f["name"] for f in first[False][0]["files"]]
    assert len(names) == 6  # 40 records, 7 per file
    drop = {names[1]: (0, 3, 6), names[4]: (2,)}
    again = run_both(tmp_path / "again", event_type, data, BASE, drop)
    assert_same(again)
    assert again[True][0]["counts"]["duplicate"] == 4
    assert sum(f["records"] for f in again[True][0]["files"]) == 36


def test_the_array_judge_is_the_scalar_judge():
    times = np.array([BASE + k * 600_000 for k in range(-60, 20)] + [BASE - 10**12, BASE + 10**12], dtype=np.int64)
    arrival = BASE + 2 * HOUR
    for wm in (None, BASE, BASE + HOUR + 1, BASE - 1):
        for ref in (None, BASE + 5 * HOUR):
            kw = dict(allowed_lateness=3 * HOUR, max_future_skew=HOUR, too_late_reference=ref)
            codes, hours = judge_array(times, arrival, wm, **kw)
            one = make_judge(wm, **kw)
            for t, c, h in zip(times.tolist(), codes.tolist(), hours.tolist()):
                outcome, hour = one(t, arrival)
                assert OUTCOME_CODES[c] is outcome
                if hour is not None:
                    assert h == hour


def test_varints_are_avro_longs():
    import pyarrow as pa

    values = np.array([0, 1, -1, 63, -64, 64, 2**31, -(2**31), 2**62, 2**63 - 1, -(2**63)], dtype=np.int64)
    present = np.array([True, False] * 5 + [True])
    arr = _varints([(_zigzag(values), None), (_zigzag(values[::-1].copy()), present)], len(values), pa)
    for row, a, b, p in zip(arr.to_pylist(), values.tolist(), values[::-1].tolist(), present.tolist()):
        want = io.BytesIO()
        fastavro.schemaless_writer(want, "long", a)
        if p:
            fastavro.schemaless_writer(want, "long", b)
        assert row == want.getvalue()


def test_schemas_the_fast_path_does_not_handle_fall_back(tmp_path):
    from event_etl.executor import _decoder

    nested = {"type": "record", "name": "N", "fields": [
        {"name": "id", "type": "string"}, {"name": "ts", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}}]}
    with_default = {"type": "record", "name": "D", "fields": [
        {"name": "id", "type": "string"}, {"name": "ts", "type": "long"},
        {"name": "c", "type": "string", "default": "x"}]}
    for i, schema in enumerate((nested, with_default)):
        et = make_event_type(tmp_path / str(i), "t", schema, time_field="ts")
        assert plan_for(_decoder(et)) is None


def test_one_split_mixes_fast_and_record_chunks(tmp_path, event_type, monkeypatch):
    """Bad lines send only their own chunk down the record path; the output is still the record path's."""
    from event_etl.fastpath import FastPlan

    taken = []
    real = FastPlan.decode

    def counting(self, data):
        fc = real(self, data)
        taken.append(fc is not None)
        return fc

    monkeypatch.setattr(FastPlan, "decode", counting)
    monkeypatch.setattr(executor, "_READ_BYTES", 400)
    good = [dump({"id": f"i{i}", "ts": BASE + (i % 5) * HOUR + i, "n": i, "small": -i, "flag": i % 2 == 0,
                  "kind": "B", "text": "x" * (i % 9), "opt_l": i if i % 3 else None, "opt_i": None, "opt_b": True})
            for i in range(60)]
    body = good[:20] + [b"null", b'{"id": 1}'] + good[20:40] + [b""] + good[40:]
    out = run_both(tmp_path, event_type, b"\n".join(body) + b"\n", BASE + 2 * HOUR + 60_000)
    assert_same(out)
    assert True in taken and False in taken
    report = out[True][0]
    assert report["reasons"] == {"not_an_object": 1, "missing_time": 1, "empty_payload": 1}
    assert report["counts"] == {"timely": 36, "late": 24, "invalid": 3}
