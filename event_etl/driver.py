"""The driver's side of a job: judging batches against a fixed watermark, ledger, markers, idleness, drain.

:class:`Controller` is called by Spark once per micro-batch (``foreachBatch``) and by
the job's main loop between batches (``tick``, ``drain``).  A lock makes the two take
turns.  Per batch, in this order, each step durable before the next:

1. the batch's *intent* (the watermark it is judged against) is written, or read back
   if Spark is replaying the batch after a crash;
2. executor tasks write the batch's files (:mod:`event_etl.executor`);
3. the files are recorded in the ledger of their hour;
4. the watermark advances; every hour it completes gets its ``_COMPLETE`` marker, built
   from the ledger and checked against the folder's listing;
5. the new state is saved; Spark then commits the batch.

A crash anywhere makes Spark replay the batch, which finds its intent, rewrites nothing
that exists, and re-creates nothing that is marked.  Idle ticks and drains never run
while a batch's intent is pending (written but its batch not finished): the pending
batch must first be replayed against the watermark it was judged with.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from event_etl import faults
from event_etl.checkpoint import BatchIntent, Checkpoint
from event_etl.errors import IntegrityError
from event_etl.eventtypes import EventType
from event_etl.executor import REPORT_SCHEMA, BatchContext, make_task
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.completeness import hours_to_mark
from event_etl.rules.manifest import FileEntry, Manifest, build_manifest, compare_listing
from event_etl.rules.watermark import WatermarkState, drain_watermark, idle_watermark
from event_etl.storage import Storage

__all__ = ["Controller", "BatchResult", "summarize", "StopRequested"]


_TASK_ERROR_RE = re.compile(r"event_etl\.errors\.(\w+Error): (.*?)(?:\n\s+fix: (.*?))?\n", re.S)


def unwrap_task_error(err: BaseException) -> BaseException:
    """An executor task's event_etl error arrives wrapped in Spark's; give it back its own class and fix."""
    from event_etl import errors

    m = _TASK_ERROR_RE.search(str(err) + "\n")
    cls = getattr(errors, m.group(1), None) if m else None
    if cls is None or not issubclass(cls, errors.EventEtlError) or cls is errors.ConfigError:
        return err
    return cls(m.group(2).strip(), fix=(m.group(3) or "").strip() or None)


class StopRequested(Exception):
    """Raised inside ``foreachBatch`` to stop a query at a batch boundary without committing the batch."""


@dataclass
class BatchResult:
    """What a micro-batch did, summed over its splits (see :func:`summarize`)."""

    counts: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    files: dict[int, list[FileEntry]] = field(default_factory=dict)
    files_written: int = 0
    bytes_written: int = 0
    deadletter_files: int = 0
    max_event_time: int | None = None
    min_hour: int | None = None
    delay_buckets: list[int] = field(default_factory=list)
    delay_sum_ms: int = 0

    @property
    def events_in(self) -> int:
        """Every payload the batch read: timely, late, too late, future, invalid and duplicate."""
        return sum(self.counts.values())

    @property
    def deadlettered(self) -> int:
        return sum(self.reasons.values())


def summarize(reports: list[dict[str, Any]]) -> BatchResult:
    """Add up the reports of a batch's splits (pure)."""
    r = BatchResult()
    for rep in reports:
        r.counts.update(rep["counts"])
        r.reasons.update(rep["reasons"])
        for f in rep["files"]:
            r.files.setdefault(int(f["hour"]), []).append(
                FileEntry(f["name"], int(f["records"]), int(f["bytes"]), f["sha256"], bool(f["late"]))
            )
            r.files_written += 1
            r.bytes_written += int(f["bytes"])
        if rep.get("deadletter"):
            r.deadletter_files += 1
        t = rep.get("max_event_time")
        if t is not None and (r.max_event_time is None or t > r.max_event_time):
            r.max_event_time = t
        h = rep.get("min_hour")
        if h is not None and (r.min_hour is None or h < r.min_hour):
            r.min_hour = h
        b = rep.get("delay_buckets") or []
        if len(r.delay_buckets) < len(b):
            r.delay_buckets.extend([0] * (len(b) - len(r.delay_buckets)))
        for i, n in enumerate(b):
            r.delay_buckets[i] += n
        r.delay_sum_ms += int(rep.get("delay_sum_ms") or 0)
    r.counts = Counter({k: v for k, v in r.counts.items() if v})
    return r


@dataclass(frozen=True)
class BatchEvent:
    """Handed to listeners after each batch (progress lines, metrics)."""

    batch_id: int
    result: BatchResult
    state: WatermarkState
    marked: list[Manifest]
    started_at: int
    finished_at: int
    replayed: bool
    attempt_started_at: int = 0
    """When this attempt began (``started_at`` is the first attempt's, from the batch's intent)."""


