"""Rewrites of a batch's splits (the controller's rewrite steps): a job's first batch written again against the
"too late" reference its own events give, and splits written again without the duplicates found after them.

Both decide once and record the decision in the checkpoint (the intent's ``reference``, the batch's drop list)
before anything is rewritten, so a replay writes the same files as the first attempt and removes what a killed
attempt left.  :class:`RewriteSteps` is a part of :class:`~event_etl.job.controller.Controller` and works on its
state: ``et``, ``storage``, ``ckpt``, ``dedupe``, ``writer``, ``_guard``, ``event_type_of``, ``batch_context``.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from event_etl import faults
from event_etl.errors import IntegrityError
from event_etl.job.checkpoint import BatchIntent
from event_etl.job.phases import Tasks
from event_etl.rules.buckets import deadletter_file_path, hour_dir, parse_data_file_name
from event_etl.rules.judge import too_late_in_first_batch

__all__ = ["RewriteSteps"]

_DL_NAME_RE = re.compile(r"^dl-(?:w[0-9a-f]{6}-)?b\d{10}-s(\d{4})\.avro$")


class RewriteSteps:
    """The rewrite steps of a :class:`~event_etl.job.controller.Controller` (see the module docstring)."""

    def _drop_duplicates(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]], outputs):
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
        again = yield Tasks(self.batch_context(intent, frozen), shards)
        faults.point("duplicates_rewritten", str(intent.batch_id))
        outputs = [o for o in outputs if o[0]["shard"] not in shards] + again
        rows = rows_of([keys for _, keys in outputs])
        left = find_duplicates(rows, known)
        if left.any():
            raise IntegrityError(f"batch {intent.batch_id}: {int(left.sum())} duplicates remain after rewriting",
                                 fix="report this as a bug, with the checkpoint's etl/ folder")
        return outputs, rows, frozen

    def _settle_first_batch(self, intent: BatchIntent, drop: dict[str, tuple[int, ...]], outputs):
        """A job's first batch has no watermark: it measures "too late" against the one its own events give,
        the largest counted time over its splits minus the out-of-orderness bound (one reference for
        the whole batch, so that the verdicts do not depend on how the input was split); for a source read in
        partitions, the least over its partitions of each one's largest (the watermark per partition).

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
        # a source read in partitions (Kafka): the watermark its events give is its slowest partition's
        by_part: dict[str, int] = {}
        for rep, _ in outputs:
            if rep.get("reference") is not None and rep.get("part") is not None:
                by_part[rep["part"]] = max(by_part.get(rep["part"], rep["reference"]), rep["reference"])
        reference = (min(by_part.values()) if by_part else max(counted)) - et.out_of_orderness
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
        again = yield Tasks(self.batch_context(intent, drop), affected)
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
