"""Merging an hour's small files (the controller's merge steps): rolling merges of open hours after a batch is
saved, the final merge before an hour's marker, and finishing what a merge killed midway left.

The rules of what to merge are pure (:mod:`event_etl.rules.compaction`); the container surgery is
:mod:`event_etl.storage.compaction`.  Every merge is recorded in the checkpoint before its members are
deleted, so a replay or a marker finds the hour's files as the ledger says.  :class:`Merger` is a collaborator
of :class:`~event_etl.job.controller.Controller`, given at construction what it works with (the type's
:class:`~event_etl.job.context.TypeContext`: the type, the sink, the checkpoint, the writer's name, the lease guard,
the event callback); it keeps its own counters (what each open
hour gathered since its last merge, the merges done) and is handed the state it merges after.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from event_etl import faults
from event_etl.job.context import TypeContext
from event_etl.rules.buckets import hour_dir
from event_etl.rules.compaction import (
    MAX_GENERATION,
    ROLLING_FILES,
    closing_soon,
    is_merged_name,
    merge_groups,
    merged_file_name,
)
from event_etl.rules.manifest import FileEntry, sum_event_hours
from event_etl.rules.watermark import WatermarkState
from event_etl.task.report import BatchResult

__all__ = ["Merge", "Merger", "MERGE_REQUESTS"]

T = TypeVar("T")
MERGE_REQUESTS = 16  # storage requests at a time while merging an hour's files on an object store


@dataclass(frozen=True)
class Merge:
    """What a merge of an hour's small files did (the ``merged`` event)."""

    hour: int
    files_written: int
    bytes_written: int
    files_merged: int
    bytes_merged: int


class Merger:
    """Merges an hour's small files for a :class:`~event_etl.job.controller.Controller` (see the module docstring):
    :meth:`rolling_merges` (rolling merges of open hours) and :meth:`merge_hour` (the final one, before a marker)."""

    def __init__(self, ctx: TypeContext) -> None:
        self.et = ctx.event_type
        self.storage = ctx.storage
        self.ckpt = ctx.checkpoint
        self.writer = ctx.writer
        self.guard = ctx.guard  # raises if this job may no longer write (it lost its lease)
        self.emit = ctx.emit
        # records in small files written to an open hour since its last merge (by hour; a rolling merge is
        # tried when they could fill a file)
        self.unmerged: Counter[int] = Counter()
        self.unmerged_files: Counter[int] = Counter()  # small files added to each open hour since its last merge
        self.merges = 0  # merges done by this run

    def rolling_merges(self, result: BatchResult, state: WatermarkState, per_file: int, advance: int = 0) -> None:
        """After a batch is saved: merge an open hour's small files once they could fill a file (of the batch's
        ``max_events_per_file``: a replay merges as its first attempt did), or are many; and as soon as there
        are two of a kind when the watermark, moving ``advance`` ms a batch, closes the hour within a few
        batches: so that the hour reaches its marker within the file bound, with no merge on the marker's path.
        ``state`` is the one the batch saved."""
        done = state.marked_through
        for hour, entries in sorted(result.files.items()):
            if done is not None and hour <= done:
                continue
            small = [e for e in entries if e.records < per_file]
            self.unmerged[hour] += sum(e.records for e in small)
            self.unmerged_files[hour] += len(small)
            closing = closing_soon(hour, state.watermark, advance)
            if (self.unmerged[hour] >= per_file or self.unmerged_files[hour] >= ROLLING_FILES
                    or (closing and small)):
                self.merge_hour(hour, self.storage.list_files(hour_dir(self.et.name, hour)), final=False,
                                per_file=per_file, max_files=2 if closing else ROLLING_FILES)
                self.unmerged[hour] = self.unmerged_files[hour] = 0
        for hour in [h for h in self.unmerged if done is not None and h <= done]:
            del self.unmerged[hour]
            self.unmerged_files.pop(hour, None)

    def _settle_merges(self, hour: int, listing: dict[str, int]) -> bool:
        """Finish what a merge killed midway left: delete merged-away members still there, and merged files no
        merge recorded (written by a merge that died before recording it).  True if anything was deleted."""
        rel_dir = hour_dir(self.et.name, hour)
        self.ckpt.project_merges(hour)  # a kill may have come between recording a merge and projecting it
        current = {e.name for e in self.ckpt.read_ledger(hour)}
        away = {n for members, _ in self.ckpt.read_merges(hour) for n in members}
        gone = [n for n in sorted(listing) if n not in current and (n in away or is_merged_name(n))]
        for name in gone:
            self.guard()
            self.storage.delete(f"{rel_dir}/{name}")
        return bool(gone)

    def merge_hour(self, hour: int, listing: dict[str, int], *, final: bool, per_file: int | None = None,
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
                    self.emit("merge_skipped", (hour, f"{e.name} is not as written"))
                    return changed
                datas.append((e.name, data))
            try:
                outputs = merge_containers(datas, per_file,
                                           partial(merged_file_name, members, generation, writer=self.writer))
            except MergeError as err:
                self.emit("merge_skipped", (hour, str(err)))
                continue
            merged: list[FileEntry] = []
            # late files: the group's records by event hour go with its first output (FileEntry.event_hours)
            group_hours = sum_event_hours(members) if members[0].late else ()
            for name, data, n in outputs:
                self.guard()
                faults.point("merge_write", f"{rel_dir}/{name}")
                self.storage.write_atomic(f"{rel_dir}/{name}", data)
                merged.append(FileEntry(name, n, len(data), hashlib.sha256(data).hexdigest(), members[0].late,
                                        members[0].schema_fingerprint, () if merged else group_hours))
            faults.point("merged_written", str(hour))
            self.ckpt.save_merge(hour, generation, [e.name for e in members], merged)
            faults.point("merge_recorded", str(hour))
            self.guard()
            # not synced one by one: members a power cut brings back are deleted again by the next merge or the
            # marker (whose own sync comes first)
            self._each_file(lambda rel: self.storage.delete(rel, durable=False), rel_dir, members)
            self.merges += 1
            changed = True
            self.emit("merged", Merge(hour, len(merged), sum(e.bytes for e in merged), len(members),
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