class Controller:
    """Drives one event type's job on the driver.  See the module docstring."""

    def __init__(
        self,
        *,
        event_type: EventType,
        storage: Storage,
        checkpoint: Checkpoint,
        clock: Callable[[], int],
        listeners: list[Callable[[str, Any], None]] | None = None,
        writer: str = "",
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.et = event_type
        self.writer = writer
        self._attempt_started: int | None = None
        self.guard = guard  # raises if this job may no longer write (it lost its lease)
        self.storage = storage
        self.ckpt = checkpoint
        self.clock = clock
        self.listeners = list(listeners or [])
        self.lock = threading.RLock()
        self.state = checkpoint.load_state()
        latest = checkpoint.latest_intent_id()
        self.pending_batch: int | None = latest if latest is not None and latest > self.state.last_batch_id else None
        started = clock()
        self.quiet_since = started
        self.wm_when_quiet = self.state.watermark
        self.stopping = False
        self.busy = False
        self.failure: BaseException | None = None
        self.totals: Counter = Counter()
        self.batches = 0
        self.hours_marked: list[int] = []
        self.last_batch_at: int | None = None
        self.dedupe = None
        if event_type.dedupe_window > 0:
            from event_etl.dedupe import DedupeState

            self.dedupe = DedupeState.from_batches(event_type.dedupe_window, checkpoint.load_dedupe_rows(),
                                                   self._event_clock(self.state))

    # -- listeners -------------------------------------------------------------------------
    def _emit(self, kind: str, payload: Any) -> None:
        for fn in self.listeners:
            fn(kind, payload)

    # -- micro-batches ---------------------------------------------------------------------
    def handle_batch(self, df, batch_id: int) -> None:
        """``foreachBatch`` callback."""
        # A batch that Spark starts after a stop was requested is processed like any other: refusing
        # it would need an exception inside foreachBatch, which Spark logs as a failed query.  The
        # runner stops the query through the API once no batch runs (see event_etl.runner).
        try:
            with self.lock:
                self.busy = True
                try:
                    self._run_batch(df, batch_id)
                finally:
                    self.busy = False
        except BaseException as err:  # remembered so the job reports the real cause, not Spark's wrapper
            self.failure = err
            raise

    def _run_batch(self, df, batch_id: int) -> None:
        def run_tasks(ctx: BatchContext, shards: set[int] | None) -> list[tuple[dict, bytes]]:
            part = df if shards is None else df.filter(df["shard"].isin(sorted(shards)))
            try:
                # Arrow all the way (not collect(): the key rows are megabytes a batch)
                table = part.mapInArrow(make_task(ctx), REPORT_SCHEMA).toArrow()
            except Exception as err:  # noqa: BLE001 - re-raised, as event_etl's own error when it is one
                raise unwrap_task_error(err) from err
            return [(json.loads(rep), keys or b"") for rep, keys in
                    zip(table.column("report").to_pylist(), table.column("keys").to_pylist())]

        self.run_batch(batch_id, run_tasks)

    def run_batch(self, batch_id: int, run_tasks: Callable[[BatchContext, set[int] | None], list[tuple[dict, bytes]]]
                  ) -> BatchEvent:
        """One micro-batch: intent, tasks (``run_tasks(ctx, shards)`` runs the executor on all or some splits),
        duplicates, ledger, markers, state.  Public so that tests can drive it without Spark."""
        if self.guard is not None:
            self.guard()
        self._attempt_started = self.clock()
        intent, replayed = self.begin_batch(batch_id)
        drop = self.ckpt.load_drops(batch_id) if replayed else {}
        outputs = run_tasks(self.batch_context(intent, drop), None)
        rows = None
        if self.dedupe is not None:
            outputs, rows = self._drop_duplicates(intent, drop, outputs, run_tasks)
        result = summarize([rep for rep, _ in outputs])
        return self.finish_batch(intent, result, replayed=replayed, dedupe_rows=rows)

    def _drop_duplicates(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]], outputs, run_tasks):
        """Find records whose key was written before (in the window) and rewrite their splits without them."""
        from event_etl.dedupe import find_duplicates, rows_of

        rows = rows_of([keys for _, keys in outputs])
        dup = find_duplicates(rows, self.dedupe.seen_before(intent.batch_id))
        if not dup.any():
            return outputs, rows
        names = {(rep["shard"], f["file_key"]): f["name"] for rep, _ in outputs for f in rep["files"]}
        names.update({(rep["shard"], rep["deadletter"]["file_key"]): rep["deadletter"]["path"].rsplit("/", 1)[1]
                      for rep, _ in outputs if rep.get("deadletter")})
        new_drop = {k: set(v) for k, v in drop.items()}
        for r in rows[dup]:
            new_drop.setdefault(names[(int(r["shard"]), int(r["file"]))], set()).add(int(r["rec"]))
        frozen = {k: tuple(sorted(v)) for k, v in sorted(new_drop.items())}
        self.ckpt.save_drops(intent.batch_id, frozen)  # a replay skips the same records
        shards = {int(s) for s in np.unique(rows[dup]["shard"])}
        again = run_tasks(self.batch_context(intent, frozen), shards)
        def paths(reports) -> set[str]:
            reports = list(reports)
            out = {f"{hour_dir(self.et.name, f['hour'])}/{f['name']}" for rep in reports for f in rep["files"]}
            return out | {rep["deadletter"]["path"] for rep in reports if rep.get("deadletter")}

        before = paths(rep for rep, _ in outputs if rep["shard"] in shards)
        after = paths(rep for rep, _ in again)
        for rel in sorted(before - after):  # every record of that file was a duplicate
            self.storage.delete(rel)
        outputs = [o for o in outputs if o[0]["shard"] not in shards] + again
        rows = rows_of([keys for _, keys in outputs])
        left = find_duplicates(rows, self.dedupe.seen_before(intent.batch_id))
        if left.any():
            raise IntegrityError(f"batch {intent.batch_id}: {int(left.sum())} duplicates remain after rewriting",
                                 fix="report this as a bug, with the checkpoint's etl/ folder")
        return outputs, rows

    def begin_batch(self, batch_id: int) -> tuple[BatchIntent, bool]:
        """Step 1: the batch's intent, new or (for a replay) as first written.  Returns ``(intent, replayed)``."""
        intent = self.ckpt.load_intent(batch_id)
        if intent is not None:
            self.pending_batch = batch_id
            return intent, True
        if batch_id <= self.state.last_batch_id:
            raise IntegrityError(
                f"Spark replays batch {batch_id}, which finished before and whose intent is gone",
                fix="the checkpoint's etl/ and spark/ parts do not belong together; restore both or start anew",
            )
        intent = BatchIntent(batch_id, self.state.watermark, self.clock())
        self.ckpt.save_intent(intent)
        self.pending_batch = batch_id
        return intent, False

    def batch_context(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]] | None = None) -> BatchContext:
        """What the executor tasks of the batch are handed."""
        return BatchContext(self.et, self.storage.url, intent.batch_id, intent.wm_start, intent.started_at,
                            dict(drop or {}), self.writer)

    def finish_batch(self, intent: BatchIntent, result: BatchResult, *, replayed: bool = False,
                     dedupe_rows: np.ndarray | None = None) -> BatchEvent:
        """Steps 3 to 5 of a batch."""
        batch_id = intent.batch_id
        faults.point("files_written", str(batch_id))
        for hour, entries in sorted(result.files.items()):
            if self.state.marked_through is not None and hour <= self.state.marked_through:
                continue  # a replay of a batch whose hours were marked: the ledger is gone on purpose
            self.ckpt.write_ledger(hour, batch_id, entries)
        new = self.state.after_batch(
            batch_id=batch_id,
            wm_start=intent.wm_start,
            batch_max_event_time=result.max_event_time,
            batch_min_hour=result.min_hour,
            out_of_orderness=self.et.out_of_orderness,
        )
        now = self.clock()
        new, marked = self._mark(new, now)
        if self.dedupe is not None and dedupe_rows is not None:
            # before the state: a batch whose state is saved must have its keys remembered
            self.ckpt.save_dedupe_rows(batch_id, dedupe_rows)
            self.dedupe.add(batch_id, dedupe_rows)
        self._commit_state(new, marked)
        if self.dedupe is not None:
            for gone in self.dedupe.evict(self._event_clock(new)):
                self.ckpt.drop_dedupe_rows(gone)
        self.ckpt.prune_intents(batch_id - 2)
        self.pending_batch = None
        if result.counts.get("timely"):
            self.quiet_since = now
            self.wm_when_quiet = new.watermark
        self.batches += 1
        self.totals.update(result.counts)
        self.totals["deadlettered"] += result.deadlettered
        self.totals["files"] += result.files_written
        self.totals["bytes"] += result.bytes_written
        self.last_batch_at = now
        event = BatchEvent(batch_id, result, new, marked, intent.started_at, now, replayed,
                           self._attempt_started or intent.started_at)
        self._emit("batch", event)
        return event

    def _event_clock(self, state: WatermarkState) -> int | None:
        """How far event time has come, for forgetting old keys: the watermark the events alone
        would give.  A drain or an idle advance moves the watermark without new events; forgetting
        by it would let the copies of events sent just before a redeploy through."""
        if state.max_event_time is None:
            return None
        return state.max_event_time - self.et.out_of_orderness

    # -- markers ---------------------------------------------------------------------------
    def _mark(self, state: WatermarkState, now: int) -> tuple[WatermarkState, list[Manifest]]:
        marked = []
        for hour in hours_to_mark(state.first_hour, state.marked_through, state.watermark):
            faults.point("before_marker", str(hour))
            marked.append(self._write_marker(hour, state.watermark, now, state.last_batch_id))
            faults.point("after_marker", str(hour))
            state = replace(state, marked_through=hour)
        return state, marked

    def _commit_state(self, new: WatermarkState, marked: list[Manifest]) -> None:
        self.ckpt.save_state(new)
        faults.point("state_saved", str(new.last_batch_id))
        self.state = new
        for m in marked:
            self.ckpt.drop_ledger(m.hour)
            self.hours_marked.append(m.hour)
            self._emit("marker", m)

    def _write_marker(self, hour: int, watermark: int, now: int, last_batch: int) -> Manifest:
        rel_dir = hour_dir(self.et.name, hour)
        entries = self.ckpt.read_ledger(hour)
        listing = self.storage.list_files(rel_dir)
        for name in list(listing):
            if name.startswith(".") and name.endswith(".tmp"):
                self.storage.delete(f"{rel_dir}/{name}")  # leftovers of attempts killed mid-write
                del listing[name]
        marker_rel = f"{rel_dir}/{MARKER_NAME}"
        existing = None
        if MARKER_NAME in listing:
            existing = Manifest.from_bytes(self.storage.read(marker_rel))
        if existing is not None:  # written before a crash; the replayed batch must agree with it
            if set(existing.files) != set(entries):
                raise IntegrityError(
                    f"{self.storage.display(marker_rel)} already exists and lists other files than this job wrote "
                    f"({compare_listing(entries, {f.name: f.bytes for f in existing.files}).describe()})",
                    fix="another job wrote this hour: make sure only one job writes each event type to each sink",
                )
            return existing
        diff = compare_listing(entries, listing)
        if not diff.ok:
            raise IntegrityError(
                f"cannot mark {self.storage.display(rel_dir)} complete: its files differ from what this job wrote "
                f"({diff.describe()})",
                fix="another writer or a manual change touched this hour; restore the files, or move the hour aside",
            )
        manifest = build_manifest(
            event_type=self.et.name,
            hour=hour,
            files=entries,
            watermark=watermark,
            completed_at=now,
            schema_fingerprint=f"crc64avro:{self.et.fingerprint}",
            # the last micro-batch whose data the hour can hold: later batches found it complete
            extra={"last_batch": last_batch},
        )
        if not self.storage.create_only(marker_rel, manifest.to_bytes()):
            other = Manifest.from_bytes(self.storage.read(marker_rel))
            if set(other.files) != set(manifest.files):
                raise IntegrityError(
                    f"{self.storage.display(marker_rel)} was created by another writer with other files",
                    fix="make sure only one job writes each event type to each sink",
                )
            return other
        return manifest

    # -- between batches -------------------------------------------------------------------
    def tick(self) -> list[Manifest]:
        """Advance the watermark of a quiet source and mark the hours it completes."""
        with self.lock:
            if self.busy or self.pending_batch is not None:
                return []
            now = self.clock()
            wm = idle_watermark(
                self.state.watermark,
                quiet_since=self.quiet_since,
                watermark_when_quiet=self.wm_when_quiet,
                now=now,
                idle_timeout=self.et.idle_timeout,
            )
            if wm is None or wm == self.state.watermark:
                return []
            new, marked = self._mark(self.state.with_watermark(wm), now)
            self._commit_state(new, marked)
            self._emit("idle", new)
            return marked

    def drain(self) -> list[Manifest]:
        """End of input: move the watermark past the last hour holding data and mark every hour up to it."""
        with self.lock:
            if self.pending_batch is not None:
                raise IntegrityError(
                    f"cannot drain: batch {self.pending_batch} was started but not finished",
                    fix="run the job again (without --drain) so Spark replays it, then drain",
                )
            wm = drain_watermark(self.state.watermark, self.state.max_event_time)
            if wm is None:
                return []
            new, marked = self._mark(self.state.with_watermark(wm), self.clock())
            self._commit_state(new, marked)
            self._emit("drain", new)
            return marked

    def request_stop(self) -> None:
        """Let the running batch finish; any later batch is refused (and replayed by the next run)."""
        with self.lock:
            self.stopping = True
