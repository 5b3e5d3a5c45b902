"""What one executor task does with one split: read, decode, judge, write.

For every payload of the split: decode and check it (:mod:`event_etl.payload`), judge
its event time against the batch's starting watermark (:func:`event_etl.rules.make_judge`),
and put it in a group per (hour, late) or in the dead-letter list.  Then each group is
written as Avro container files (at most ``max_events_per_file`` records each) under
deterministic names, and the rejects as one dead-letter file.  A file that already
exists under its final name is not written again: it is the same file, written by an
earlier attempt of the same batch.

The task returns a small JSON report (counts, files with sizes and sha256, the largest
accepted event time...) that the driver turns into the batch's result, ledger and metrics.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from event_etl.avroio import encode_container
from event_etl.deadletter import DEADLETTER_SCHEMA
from event_etl.errors import IntegrityError, SourceError
from event_etl.eventtypes import EventType
from event_etl.rules.buckets import MARKER_NAME, data_file_name, deadletter_file_path, hour_dir
from event_etl.rules.judge import Outcome, make_judge
from event_etl.rules.reasons import Reason
from event_etl.sources.splits import Split
from event_etl.storage import Storage, open_storage

__all__ = ["BatchContext", "process_split", "make_task", "REPORT_SCHEMA", "DELAY_BUCKETS_S"]

REPORT_SCHEMA = "report string"
DELAY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


@dataclass(frozen=True)
class BatchContext:
    """What every task of one micro-batch needs to know (shipped to executors with the task)."""

    event_type: EventType
    sink: str
    batch_id: int
    wm_start: int | None
    started_at: int


_DECODERS: dict[tuple[str, str], Any] = {}


def _decoder(et: EventType):
    from event_etl.payload import Decoder

    key = (et.name, repr(sorted(et.settings_summary().items())) + et.fingerprint)
    d = _DECODERS.get(key)
    if d is None:
        d = _DECODERS[key] = Decoder(et)
    return d


def iter_payloads(split: Split, et: EventType) -> Iterator[tuple[bytes, int, str]]:
    """``(payload, arrival_ms, position)`` for every payload of the split."""
    if split.kind == "file":
        try:
            with open(split.uri, "rb") as fh:
                fh.seek(split.start)
                data = fh.read(split.end - split.start)
        except OSError as err:
            raise SourceError(f"cannot read {split.uri}: {err}", fix="input files must stay until their batch is committed") from err
        if len(data) != split.end - split.start:
            raise SourceError(
                f"{split.uri} is shorter than when it was found ({split.start + len(data)} < {split.end} bytes)",
                fix="do not truncate or rewrite input files; write new files instead",
            )
        name = os.path.basename(split.uri)
        arrival = split.arrival
        pos, n = 0, len(data)
        while pos < n:
            j = data.find(b"\n", pos)
            if j < 0:
                j = n
            line = data[pos:j]
            if line.endswith(b"\r"):
                line = line[:-1]
            yield line, arrival, f"{name}@{split.start + pos}"
            pos = j + 1
    elif split.kind == "gen":
        from event_etl.generator import Generator, GeneratorParams

        gen = Generator(et, GeneratorParams.from_json(json.loads(split.meta)))
        for g in gen.range(split.start, split.end):
            yield g.payload, g.arrival, f"gen:{g.index}"
    else:
        raise SourceError(f"unknown split kind {split.kind!r}")


def _delay_bucket(delay_ms: int) -> int:
    s = delay_ms / 1000.0
    for i, b in enumerate(DELAY_BUCKETS_S):
        if s <= b:
            return i
    return len(DELAY_BUCKETS_S)


def process_split(split: Split, ctx: BatchContext, storage: Storage) -> dict[str, Any]:
    """Process one split; returns its report (JSON-able)."""
    et = ctx.event_type
    decoder = _decoder(et)
    decode = decoder.decode
    accepted: list[tuple[dict, int, int, bytes, str]] = []  # record, event time, arrival, payload, position
    rejects: list[tuple[str, str, bytes, str, int, int | None]] = []  # reason, detail, payload, pos, arrival, et
    for payload, arrival, pos in iter_payloads(split, et):
        ok, a, b = decode(payload)
        if ok:
            accepted.append((a, b, arrival, payload, pos))
        else:
            rejects.append((a.value, b, payload, pos, arrival, None))
    reference = None
    if ctx.wm_start is None and accepted:
        # First batch of a job: measure "too late" against this split's own would-be watermark.
        limit = max(item[2] for item in accepted) + et.max_future_skew
        times = [item[1] for item in accepted if item[1] <= limit]
        reference = (max(times) - et.out_of_orderness) if times else None
    judge = make_judge(
        ctx.wm_start,
        allowed_lateness=et.allowed_lateness,
        max_future_skew=et.max_future_skew,
        too_late_reference=reference,
    )
    groups: dict[tuple[int, bool], list[tuple]] = {}
    counts: Counter[str] = Counter()
    delays = [0] * (len(DELAY_BUCKETS_S) + 1)
    delay_sum = 0
    late_o, timely_o = Outcome.LATE, Outcome.TIMELY
    for item in accepted:
        t, arrival = item[1], item[2]
        outcome, hour = judge(t, arrival)
        if outcome is timely_o or outcome is late_o:
            groups.setdefault((hour, outcome is late_o), []).append(item)
            d = arrival - t
            delays[_delay_bucket(d)] += 1
            delay_sum += d
        else:
            reason = Reason.FUTURE if outcome is Outcome.FUTURE else Reason.TOO_LATE
            rejects.append((reason.value, _reject_detail(reason, t, arrival, ctx, et), item[3], item[4], arrival, t))
        counts[outcome.value] += 1
    files, max_t, min_hour = _write_groups(groups, split, ctx, storage, rejects, counts)
    dl = _write_deadletters(rejects, split, ctx, storage)
    reasons = Counter(r[0] for r in rejects)
    counts["invalid"] = sum(n for r, n in reasons.items() if r not in (Reason.FUTURE.value, Reason.TOO_LATE.value))
    return {
        "shard": split.shard,
        "counts": dict(counts),
        "reasons": dict(reasons),
        "files": files,
        "deadletter": dl,
        "max_event_time": max_t,
        "min_timely_hour": min_hour,
        "delay_buckets": delays,
        "delay_sum_ms": delay_sum,
    }


def _reject_detail(reason: Reason, t: int, arrival: int, ctx: BatchContext, et: EventType) -> str:
    from event_etl.timeutil import format_duration, iso

    if reason is Reason.FUTURE:
        return f"event time {iso(t)} is {format_duration(t - arrival)} after its arrival (max_future_skew {format_duration(et.max_future_skew)})"
    wm = ctx.wm_start
    return f"event time {iso(t)}; watermark {iso(wm) if wm is not None else 'not set'} (allowed_lateness {format_duration(et.allowed_lateness)})"


def _write_groups(groups, split, ctx, storage, rejects, counts):
    et = ctx.event_type
    schema = _decoder(et).schema
    files = []
    max_t = None
    min_hour = None
    for (hour, late), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        records = [item[0] for item in items]
        try:
            chunks = _encode_chunks(records, hour, late, split, ctx, schema)
        except (ValueError, TypeError, AttributeError, OverflowError):
            items = _drop_unencodable(items, schema, rejects, counts, late)
            if not items:
                continue
            chunks = _encode_chunks([item[0] for item in items], hour, late, split, ctx, schema)
        for name, data, n in chunks:
            rel = f"{hour_dir(et.name, hour)}/{name}"
            written = _store_once(storage, rel, data, hour)
            files.append(
                {
                    "hour": hour,
                    "name": name,
                    "records": n,
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "late": late,
                    "written": written,
                }
            )
        tmax = max(item[1] for item in items)
        max_t = tmax if max_t is None else max(max_t, tmax)
        if not late:
            min_hour = hour if min_hour is None else min(min_hour, hour)
    return files, max_t, min_hour


def _encode_chunks(records, hour, late, split, ctx, schema):
    et = ctx.event_type
    step = et.max_events_per_file
    out = []
    for seq, i in enumerate(range(0, len(records), step)):
        name = data_file_name(hour, ctx.batch_id, split.shard, seq, late=late)
        part = records[i : i + step]
        out.append((name, encode_container(schema, part, name=name, codec=et.codec), len(part)))
    return out


def _drop_unencodable(items, schema, rejects, counts, late):
    """Find the records fastavro cannot write (e.g. a malformed UUID) and dead-letter them."""
    import io

    from fastavro import schemaless_writer

    keep = []
    for item in items:
        try:
            schemaless_writer(io.BytesIO(), schema, item[0])
            keep.append(item)
        except (ValueError, TypeError, AttributeError, OverflowError) as err:
            rejects.append((Reason.SCHEMA_MISMATCH.value, f"cannot encode: {err}"[:300], item[3], item[4], item[2], item[1]))
            counts[Outcome.LATE.value if late else Outcome.TIMELY.value] -= 1
    return keep


def _store_once(storage: Storage, rel: str, data: bytes, hour: int | None) -> bool:
    """Write ``rel`` unless an earlier attempt of the same batch already did.  True if written now."""
    if storage.exists(rel):
        size = storage.list_files(rel.rsplit("/", 1)[0]).get(rel.rsplit("/", 1)[1])
        if size == len(data):
            return False
        if hour is not None and storage.exists(f"{rel.rsplit('/', 1)[0]}/{MARKER_NAME}"):
            raise IntegrityError(
                f"{storage.display(rel)} exists with {size} bytes, but a replay of its batch made {len(data)}, "
                "and its hour is already marked complete",
                fix="the input of a finished batch changed; restore it, or move this hour aside and re-run",
            )
    storage.write_atomic(rel, data)
    return True


def _write_deadletters(rejects, split, ctx, storage) -> dict[str, Any] | None:
    if not rejects:
        return None
    et = ctx.event_type
    rel = deadletter_file_path(et.name, ctx.started_at, ctx.batch_id, split.shard)
    recs = [
        {
            "event_type": et.name,
            "reason": reason,
            "detail": detail,
            "arrived_at": arrival,
            "event_time": t,
            "source": pos,
            "batch_id": ctx.batch_id,
            "payload": payload,
        }
        for reason, detail, payload, pos, arrival, t in rejects
    ]
    data = encode_container(DEADLETTER_SCHEMA, recs, name=rel, codec="deflate")
    written = _store_once(storage, rel, data, None)
    return {"path": rel, "records": len(recs), "bytes": len(data), "written": written}


def make_task(ctx: BatchContext):
    """The ``mapInArrow`` function of a batch: one report row per split row."""

    def task(batches):
        import pyarrow as pa

        storage = open_storage(ctx.sink)
        for rb in batches:
            for row in rb.to_pylist():
                report = process_split(Split(**row), ctx, storage)
                yield pa.RecordBatch.from_pylist([{"report": json.dumps(report)}])

    return task
