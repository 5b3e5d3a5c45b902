"""The columnar fast path gives exactly what the record path gives:
same files (byte for byte), counts, dead-letter, keys."""

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

from event_etl.rules.judge import OUTCOME_CODES, judge_array, make_judge
from event_etl.sources import read
from event_etl.sources.splits import Split
from event_etl.storage import open_storage
from event_etl.task.executor import BatchContext, process_split, split_reference
from event_etl.task.fastpath import _varints, _zigzag, plan_for
from tests.lib.fastpath import (
    ARRIVAL,
    BASE,
    HOUR,
    SCHEMA,
    assert_same,
    check_measured_reference,
    count_fast_decodes,
    dump,
    executor_key_dtype,
    lines,
    records,
    run_both,
    run_both_files,
    sink_files,
)
from tests.lib.harness import make_event_type, read_deadletter


@pytest.fixture(scope="module")
def event_type(tmp_path_factory):
    return make_event_type(tmp_path_factory.mktemp("types"), "mixed", SCHEMA, time_field="ts", id_field="id",
                           dedupe_window="10m", max_events_per_file=7, allowed_lateness="1d")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(lines(), min_size=1, max_size=60), wm=st.sampled_from([None, BASE + 2 * HOUR + 60_000]),
       chunk=st.sampled_from([256, 1 << 20]), last_newline=st.booleans())
def test_fast_and_record_paths_write_the_same_bytes(
    tmp_path_factory, event_type, monkeypatch, body, wm, chunk, last_newline
):
    monkeypatch.setattr(read, "READ_BYTES", chunk)  # small chunks: some fast, some not, in one split
    data = b"\n".join(body) + (b"\n" if last_newline else b"")
    assert_same(run_both(tmp_path_factory.mktemp("run"), event_type, data, wm))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), clean=st.booleans(), wm=st.sampled_from([None, BASE + 2 * HOUR + 60_000]),
       chunk=st.sampled_from([300, 1 << 20]))
def test_a_split_of_many_small_files_decoded_together_writes_the_record_paths_bytes(
    tmp_path_factory, event_type, monkeypatch, data, clean, wm, chunk
):
    # each file with its own arrival (an event timely in one is late, too late or from the future in another), with
    # or without its last newline; all of them valid lines (decoded together), or some not (decoded file by file)
    body = st.lists(records().map(dump) if clean else lines(), min_size=1, max_size=8)
    files = data.draw(st.lists(st.tuples(body, st.integers(-HOUR, HOUR), st.booleans()), min_size=2, max_size=8))
    monkeypatch.setattr(read, "READ_BYTES", chunk)
    pieces = [(b"\n".join(body) + (b"\n" if nl else b""), ARRIVAL + shift) for body, shift, nl in files]
    assert_same(run_both_files(tmp_path_factory.mktemp("run"), event_type, pieces, wm))


def test_small_files_of_a_split_are_decoded_in_one_go_and_keep_their_own_arrivals(tmp_path, event_type, monkeypatch):
    from event_etl.task.fastpath import FastPlan

    decoded = []
    real = FastPlan.decode
    monkeypatch.setattr(FastPlan, "decode", lambda self, data: decoded.append(data) or real(self, data))
    rec = {"id": "", "ts": 0, "n": 1, "small": 1, "flag": True, "kind": "B", "text": "x", "opt_l": None,
           "opt_i": None, "opt_b": True}
    # an event of 12:00 is timely in the file that arrived at 12:30, from the future in the one that arrived at 10:00
    at = [BASE + 12 * HOUR + 30 * 60_000, BASE + 10 * HOUR, BASE + 13 * HOUR + 30 * 60_000]
    pieces = [(dump({**rec, "id": "f0", "ts": BASE + 12 * HOUR}) + b"\n", at[0]),
              (dump({**rec, "id": "f1", "ts": BASE + 12 * HOUR}) + b"\n", at[1]),
              (dump({**rec, "id": "last", "ts": BASE + 13 * HOUR}), at[2])]  # no newline at its end
    out = run_both_files(tmp_path, event_type, pieces, BASE + 12 * HOUR + 60_000)
    assert_same(out)
    assert len(decoded) == 1, "three files, one decode"
    report = out[True][0]
    assert report["counts"] == {"timely": 2, "future": 1}, report["counts"]
    dl = read_deadletter(tmp_path / "sink-True", "mixed")
    assert [(r["source"], round(r["arrived_at"].timestamp() * 1000)) for r in dl] == [("in-001.jsonl@0", at[1])], \
        "a dead letter names its own file, line and arrival"


