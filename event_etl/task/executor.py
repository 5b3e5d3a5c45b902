"""What one executor task does with one split: read, decode, judge, write.

For every payload of the split: decode and check it (:mod:`event_etl.task.payload`), judge its
event time against the batch's starting watermark (:func:`event_etl.rules.make_judge`), and append it to the open Avro
file of its (hour, late) group (:class:`event_etl.storage.rolling.RollingFiles`), or to the
dead-letter list (:class:`event_etl.storage.deadletter.Rejected`).  Records are encoded as they
come (one datum at a time, so a record fastavro cannot encode is rejected alone), so a task holds
encoded bytes, not Python objects.  A group's file is closed when it reaches
``max_events_per_file`` records and at the end of the split, under a deterministic name.  A file
that already exists under its final name is not written again: it is the same file, written by an
earlier attempt of the same batch.

The task returns a small JSON report (counts, files with sizes and sha256, the largest
accepted event time...) that the driver turns into the batch's result, ledger and metrics.
"""

from __future__ import annotations

import hashlib
import json
import os
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from event_etl import faults
from event_etl.errors import EventEtlError, IntegrityError
from event_etl.eventtypes import EventType
from event_etl.rules.buckets import MARKER_NAME, deadletter_file_path, hour_dir
from event_etl.rules.judge import OUTCOME_CODES, Outcome, beyond_backfill, judge_array, make_judge
from event_etl.rules.reasons import Reason
from event_etl.settings import settings_in_force
from event_etl.sources.read import OffsetIds, SplitReader
from event_etl.sources.registry import split_reader
from event_etl.sources.splits import Split
from event_etl.storage import Storage, open_storage
from event_etl.storage.avroio import encode_container
from event_etl.storage.deadletter import DEADLETTER_SCHEMA, Rejected
from event_etl.storage.lease import Fence
from event_etl.storage.rolling import ParquetOutput, RollingFiles, SplitFiles
from event_etl.task.fastpath import FastChunk, int64_array, offset_message_keys, plan_for, rows_buffer
from event_etl.task.report import DELAY_BUCKETS_S, SplitReport

if TYPE_CHECKING:
    from event_etl.task.payload import Decoder

__all__ = ["BatchContext", "process_split", "make_shared_task", "DELAY_BUCKETS_S"]

_DELAY_BOUNDS_MS = [int(b * 1000) for b in DELAY_BUCKETS_S]
_NO_ROWS = np.zeros(1, dtype=np.int64)  # the offsets of no encoded rows (a Parquet type's chunk is columns only)
DEADLETTER_FILE_KEY = 99_990_000  # "file" of dedupe rows that point into a shard's dead-letter file


@dataclass(frozen=True)
class BatchContext:
    """What every task of one micro-batch needs to know (shipped to executors with the task).

    - ``drop``: records not to write again (file name -> positions): duplicates found by an
      earlier attempt;
    - ``reference``: for a job's first batch, the watermark the whole batch's events give, to
      measure "too late" against (fixed in the batch's intent).  A first batch is first run
      without it: each split then reports its own largest counted time and earliest event time
      (``reference`` and ``earliest``), from which the driver learns the batch's reference and
      which splits, if any, hold events too late against it (see
      :meth:`event_etl.job.controller.Controller.run_batch`);
    - ``fence``: the lease the job must still hold when a task writes (see :mod:`event_etl.storage.lease`);
    - ``sealed_through``, ``merged_away`` (a replay only): hours marked complete since the first
      attempt, and names of files merged into larger ones since (see
      :mod:`event_etl.rules.compaction`): a replay does not write those again (their records are
      there already).
    """

    event_type: EventType
    sink: str
    batch_id: int
    wm_start: int | None
    started_at: int
    drop: dict[str, tuple[int, ...]] = field(default_factory=dict)
    writer: str = ""
    reference: int | None = None
    fence: dict[str, Any] | None = None
    sealed_through: int | None = None
    merged_away: frozenset[str] = frozenset()
    registry: dict[str, Any] = field(default_factory=dict)
    """The schema registry's schemas the job keeps in its checkpoint (id -> schema, :mod:`event_etl.task.writers`):
    a replay reads its payloads with them, without asking the registry."""

    def written_since(self, hour: int, name: str) -> bool:
        """Whether a replay finds the file ``name`` of ``hour`` taken further already (marked or merged)."""
        return (self.sealed_through is not None and hour <= self.sealed_through) or name in self.merged_away


