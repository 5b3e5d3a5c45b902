"""The driver's side of a job: judging batches against a fixed watermark, ledger, markers, idleness, drain.

:class:`Controller` is called by Spark once per micro-batch (``foreachBatch``) and by
the job's main loop between batches (``tick``, ``drain``).  A lock makes the two take
turns.  Per batch, in this order, each step durable before the next:

1. the batch's *intent* (the watermark it is judged against, the settings and schema it
   is judged and written with) is written, or read back if Spark is replaying the batch
   after a crash;
2. executor tasks write the batch's files (:mod:`event_etl.task.executor`); a job's first
   batch, which has no watermark, learns from them the "too late" reference of the whole
   batch and, in the rare case that some splits hold events too late against it, writes those
   splits again against it (recorded in the intent first); duplicates found afterwards are
   recorded, their splits rewritten without them, and files left with no record removed (a
   replay removes what a killed attempt left);
3. the files are recorded in the ledger of their hour;
4. the watermark advances; every hour it completes gets its ``_COMPLETE`` marker, built
   from the ledger and checked against the folder's listing;
5. the new state is saved; Spark then commits the batch.

A crash anywhere makes Spark replay the batch, which finds its intent, rewrites nothing
that exists, and re-creates nothing that is marked.  Idle ticks and drains never run
while a batch's intent is pending (written but its batch not finished): the pending
batch must first be replayed against the watermark it was judged with.  Markers are
written in hour order and each records the watermark that completed it, so markers a
killed job wrote before saving its state (in a batch, an idle tick or a drain) are
*adopted* when the controller starts: its watermark moves to theirs, and the hours that watermark
completes and the killed step had not marked yet are marked then, before any batch.

Every write checks first that the job still holds its lease (``guard``): a job that lost
it writes nothing more.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from event_etl import faults
from event_etl.errors import IntegrityError
from event_etl.eventtypes import EventType
from event_etl.job.checkpoint import FROZEN_SETTINGS, BatchIntent, Checkpoint
from event_etl.rules.buckets import MARKER_NAME, deadletter_file_path, hour_dir, parse_data_file_name
from event_etl.rules.compaction import (
    MAX_GENERATION,
    ROLLING_FILES,
    closing_soon,
    is_merged_name,
    merge_groups,
    merged_file_name,
)
from event_etl.rules.completeness import hours_to_mark
from event_etl.rules.judge import too_late_in_first_batch
from event_etl.rules.manifest import FileEntry, Manifest, build_manifest, compare_listing
from event_etl.rules.watermark import (
    SourceActivity,
    WatermarkState,
    clock_step,
    drain_watermark,
    idle_advance,
    quiet_since,
    quiet_start,
)
from event_etl.storage import Storage
from event_etl.storage.temporaries import sweep_temporaries
from event_etl.task.executor import REPORT_SCHEMA, BatchContext, make_task
from event_etl.timeutil import HOUR_MS

T = TypeVar("T")
MERGE_REQUESTS = 16  # storage requests at a time while merging an hour's files on an object store

__all__ = ["Controller", "BatchResult", "summarize"]


_TASK_ERROR_RE = re.compile(r"event_etl\.errors\.(\w+Error): (.*?)(?:\n\s+fix: (.*?))?\n", re.S)


def unwrap_task_error(err: BaseException) -> BaseException:
    """An executor task's event_etl error arrives wrapped in Spark's; give it back its own class and fix."""
    from event_etl import errors

    m = _TASK_ERROR_RE.search(str(err) + "\n")
    cls = getattr(errors, m.group(1), None) if m else None
    if cls is None or not issubclass(cls, errors.EventEtlError) or cls is errors.ConfigError:
        return err
    return cls(m.group(2).strip(), fix=(m.group(3) or "").strip() or None)


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
    max_counted_time: int | None = None
    min_hour: int | None = None
    max_hour: int | None = None
    delay_buckets: list[int] = field(default_factory=list)
    delay_sum_ms: int = 0
    inputs: set[str] = field(default_factory=set)
    """What the batch read that its source must be told about once it is saved (Pub/Sub spool segments)."""

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
                FileEntry(f["name"], int(f["records"]), int(f["bytes"]), f["sha256"], bool(f["late"]),
                          f.get("schema_fingerprint", ""))
            )
            r.files_written += 1
            r.bytes_written += int(f["bytes"])
        if rep.get("deadletter"):
            r.deadletter_files += 1
        t = rep.get("max_event_time")
        if t is not None and (r.max_event_time is None or t > r.max_event_time):
            r.max_event_time = t
        # an executor of format 1 did not report counted times: its events count as before
        c = rep.get("max_counted_time", t)
        if c is not None and (r.max_counted_time is None or c > r.max_counted_time):
            r.max_counted_time = c
        h = rep.get("min_hour")
        if h is not None and (r.min_hour is None or h < r.min_hour):
            r.min_hour = h
        h = rep.get("max_hour")
        if h is not None and (r.max_hour is None or h > r.max_hour):
            r.max_hour = h
        b = rep.get("delay_buckets") or []
        if len(r.delay_buckets) < len(b):
            r.delay_buckets.extend([0] * (len(b) - len(r.delay_buckets)))
        for i, n in enumerate(b):
            r.delay_buckets[i] += n
        r.delay_sum_ms += int(rep.get("delay_sum_ms") or 0)
        r.inputs.update(rep.get("inputs") or ())
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


@dataclass(frozen=True)
class Merge:
    """What a merge of an hour's small files did (the ``merged`` event)."""

    hour: int
    files_written: int
    bytes_written: int
    files_merged: int
    bytes_merged: int


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
        fence: dict[str, Any] | None = None,
        source_activity: Callable[[], SourceActivity | None] | None = None,
        activity_stale_ms: int = 60_000,
        source_done: Callable[[set[str]], bool] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.et = event_type
        # seconds on a clock that never steps (time.monotonic in a job): how long the source has been quiet is
        # measured on it; without one (tests driving a fake wall clock), the wall clock stands in for it
        self.monotonic = monotonic or (lambda: clock() / 1000)
        self.writer = writer
        self._attempt_started: int | None = None
        self.guard = guard  # raises if this job may no longer write (it lost its lease)
        self.fence = fence  # what executor tasks check before they write (see event_etl.storage.lease)
        self.source_activity = source_activity  # what the source last said of its backlog and health
        self.activity_stale_ms = activity_stale_ms
        # told, after a batch's state is saved, what the batch read (Pub/Sub acknowledges it); True if all of
        # it was acknowledged in time (else redeliveries are expected: see event_etl.task.dedupe)
        self.source_done = source_done
        # called in a batch once its markers are written (before the ledgers when it completes no hour): a shared
        # engine holds the rest of each type's batch (its state, keys, merges) there until every type of the round
        # has written its markers, so that a round's markers do not queue behind other types' bookkeeping
        self.after_markers: Callable[[], None] | None = None
        self.storage = storage
        self.ckpt = checkpoint
        self.clock = clock
        self.listeners = list(listeners or [])
        # before anything is replayed or judged: what a killed run left half written (see event_etl.storage.temporaries)
        self.swept = sweep_temporaries(storage.path(event_type.name), keep_top=True) if storage.local else []
        if self.swept:
            self._emit("swept", self.swept)
        self.lock = threading.RLock()
        self.state = checkpoint.load_state()
        latest = checkpoint.latest_intent_id()
        self.pending_batch: int | None = latest if latest is not None and latest > self.state.last_batch_id else None
        started = self.started_at = clock()
        self.last_input = started  # the idle timer runs from the last batch holding any record, or the start
        self.quiet_since = started
        self.wm_when_quiet = self.state.watermark
        self._wall_look, self._mono_look = started, self.monotonic()  # the last look at both clocks (a tick)
        self.mono_quiet_start = self._mono_look  # the monotonic instant the source went quiet (see tick)
        self.clock_steps = 0
        self.stopping = False
        self.busy = False
        self.failure: BaseException | None = None
        self.totals: Counter = Counter()
        self.batches = 0
        self.hours_marked: list[int] = []
        self.adopted: list[Manifest] = []
        self.last_batch_at: int | None = None
        self._replaying = False
        # records in small files written to an open hour since its last merge (by hour; a rolling merge is
        # tried when they could fill a file)
        self._unmerged: Counter = Counter()
        self._unmerged_files: Counter = Counter()  # small files batches added to each open hour since its last merge
        self.merges = 0
        self.held = False  # the watermark was held while the source was settling; it catches up once it is not
        self.dedupe = None
        if self.pending_batch is None:
            self.adopted = self._adopt_markers()
            self._drop_marked_ledgers()
        if event_type.dedupe_window > 0:
            from event_etl.task.dedupe import DedupeState

            self.dedupe = DedupeState.from_batches(event_type.dedupe_window, checkpoint.load_dedupe_rows(),
                                                   self._event_clock(self.state))

    # -- listeners -------------------------------------------------------------------------
    def _emit(self, kind: str, payload: Any) -> None:
        for fn in self.listeners:
            fn(kind, payload)

    def _guard(self) -> None:
        if self.guard is not None:
            self.guard()

    # -- micro-batches ---------------------------------------------------------------------
    def handle_batch(self, df, batch_id: int) -> None:
        """``foreachBatch`` callback."""
        # A batch that Spark starts after a stop was requested is processed like any other: refusing
        # it would need an exception inside foreachBatch, which Spark logs as a failed query.  The
        # runner stops the query through the API once no batch runs (see event_etl.job.runner).
        self.run_batch_locked(batch_id, self._spark_tasks(df))

    def run_batch_locked(self, batch_id: int,
                         run_tasks: Callable[[BatchContext, set[int] | None], list[tuple[dict, bytes]]]) -> BatchEvent:
        """:meth:`run_batch` under the controller's lock, marked busy (ticks wait); its error is remembered."""
        try:
            with self.lock:
                self.busy = True
                try:
                    return self.run_batch(batch_id, run_tasks)
                finally:
                    self.busy = False
        except BaseException as err:  # remembered so the job reports the real cause, not Spark's wrapper
            self.failure = err
            raise

    @staticmethod
    def _spark_tasks(df) -> Callable[[BatchContext, set[int] | None], list[tuple[dict, bytes]]]:
        """How a streaming query's batch runs its tasks: ``mapInArrow`` over the batch's split rows."""

        def run_tasks(ctx: BatchContext, shards: set[int] | None) -> list[tuple[dict, bytes]]:
            part = df if shards is None else df.filter(df["shard"].isin(sorted(shards)))
            try:
                # Arrow all the way (not collect(): the key rows are megabytes a batch)
                table = part.mapInArrow(make_task(ctx), REPORT_SCHEMA).toArrow()
            except Exception as err:  # noqa: BLE001 - re-raised, as event_etl's own error when it is one
                raise unwrap_task_error(err) from err
            return [(json.loads(rep), keys or b"") for rep, keys in
                    zip(table.column("report").to_pylist(), table.column("keys").to_pylist())]

        return run_tasks

    def run_batch(self, batch_id: int, run_tasks: Callable[[BatchContext, set[int] | None], list[tuple[dict, bytes]]]
                  ) -> BatchEvent:
        """One micro-batch: intent, tasks (``run_tasks(ctx, shards)`` runs the executor on all or some splits),
        duplicates, ledger, markers, state.  Public so that tests can drive it without Spark."""
        self._guard()
        self._attempt_started = self.clock()
        intent, replayed = self.begin_batch(batch_id)
        self._replaying = replayed
        drop = self.ckpt.load_drops(batch_id) if replayed else {}
        outputs = run_tasks(self.batch_context(intent, drop), None)
        if intent.wm_start is None and intent.reference is None:
            intent, outputs = self._settle_first_batch(intent, drop, outputs, run_tasks)
        rows = None
        if self.dedupe is not None:
            if replayed and self.ckpt.has_drops(batch_id):
                # decided by an earlier attempt, whose files a marker may list already: the dedupe state as
                # reloaded can know keys that attempt did not (a redelivery found again only in its memory)
                from event_etl.task.dedupe import stored_of

                rows = stored_of(keys for _, keys in outputs)
            else:
                outputs, rows, drop = self._drop_duplicates(intent, drop, outputs, run_tasks)
                if not drop:
                    self.ckpt.save_drops(batch_id, {})  # the decision: nothing dropped (before any ledger or marker)
            # the keys of the records dropped as duplicates are remembered too: a message dropped here may be
            # delivered again (its acknowledgement can be lost), and its id key may be gone from the window by then
            dropped = self.ckpt.load_dropped_keys(batch_id)
            if len(dropped):
                from event_etl.task.dedupe import stored

                rows = np.concatenate([stored(rows), dropped])
        if drop:
            self._remove_emptied(intent, drop, [rep for rep, _ in outputs])
        result = summarize([rep for rep, _ in outputs])
        return self.finish_batch(intent, result, replayed=replayed, dedupe_rows=rows)

    def _drop_duplicates(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]], outputs, run_tasks):
        """Find records whose key was written before (in the window) and rewrite their splits without them.

        Returns the final outputs, their key rows (``STORED_DTYPE`` when the batch has no duplicate) and the
        batch's drop list."""
        from event_etl.task.dedupe import find_duplicates, may_hold_duplicates, rows_of, stored_of

        known = self.dedupe.known_before(intent.batch_id)
        blobs = [keys for _, keys in outputs]
        if not may_hold_duplicates(blobs, known):  # the common case, settled on the keys alone
            return outputs, stored_of(blobs), drop
        rows = rows_of(blobs)
        dup = find_duplicates(rows, known)
        if not dup.any():
            return outputs, rows, drop
        self.dedupe.seen_again(rows["key"][dup])  # redeliveries of unacknowledged batches: each comes once
        names = {(rep["shard"], f["file_key"]): f["name"] for rep, _ in outputs for f in rep["files"]}
        names.update({(rep["shard"], rep["deadletter"]["file_key"]): rep["deadletter"]["path"].rsplit("/", 1)[1]
                      for rep, _ in outputs if rep.get("deadletter")})
        new_drop = {k: set(v) for k, v in drop.items()}
        for r in rows[dup]:
            new_drop.setdefault(names[(int(r["shard"]), int(r["file"]))], set()).add(int(r["rec"]))
        frozen = {k: tuple(sorted(v)) for k, v in sorted(new_drop.items())}
        from event_etl.task.dedupe import stored

        earlier = self.ckpt.load_dropped_keys(intent.batch_id)
        self.ckpt.save_dropped_keys(intent.batch_id, np.concatenate([earlier, stored(rows[dup])]))
        self.ckpt.save_drops(intent.batch_id, frozen)  # a replay skips the same records
        shards = {int(s) for s in np.unique(rows[dup]["shard"])}
        again = run_tasks(self.batch_context(intent, frozen), shards)
        faults.point("duplicates_rewritten", str(intent.batch_id))
        outputs = [o for o in outputs if o[0]["shard"] not in shards] + again
        rows = rows_of([keys for _, keys in outputs])
        left = find_duplicates(rows, known)
        if left.any():
            raise IntegrityError(f"batch {intent.batch_id}: {int(left.sum())} duplicates remain after rewriting",
                                 fix="report this as a bug, with the checkpoint's etl/ folder")
        return outputs, rows, frozen

    def _settle_first_batch(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]], outputs, run_tasks):
        """A job's first batch has no watermark: it measures "too late" against the one its own events give,
        the largest counted time over its splits minus the out-of-orderness bound (one reference for
        the whole batch, so that the verdicts do not depend on how the input was split).

        The batch is first run without it; each split reports its largest counted time and its
        earliest event.  Usually no event is that old, and what the splits wrote is exactly what
        they would have written against the reference: the batch goes on, with no second pass over
        its input.  Otherwise the splits that hold such events are written again against it: their
        files of the first run are deleted (nothing records them yet, and their hours are open), then
        the reference is saved in the intent (a replay judges the whole batch against it, and writes
        the same bytes for the other splits), then those splits run again.  Returns the intent and
        the outputs to go on with."""
        et = self.event_type_of(intent)
        counted = [rep["reference"] for rep, _ in outputs if rep.get("reference") is not None]
        if not counted:
            return intent, outputs
        reference = max(counted) - et.out_of_orderness
        affected = {rep["shard"] for rep, _ in outputs if rep.get("earliest") is not None
                    and too_late_in_first_batch(rep["earliest"], reference, et.allowed_lateness)}
        if not affected:
            return intent, outputs
        made = self._made_paths(rep for rep, _ in outputs if rep["shard"] in affected)
        for rel in sorted(made):  # a file already gone (a replay) is no error: delete ignores it
            self._guard()
            self.storage.delete(rel)
        # an hour folder that held only such files goes too (with its day's, if that is empty then): a folder
        # without a marker reads as an hour still open
        for folder in sorted({rel.rsplit("/", 1)[0] for rel in made}, reverse=True):
            if self.storage.remove_empty_folder(folder):
                self.storage.remove_empty_folder(folder.rsplit("/", 1)[0])
        faults.point("first_batch_unwritten", str(intent.batch_id))
        intent = replace(intent, reference=reference)
        self.ckpt.save_intent(intent)
        again = run_tasks(self.batch_context(intent, drop), affected)
        return intent, [out for out in outputs if out[0]["shard"] not in affected] + list(again)

    def _made_paths(self, reports) -> set[str]:
        """The files (data and dead-letter, relative to the sink) that the splits of ``reports`` wrote."""
        made = set()
        for rep in reports:
            made.update(f"{hour_dir(self.et.name, f['hour'])}/{f['name']}" for f in rep["files"])
            if rep.get("deadletter"):
                made.add(rep["deadletter"]["path"])
        return made

    def _remove_emptied(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]], reports: list[dict]) -> None:
        """Delete the batch's files that its duplicates emptied: named in the drop list, but no longer written.

        A first attempt removes them after rewriting; a replay removes what a killed attempt left."""
        made = self._made_paths(reports)
        for name in sorted(drop):
            rel = self._output_path(intent, name)
            if rel is not None and rel not in made and self.storage.exists(rel):
                self._guard()
                self.storage.delete(rel)

    def _output_path(self, intent: BatchIntent, name: str) -> str | None:
        """Where a file of this batch named ``name`` (a data or dead-letter file) lies, relative to the sink."""
        if name.startswith("dl-"):
            m = _DL_NAME_RE.match(name)
            if m is None:
                return None
            rel = deadletter_file_path(self.et.name, intent.started_at, intent.batch_id, int(m.group(1)),
                                       writer=self.writer)
            return rel if rel.endswith("/" + name) else None
        try:
            return f"{hour_dir(self.et.name, parse_data_file_name(name).hour_start)}/{name}"
        except ValueError:
            return None

    def begin_batch(self, batch_id: int) -> tuple[BatchIntent, bool]:
        """Step 1: the batch's intent, new or (for a replay) as first written.  Returns ``(intent, replayed)``.

        A job's first batch (no watermark yet) has no "too late" reference in its intent until
        :meth:`_settle_first_batch` finds that it needs one."""
        intent = self.ckpt.load_intent(batch_id)
        if intent is not None:
            self.pending_batch = batch_id
            return intent, True
        if batch_id <= self.state.last_batch_id:
            raise IntegrityError(
                f"Spark replays batch {batch_id}, which finished before and whose intent is gone",
                fix="the checkpoint's etl/ and spark/ parts do not belong together; restore both or start anew",
            )
        settings = {k: getattr(self.et, k) for k in FROZEN_SETTINGS}
        intent = BatchIntent(batch_id, self.state.watermark, self.clock(), settings)
        self.ckpt.save_intent(intent)
        self.pending_batch = batch_id
        return intent, False

    def event_type_of(self, intent: BatchIntent) -> EventType:
        """The event type as the batch was first judged: its frozen settings and schema over today's."""
        if not intent.settings:
            return self.et
        frozen = {k: v for k, v in intent.settings.items() if k in FROZEN_SETTINGS}
        frozen.setdefault("schema_versions", ())  # an intent from before schema versions accepted its schema only
        frozen.setdefault("max_backfill", 0)  # an intent from before max_backfill judged with no bound
        return replace(self.et, **frozen)

    def batch_context(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]] | None = None) -> BatchContext:
        """What the executor tasks of the batch are handed."""
        sealed, merged_away = None, frozenset()
        if self._replaying:
            # A replay (its first attempt died after writing) leaves alone what became of its files since:
            # hours marked complete, and files merged into larger ones (see event_etl.rules.compaction).
            sealed = self.state.marked_through
            merged_away = frozenset(n for h in self.ckpt.ledger_hours() for members, _ in self.ckpt.read_merges(h)
                                    for n in members)
        return BatchContext(self.event_type_of(intent), self.storage.url, intent.batch_id, intent.wm_start,
                            intent.started_at, dict(drop or {}), self.writer, reference=intent.reference,
                            fence=self.fence, sealed_through=sealed, merged_away=merged_away)

    def finish_batch(self, intent: BatchIntent, result: BatchResult, *, replayed: bool = False,
                     dedupe_rows: np.ndarray | None = None) -> BatchEvent:
        """Steps 3 to 5 of a batch."""
        batch_id = intent.batch_id
        faults.point("files_written", str(batch_id))
        new = self.state.after_batch(
            batch_id=batch_id,
            wm_start=intent.wm_start,
            batch_max_event_time=result.max_event_time,
            batch_max_counted=result.max_counted_time,
            batch_min_hour=result.min_hour,
            batch_max_hour=result.max_hour,
            out_of_orderness=self.event_type_of(intent).out_of_orderness,
        )
        new = self._hold_or_catch_up(new)
        marks = bool(hours_to_mark(new.first_hour, new.marked_through, new.watermark))
        if not marks:
            self._markers_done()
        for hour, entries in sorted(result.files.items()):
            if self.state.marked_through is not None and hour <= self.state.marked_through:
                continue  # a replay of a batch whose hours were marked: the ledger is gone on purpose
            self.ckpt.write_ledger(hour, batch_id, entries)
        now = self.clock()
        new, marked = self._mark(new, now)
        if marks:
            self._markers_done()
        if self.dedupe is not None and dedupe_rows is not None:
            # before the state: a batch whose state is saved must have its keys remembered
            from event_etl.task.dedupe import STORED_DTYPE, stored

            kept = dedupe_rows if dedupe_rows.dtype == STORED_DTYPE else stored(dedupe_rows)
            self.ckpt.save_dedupe_rows(batch_id, kept)
            self.dedupe.add(batch_id, kept, acked=False)
        advance = 0 if self.state.watermark is None or new.watermark is None else new.watermark - self.state.watermark
        self._commit_state(new, marked)
        self._rolling_merges(result, self.event_type_of(intent).max_events_per_file, advance)
        if result.inputs and self.source_done is not None:
            acked = self.source_done(result.inputs)  # Pub/Sub: acknowledged now, not at the next batch
            if self.dedupe is not None and acked:
                self.ckpt.mark_dedupe_acked(batch_id)
                self.dedupe.mark_acked(batch_id, True)
        elif self.dedupe is not None:
            self.dedupe.mark_acked(batch_id, True)
        if self.dedupe is not None:
            for gone in self.dedupe.evict(self._event_clock(new)):
                self.ckpt.drop_dedupe_rows(gone)
        if batch_id >= 2:
            self.ckpt.prune_intents(batch_id - 2, sweep=self.batches == 0)  # a full sweep once a run
        self.pending_batch = None
        if result.events_in:  # any record shows the source is alive: late, invalid and duplicate ones too
            self.last_input = now
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

    def _settling(self) -> bool:
        """Whether the source says input a killed run held may still come back (see SourceActivity.settling)."""
        activity = self.source_activity() if self.source_activity is not None else None
        return bool(activity is not None and activity.settling and activity.updated_at >= self.started_at)

    def _hold_or_catch_up(self, new: WatermarkState) -> WatermarkState:
        """While the source is settling the watermark holds where it was (events still count in the state's
        maxima); once it is not, it catches up with the events seen meanwhile."""
        if self._settling():
            self.held = True
            return replace(new, watermark=self.state.watermark)
        if self.held and new.max_counted_time is not None:
            self.held = False
            return new.with_watermark(new.max_counted_time - self.et.out_of_orderness)
        return new

    def _markers_done(self) -> None:
        """The batch wrote the markers it completes (or completes none): tell :attr:`after_markers`."""
        if self.after_markers is not None:
            self.after_markers()

    def _event_clock(self, state: WatermarkState) -> int | None:
        """How far event time has come, for forgetting old keys: the watermark the events alone
        would give (each counted at most up to its arrival).  A drain or an idle advance moves the
        watermark without new events; forgetting by it would let the copies of events sent just
        before a redeploy through."""
        if state.event_clock is None:
            return None
        return state.event_clock - self.et.out_of_orderness

    # -- markers ---------------------------------------------------------------------------
    def _mark(
        self, state: WatermarkState, now: int, closed_by: str = "watermark"
    ) -> tuple[WatermarkState, list[Manifest]]:
        """Mark the hours ``state`` completes (at most a step's worth, oldest first).

        ``closed_by`` (recorded in each manifest) says what moved the watermark past the hour:
        ``watermark`` (events), ``idle`` (a quiet source, by the clock) or ``drain`` (end of input)."""
        marked = []
        for hour in hours_to_mark(state.first_hour, state.marked_through, state.watermark):
            self._guard()
            faults.point("before_marker", str(hour))
            marked.append(self._write_marker(hour, state.watermark, now, state.last_batch_id, closed_by))
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

    def _adopt_markers(self) -> list[Manifest]:
        """Markers this job wrote after its last saved state (it was killed in between): take them as written.

        Markers are written oldest first, so they are the hours right after ``marked_through``
        that hold one.  Each must list exactly the files of this job's ledger; the watermark
        moves to the one that completed them."""
        st = self.state
        if st.first_hour is None:
            return []
        hour = st.first_hour if st.marked_through is None else max(st.first_hour, st.marked_through + HOUR_MS)
        adopted: list[Manifest] = []
        while True:
            rel = f"{hour_dir(self.et.name, hour)}/{MARKER_NAME}"
            try:
                data = self.storage.read(rel)
            except FileNotFoundError:
                break
            m = Manifest.from_bytes(data)
            entries = self.ckpt.read_ledger(hour)
            if set(m.files) != set(entries):
                raise IntegrityError(
                    f"{self.storage.display(rel)} lists other files than this job wrote "
                    f"({compare_listing(entries, {f.name: f.bytes for f in m.files}).describe()})",
                    fix="another job wrote this hour: make sure only one job writes each event type to each sink",
                )
            adopted.append(m)
            hour += HOUR_MS
        if adopted:
            new = replace(st.with_watermark(max(m.watermark for m in adopted)), marked_through=adopted[-1].hour)
            # The step that wrote them (a tick or a drain) was killed before it had marked every hour that watermark
            # completes: finish it now, before a batch judges events by that watermark (late for an hour not marked)
            new, rest = self._mark(new, self.clock(), adopted[-1].extra.get("closed_by", "watermark"))
            self._commit_state(new, adopted + rest)
            self._emit("adopted", adopted)
        return adopted

    def _drop_marked_ledgers(self) -> None:
        """Ledgers of hours marked and saved that a kill left (in the middle of dropping one): nothing reads them."""
        done = self.state.marked_through
        for hour in self.ckpt.ledger_hours() if done is not None else []:
            if hour <= done:
                self.ckpt.drop_ledger(hour)

    def _write_marker(self, hour: int, watermark: int, now: int, last_batch: int, closed_by: str) -> Manifest:
        rel_dir = hour_dir(self.et.name, hour)
        listing = self.storage.list_files(rel_dir)
        marker_rel = f"{rel_dir}/{MARKER_NAME}"
        existing = None
        if MARKER_NAME in listing:
            existing = Manifest.from_bytes(self.storage.read(marker_rel))
        else:
            for name in list(listing):
                if name.startswith(".") and name.endswith(".tmp"):
                    self.storage.delete(f"{rel_dir}/{name}")  # leftovers of attempts killed mid-write
                    del listing[name]
            if self._merge_hour(hour, listing, final=True):
                listing = self.storage.list_files(rel_dir)
        entries = self.ckpt.read_ledger(hour)
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
            extra={"last_batch": last_batch, "closed_by": closed_by},
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

    # -- merging small files ----------------------------------------------------------------
    def _rolling_merges(self, result: "BatchResult", per_file: int, advance: int = 0) -> None:
        """After a batch is saved: merge an open hour's small files once they could fill a file (of the batch's
        ``max_events_per_file``: a replay merges as its first attempt did), or are many; and as soon as there
        are two of a kind when the watermark, moving ``advance`` ms a batch, closes the hour within a few
        batches: so that the hour reaches its marker within the file bound, with no merge on the marker's path."""
        for hour, entries in sorted(result.files.items()):
            if self.state.marked_through is not None and hour <= self.state.marked_through:
                continue
            small = [e for e in entries if e.records < per_file]
            self._unmerged[hour] += sum(e.records for e in small)
            self._unmerged_files[hour] += len(small)
            closing = closing_soon(hour, self.state.watermark, advance)
            if (self._unmerged[hour] >= per_file or self._unmerged_files[hour] >= ROLLING_FILES
                    or (closing and small)):
                self._merge_hour(hour, self.storage.list_files(hour_dir(self.et.name, hour)), final=False,
                                 per_file=per_file, max_files=2 if closing else ROLLING_FILES)
                self._unmerged[hour] = self._unmerged_files[hour] = 0
        for hour in [h for h in self._unmerged if self.state.marked_through is not None
                     and h <= self.state.marked_through]:
            del self._unmerged[hour]
            self._unmerged_files.pop(hour, None)

    def _settle_merges(self, hour: int, listing: dict[str, int]) -> bool:
        """Finish what a merge killed midway left: delete merged-away members still there, and merged files no
        merge recorded (written by a merge that died before recording it).  True if anything was deleted."""
        rel_dir = hour_dir(self.et.name, hour)
        self.ckpt.project_merges(hour)  # a kill may have come between recording a merge and projecting it
        current = {e.name for e in self.ckpt.read_ledger(hour)}
        away = {n for members, _ in self.ckpt.read_merges(hour) for n in members}
        gone = [n for n in sorted(listing) if n not in current and (n in away or is_merged_name(n))]
        for name in gone:
            self._guard()
            self.storage.delete(f"{rel_dir}/{name}")
        return bool(gone)

    def _merge_hour(self, hour: int, listing: dict[str, int], *, final: bool, per_file: int | None = None,
                    max_files: int = ROLLING_FILES) -> bool:
        """Merge the hour's small files (all of them when ``final``, before its marker, if the hour holds more
        files than the bound; else only when they fill a file or are ``max_files``).  True if the hour's files
        changed.  A merge that cannot be done is skipped, never fatal: the hour keeps its files."""
        import hashlib

        from event_etl.storage.compaction import MergeError, merge_containers

        rel_dir = hour_dir(self.et.name, hour)
        changed = self._settle_merges(hour, listing)
        per_file = per_file or self.et.max_events_per_file
        for members in merge_groups(self.ckpt.read_ledger(hour), per_file, final=final, max_files=max_files):
            generation = len(self.ckpt.read_merges(hour))
            if generation > MAX_GENERATION:
                return changed
            datas = []
            for e, data in zip(members, self._each_file(self.storage.read, rel_dir, members)):
                if len(data) != e.bytes or hashlib.sha256(data).hexdigest() != e.sha256:
                    self._emit("merge_skipped", (hour, f"{e.name} is not as written"))
                    return changed
                datas.append((e.name, data))
            try:
                outputs = merge_containers(datas, per_file,
                                           lambda seq: merged_file_name(members, generation, seq, self.writer))
            except MergeError as err:
                self._emit("merge_skipped", (hour, str(err)))
                continue
            merged = []
            for name, data, n in outputs:
                self._guard()
                faults.point("merge_write", f"{rel_dir}/{name}")
                self.storage.write_atomic(f"{rel_dir}/{name}", data)
                merged.append(FileEntry(name, n, len(data), hashlib.sha256(data).hexdigest(), members[0].late,
                                        members[0].schema_fingerprint))
            faults.point("merged_written", str(hour))
            self.ckpt.save_merge(hour, generation, [e.name for e in members], merged)
            faults.point("merge_recorded", str(hour))
            self._guard()
            # not synced one by one: members a power cut brings back are deleted again by the next merge or the
            # marker (whose own sync comes first)
            self._each_file(lambda rel: self.storage.delete(rel, durable=False), rel_dir, members)
            self.merges += 1
            changed = True
            self._emit("merged", Merge(hour, len(merged), sum(e.bytes for e in merged), len(members),
                                       sum(e.bytes for e in members)))
        return changed

    def _each_file(self, fn: Callable[[str], T], rel_dir: str, entries: Sequence[FileEntry]) -> list[T]:
        """``fn`` (a storage read or delete) on each file of ``entries``, several requests at a time, results
        in order.  An object store answers each request after tens of milliseconds: one after another, the
        hundreds of small files of a quiet type's hour would hold its marker back for tens of seconds."""
        paths = [f"{rel_dir}/{e.name}" for e in entries]
        if self.storage.local or len(paths) < 2:
            return [fn(p) for p in paths]
        from concurrent.futures import ThreadPoolExecutor

        workers = min(MERGE_REQUESTS, len(paths))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="event_etl-merge") as pool:
            return list(pool.map(fn, paths))

    def unmarked_complete_hours(self) -> bool:
        """Whether hours the watermark has passed still wait for their marker (a jump of event time)."""
        st = self.state
        return bool(hours_to_mark(st.first_hour, st.marked_through, st.watermark, limit=1))

    # -- between batches -------------------------------------------------------------------
    def tick(self) -> list[Manifest]:
        """Advance the watermark of a quiet source and mark the hours it completes.

        The source is quiet (:func:`event_etl.rules.watermark.quiet_since`) when no batch held any
        record, and it reports no backlog and no outage, for the type's idle timeout."""
        with self.lock:
            if self.busy or self.pending_batch is not None:
                return []
            now = self.clock()
            mono = self.monotonic()
            step = clock_step(self._wall_look, self._mono_look, now, mono)
            if step:  # what this run remembers of the wall clock moves with it (quiet_start bounds the rest)
                self.clock_steps += 1
                self.started_at += step
                self.quiet_since += step
                self.last_input += step
                self._emit("clock_step", step)
            activity = None
            if self.source_activity is None:  # no source reports (tests driving batches by hand): batches only
                since = max(self.quiet_since, self.last_input)
            else:
                activity = self.source_activity()
                if activity is not None and activity.updated_at < self.started_at:
                    activity = None  # a report of the run before this one says nothing about now
                since = max(self.quiet_since,
                            quiet_since(self.last_input, activity, now=now, stale_after=self.activity_stale_ms))
            if since != self.quiet_since:  # not quiet after all: the idle timer starts again from here
                self.quiet_since = since
                self.wm_when_quiet = self.state.watermark
                self.mono_quiet_start = quiet_start(since, now, mono_now=mono, mono_last_look=self._mono_look)
            self._wall_look, self._mono_look = now, mono
            # quiet for the monotonic time since then: a step of the wall clock moves nothing
            wm = idle_advance(
                self.state.watermark,
                quiet_for=int((mono - self.mono_quiet_start) * 1000),
                watermark_when_quiet=self.wm_when_quiet,
                idle_timeout=self.et.idle_timeout,
            )
            if activity is not None and activity.settling:
                self.held = True
                return []  # a killed run's input may still come back: nothing moves, nothing is marked
            caught_up = self.held
            if caught_up:
                wm = self._hold_or_catch_up(self.state.with_watermark(wm)).watermark
            if (wm is None or wm == self.state.watermark) and not self.unmarked_complete_hours():
                return []
            self._guard()
            faults.point("idle_advance", str(wm))
            before = self.state.watermark
            closed_by = "idle" if wm != before and not caught_up else "watermark"
            new, marked = self._mark(self.state.with_watermark(wm), now, closed_by)
            self._commit_state(new, marked)
            if new.watermark != before or marked:
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
            self._guard()
            faults.point("drain", str(self.state.last_batch_id))
            st = self.state
            wm = drain_watermark(st.watermark, st.max_event_time, st.last_hour)
            if wm is None:
                return []
            new = st.with_watermark(wm)
            marked: list[Manifest] = []
            while True:  # a step at a time (a jump of event time can complete thousands of hours)
                new, step = self._mark(new, self.clock(), "drain")
                self._commit_state(new, step)
                marked.extend(step)
                if not step:
                    break
            self._emit("drain", new)
            return marked

    def request_stop(self) -> None:
        """Note that the job stops; the runner stops the query once no batch runs (see event_etl.job.stopping)."""
        with self.lock:
            self.stopping = True


_DL_NAME_RE = re.compile(r"^dl-(?:w[0-9a-f]{6}-)?b\d{10}-s(\d{4})\.avro$")