def test_valid_lines_take_the_fast_path_and_match_fastavro(event_type):
    """The fast path is really taken for clean input, and each row is fastavro's encoding of the record."""
    from event_etl.task.executor import _decoder

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
    from event_etl.task.executor import _decoder

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
    taken = count_fast_decodes(monkeypatch)
    monkeypatch.setattr(read, "READ_BYTES", 400)
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


# -- Pub/Sub segments: the messages' payloads take the fast path as lines, each with its own arrival -------------
def write_segments(folder, messages, per_response: int, per_segment: int):
    """``messages`` = ``[(data, publish_time, attributes)]`` into segments of whole ``PullResponse``s; their names."""
    from google.protobuf import timestamp_pb2
    from google.pubsub_v1.types import PubsubMessage, PullResponse, ReceivedMessage

    from event_etl.sources.spool import SegmentName, write_segment

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for seq, s0 in enumerate(range(0, len(messages), per_segment)):
        responses = []
        seg = messages[s0:s0 + per_segment]
        for r0 in range(0, len(seg), per_response):
            out = []
            for k, (data, published, attrs) in enumerate(seg[r0:r0 + per_response]):
                ts = timestamp_pb2.Timestamp(seconds=published // 1000, nanos=(published % 1000) * 1_000_000)
                mid = str(1_000_000 + s0 + r0 + k)
                out.append(ReceivedMessage(ack_id=f"ack-{mid}", message=PubsubMessage(
                    data=data, message_id=mid, publish_time=ts, attributes=attrs)))
            responses.append(PullResponse.serialize(PullResponse(received_messages=out)))
        name = SegmentName("0badcafe", 1, seq, len(seg))
        write_segment(folder, name, responses)
        names.append(str(folder / name.name))
    return names


def run_both_seg(tmp_path, et, messages, wm_start, drop=None, *, batch_id=3, per_response=7, per_segment=23,
                 skip=0, reference=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = write_segments(tmp_path / "segments", messages, per_response, per_segment)
    ranges, left, total = [], skip, 0
    for p in paths:  # the split starts ``skip`` messages into the first segment(s), as a cut batch does
        n = int(p.rsplit("-n", 1)[1][:-4])
        if left >= n:
            left -= n
            continue
        ranges.append([p, left, n, 0])
        total += n - left
        left = 0
    split = Split(4, "seg", "", 0, total, 0, json.dumps(ranges))
    out = {}
    for fast in (False, True):
        sink = tmp_path / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), batch_id, wm_start, ARRIVAL + 5, drop=drop or {}, writer="abc123",
                           reference=reference)
        report, keys = process_split(split, ctx, open_storage(str(sink)), fast=fast)
        out[fast] = (report, keys, sink_files(sink))
        if wm_start is None and reference is None:
            check_measured_reference(report, split, et)
    refs = [split_reference(split, et, fast=fast) for fast in (False, True)]
    assert refs[0] == refs[1], "the first batch's reference is the same on both paths"
    return out


