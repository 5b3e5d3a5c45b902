"""Merging an hour's small files (the controller's merge steps): rolling merges of open hours after a batch is
saved, the final merge before an hour's marker, and finishing what a merge killed midway left.

The rules of what to merge are pure (:mod:`event_etl.rules.compaction`); the container surgery is
:mod:`event_etl.storage.compaction`.  Every merge is recorded in the checkpoint before its members are
deleted, so a replay or a marker finds the hour's files as the ledger says.  :class:`MergeSteps` is a part
of :class:`~event_etl.job.controller.Controller` and works on its state: ``et``, ``storage``, ``ckpt``,
``state``, ``writer``, ``_guard``, ``_emit`` and the counters ``_unmerged``, ``_unmerged_files``, ``merges``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from event_etl import faults
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
from event_etl.task.report import BatchResult

__all__ = ["Merge", "MergeSteps", "MERGE_REQUESTS"]

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


class MergeSteps:
    """The merge steps of a :class:`~event_etl.job.controller.Controller` (see the module docstring)."""

    def _rolling_merges(self, result: BatchResult, per_file: int, advance: int = 0) -> None:
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
                                           lambda seq, members=members, generation=generation: merged_file_name(
                                               members, generation, seq, self.writer))
            except MergeError as err:
                self._emit("merge_skipped", (hour, str(err)))
                continue
            merged = []
            # late files: the group's records by event hour go with its first output (FileEntry.event_hours)
            group_hours = sum_event_hours(members) if members[0].late else ()
            for name, data, n in outputs:
                self._guard()
                faults.point("merge_write", f"{rel_dir}/{name}")
                self.storage.write_atomic(f"{rel_dir}/{name}", data)
                merged.append(FileEntry(name, n, len(data), hashlib.sha256(data).hexdigest(), members[0].late,
                                        members[0].schema_fingerprint, () if merged else group_hours))
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