_DECODERS: dict[tuple[str, str], Decoder] = {}


def _decoder(et: EventType) -> Decoder:
    from event_etl.task.payload import Decoder

    key = (et.name, et.decoder_key)  # everything the decoder is built from (frozen settings, schema versions)
    d = _DECODERS.get(key)
    if d is None:
        d = _DECODERS[key] = Decoder(et)
    return d


_PARQUET: dict[tuple[str, str, str], ParquetOutput] = {}


def _parquet_output(et: EventType) -> ParquetOutput | None:
    """How the type writes Parquet files (None: it writes Avro), one per schema and codec in an executor."""
    if et.format != "parquet":
        return None
    key = (et.name, et.decoder_key, et.codec)
    out = _PARQUET.get(key)
    if out is None:
        out = _PARQUET[key] = ParquetOutput.of(et.schema, et.codec)
    return out


def _message_keys(mids: list[str], arrivals: list[int]) -> np.ndarray:
    """:func:`event_etl.task.dedupe.key_hash` ``("m", f"{message id}@{arrival}")`` of each message (``uint64``)."""
    import xxhash

    h = xxhash.xxh3_64_intdigest
    return np.fromiter((h(f"m:{m}@{a}".encode("utf-8", "surrogatepass")) for m, a in zip(mids, arrivals)),
                       dtype=np.uint64, count=len(mids))


def split_reference(split: Split, et: EventType, *, fast: bool = True) -> int | None:
    """The largest counted time (event time, at most its arrival) of the split's acceptable events.

    A job's first batch has no watermark: it measures "too late" against the one its own
    events give, the largest of these over its splits minus the out-of-orderness bound.  An
    acceptable event is neither ``future`` nor more than ``max_backfill`` before its arrival
    (a stray event from 1970 sets no reference).  A first batch's run reports it
    (``reference``) as it writes; this separate pass over the split is the rule spelled out,
    which the tests hold that report to.
    """
    decoder = _decoder(et)
    skew = et.max_future_skew
    backfill = et.max_backfill or None
    best = None
    reader = split_reader(split.kind)
    plan = plan_for(decoder) if fast and reader.fast_path(et) else None

    def consider(t: int, arrival: int) -> None:
        nonlocal best
        if t <= arrival + skew and not beyond_backfill(t, arrival, backfill):
            c = t if t <= arrival else arrival
            if best is None or c > best:
                best = c

    def consider_payload(payload: bytes, arrival: int, msg: Any) -> None:
        good, _, t = decoder.decode(payload) if msg is None else decoder.decode_message(payload, msg[1], arrival)
        if good:
            consider(t, arrival)

    if plan is None:
        for payload, arrival, _, _, msg in reader.payloads(split, et):
            consider_payload(payload, arrival, msg)
        return best
    for piece in reader.pieces(split, plan):
        if piece.decoded is not None:
            c = _chunk_reference(piece.decoded, piece.arrival, skew, backfill)
            if c is not None:
                consider(c, c)
            continue
        assert piece.records is not None  # a piece the plan could not take carries its payloads
        for payload, arrival, _, _, msg in piece.records:
            consider_payload(payload, arrival, msg)
    return best


def _chunk_reference(fc: FastChunk, arrivals: int | np.ndarray, skew: int, backfill: int | None) -> int | None:
    """:func:`split_reference` of a fast-path chunk: the largest counted time of its acceptable events."""
    ok = fc.times <= arrivals + skew
    if backfill:
        ok &= arrivals - fc.times <= backfill
    if not ok.any():
        return None
    arrivals_ok = arrivals[ok] if isinstance(arrivals, np.ndarray) else arrivals
    return int(np.minimum(fc.times[ok], arrivals_ok).max())


def process_split(
    split: Split, ctx: BatchContext, storage: Storage, *, fast: bool = True, reader: SplitReader | None = None
) -> tuple[dict[str, Any], bytes]:
    """Process one split; returns its report (JSON-able) and its dedupe key rows (``KEY_DTYPE`` bytes).

    ``fast``: let chunks of valid JSON lines take the columnar path (:mod:`event_etl.task.fastpath`);
    the output is the same either way (``False`` is for tests that compare both).  The steps, in
    order: read and judge every payload into its group's files (:meth:`_SplitRun.read`), store the
    files and the dead letters, then the report (:meth:`_SplitRun.finish`).
    """
    run = _SplitRun(split, ctx, fast=fast, reader=reader)
    run.read()
    return run.finish(storage)