@st.composite
def payloads(draw):
    """A message's payload: mostly a valid record, sometimes a bad one, or one holding a newline."""
    if draw(st.integers(0, 9)) == 0:
        rec = draw(records())
        return draw(st.sampled_from([
            json.dumps(rec, indent=1).encode(),  # newlines inside: the chunk cannot be cut into lines
            dump(rec) + b"\n",
            dump(rec) + b"\n" + dump(rec),
        ]))
    return draw(lines())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(st.tuples(payloads(), st.integers(-3 * HOUR, HOUR), st.booleans()), min_size=1, max_size=60),
       wm=st.sampled_from([None, BASE + 2 * HOUR + 60_000]), chunk=st.sampled_from([256, 1 << 20]),
       skip=st.integers(0, 30), first=st.booleans())
def test_segments_fast_and_record_paths_write_the_same_bytes(tmp_path_factory, event_type, monkeypatch, body, wm,
                                                             chunk, skip, first):
    """Pub/Sub messages: each with its own publish time (its arrival), id (positions, message dedupe keys) and
    attributes; split into responses and segments, the split starting inside them."""
    monkeypatch.setattr(read, "READ_BYTES", chunk)
    messages = [(data, ARRIVAL + delta, {"a": "1"} if attr else {}) for data, delta, attr in body]
    skip = min(skip, len(messages) - 1)
    reference = BASE + 5 * HOUR if wm is None and first else None
    assert_same(run_both_seg(tmp_path_factory.mktemp("seg"), event_type, messages, wm, skip=skip,
                             reference=reference))


def test_segments_of_valid_messages_take_the_fast_path(tmp_path, event_type, monkeypatch):
    """Clean JSON messages go through the columnar path (counted), and still write what the record path writes,
    message dedupe keys and dead letters of future events (by their own publish time) included."""
    taken = count_fast_decodes(monkeypatch)
    messages = []
    for i in range(200):
        rec = {"id": f"i{i}", "ts": BASE + (i % 6) * HOUR + i, "n": i, "small": -i, "flag": i % 2 == 0,
               "kind": "C", "text": "y" * (i % 7), "opt_i": None, "opt_b": True}
        published = BASE if i % 50 == 0 else ARRIVAL + i  # a few arrive hours before their event time
        messages.append((dump(rec), published, {}))
    future = sum(1 for i in range(0, 200, 50) if (i % 6) * HOUR + i > 10 * 60_000)
    out = run_both_seg(tmp_path, event_type, messages, BASE + 2 * HOUR + 60_000, per_response=30, per_segment=70)
    assert_same(out)
    assert taken and all(taken)
    report, keys, _ = out[True]
    assert future == 2 and report["reasons"] == {"future": future}  # more than max_future_skew ahead of their arrival
    from event_etl.task.dedupe import KEY_DTYPE, MESSAGE_KEY, key_hash

    rows = np.frombuffer(keys, dtype=KEY_DTYPE)
    msg_rows = rows[rows["kind"] == MESSAGE_KEY]
    assert len(msg_rows) == 200, "every message has its key, a dead-lettered one too"
    assert key_hash("m", f"1000001@{ARRIVAL + 1}") in set(msg_rows["key"].tolist())


def test_a_type_reading_time_from_an_attribute_takes_the_record_path(tmp_path):
    from event_etl.sources.registry import split_reader
    from event_etl.task.executor import _decoder

    et = make_event_type(tmp_path, "attr", SCHEMA, time_field="ts", id_field="id", time_attribute="event_time")
    seg = Split(0, "seg", "", 0, 1, 0, "[]")
    files = Split.of_files(0, [("x", 0, 1, ARRIVAL)])
    assert not split_reader(seg.kind).fast_path(et)
    assert split_reader(files.kind).fast_path(et) and plan_for(_decoder(et)) is not None


def test_message_keys_are_the_dedupe_keys():
    from event_etl.task.dedupe import key_hash
    from event_etl.task.executor import _message_keys

    mids, arrivals = ["1", "17265478", "x-é"], [0, ARRIVAL, -5]
    assert _message_keys(mids, arrivals).tolist() == [key_hash("m", f"{m}@{a}") for m, a in zip(mids, arrivals)]


