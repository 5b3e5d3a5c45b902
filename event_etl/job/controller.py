"""The driver's side of a job: judging batches against a fixed watermark, ledger, markers, idleness, drain.

:class:`Controller` runs each micro-batch of one event type (:meth:`Controller.batch_phases`, driven by the
shared engine's round, :mod:`event_etl.job.engine`) and, between batches, the job's idle ticks and drain (``tick``,
``drain``).  A lock makes them take turns.  Per batch, in this order, each step durable before the next:

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

The controller holds its steps as collaborators, each given at construction what it works with and handed the
batch's intent, context and outputs: :class:`~event_etl.job.rewrites.Rewriter` (a first batch's rewrite, files
emptied by duplicates), :class:`~event_etl.job.rewrites.Duplicates` (the window of keys: duplicates found and their
splits rewritten, keys remembered and forgotten), :class:`~event_etl.job.markers.MarkerWriter` (markers, adopted
markers) and :class:`~event_etl.job.merges.Merger` (rolling and final merges); the idle timers are its
:class:`~event_etl.job.idle.IdleClock` (``idle``).  The controller keeps the state (``state``, saved only by
:meth:`Controller._commit_state`) and the intent; a batch reads top to bottom in :meth:`Controller.batch_phases`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from event_etl import faults
from event_etl.errors import IntegrityError
from event_etl.eventtypes import EventType
from event_etl.job.checkpoint import FROZEN_SETTINGS, BatchIntent, Checkpoint
from event_etl.job.context import TypeContext, Writer
from event_etl.job.idle import IdleClock, IdleSettings
from event_etl.job.markers import MarkerWriter
from event_etl.job.merges import Merger
from event_etl.job.phases import MARKED, Phases, RunTasks, Tasks, drive
from event_etl.job.rewrites import Drops, Duplicates, Rewriter
from event_etl.rules.completeness import hours_to_mark
from event_etl.rules.manifest import Manifest
from event_etl.rules.watermark import WatermarkState, drain_watermark, parts_watermark
from event_etl.sources.face import SourceHooks
from event_etl.storage import Storage
from event_etl.storage.temporaries import sweep_temporaries
from event_etl.task.executor import BatchContext
from event_etl.task.report import BatchResult, summarize

__all__ = ["Controller", "BatchEvent", "IDLE_SAVE_S"]

IDLE_SAVE_S = 30.0
"""Seconds: the longest a quiet type's idle watermark stays unsaved while it completes no hour (see
:meth:`Controller.tick`)."""


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
    lost: dict[int, int] = field(default_factory=dict)
    """Input records the source lost before this batch could read them, by partition (Kafka records deleted by
    retention, skipped with ``EVENT_ETL_KAFKA_ON_DATA_LOSS=skip``); empty for other sources."""


class Controller:
    """Drives one event type's job on the driver.  See the module docstring; its steps are its collaborators
    ``rewriter``, ``duplicates``, ``markers`` and ``merger`` (:mod:`~event_etl.job.rewrites`,
    :mod:`~event_etl.job.markers`, :mod:`~event_etl.job.merges`), its idle timers ``idle``
    (:mod:`~event_etl.job.idle`: given the ``source``'s activity and the ``idle`` settings); its source's hooks
    ``source`` (:class:`~event_etl.sources.face.SourceHooks`), given once; ``writer``, the job as a writer of its
    sink (:class:`~event_etl.job.context.Writer`: its name in the files, its lease's guard and fence)."""

    def __init__(
        self,
        *,
        event_type: EventType,
        storage: Storage,
        checkpoint: Checkpoint,
        clock: Callable[[], int],
        listeners: list[Callable[[str, Any], None]] | None = None,
        writer: Writer | None = None,
        source: SourceHooks | None = None,
        idle: IdleSettings | None = None,
    ) -> None:
        writer, idle = writer or Writer(), idle or IdleSettings()
        self.et = event_type
        self.writer = writer.name
        self._attempt_started: int | None = None
        self.guard = writer.guard  # raises if this job may no longer write (it lost its lease)
        self.fence = writer.fence  # what executor tasks check before they write (see event_etl.storage.lease)
        # the source's hooks (event_etl.sources.face.SourceHooks), given once: what it says of its backlog (the
        # idle rule), told what a saved batch read (Pub/Sub acknowledges it), what it lost before a batch read it
        self.source = source
        self.storage = storage
        self.ckpt = checkpoint
        self.clock = clock
        self.listeners = list(listeners or [])
        # the steps, each given the type's context (the guard and the listeners as the controller's own, which
        # a job may change after construction); not a batch's BatchContext, the ``ctx`` of batch_phases
        self.ctx = TypeContext(event_type=event_type, storage=storage, checkpoint=checkpoint, clock=clock,
                               writer=writer.name, guard=self._guard, emit=self._emit)
        self.merger = Merger(self.ctx)
        self.markers = MarkerWriter(self.ctx, merger=self.merger)
        self.rewriter = Rewriter(self.ctx)
        self.duplicates: Duplicates | None = None  # the window of keys, for a type with a dedupe window (below)
        # before anything is replayed or judged: what a killed run left half written (see event_etl.storage.temporaries)
        self.swept = sweep_temporaries(storage.path(event_type.name), keep_top=True) if storage.local else []
        if self.swept:
            self._emit("swept", self.swept)
        self.lock = threading.RLock()
        self.state = checkpoint.load_state()
        latest = checkpoint.latest_intent_id()
        self.pending_batch: int | None = latest if latest is not None and latest > self.state.last_batch_id else None
        # how long the source (and each part the state knows) has been quiet, from now
        self.idle = IdleClock(clock=clock, monotonic=idle.monotonic,
                              source_activity=source.activity if source is not None else None,
                              activity_stale_ms=idle.activity_stale_ms, parts=self.state.parts,
                              watermark=self.state.watermark, emit=self._emit)
        self.busy = False
        self._saved_at = self.idle.monotonic()  # when the state was last saved (loaded: as good as saved)
        self.failure: BaseException | None = None
        self.totals: Counter[str] = Counter()
        self.batches = 0
        self.hours_marked: list[int] = []
        self.adopted: list[Manifest] = []
        self.last_batch_at: int | None = None
        self._replaying = False
        self.held = False  # the watermark was held while the source was settling; it catches up once it is not
        if self.pending_batch is None:
            self.adopted = self._adopt_markers()
            self.markers.drop_marked_ledgers(self.state.marked_through)
        if event_type.dedupe_window > 0:
            self.duplicates = Duplicates.load(self.ctx, self._event_clock(self.state))

    @property
    def merges(self) -> int:
        """The merges of small files this run did."""
        return self.merger.merges

    # -- listeners -------------------------------------------------------------------------
    def _emit(self, kind: str, payload: Any) -> None:
        for fn in self.listeners:
            fn(kind, payload)

    def _guard(self) -> None:
        if self.guard is not None:
            self.guard()

    # -- micro-batches ---------------------------------------------------------------------
    @contextmanager
    def turn(self) -> Iterator[None]:
        """A batch's turn: under the controller's lock, marked busy (ticks wait); its error is remembered, so that
        the job reports the real cause, not Spark's wrapper."""
        try:
            with self.lock:
                self.busy = True
                try:
                    yield
                finally:
                    self.busy = False
        except BaseException as err:
            self.failure = err
            raise

    def run_batch(self, batch_id: int, run_tasks: RunTasks) -> BatchEvent:
        """One micro-batch, its phases (:meth:`batch_phases`) driven one after the other: ``run_tasks(ctx, shards)``
        runs the executor on all or some splits.  Public so that tests can drive it without Spark."""
        event: BatchEvent = drive(self.batch_phases(batch_id), run_tasks)
        return event

    def batch_phases(self, batch_id: int) -> Phases:
        """One micro-batch as its phases, in order (a generator; :func:`drive` or the shared engine runs it):

        1. **intent**: written, or read back for a replay (:meth:`begin_batch`), with the drop list a replay
           finds; the context of the batch's tasks (:meth:`batch_context`) comes from it;
        2. **tasks**: it yields :class:`Tasks` (all its splits) and is sent their outputs;
        3. **settle**: a first batch's too-late rewrite (``rewriter``) and the duplicates' rewrite (``duplicates``)
           may yield :class:`Tasks` again (some splits, the same context with their decision), each decision
           recorded before; then the files duplicates emptied are removed;
        4. **mark**: ledgers, watermark, markers (``markers``); then it yields :data:`MARKED` (an engine running
           several batches lets every one of them write its markers before any goes on);
        5. **commit**: dedupe keys, the state (the batch is done), then after-commit work: merges (``merger``),
           the source told what the batch read, old keys and intents forgotten; it returns the
           :class:`BatchEvent`."""
        self._guard()
        self._attempt_started = self.clock()
        intent, replayed = self.begin_batch(batch_id)
        self._replaying = replayed
        drop: Drops = self.ckpt.load_drops(batch_id) if replayed else {}
        ctx = self.batch_context(intent, drop)
        outputs = yield Tasks(ctx, None)
        assert outputs is not None, "a batch's tasks were run"
        ctx = self._schemas_learned(ctx, outputs)
        if intent.wm_start is None and intent.reference is None:
            intent, outputs = yield from self.rewriter.settle_first_batch(intent, ctx, outputs)
            ctx = replace(ctx, reference=intent.reference)  # later tasks of the batch run against it too
        rows = None
        if self.duplicates is not None:
            outputs, rows, drop = yield from self.duplicates.settle(intent, ctx, drop, outputs, replayed=replayed)
        if drop:
            self.rewriter.remove_emptied(intent, drop, [rep for rep, _ in outputs])
        result = summarize([rep for rep, _ in outputs])
        event: BatchEvent = yield from self._finish_phases(intent, result, replayed=replayed, dedupe_rows=rows)
        return event

    def _schemas_learned(self, ctx: BatchContext, outputs: list[tuple[dict[str, Any], bytes]]) -> BatchContext:
        """The registry schemas the tasks fetched, kept in the checkpoint before the batch is marked (a replay
        reads with them, without the registry); the context of the batch's later tasks holds them too."""
        learned: dict[str, Any] = {}
        for rep, _ in outputs:
            learned.update(rep.get("schemas") or {})
        if not learned:
            return ctx
        self.ckpt.keep_registry_schemas(learned)
        return replace(ctx, registry={**ctx.registry, **learned})

    def begin_batch(self, batch_id: int) -> tuple[BatchIntent, bool]:
        """Step 1: the batch's intent, new or (for a replay) as first written.  Returns ``(intent, replayed)``.

        A job's first batch (no watermark yet) has no "too late" reference in its intent until
        :meth:`Rewriter.settle_first_batch <event_etl.job.rewrites.Rewriter.settle_first_batch>` finds that it
        needs one."""
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
        return intent.judged_with(self.et)

    def batch_context(self, intent: BatchIntent, drop: Drops | None = None) -> BatchContext:
        """What the executor tasks of the batch are handed."""
        sealed, merged_away = None, frozenset[str]()
        if self._replaying:
            # A replay (its first attempt died after writing) leaves alone what became of its files since:
            # hours marked complete, and files merged into larger ones (see event_etl.rules.compaction).
            sealed = self.state.marked_through
            merged_away = frozenset(n for h in self.ckpt.ledger_hours() for members, _ in self.ckpt.read_merges(h)
                                    for n in members)
        et = self.event_type_of(intent)
        registry = self.ckpt.registry_schemas() if et.schema_registry else {}
        return BatchContext(et, self.storage.url, intent.batch_id, intent.wm_start,
                            intent.started_at, dict(drop or {}), self.writer, reference=intent.reference,
                            fence=self.fence, sealed_through=sealed, merged_away=merged_away, registry=registry)

    def finish_batch(self, intent: BatchIntent, result: BatchResult, *, replayed: bool = False,
                     dedupe_rows: np.ndarray | None = None) -> BatchEvent:
        """Steps 3 to 5 of a batch (the module docstring): its mark and commit phases, at once."""
        event: BatchEvent = drive(self._finish_phases(intent, result, replayed=replayed, dedupe_rows=dedupe_rows),
                                  None)
        return event

    def _finish_phases(self, intent: BatchIntent, result: BatchResult, *, replayed: bool,
                       dedupe_rows: np.ndarray | None) -> Generator[str, None, BatchEvent]:
        """The mark and commit phases of a batch (:meth:`batch_phases`)."""
        batch_id = intent.batch_id
        faults.point("files_written", str(batch_id))
        new = self._hold_or_catch_up(self._state_after(intent, result))
        marks = bool(hours_to_mark(new.first_hour, new.marked_through, new.watermark))
        if not marks:
            yield MARKED  # it completes no hour: its markers are done before its ledgers
        self._write_ledgers(batch_id, result)
        now = self.clock()
        new, marked = self.markers.mark(new, now)
        if marks:
            yield MARKED
        if self.duplicates is not None and dedupe_rows is not None:
            self.duplicates.remember(batch_id, dedupe_rows)  # before the state, which relies on them
        advance = 0 if self.state.watermark is None or new.watermark is None else new.watermark - self.state.watermark
        self._commit_state(new, marked)
        self._after_commit(intent, result, advance)
        return self._batch_done(intent, result, marked, now=now, replayed=replayed)

    def _state_after(self, intent: BatchIntent, result: BatchResult) -> WatermarkState:
        """The state after the batch (the watermark its events give, before any hold)."""
        mono = self.idle.heard(result.parts)
        return self.state.after_batch(
            batch_id=intent.batch_id,
            wm_start=intent.wm_start,
            times=result.times,
            out_of_orderness=self.event_type_of(intent).out_of_orderness,
            parts_quiet_for=self.idle.parts_quiet_for(mono),
            idle_timeout=self.et.idle_timeout,
        )

    def _write_ledgers(self, batch_id: int, result: BatchResult) -> None:
        """The batch's files in the ledger of their hour (not those of hours marked since: a replay)."""
        for hour, entries in sorted(result.files.items()):
            if self.state.marked_through is not None and hour <= self.state.marked_through:
                continue  # a replay of a batch whose hours were marked: the ledger is gone on purpose
            self.ckpt.write_ledger(hour, batch_id, entries)

    def _commit_state(self, new: WatermarkState, marked: list[Manifest]) -> None:
        """Save ``new`` (with the hours ``marked`` for it): from here on it is the controller's state."""
        self.ckpt.save_state(new)
        self._saved_at = self.idle.monotonic()
        faults.point("state_saved", str(new.last_batch_id))
        self.state = new
        for m in marked:
            self.ckpt.drop_ledger(m.hour)
            self.hours_marked.append(m.hour)
            self._emit("marker", m)

    def _after_commit(self, intent: BatchIntent, result: BatchResult, advance: int) -> None:
        """Once the batch's state is saved: rolling merges, the source told what the batch read, the keys and the
        intents the job no longer needs forgotten."""
        batch_id = intent.batch_id
        self.merger.rolling_merges(result, self.state, self.event_type_of(intent).max_events_per_file, advance)
        # Pub/Sub: acknowledged now, not at the next batch; True if all of it was acknowledged in time (else
        # redeliveries are expected: see event_etl.task.dedupe); None: a source with nothing to acknowledge
        answer = self.source.acknowledge(result.inputs) if result.inputs and self.source is not None else None
        told, acked = (answer is not None), (answer is None or answer)
        if self.duplicates is not None:
            if acked:
                self.duplicates.acknowledged(batch_id, durable=told)
            self.duplicates.forget(self._event_clock(self.state))
        if batch_id >= 2:
            self.ckpt.prune_intents(batch_id - 2, sweep=self.batches == 0)  # a full sweep once a run

    def _batch_done(self, intent: BatchIntent, result: BatchResult, marked: list[Manifest], *, now: int,
                    replayed: bool) -> BatchEvent:
        """The batch is no longer pending: counted, and told to the listeners."""
        self.pending_batch = None
        if result.events_in:  # any record shows the source is alive: late, invalid and duplicate ones too
            self.idle.input_seen(now)
        self.batches += 1
        self.totals.update(result.counts)
        self.totals["deadlettered"] += result.deadlettered
        self.totals["files"] += result.files_written
        self.totals["bytes"] += result.bytes_written
        if result.dropped_fields:  # Protobuf fields schema.desc does not know: dropped, counted, said
            self.totals["dropped_fields"] += result.dropped_fields
        lost = self.source.lost(intent.batch_id) if self.source is not None else {}
        if lost:
            self.totals["lost"] += sum(lost.values())
        self.last_batch_at = now
        event = BatchEvent(intent.batch_id, result, self.state, marked, intent.started_at, now, replayed,
                           self._attempt_started or intent.started_at, lost)
        self._emit("batch", event)
        return event

    def _hold_or_catch_up(self, new: WatermarkState) -> WatermarkState:
        """While the source is settling the watermark holds where it was (events still count in the state's
        maxima), and in a replay no lower than the markers its first attempt wrote (a kill between them and the
        state: those hours are complete for everyone already); once it is not, it catches up with the events seen
        meanwhile."""
        if self.idle.settling():
            self.held = True
            held = self.state.watermark
            if self._replaying:  # its first attempt may have marked hours before a kill took it (state unsaved):
                written = self.markers.written_after(self.state)  # they are out; no lower than what completed them
                if written:
                    top = max(m.watermark for m in written)
                    held = top if held is None else max(held, top)
            return replace(new, watermark=held)
        if self.held and new.max_counted_time is not None:
            self.held = False
            return new.with_watermark(new.max_counted_time - self.et.out_of_orderness)
        return new

    def _event_clock(self, state: WatermarkState) -> int | None:
        """How far event time has come, for forgetting old keys: the watermark the events alone
        would give (each counted at most up to its arrival).  A drain or an idle advance moves the
        watermark without new events; forgetting by it would let the copies of events sent just
        before a redeploy through."""
        if state.event_clock is None:
            return None
        clock = state.event_clock
        if state.parts:
            # Partitions (Kafka) are read by count, each at its own pace in event time: a producer's retry on a
            # partition behind the others comes after the others' later events.  A key is kept until every live
            # partition has passed it (a quiet one stops holding it back after idle_timeout, as for the watermark).
            slowest = parts_watermark(state.parts, self.idle.parts_quiet_for(), out_of_orderness=0,
                                      idle_timeout=self.et.idle_timeout)
            clock = clock if slowest is None else min(clock, slowest)
        return clock - self.et.out_of_orderness

    # -- markers ---------------------------------------------------------------------------
    def _adopt_markers(self) -> list[Manifest]:
        """Markers this job wrote after its last saved state (it was killed in between): taken as written, the
        watermark moves to the one that completed them (see :meth:`MarkerWriter.written_after
        <event_etl.job.markers.MarkerWriter.written_after>`)."""
        adopted = self.markers.written_after(self.state)
        if adopted:
            new = replace(self.state.with_watermark(max(m.watermark for m in adopted)), marked_through=adopted[-1].hour)
            # The step that wrote them (a tick or a drain) was killed before it had marked every hour that watermark
            # completes: finish it now, before a batch judges events by that watermark (late for an hour not marked)
            new, rest = self.markers.mark(new, self.clock(), adopted[-1].extra.get("closed_by", "watermark"))
            self._commit_state(new, adopted + rest)
            self._emit("adopted", adopted)
        return adopted

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
            mono, activity = self.idle.look(now, self.state.watermark)
            wm = self.idle.idle_watermark(mono, self.state.watermark, self.state.parts,
                                          idle_timeout=self.et.idle_timeout, out_of_orderness=self.et.out_of_orderness)
            if activity is not None and activity.settling:
                self.held = True
                return []  # a killed run's input may still come back: nothing moves, nothing is marked
            return self._idle_step(wm, now)

    def _idle_step(self, wm: int | None, now: int) -> list[Manifest]:
        """Move the watermark to ``wm`` (caught up with the events if it was held) and mark the hours it
        completes, or those a jump of event time left waiting."""
        caught_up = self.held
        if caught_up:
            wm = self._hold_or_catch_up(self.state.with_watermark(wm)).watermark
        if (wm is None or wm == self.state.watermark) and not self.unmarked_complete_hours():
            return []
        self._guard()
        before = self.state.watermark
        closed_by = "idle" if wm != before and not caught_up else "watermark"
        if not caught_up and not self.unmarked_complete_hours() and not self._idle_save_due(wm):
            # a quiet type whose watermark moves on within an hour: kept in memory, saved with the next step that
            # marks an hour, a batch, or IDLE_SAVE_S from the last save (a thousand quiet types do not write their
            # state every second; after a crash the idle rule moves it again from the saved one: nothing was judged
            # or marked against the newer one)
            self.state = self.state.with_watermark(wm)
            self._emit("idle", self.state)
            return []
        faults.point("idle_advance", str(wm))
        new, marked = self.markers.mark(self.state.with_watermark(wm), now, closed_by)
        self._commit_state(new, marked)
        if new.watermark != before or marked:
            self._emit("idle", new)
        return marked

    def _idle_save_due(self, wm: int | None) -> bool:
        """Whether an idle step to ``wm`` is saved although it marks no hour: it completes one, or the state was last
        saved :data:`IDLE_SAVE_S` ago or more."""
        st = self.state.with_watermark(wm)
        if hours_to_mark(st.first_hour, st.marked_through, st.watermark, limit=1):
            return True
        return self.idle.monotonic() - self._saved_at >= IDLE_SAVE_S

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
                new, step = self.markers.mark(new, self.clock(), "drain")
                self._commit_state(new, step)
                marked.extend(step)
                if not step:
                    break
            self._emit("drain", new)
            return marked
