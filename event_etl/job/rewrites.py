"""Rewrites of a batch's splits: a job's first batch written again against the "too late" reference its own events
give (:class:`Rewriter`), and splits written again without the duplicates found after them (:class:`Duplicates`).

Both decide once and record the decision in the checkpoint (the intent's ``reference``, the batch's drop list)
before anything is rewritten, so a replay writes the same files as the first attempt and removes what a killed
attempt left.  Both are collaborators of :class:`~event_etl.job.controller.Controller`, given at construction what
they work with (the type's :class:`~event_etl.job.context.TypeContext`: the type, the sink, the checkpoint, the
lease guard; :class:`Duplicates` also the window of keys it keeps), and handed the batch's intent, the context its
tasks ran with (a :class:`~event_etl.task.executor.BatchContext`) and their outputs.  A rewrite asks for tasks
with that context, changed only by its decision (:class:`~event_etl.job.phases.Tasks`), as the batch's phases do.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterable
from dataclasses import replace
from typing import Any, TypeAlias, TypeVar

import numpy as np

from event_etl import faults
from event_etl.errors import IntegrityError
from event_etl.job.checkpoint import BatchIntent
from event_etl.job.context import TypeContext
from event_etl.job.phases import Outputs, Tasks
from event_etl.rules.buckets import deadletter_file_path, hour_dir, parse_data_file_name
from event_etl.rules.judge import too_late_in_first_batch
from event_etl.task.dedupe import DedupeState
from event_etl.task.executor import BatchContext

__all__ = ["Rewriter", "Duplicates", "Drops", "Rewrite"]

R = TypeVar("R")

_DL_NAME_RE = re.compile(r"^dl-(?:w[0-9a-f]{6}-)?b\d{10}-s(\d{4})\.avro$")

Drops = dict[str, tuple[int, ...]]
"""A batch's drop list: file name -> positions of the records not to write (duplicates)."""

Rewrite: TypeAlias = Generator[Tasks, Outputs, R]
"""A rewrite step returning ``R``: it may yield :class:`~event_etl.job.phases.Tasks` (some splits again) and is sent
their outputs."""


class Rewriter:
    """A job's first batch written again against its own reference, and the files a batch's duplicates emptied
    removed (see the module docstring)."""

    def __init__(self, ctx: TypeContext) -> None:
        self.et = ctx.event_type
        self.storage = ctx.storage
        self.ckpt = ctx.checkpoint
        self.writer = ctx.writer
        self.guard = ctx.guard  # raises if this job may no longer write (it lost its lease)

    def settle_first_batch(self, intent: BatchIntent, ctx: BatchContext, outputs: Outputs
                           ) -> Rewrite[tuple[BatchIntent, Outputs]]:
        """A job's first batch has no watermark: it measures "too late" against the one its own events give,
        the largest counted time over its splits minus the out-of-orderness bound (one reference for
        the whole batch, so that the verdicts do not depend on how the input was split); for a source read in
        partitions, the least over its partitions of each one's largest (the watermark per partition).

        The batch is first run without it (with ``ctx``); each split reports its largest counted time and its
        earliest event.  Usually no event is that old, and what the splits wrote is exactly what
        they would have written against the reference: the batch goes on, with no second pass over
        its input.  Otherwise the splits that hold such events are written again against it: their
        files of the first run are deleted (nothing records them yet, and their hours are open), then
        the reference is saved in the intent (a replay judges the whole batch against it, and writes
        the same bytes for the other splits), then those splits run again.  Returns the intent and
        the outputs to go on with."""
        et = ctx.event_type
        reference = _first_reference(outputs, et.out_of_orderness)
        if reference is None:
            return intent, outputs
        affected = {rep["shard"] for rep, _ in outputs if rep.get("earliest") is not None
                    and too_late_in_first_batch(rep["earliest"], reference, et.allowed_lateness)}
        if not affected:
            return intent, outputs
        made = self._made_paths(rep for rep, _ in outputs if rep["shard"] in affected)
        for rel in sorted(made):  # a file already gone (a replay) is no error: delete ignores it
            self.guard()
            self.storage.delete(rel)
        # an hour folder that held only such files goes too (with its day's, if that is empty then): a folder
        # without a marker reads as an hour still open
        for folder in sorted({rel.rsplit("/", 1)[0] for rel in made}, reverse=True):
            if self.storage.remove_empty_folder(folder):
                self.storage.remove_empty_folder(folder.rsplit("/", 1)[0])
        faults.point("first_batch_unwritten", str(intent.batch_id))
        intent = replace(intent, reference=reference)
        self.ckpt.save_intent(intent)
        again = yield Tasks(replace(ctx, reference=reference), affected)
        return intent, [out for out in outputs if out[0]["shard"] not in affected] + list(again)

    def _made_paths(self, reports: Iterable[dict[str, Any]]) -> set[str]:
        """The files (data and dead-letter, relative to the sink) that the splits of ``reports`` wrote."""
        made: set[str] = set()
        for rep in reports:
            made.update(f"{hour_dir(self.et.name, f['hour'])}/{f['name']}" for f in rep["files"])
            if rep.get("deadletter"):
                made.add(rep["deadletter"]["path"])
        return made

    def remove_emptied(self, intent: BatchIntent, drop: Drops, reports: list[dict[str, Any]]) -> None:
        """Delete the batch's files that its duplicates emptied: named in the drop list, but no longer written.

        A first attempt removes them after rewriting; a replay removes what a killed attempt left."""
        made = self._made_paths(reports)
        for name in sorted(drop):
            rel = self._output_path(intent, name)
            if rel is not None and rel not in made and self.storage.exists(rel):
                self.guard()
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