def test_the_array_judge_takes_one_arrival_per_event():
    times = np.array([BASE + k * 600_000 for k in range(-60, 20)], dtype=np.int64)
    arrivals = BASE + np.arange(len(times), dtype=np.int64) * 300_000 - 3 * HOUR
    for wm in (None, BASE, BASE + HOUR + 1):
        kw = dict(allowed_lateness=3 * HOUR, max_future_skew=HOUR, too_late_reference=BASE + 5 * HOUR)
        codes, hours = judge_array(times, arrivals, wm, **kw)
        one = make_judge(wm, **kw)
        for t, a, c, h in zip(times.tolist(), arrivals.tolist(), codes.tolist(), hours.tolist()):
            outcome, hour = one(t, a)
            assert OUTCOME_CODES[c] is outcome
            if hour is not None:
                assert h == hour
    with pytest.raises(ValueError):
        judge_array(times, arrivals[:3], None, **kw)


def test_a_fresh_worker_runs_the_fast_path_without_importing_pandas(tmp_path, event_type):
    """pyarrow imports pandas at the first ``pa.array``, ``pa.scalar`` or ``to_numpy`` call (~0.25 s in each
    fresh Python worker, inside the batch); the fast path builds its arrays from buffers instead."""
    import subprocess
    import sys

    lines = [{"id": f"{k:032x}", "ts": BASE + k, "n": k, "small": -k, "flag": k % 2 == 0, "kind": "ABC"[k % 3],
              "text": f"t{k}", "opt_s": None if k % 2 else "s", "opt_l": None if k % 3 else k,
              "opt_b": None if k % 4 else True, "opt_e": None if k % 5 else "B", "opt_i": None if k % 6 else 7}
             for k in range(200)]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(orjson.dumps(rec) + b"\n" for rec in lines))
    script = f"""
import sys
from event_etl.eventtypes import load_event_type
from event_etl.sources.splits import Split
from event_etl.storage import open_storage
from event_etl.task import fastpath
from event_etl.task.executor import BatchContext, process_split
decoded = []
decode = fastpath.FastPlan.decode
fastpath.FastPlan.decode = lambda plan, data: decoded.append(decode(plan, data)) or decoded[-1]
et = load_event_type({event_type.directory!r})
split = Split.of_files(0, [({str(src)!r}, 0, {src.stat().st_size}, {ARRIVAL})])
ctx = BatchContext(et, {str(tmp_path / 'sink')!r}, 1, None, {ARRIVAL + 5})
report, keys = process_split(split, ctx, open_storage({str(tmp_path / 'sink')!r}), fast=True)
assert report["counts"].get("timely") == 200, report
assert decoded and all(fc is not None for fc in decoded), "the fast path was not taken"
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split()[0] == "False", out.stdout + out.stderr


@pytest.mark.parametrize("id_type", ["long", "int"])
def test_an_integer_id_gives_the_record_paths_keys(tmp_path, id_type):
    """id_field may be an integer: its key is the hash of its decimal text, on both paths (and the fast
    path takes such chunks too)."""
    schema = {"type": "record", "name": "WithIntId", "namespace": "t",
              "fields": [{"name": "id", "type": ["null", id_type]},
                         {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    et = make_event_type(tmp_path / "types", "int_id", schema, time_field="ts", id_field="id",
                         dedupe_window="10m", allowed_lateness="1d")
    recs = [{"id": None if i % 5 == 0 else i * 7 - 20, "ts": BASE + 3 * HOUR + i} for i in range(30)]
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    from event_etl.task.payload import Decoder

    plan = plan_for(Decoder(et))
    assert plan is not None and plan.decode(data) is not None, "such chunks take the fast path"
    out = run_both(tmp_path / "run", et, data, BASE)
    assert_same(out)
    keys = np.frombuffer(out[True][1], dtype=executor_key_dtype())
    assert len(keys) == 24  # one key per event with an id
