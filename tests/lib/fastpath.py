"""The columnar fast path beside the record path: the same split through both, and JSON lines to feed them.

- :data:`SCHEMA`: a record of every kind the fast path decodes (uuid, timestamp, long, int, boolean, enum, string,
  nullable ones); :func:`records` and :func:`lines`: hypothesis strategies of its JSON lines, valid and broken;
- :func:`run_both`, :func:`run_both_files`: one split through ``process_split`` on each path (``fast=False`` and
  ``True``), each into its own sink; :func:`assert_same`: the two wrote the same bytes, counts and keys;
- :func:`count_fast_decodes`: whether each chunk the fast path is given is decoded or refused.
"""

from __future__ import annotations

import json
import os

import numpy as np
from hypothesis import strategies as st

from event_etl.rules.judge import beyond_backfill
from event_etl.sources.splits import Split
from event_etl.storage import open_storage
from event_etl.task.executor import BatchContext, process_split, split_reference

__all__ = ["ARRIVAL", "BAD", "BASE", "HOUR", "SCHEMA", "assert_same", "check_measured_reference",
           "count_fast_decodes", "dump", "executor_key_dtype", "lines", "records", "run_both", "run_both_files",
           "sink_files"]

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
    rec["ts"] = draw(
        st.sampled_from([BASE + 400 * HOUR, -(2**62), 2**62, BASE - 900 * HOUR])
    )  # future, out of range, too late
    return dump(rec)


def sink_files(sink) -> dict[str, bytes]:
    """Every file under ``sink`` (relative path -> bytes): what a run wrote, to compare byte for byte."""
    files = {}
    for root, _, names in os.walk(sink):
        for name in names:
            p = os.path.join(root, name)
            files[os.path.relpath(p, sink)] = open(p, "rb").read()
    return files


def run_both(tmp_path, et, data: bytes, wm_start, drop=None, *, batch_id=3):
    return run_both_files(tmp_path, et, [(data, ARRIVAL)], wm_start, drop, batch_id=batch_id)


def run_both_files(tmp_path, et, pieces: list[tuple[bytes, int]], wm_start, drop=None, *, batch_id=3):
    """One split over files ``(content, arrival)``, through the record path and the fast path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    ranges = []
    for k, (data, arrival) in enumerate(pieces):
        src = tmp_path / f"in-{k:03d}.jsonl"
        src.write_bytes(data)
        os.utime(src, (arrival / 1000, arrival / 1000))
        ranges.append((str(src), 0, len(data), arrival))
    split = Split.of_files(2, ranges)
    out = {}
    for fast in (False, True):
        sink = tmp_path / f"sink-{fast}"
        ctx = BatchContext(et, str(sink), batch_id, wm_start, ARRIVAL + 5, drop=drop or {}, writer="abc123")
        report, keys = process_split(split, ctx, open_storage(str(sink)), fast=fast)
        out[fast] = (report, keys, sink_files(sink))
        if wm_start is None:
            check_measured_reference(report, split, et)
    return out


def check_measured_reference(report, split, et):
    """A first batch's first run reports what the separate reference pass measured, and the earliest of the
    events it counts (valid, not in the future), whichever path decoded them."""
    from event_etl.sources.registry import split_reader
    from event_etl.task.executor import _decoder

    assert report["reference"] == split_reference(split, et, fast=False) == split_reference(split, et, fast=True)
    decoder, earliest = _decoder(et), None
    for payload, arrival, _, _, msg in split_reader(split.kind).payloads(split, et):
        ok, _, t = decoder.decode(payload) if msg is None else decoder.decode_message(payload, msg[1], arrival)
        if ok and t <= arrival + et.max_future_skew and not beyond_backfill(t, arrival, et.max_backfill):
            earliest = t if earliest is None else min(earliest, t)
    assert report["earliest"] == earliest


def assert_same(out):
    (r0, k0, f0), (r1, k1, f1) = out[False], out[True]
    assert r1 == r0
    assert sorted(np.frombuffer(k1, dtype=executor_key_dtype()).tolist()) == \
        sorted(np.frombuffer(k0, dtype=executor_key_dtype()).tolist())
    assert f1.keys() == f0.keys()
    for name in f0:
        assert f1[name] == f0[name], name


def count_fast_decodes(monkeypatch) -> list[bool]:
    """From now on, whether each chunk the fast path's plan is given is decoded (True) or refused (False)."""
    from event_etl.task.fastpath import FastPlan

    taken: list[bool] = []
    real = FastPlan.decode

    def counting(self, data):
        fc = real(self, data)
        taken.append(fc is not None)
        return fc

    monkeypatch.setattr(FastPlan, "decode", counting)
    return taken


def executor_key_dtype():
    from event_etl.task.dedupe import KEY_DTYPE

    return KEY_DTYPE