def _first_reference(outputs: Outputs, out_of_orderness: int) -> int | None:
    """The "too late" reference a first batch's own events give (see :meth:`Rewriter.settle_first_batch`); None
    when no split counted an event."""
    counted = [rep["reference"] for rep, _ in outputs if rep.get("reference") is not None]
    if not counted:
        return None
    # a source read in partitions (Kafka): the watermark its events give is its slowest partition's
    by_part: dict[str, int] = {}
    for rep, _ in outputs:
        if rep.get("reference") is not None and rep.get("part") is not None:
            by_part[rep["part"]] = max(by_part.get(rep["part"], rep["reference"]), rep["reference"])
    return int(min(by_part.values()) if by_part else max(counted)) - out_of_orderness


class Duplicates:
    """A type's window of keys (:class:`~event_etl.task.dedupe.DedupeState`) and what a batch does with it: find the
    records written before, rewrite their splits without them (:meth:`settle`), remember the batch's keys before
    its state is saved (:meth:`remember`), and forget old ones (:meth:`forget`).  Each of these is durable in the
    checkpoint (``etl/batches/<id>.drop.json`` and ``.dropkeys``, ``etl/dedupe/``) before what relies on it."""

    def __init__(self, ctx: TypeContext, *, window: DedupeState) -> None:
        self.window = window
        self.ckpt = ctx.checkpoint

    @classmethod
    def load(cls, ctx: TypeContext, event_clock: int | None) -> Duplicates:
        """The keys the checkpoint keeps for the type's ``dedupe_window``, as of ``event_clock`` (see
        ``Controller._event_clock``)."""
        ckpt = ctx.checkpoint
        return cls(ctx, window=DedupeState.from_batches(ctx.event_type.dedupe_window, ckpt.load_dedupe_rows(),
                                                        event_clock))

    def settle(self, intent: BatchIntent, ctx: BatchContext, drop: Drops, outputs: Outputs, *, replayed: bool
               ) -> Rewrite[tuple[Outputs, np.ndarray, Drops]]:
        """The duplicates of a batch whose tasks ran with ``ctx`` and gave ``outputs``: decided once (a replay reads
        the decision), their splits rewritten.  Returns the final outputs, the key rows to remember for the batch
        (``STORED_DTYPE``, with those of the records dropped as duplicates) and its drop list."""
        from event_etl.task.dedupe import stored, stored_of

        batch_id = intent.batch_id
        if replayed and self.ckpt.has_drops(batch_id):
            # decided by an earlier attempt, whose files a marker may list already: the dedupe state as
            # reloaded can know keys that attempt did not (a redelivery found again only in its memory)
            rows = stored_of(keys for _, keys in outputs)
        else:
            outputs, rows, drop = yield from self.drop_duplicates(intent, ctx, drop, outputs)
            if not drop:
                self.ckpt.save_drops(batch_id, {})  # the decision: nothing dropped (before any ledger or marker)
        # the keys of the records dropped as duplicates are remembered too: a message dropped here may be
        # delivered again (its acknowledgement can be lost), and its id key may be gone from the window by then
        dropped = self.ckpt.load_dropped_keys(batch_id)
        if len(dropped):
            rows = np.concatenate([stored(rows), dropped])
        return outputs, rows, drop

    def drop_duplicates(self, intent: BatchIntent, ctx: BatchContext, drop: Drops, outputs: Outputs
                        ) -> Rewrite[tuple[Outputs, np.ndarray, Drops]]:
        """Find records whose key was written before (in the window) and rewrite their splits without them.

        Returns the final outputs, their key rows (``STORED_DTYPE`` when the batch has no duplicate) and the
        batch's drop list."""
        from event_etl.task.dedupe import find_duplicates, may_hold_duplicates, rows_of, stored, stored_of

        known = self.window.known_before(intent.batch_id)
        blobs = [keys for _, keys in outputs]
        if not may_hold_duplicates(blobs, known):  # the common case, settled on the keys alone
            return outputs, stored_of(blobs), drop
        rows = rows_of(blobs)
        dup = find_duplicates(rows, known)
        if not dup.any():
            return outputs, rows, drop
        self.window.seen_again(rows["key"][dup])  # redeliveries of unacknowledged batches: each comes once
        frozen = _with_duplicates(drop, outputs, rows[dup])
        earlier = self.ckpt.load_dropped_keys(intent.batch_id)
        self.ckpt.save_dropped_keys(intent.batch_id, np.concatenate([earlier, stored(rows[dup])]))
        self.ckpt.save_drops(intent.batch_id, frozen)  # a replay skips the same records
        shards = {int(s) for s in np.unique(rows[dup]["shard"])}
        again = yield Tasks(replace(ctx, drop=frozen), shards)
        faults.point("duplicates_rewritten", str(intent.batch_id))
        outputs = [o for o in outputs if o[0]["shard"] not in shards] + again
        rows = rows_of([keys for _, keys in outputs])
        left = find_duplicates(rows, known)
        if left.any():
            raise IntegrityError(f"batch {intent.batch_id}: {int(left.sum())} duplicates remain after rewriting",
                                 fix="report this as a bug, with the checkpoint's etl/ folder")
        return outputs, rows, frozen

    def remember(self, batch_id: int, rows: np.ndarray) -> None:
        """Keep the keys a batch wrote (before its state is saved: a batch whose state is saved must have its keys
        remembered), as not acknowledged yet."""
        from event_etl.task.dedupe import STORED_DTYPE, stored

        kept = rows if rows.dtype == STORED_DTYPE else stored(rows)
        self.ckpt.save_dedupe_rows(batch_id, kept)
        self.window.add(batch_id, kept, acked=False)

    def acknowledged(self, batch_id: int, *, durable: bool) -> None:
        """The batch's input was acknowledged to its source (``durable``: recorded, Pub/Sub's), or needs none."""
        if durable:
            self.ckpt.mark_dedupe_acked(batch_id)
        self.window.mark_acked(batch_id, True)

    def forget(self, event_clock: int | None) -> None:
        """Forget the keys of the batches event time has left behind."""
        for gone in self.window.evict(event_clock):
            self.ckpt.drop_dedupe_rows(gone)


def _with_duplicates(drop: Drops, outputs: Outputs, dups: np.ndarray) -> Drops:
    """The drop list ``drop`` with the records of the key rows ``dups`` (``KEY_DTYPE``), by file name."""
    names = {(rep["shard"], f["file_key"]): f["name"] for rep, _ in outputs for f in rep["files"]}
    names.update({(rep["shard"], rep["deadletter"]["file_key"]): rep["deadletter"]["path"].rsplit("/", 1)[1]
                  for rep, _ in outputs if rep.get("deadletter")})
    new_drop = {k: set(v) for k, v in drop.items()}
    for r in dups:
        new_drop.setdefault(names[(int(r["shard"]), int(r["file"]))], set()).add(int(r["rec"]))
    return {k: tuple(sorted(v)) for k, v in sorted(new_drop.items())}
