"""What one executor task does with one split: read, decode, judge, write.

For every payload of the split: decode and check it (:mod:`event_etl.payload`), judge
its event time against the batch's starting watermark (:func:`event_etl.rules.make_judge`),
and append it to the open Avro file of its (hour, late) group, or to the dead-letter
list.  Records are encoded as they come (one datum at a time, so a record fastavro
cannot encode is rejected alone), so a task holds encoded bytes, not Python objects.
A group's file is closed when it reaches ``max_events_per_file`` records and at the
end of the split, under a deterministic name.  A file that already exists under its
final name is not written again: it is the same file, written by an earlier attempt of
the same batch.

The task returns a small JSON report (counts, files with sizes and sha256, the largest
accepted event time...) that the driver turns into the batch's result, ledger and metrics.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from fastavro import schemaless_writer
from fastavro.write import Writer

from event_etl import faults
from event_etl.avroio import encode_container, sync_marker_for
from event_etl.deadletter import DEADLETTER_SCHEMA
from event_etl.errors import IntegrityError, SourceError
from event_etl.eventtypes import EventType
from event_etl.rules.buckets import MARKER_NAME, data_file_name, deadletter_file_path, hour_dir
from event_etl.rules.judge import Outcome, make_judge
from event_etl.rules.reasons import Reason
from event_etl.sources.splits import Split
from event_etl.storage import Storage, open_storage

__all__ = ["BatchContext", "process_split", "make_task", "REPORT_SCHEMA", "DELAY_BUCKETS_S"]

REPORT_SCHEMA = "report string, keys binary"
DELAY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
_DELAY_BOUNDS_MS = [int(b * 1000) for b in DELAY_BUCKETS_S]
_BLOCK_BYTES = 64 * 1024
DEADLETTER_FILE_KEY = 99_990_000  # "file" of dedupe rows that point into a shard's dead-letter file
_READ_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class BatchContext:
    """What every task of one micro-batch needs to know (shipped to executors with the task)."""

    event_type: EventType
    sink: str
    batch_id: int
    wm_start: int | None
    started_at: int
    drop: dict[str, tuple[int, ...]] = field(default_factory=dict)
    writer: str = ""
    """Records not to write again (file name -> positions): duplicates found by an earlier attempt."""


_DECODERS: dict[tuple[str, str], Any] = {}


def _decoder(et: EventType):
    from event_etl.payload import Decoder

    key = (et.name, repr(sorted(et.settings_summary().items())) + et.fingerprint)
    d = _DECODERS.get(key)
    if d is None:
        d = _DECODERS[key] = Decoder(et)
    return d


def _file_lines(uri: str, start: int, end: int, arrival: int) -> Iterator[tuple[bytes, int, str, int]]:
    """Lines of bytes ``start``..``end`` of a file, read in blocks (the range holds whole lines)."""
    name = os.path.basename(uri) + "@"
    try:
        fh = open(uri, "rb")
    except OSError as err:
        raise SourceError(f"cannot read {uri}: {err}", fix="input files must stay until their batch is committed") from err
    with fh:
        fh.seek(start)
        offset = start
        rest = b""
        remaining = end - start
        while remaining > 0:
            chunk = fh.read(min(_READ_BYTES, remaining))
            if not chunk:
                raise SourceError(
                    f"{uri} is shorter than when it was found ({end - remaining} < {end} bytes)",
                    fix="do not truncate or rewrite input files; write new files instead",
                )
            remaining -= len(chunk)
            data = rest + chunk if rest else chunk
            pos, n = 0, len(data)
            while True:
                j = data.find(b"\n", pos)
                if j < 0:
                    break
                line = data[pos:j]
                if line[-1:] == b"\r":
                    line = line[:-1]
                yield line, arrival, name, offset + pos, None
                pos = j + 1
            offset += pos
            rest = data[pos:] if pos < n else b""
        if rest:
            yield (rest[:-1] if rest[-1:] == b"\r" else rest), arrival, name, offset, None


def iter_payloads(split: Split, et: EventType) -> Iterator[tuple[bytes, int, str, int, Any]]:
    """``(payload, arrival_ms, where, offset, message)`` for every payload of the split.

    ``where + str(offset)`` names its position; ``message`` is ``(message_id, attributes)``
    for Pub/Sub messages, else ``None``.
    """
    if split.kind == "files":
        for uri, start, end, arrival in split.ranges():
            yield from _file_lines(uri, start, end, arrival)
    elif split.kind == "gen":
        from event_etl.generator import Generator, GeneratorParams

        gen = Generator(et, GeneratorParams.from_json(json.loads(split.meta)))
        for g in gen.range(split.start, split.end):
            yield g.payload, g.arrival, "gen:", g.index, None
    elif split.kind == "spool":
        from event_etl.sources.pubsub import read_spool

        for i, m in read_spool(split.uri, split.start, split.end):
            yield m["data"], m["publish_time"], "msg:", m["message_id"], (m["message_id"], m["attributes"])
    else:
        raise SourceError(f"unknown split kind {split.kind!r}")


class _Block:
    """What ``fastavro.write.Writer.write_block`` reads: encoded datums and their count."""

    __slots__ = ("bytes_", "num_records")

    def __init__(self, buf: io.BytesIO, n: int) -> None:
        self.bytes_ = buf
        self.num_records = n


class _OpenFile:
    """One Avro container file being filled with pre-encoded records."""

    def __init__(self, name: str, schema: dict, codec: str) -> None:
        self.name = name
        self.out = io.BytesIO()
        self.writer = Writer(self.out, schema, codec=codec, sync_marker=sync_marker_for(name),
                             compression_level=1 if codec == "deflate" else None)
        self.block = io.BytesIO()
        self.in_block = 0
        self.records = 0

    def flush_block(self) -> None:
        if self.in_block:
            self.writer.write_block(_Block(self.block, self.in_block))
            self.block = io.BytesIO()
            self.in_block = 0

    def close(self) -> bytes:
        self.flush_block()
        self.writer.flush()
        return self.out.getvalue()


class _Group:
    """The files of one (hour, late) group of a split, filled in order.

    ``pos`` counts the records offered to the current file, written or not: a record that
    an earlier attempt found to be a duplicate (``ctx.drop``) is skipped, and files roll
    over at the same positions as in that attempt, so they come out the same.
    """

    def __init__(self, index: int, hour: int, late: bool, ctx: BatchContext, shard: int, schema: dict) -> None:
        self.index, self.hour, self.late, self.ctx, self.shard, self.schema = index, hour, late, ctx, shard, schema
        self.seq = 0
        self.pos = 0
        self.max_t: int | None = None
        self.done: list[tuple[str, bytes, int, int]] = []  # name, bytes, records, file key
        self.current = self._new()

    def _new(self) -> _OpenFile:
        name = data_file_name(self.hour, self.ctx.batch_id, self.shard, self.seq, late=self.late, writer=self.ctx.writer)
        self.skip = frozenset(self.ctx.drop.get(name, ()))
        return _OpenFile(name, self.schema, self.ctx.event_type.codec)

    @property
    def file_key(self) -> int:
        return self.index * 10000 + self.seq

    def add(self, rec: dict, t: int) -> str | int | None:
        """Encode ``rec`` into the current file.

        Returns ``None`` when it was written (its position is then ``self.last``), ``-1``
        when it is a known duplicate that was skipped, or an error message when fastavro
        cannot encode it.
        """
        f = self.current
        pos = self.pos
        if pos in self.skip:
            self._advance()
            return -1
        buf = f.block
        at = buf.tell()
        try:
            schemaless_writer(buf, self.schema, rec)
        except (ValueError, TypeError, AttributeError, OverflowError, KeyError) as err:
            buf.seek(at)
            buf.truncate()
            return f"cannot encode: {err}"[:300]
        self.last = (self.file_key, pos)
        f.in_block += 1
        f.records += 1
        if self.max_t is None or t > self.max_t:
            self.max_t = t
        if buf.tell() >= _BLOCK_BYTES:
            f.flush_block()
        self._advance()
        return None

    def _advance(self) -> None:
        self.pos += 1
        if self.pos >= self.ctx.event_type.max_events_per_file:
            f = self.current
            if f.records:
                self.done.append((f.name, f.close(), f.records, self.file_key))
            self.seq += 1
            self.pos = 0
            self.current = self._new()

    def finish(self) -> list[tuple[str, bytes, int, int]]:
        if self.current.records:
            self.done.append((self.current.name, self.current.close(), self.current.records, self.file_key))
        return self.done


def _first_batch_reference(split: Split, ctx: BatchContext, decode) -> int | None:
    """For a job's first batch: this split's would-be watermark, to measure "too late" against."""
    et = ctx.event_type
    best = None
    for payload, arrival, _, _, msg in iter_payloads(split, et):
        ok, _, t = decode(payload) if msg is None else _decoder(et).decode_message(payload, msg[1], arrival)
        if ok and t <= arrival + et.max_future_skew and (best is None or t > best):
            best = t
    return None if best is None else best - et.out_of_orderness


def process_split(split: Split, ctx: BatchContext, storage: Storage) -> tuple[dict[str, Any], bytes]:
    """Process one split; returns its report (JSON-able) and its dedupe key rows (``KEY_DTYPE`` bytes)."""
    from event_etl.dedupe import KEY_DTYPE, key_hash

    et = ctx.event_type
    decoder = _decoder(et)
    decode, decode_message = decoder.decode, decoder.decode_message
    reference = _first_batch_reference(split, ctx, decode) if ctx.wm_start is None else None
    judge = make_judge(
        ctx.wm_start, allowed_lateness=et.allowed_lateness, max_future_skew=et.max_future_skew,
        too_late_reference=reference,
    )
    dedupe = et.dedupe_window > 0
    id_field = et.id_field if dedupe else None
    shard = split.shard
    keys: list[tuple[int, int, int, int, int]] = []
    groups: dict[tuple[int, bool], _Group] = {}
    rejects: list[tuple[str, str, bytes, str, int, int | None]] = []  # reason, detail, payload, pos, arrival, et
    counts: Counter[str] = Counter()
    delays = [0] * (len(DELAY_BUCKETS_S) + 1)
    delay_sum = 0
    timely_o, late_o = Outcome.TIMELY, Outcome.LATE
    for payload, arrival, where, off, msg in iter_payloads(split, et):
        ok, rec, t = decode(payload) if msg is None else decode_message(payload, msg[1], arrival)
        if not ok:
            rejects.append((rec.value, t, payload, where + str(off), arrival, None))
            continue
        outcome, hour = judge(t, arrival)
        if outcome is timely_o or outcome is late_o:
            late = outcome is late_o
            g = groups.get((hour, late))
            if g is None:
                g = groups[(hour, late)] = _Group(len(groups), hour, late, ctx, shard, decoder.schema)
            problem = g.add(rec, t)
            if problem is not None:
                if problem == -1:
                    counts["duplicate"] += 1
                else:
                    rejects.append((Reason.SCHEMA_MISMATCH.value, problem, payload, where + str(off), arrival, t))
                continue
            if dedupe:
                fk, pos = g.last
                if id_field is not None:
                    v = rec.get(id_field)
                    if v is not None:
                        keys.append((key_hash("i", v), t, shard, fk, pos))
                if msg is not None:  # remembered by publish time too: a redelivered late event is old in event time
                    keys.append((key_hash("m", f"{msg[0]}@{arrival}"), max(t, arrival), shard, fk, pos))
            d = arrival - t
            delays[bisect_left(_DELAY_BOUNDS_MS, d)] += 1
            if d > 0:  # early events (within max_future_skew) count in the lowest bucket and add nothing
                delay_sum += d
        else:
            reason = Reason.FUTURE if outcome is Outcome.FUTURE else Reason.TOO_LATE
            rejects.append((reason.value, _reject_detail(reason, t, arrival, ctx, et), payload, where + str(off), arrival, t))
        counts[outcome.value] += 1
    files: list[dict[str, Any]] = []
    max_t = min_hour = None
    for (hour, late), g in sorted(groups.items()):
        written = g.finish()
        if g.max_t is not None:
            max_t = g.max_t if max_t is None else max(max_t, g.max_t)
            # every hour that receives a file counts, the open hour of late records too: markers
            # start at the earliest hour that received data
            min_hour = hour if min_hour is None else min(min_hour, hour)
        rel_dir = hour_dir(et.name, hour)
        for name, data, n, fk in written:
            files.append({
                "hour": hour, "name": name, "records": n, "bytes": len(data), "file_key": fk,
                "sha256": hashlib.sha256(data).hexdigest(), "late": late,
                "written": _store_once(storage, f"{rel_dir}/{name}", data, hour),
            })
    dl_rel = deadletter_file_path(et.name, ctx.started_at, ctx.batch_id, shard, writer=ctx.writer)
    dl_skip = frozenset(ctx.drop.get(os.path.basename(dl_rel), ()))
    if dl_skip:  # redelivered messages an earlier attempt found in the dead-letter area already
        counts["duplicate"] += len(dl_skip)
    if dedupe:
        for i, r in enumerate(rejects):
            if r[3].startswith("msg:") and i not in dl_skip:
                keys.append((key_hash("m", f"{r[3][4:]}@{r[4]}"), max(r[4], r[5] or r[4]), shard, DEADLETTER_FILE_KEY, i))
    rejects = [r for i, r in enumerate(rejects) if i not in dl_skip]
    dl = _write_deadletters(rejects, dl_rel, ctx, storage)
    reasons = Counter(r[0] for r in rejects)
    counts["invalid"] = sum(n for r, n in reasons.items() if r not in (Reason.FUTURE.value, Reason.TOO_LATE.value))
    report = {
        "shard": shard,
        "counts": {k: v for k, v in counts.items() if v},
        "reasons": dict(reasons),
        "files": files,
        "deadletter": dl,
        "max_event_time": max_t,
        "min_hour": min_hour,
        "delay_buckets": delays,
        "delay_sum_ms": delay_sum,
    }
    return report, np.array(keys, dtype=KEY_DTYPE).tobytes()


def _reject_detail(reason: Reason, t: int, arrival: int, ctx: BatchContext, et: EventType) -> str:
    from event_etl.timeutil import format_duration, iso

    if reason is Reason.FUTURE:
        return (f"event time {iso(t)} is {format_duration(t - arrival)} after its arrival "
                f"(max_future_skew {format_duration(et.max_future_skew)})")
    wm = ctx.wm_start
    return (f"event time {iso(t)}; watermark {iso(wm) if wm is not None else 'not set'} "
            f"(allowed_lateness {format_duration(et.allowed_lateness)})")


def _store_once(storage: Storage, rel: str, data: bytes, hour: int | None) -> bool:
    """Write ``rel`` unless an earlier attempt of the same batch already did.  True if written now."""
    folder, name = rel.rsplit("/", 1)
    if storage.exists(rel):
        size = storage.list_files(folder).get(name)
        if size == len(data):
            return False
        if hour is not None and storage.exists(f"{folder}/{MARKER_NAME}"):
            raise IntegrityError(
                f"{storage.display(rel)} exists with {size} bytes, but a replay of its batch made {len(data)}, "
                "and its hour is already marked complete",
                fix="the input of a finished batch changed; restore it, or move this hour aside and re-run",
            )
    elif hour is not None and storage.exists(f"{folder}/{MARKER_NAME}"):
        # This job judged the hour open, yet it is marked: another writer marked it.
        raise IntegrityError(
            f"{storage.display(folder)} is already complete, but this job was about to add {name} to it",
            fix="two jobs write this event type to this sink; stop one (each job holds a lease, see the README)",
        )
    faults.point("write_file", rel)
    storage.write_atomic(rel, data)
    return True


def _write_deadletters(rejects, rel, ctx, storage) -> dict[str, Any] | None:
    if not rejects:
        return None
    et = ctx.event_type
    recs = [
        {"event_type": et.name, "reason": reason, "detail": detail, "arrived_at": arrival, "event_time": t,
         "source": pos, "batch_id": ctx.batch_id, "payload": payload}
        for reason, detail, payload, pos, arrival, t in rejects
    ]
    data = encode_container(DEADLETTER_SCHEMA, recs, name=rel, codec="deflate")
    written = _store_once(storage, rel, data, None)
    return {"path": rel, "records": len(recs), "bytes": len(data), "written": written,
            "file_key": DEADLETTER_FILE_KEY}


def make_task(ctx: BatchContext):
    """The ``mapInArrow`` function of a batch: one report row per split row."""

    def task(batches):
        import pyarrow as pa

        storage = open_storage(ctx.sink)
        for rb in batches:
            for row in rb.to_pylist():
                report, keys = process_split(Split(**row), ctx, storage)
                yield pa.RecordBatch.from_pylist([{"report": json.dumps(report), "keys": keys}])

    return task