class _SplitRun:
    """One split being processed: what the record path (:meth:`record_path`) and the fast path (:meth:`chunk`)
    add to, and what :meth:`finish` turns into the split's files, dead letters and report."""

    def __init__(self, split: Split, ctx: BatchContext, *, fast: bool, reader: SplitReader | None = None) -> None:
        et = ctx.event_type
        self.split, self.ctx, self.et = split, ctx, et
        self.decoder = _decoder(et)
        self.decoder.writers.seed(ctx.registry)
        self.unknown_fields = self.decoder.unknown_fields  # the decoder's count when the split began
        # a bus's split: the messages this type claims, read once for the bus (event_etl.bus.task)
        self.reader = reader if reader is not None else split_reader(split.kind)
        self.parquet = _parquet_output(et)
        # a Parquet type's files are written from the fast path's columns: no Avro encoding of its rows
        self.plan = plan_for(self.decoder, encode=self.parquet is None) if fast and self.reader.fast_path(et) else None
        self.reference = ctx.reference if ctx.wm_start is None else None
        self.measuring = ctx.wm_start is None and self.reference is None  # a first batch's first run: measures
        # largest counted time, earliest event time of the split's acceptable events
        self.acceptable: list[int | None] = [None, None]
        self.judge = make_judge(
            ctx.wm_start, allowed_lateness=et.allowed_lateness, max_future_skew=et.max_future_skew,
            too_late_reference=self.reference, max_backfill=et.max_backfill,
        )
        self.dedupe = et.dedupe_window > 0
        self.id_field = et.id_field if self.dedupe else None
        self.shard = split.shard
        self.keys: list[tuple[int, int, int, int, int, int]] = []
        self.key_parts: list[np.ndarray] = []  # key rows of fast chunks (order does not matter: find_duplicates sorts)
        self.groups: dict[tuple[int, bool], RollingFiles] = {}
        self.rejects: list[Rejected] = []
        self.counts: Counter[str] = Counter()
        self.delays = [0] * (len(DELAY_BUCKETS_S) + 1)
        self.delay_sum = 0
        # the largest counted time (event time, at most its arrival) of the records written
        self.counted: int | None = None

    def note(self, counted_time: int, earliest: int) -> None:
        acc = self.acceptable
        if acc[0] is None or counted_time > acc[0]:
            acc[0] = counted_time
        if acc[1] is None or earliest < acc[1]:
            acc[1] = earliest

    def count_written(self, c: int) -> None:
        """A written record's counted time ``c`` (event time, at most its arrival)."""
        if self.counted is None or c > self.counted:
            self.counted = c

    def group_for(self, hour: int, late: bool) -> RollingFiles:
        """The group of (hour, late), opened at its first record (its index orders the file keys)."""
        g = self.groups.get((hour, late))
        if g is None:
            ctx, et = self.ctx, self.et
            files = SplitFiles(batch_id=ctx.batch_id, shard=self.shard, writer=ctx.writer, schema=self.decoder.schema,
                               codec=et.codec, max_records=et.max_events_per_file, drop=ctx.drop, parquet=self.parquet)
            g = self.groups[(hour, late)] = RollingFiles(len(self.groups), hour, late, files)
        return g

    # -- reading ------------------------------------------------------------------------------------------
    def read(self) -> None:
        """Every payload of the split: pieces of JSON lines decoded at once where the plan takes them, else (and a
        piece the plan cannot take) one by one."""
        one = self.record_path()
        if self.plan is None:
            for item in self.reader.payloads(self.split, self.et):
                one(*item)
            return
        for piece in self.reader.pieces(self.split, self.plan):
            if piece.decoded is not None:
                assert piece.data is not None and piece.position is not None  # a decoded piece carries both
                self.chunk(piece.decoded, piece.data, piece.arrival, piece.position, piece.mids)
            else:
                assert piece.records is not None  # a piece the plan could not take carries its payloads
                for item in piece.records:
                    one(*item)

    def record_path(self) -> Callable[[bytes, int, str, Any, Any], None]:
        """The record path: a function of one payload (a closure over this run's parts, for speed)."""
        from event_etl.task.dedupe import ID_KEY, MESSAGE_KEY, key_hash

        ctx, et = self.ctx, self.et
        decode, decode_message = self.decoder.decode, self.decoder.decode_message
        judge, measuring, dedupe, id_field, shard = self.judge, self.measuring, self.dedupe, self.id_field, self.shard
        rejects, counts, keys, delays, group_for = self.rejects, self.counts, self.keys, self.delays, self.group_for
        timely_o, late_o = Outcome.TIMELY, Outcome.LATE

        def one(payload: bytes, arrival: int, where: str, off: Any, msg: Any) -> None:
            ok, rec, t = decode(payload) if msg is None else decode_message(payload, msg[1], arrival)
            if not ok:
                rejects.append(Rejected(rec.value, t, payload, where + str(off), arrival, None))
                return
            outcome, hour = judge(t, arrival)
            if measuring and outcome is timely_o:  # accepted (not future, within max_backfill): as split_reference
                self.note(t if t <= arrival else arrival, t)
            if outcome is timely_o or outcome is late_o:
                assert hour is not None  # the judge gives timely and late records their hour
                g = group_for(hour, outcome is late_o)
                problem = g.add(rec, t)
                if problem is not None:
                    if problem == -1:
                        counts["duplicate"] += 1
                    else:
                        rejects.append(Rejected(Reason.SCHEMA_MISMATCH.value, problem, payload, where + str(off),
                                                arrival, t))
                    return
                if dedupe:
                    fk, pos = g.last
                    if id_field is not None:
                        v = rec.get(id_field)
                        if v is not None:
                            keys.append((key_hash("i", v), t, shard, fk, pos, ID_KEY))
                    if msg is not None:  # stamped with its publish time: forgotten by the arrival clock
                        keys.append((key_hash("m", f"{msg[0]}@{arrival}"), arrival, shard, fk, pos, MESSAGE_KEY))
                self.count_written(t if t <= arrival else arrival)
                d = arrival - t
                delays[bisect_left(_DELAY_BOUNDS_MS, d)] += 1
                if d > 0:  # early events (within max_future_skew) count in the lowest bucket and add nothing
                    self.delay_sum += d
            else:
                reason = _REASON_OF[outcome]
                rejects.append(Rejected(reason.value, _reject_detail(reason, t, arrival, ctx, et), payload,
                                        where + str(off), arrival, t))
            counts[outcome.value] += 1

        return one

    def chunk(self, fc: FastChunk, data: bytes, arrival: int | np.ndarray, position: Callable[[int], str],
              mids: Sequence[str] | None = None) -> None:
        """The fast path: a chunk of valid JSON lines (:mod:`event_etl.task.fastpath`), the same outcome as the
        record path on each.

        ``arrival``: one arrival for the chunk (the lines of a file) or one per line (Pub/Sub
        messages: their publish times); ``position(i)``: the position of line ``i`` (``where + offset``);
        ``mids``: the message id of each line (Pub/Sub), for the message dedupe keys."""
        et = self.et
        codes, hours = judge_array(fc.times, arrival, self.ctx.wm_start, allowed_lateness=et.allowed_lateness,
                                   max_future_skew=et.max_future_skew, too_late_reference=self.reference,
                                   max_backfill=et.max_backfill)
        if self.measuring:
            ok = codes == 0  # accepted (not future, within max_backfill): as split_reference counts them
            if ok.any():
                times_ok = fc.times[ok]
                arrival_ok = arrival[ok] if isinstance(arrival, np.ndarray) else arrival
                self.note(int(np.minimum(times_ok, arrival_ok).max()), int(times_ok.min()))
        accepted = np.flatnonzero(codes <= 1)
        written, fks, poss = self._write_chunk(fc, codes, hours, accepted)
        self.counts["duplicate"] += int(len(accepted) - written.sum())
        for code in range(len(OUTCOME_CODES)):
            k = int(np.count_nonzero(written & (codes == code))) if code <= 1 else int(np.count_nonzero(codes == code))
            if k:
                self.counts[OUTCOME_CODES[code].value] += k
        wi = np.flatnonzero(written)
        if len(wi):
            arr = arrival[wi] if isinstance(arrival, np.ndarray) else arrival
            self._chunk_delays(fc.times[wi], arr)
            self._chunk_keys(fc, wi, arr, fks, poss, mids)
        self._chunk_rejects(fc, codes, data, arrival, position)

    def _write_chunk(self, fc: FastChunk, codes: np.ndarray, hours: np.ndarray, accepted: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The chunk's accepted records into their groups' files: ``(written, file keys, positions)`` per line."""
        written = np.zeros(fc.n, dtype=bool)
        fks = np.zeros(fc.n, dtype=np.int64)
        poss = np.zeros(fc.n, dtype=np.int64)
        if not len(accepted):
            return written, fks, poss
        gkey = hours[accepted] * 2 + codes[accepted]  # hour (a multiple of 2) and late
        uniq, first = np.unique(gkey, return_index=True)
        for key in uniq[np.argsort(first, kind="stable")].tolist():  # groups open in order of first record
            hour, late = key // 2, bool(key & 1)
            g = self.group_for(hour, late)
            idx = accepted[gkey == key]
            a = int(idx[0])  # a run of consecutive records (time-ordered input) is a slice, not a copy
            run = int(idx[-1]) - a + 1 == len(idx)
            if fc.rows is None:  # a Parquet type's plan: the columns only
                offs, data, columns = _NO_ROWS, memoryview(b""), fc.columns
            else:
                offs, data = rows_buffer(fc.rows.slice(a, len(idx)) if run else fc.rows.take(int64_array(idx)))
                columns = None if self.parquet is None else fc.columns  # a Parquet file takes the columns
            if columns is not None:
                columns = columns.slice(a, len(idx)) if run else columns.take(int64_array(idx))
            w, fk, pos = g.add_encoded(offs, data, fc.times[idx], columns=columns)
            written[idx], fks[idx], poss[idx] = w, fk, pos
        return written, fks, poss

    def _chunk_delays(self, times: np.ndarray, arr: int | np.ndarray) -> None:
        """The counted time and the delay histogram of a chunk's written records."""
        self.count_written(int(np.minimum(times, arr).max()))
        d = arr - times
        per_bucket = np.bincount(np.searchsorted(_DELAY_BOUNDS_MS, d, side="left"), minlength=len(self.delays))
        for b, c in enumerate(per_bucket.tolist()):
            self.delays[b] += c
        self.delay_sum += int(d[d > 0].sum())

    def _chunk_keys(self, fc: FastChunk, wi: np.ndarray, arr: int | np.ndarray, fks: np.ndarray, poss: np.ndarray,
                    mids: Sequence[str] | None) -> None:
        """The dedupe key rows of a chunk's written records: by id, and by message (Pub/Sub, Kafka)."""
        from event_etl.task.dedupe import ID_KEY, KEY_DTYPE, MESSAGE_KEY

        if not self.dedupe:
            return
        if self.id_field is not None and fc.id_keys is not None:
            assert fc.has_id is not None  # the fast path sets it with id_keys
            wid = wi[fc.has_id[wi]]
            part = np.empty(len(wid), dtype=KEY_DTYPE)
            part["key"] = fc.id_keys[wid]
            part["time"], part["shard"] = fc.times[wid], self.shard
            part["file"], part["rec"], part["kind"] = fks[wid], poss[wid], ID_KEY
            self.key_parts.append(part)
        if mids is not None:  # stamped with its publish time: forgotten by the arrival clock
            assert isinstance(arr, np.ndarray)  # messages (with their ids) come with one arrival each
            part = np.empty(len(wi), dtype=KEY_DTYPE)
            if isinstance(mids, OffsetIds):  # Kafka's topic/partition/offset: made and hashed as columns
                part["key"] = offset_message_keys(mids.prefix, mids.offsets, wi, arr)
            else:
                part["key"] = _message_keys([mids[i] for i in wi.tolist()], arr.tolist())
            part["time"], part["shard"] = arr, self.shard
            part["file"], part["rec"], part["kind"] = fks[wi], poss[wi], MESSAGE_KEY
            self.key_parts.append(part)

    def _chunk_rejects(self, fc: FastChunk, codes: np.ndarray, data: bytes, arrival: int | np.ndarray,
                       position: Callable[[int], str]) -> None:
        """The chunk's records the judge dead-letters (future, too late, before the backfill bound)."""
        for i in np.flatnonzero(codes >= 2).tolist():
            reason = _REASON_OF[OUTCOME_CODES[codes[i]]]
            t = int(fc.times[i])
            a = int(arrival[i]) if isinstance(arrival, np.ndarray) else arrival
            payload = data[fc.starts[i]:fc.ends[i]]
            self.rejects.append(Rejected(reason.value, _reject_detail(reason, t, a, self.ctx, self.et), payload,
                                         position(i), a, t))

    # -- finishing ----------------------------------------------------------------------------------------
    def finish(self, storage: Storage) -> tuple[dict[str, Any], bytes]:
        """Store the files and the dead letters; the report and the dedupe key rows."""
        from event_etl.task.dedupe import KEY_DTYPE

        fence = Fence.of(self.ctx.fence, storage)
        files, max_t, min_hour, max_hour = self._store_files(storage, fence)
        dl = self._store_deadletters(storage, fence)
        reasons = Counter(r.reason for r in self.rejects)
        self.counts["invalid"] = sum(n for r, n in reasons.items() if r not in _JUDGED_REASONS)
        report = SplitReport(shard=self.shard, counts={k: v for k, v in self.counts.items() if v},
                             reasons=dict(reasons), files=files, deadletter=dl, max_event_time=max_t,
                             max_counted_time=self.counted, min_hour=min_hour, max_hour=max_hour,
                             delay_buckets=self.delays, delay_sum_ms=self.delay_sum)
        inputs = self.reader.inputs(self.split)  # Pub/Sub's segments or 0.1.0 spool file: acked once saved
        if inputs is not None:
            report.inputs = inputs
        report.part = self.reader.part(self.split)  # a partitioned source (Kafka): its watermark is kept per part
        backfill = [r.event_time for r in self.rejects
                    if r.reason == Reason.BEFORE_BACKFILL.value and r.event_time is not None]
        if backfill:  # said by the run (progress line, summary), so that a backfill is not dead-lettered in silence
            report.backfill = {"events": len(backfill), "max_backfill": int(self.et.max_backfill),
                               "oldest": min(backfill), "newest": max(backfill)}
        report.schemas = self.decoder.writers.report(self.ctx.registry) or None
        report.dropped_fields = self.decoder.unknown_fields - self.unknown_fields
        rows = np.array(self.keys, dtype=KEY_DTYPE)
        if self.key_parts:
            rows = np.concatenate([rows, *self.key_parts])
        out = report.to_json()
        if self.measuring:
            out["reference"], out["earliest"] = self.acceptable
        return out, rows.tobytes()

    def _store_files(self, storage: Storage, fence: Fence | None
                     ) -> tuple[list[dict[str, Any]], int | None, int | None, int | None]:
        """Every group's files stored (each once): their report entries, the largest event time, the first and last
        hour that received a file."""
        et, ctx = self.et, self.ctx
        files: list[dict[str, Any]] = []
        max_t = min_hour = max_hour = None
        for (hour, late), g in sorted(self.groups.items()):
            written = g.finish()
            if g.max_t is not None:
                max_t = g.max_t if max_t is None else max(max_t, g.max_t)
                # every hour that receives a file counts, the open hour of late records too: markers
                # start at the earliest hour that received data, and a drain closes up to the latest
                min_hour = hour if min_hour is None else min(min_hour, hour)
                max_hour = hour if max_hour is None else max(max_hour, hour)
            rel_dir = hour_dir(et.name, hour)
            for name, data, n, fk in written:
                files.append({
                    "hour": hour, "name": name, "records": n, "bytes": len(data), "file_key": fk,
                    "sha256": hashlib.sha256(data).hexdigest(), "late": late,
                    "schema_fingerprint": f"crc64avro:{et.fingerprint}",  # the schema the file is written in
                    **({"event_hours": {str(h): c for h, c in sorted(g.event_hours.get(name, {}).items())}}
                       if late else {}),  # where a late file's records came from (the manifest says it)
                    "written": _store_once(storage, f"{rel_dir}/{name}", data, hour, fence,
                                           check_only=ctx.written_since(hour, name)),
                })
        return files, max_t, min_hour, max_hour

    def _store_deadletters(self, storage: Storage, fence: Fence | None) -> dict[str, Any] | None:
        """The split's dead-letter file, without the records an earlier attempt found there already."""
        from event_etl.task.dedupe import MESSAGE_KEY, key_hash

        ctx = self.ctx
        dl_rel = deadletter_file_path(self.et.name, ctx.started_at, ctx.batch_id, self.shard, writer=ctx.writer)
        dl_skip = frozenset(ctx.drop.get(os.path.basename(dl_rel), ()))
        if dl_skip:  # redelivered messages an earlier attempt found in the dead-letter area already
            self.counts["duplicate"] += len(dl_skip)
        if self.dedupe:
            for i, r in enumerate(self.rejects):
                if r.position.startswith("msg:") and i not in dl_skip:
                    self.keys.append((key_hash("m", f"{r.position[4:]}@{r.arrival}"), r.arrival, self.shard,
                                      DEADLETTER_FILE_KEY, i, MESSAGE_KEY))
        self.rejects = [r for i, r in enumerate(self.rejects) if i not in dl_skip]
        return _write_deadletters(self.rejects, dl_rel, ctx, storage, fence)


_REASON_OF: dict[Outcome, Reason] = {Outcome.TOO_LATE: Reason.TOO_LATE, Outcome.FUTURE: Reason.FUTURE,
                                     Outcome.BEFORE_BACKFILL: Reason.BEFORE_BACKFILL}
"""The dead-letter reason of each outcome the judge dead-letters."""
_JUDGED_REASONS = frozenset(r.value for r in _REASON_OF.values())
"""Reasons of records the judge dead-lettered (counted by their outcome); every other reason counts as ``invalid``."""


def _reject_detail(reason: Reason, t: int, arrival: int, ctx: BatchContext, et: EventType) -> str:
    from event_etl.timeutil import format_duration, iso

    if reason is Reason.FUTURE:
        return (f"event time {iso(t)} is {format_duration(t - arrival)} after its arrival "
                f"(max_future_skew {format_duration(et.max_future_skew)})")
    wm = ctx.wm_start
    if reason is Reason.BEFORE_BACKFILL:
        return (f"event time {iso(t)} is {format_duration(arrival - t)} before its arrival and the job has no "
                f"watermark yet (max_backfill {format_duration(et.max_backfill)})")
    return (f"event time {iso(t)}; watermark {iso(wm) if wm is not None else 'not set'} "
            f"(allowed_lateness {format_duration(et.allowed_lateness)})")


def _store_once(storage: Storage, rel: str, data: bytes, hour: int | None, fence: Fence | None = None, *,
                check_only: bool = False) -> bool:
    """Write ``rel`` unless an earlier attempt of the same batch already did.  True if written now.

    An existing file counts as written only if it holds exactly these bytes (its sha256); a
    replay that makes other bytes under the same name means its input changed.  ``check_only``:
    the file was taken further since (its hour marked, or it was merged): only compared, if
    still there, never written again.
    """
    folder, name = rel.rsplit("/", 1)
    if check_only and not storage.exists(rel):
        return False
    if storage.exists(rel):
        old = storage.read(rel)
        if hashlib.sha256(old).digest() == hashlib.sha256(data).digest():
            return False
        if hour is not None and storage.exists(f"{folder}/{MARKER_NAME}"):
            raise IntegrityError(
                f"{storage.display(rel)} exists ({len(old)} bytes, sha256 {hashlib.sha256(old).hexdigest()[:12]}…), "
                f"but a replay of its batch made other bytes ({len(data)} bytes, sha256 "
                f"{hashlib.sha256(data).hexdigest()[:12]}…), and its hour is already marked complete",
                fix="the input of a finished batch changed; restore it, or move this hour aside and re-run",
            )
        if check_only:
            return False
    elif hour is not None and storage.exists(f"{folder}/{MARKER_NAME}"):
        # This job judged the hour open, yet it is marked: another writer marked it.
        raise IntegrityError(
            f"{storage.display(folder)} is already complete, but this job was about to add {name} to it",
            fix="two jobs write this event type to this sink; stop one (each job holds a lease, see the README)",
        )
    if fence is not None:
        fence.check()
    faults.point("write_file", rel)
    storage.write_atomic(rel, data)
    return True


def _write_deadletters(rejects: list[Rejected], rel: str, ctx: BatchContext, storage: Storage,
                       fence: Fence | None = None) -> dict[str, Any] | None:
    if not rejects:
        return None
    size, written = _store_deadletters(rejects, rel, ctx.event_type.name, ctx.batch_id, storage, fence)
    return {"path": rel, "records": len(rejects), "bytes": size, "written": written,
            "file_key": DEADLETTER_FILE_KEY}


def _store_deadletters(rejects: list[Rejected], rel: str, owner: str, batch_id: int, storage: Storage,
                       fence: Fence | None) -> tuple[int, bool]:
    """A dead-letter file of ``rejects`` (``owner``: a type, or a bus), stored once: ``(its bytes, written now)``."""
    recs = [r.record(owner, batch_id) for r in rejects]
    data = encode_container(DEADLETTER_SCHEMA, recs, name=rel, codec="deflate")
    return len(data), _store_once(storage, rel, data, None, fence)


def store_unclaimed(rejects: list[Rejected], rel: str, bus: str, ctx: BatchContext, storage: Storage) -> None:
    """A bus's dead-letter file of a split's unclaimed messages (:mod:`event_etl.bus.task`), written once (a replay
    of the split makes the same bytes), under the lease of the batch that read it."""
    _store_deadletters(rejects, rel, bus, 0, storage, Fence.of(ctx.fence, storage))


def _error_parts(err: BaseException) -> tuple[str, str, str | None]:
    fix = err.fix if isinstance(err, EventEtlError) else None
    message = err.message if isinstance(err, EventEtlError) else f"{type(err).__name__}: {err}"
    return type(err).__name__, message, fix


BUS_ROW = "_bus/"
"""A shared job's row of a bus's split read once for several types: ``_bus/<bus id>/<type>,<type>...``."""


def bus_row(bus: str, names: Sequence[str]) -> str:
    return f"{BUS_ROW}{bus}/{','.join(names)}"


_SharedRow = tuple[str, int, str | None, bytes | None, tuple[str, str, str | None] | None]
"""What a shared task yields per split: type name, shard, report JSON, keys, (error class, message, fix)."""


def make_shared_task(contexts: dict[str, BatchContext], routers: Mapping[str, Any] | None = None
                     ) -> Callable[[Iterable[tuple[str, Iterable[Any]]]], Iterator[_SharedRow]]:
    """The ``mapPartitions`` function of a shared engine's Spark job (:mod:`event_etl.job.engine`).

    Its rows are ``(type name, split row)`` of several types' batches; it yields one
    ``(type name, shard, report JSON, keys, None)`` per split, or ``(type name, shard, None, None,
    (error class, message, fix))`` for a split that failed: that type's batch fails, the other
    types' splits go on.  A bus's row (:func:`bus_row`, ``routers``: ``{bus id: Router}``) is read once and yields
    one such row per type of it, then ``(bus row, shard, {"unclaimed": n, "path": ...}, None, None)``."""

    def task(rows: Iterable[tuple[str, Iterable[Any]]]) -> Iterator[_SharedRow]:
        stores: dict[str, Storage] = {}

        def storage_of(sink: str) -> Storage:
            if sink not in stores:
                stores[sink] = open_storage(sink)
            return stores[sink]

        with settings_in_force():  # the executor's EVENT_ETL_* variables, read once per task
            for name, row in rows:
                split = Split(*row)
                if name.startswith(BUS_ROW):
                    yield from _bus_task(name, split, contexts, routers or {}, storage_of)
                    continue
                ctx = contexts[name]
                try:
                    report, keys = process_split(split, ctx, storage_of(ctx.sink))
                except Exception as err:  # noqa: BLE001 - handed to the driver, as this type's failure
                    yield name, split.shard, None, None, _error_parts(err)
                    continue
                yield name, split.shard, json.dumps(report), keys or b"", None

    return task


def _bus_task(row: str, split: Split, contexts: dict[str, BatchContext], routers: Mapping[str, Any],
              storage_of: Callable[[str], Storage]) -> Iterator[_SharedRow]:
    """A bus's split read once for the types its row names (:mod:`event_etl.bus.task`)."""
    from event_etl.bus.task import process_bus_split

    bus, names = row[len(BUS_ROW):].split("/", 1)
    group = {n: contexts[n] for n in names.split(",")}
    done: set[str] = set()
    try:
        for name, report, keys, error in process_bus_split(split, group, routers[bus], bus, storage_of,
                                                           process=process_split, store_unclaimed=store_unclaimed):
            if not name:
                yield row, split.shard, json.dumps(report), None, None
            elif error is not None:
                yield name, split.shard, None, None, _error_parts(error)
            else:
                yield name, split.shard, json.dumps(report), keys or b"", None
            done.add(name)
    except Exception as err:  # noqa: BLE001 - reading the split failed: every type of the row fails this batch
        for name in group:
            if name not in done:
                yield name, split.shard, None, None, _error_parts(err)
