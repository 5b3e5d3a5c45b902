"""Few files per hour, whatever the trigger: which of an hour's files to merge (pure rules).

Every micro-batch writes its records at once, a file per hour per split, so a small event
type with a short trigger would end an hour with hundreds of tiny files.  The job merges
them (block by block, without decoding records; see :mod:`event_etl.storage.compaction`):

- **rolling**, after a batch is saved: when an open hour's *small* files (fewer records than
  ``max_events_per_file``) of one kind hold together at least ``max_events_per_file``
  records, they are merged into full files (and one file for the remainder); and when they
  are :data:`ROLLING_FILES` or more, whatever they hold, into one (still small, merged again
  later): so the final merge never has more than that many files to read and delete, which
  on an object store (tens of milliseconds a request) keeps a quiet type's marker in bound;
- **closing**, after a batch, for an open hour the watermark will pass within
  :data:`CLOSING_BATCHES` batches (moving as it did in the batch, see :func:`closing_soon`):
  a kind's small files are merged as soon as there are two, so the hour reaches its close
  with one merged file per kind plus the closing batch's own files;
- **final**, just before the hour's marker, and only when the hour holds more files than
  :func:`file_bound` allows: its small files of one kind, if there are two or more, are
  merged.  An hour already within the bound is marked as it is, with no merge on the
  marker's path (a hundred types closing an hour in the same round each save a merge's
  reads, writes and records there).

Files are merged by *kind*: ``part-`` and ``late-`` files apart (a reader can tell the late
records of an hour), and files of different schemas apart.  Each kind then ends with
``ceil(records / max_events_per_file)`` files after a final merge, so a complete hour holds at
most :func:`file_bound` ``= ceil(records / max_events_per_file) + 2`` data files, late files
counted (a schema change within the hour adds one per new schema).

A merged file is named like any data file, in the hour it lies in, with a shard number of
:data:`MERGED_SHARD_BASE` or more (tasks' shards stay below it), the largest batch id of its
members and the merge's *generation* (how many merges the hour had before):
``part-2026112113-w3fa9c1-b0000000042-s9003-0000.avro``.  A merge is recorded in the job's
checkpoint (members and merged files) after its files are durable and before its members
are deleted; the hour's file list is the batches' files with every recorded merge applied
(:func:`apply_merges`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from event_etl.rules.buckets import MAX_SHARD, data_file_name, parse_data_file_name
from event_etl.rules.completeness import is_complete
from event_etl.rules.manifest import FileEntry

__all__ = ["MERGED_SHARD_BASE", "MAX_GENERATION", "ROLLING_FILES", "CLOSING_BATCHES", "SLACK_FILES", "merge_groups",
           "merged_file_name", "is_merged_name", "apply_merges", "file_bound", "closing_soon"]

MERGED_SHARD_BASE = 9000
"""Shard numbers from here up name merged files; tasks' shards stay below."""

ROLLING_FILES = 32
"""An open hour's small files of one kind are merged once there are this many, even if they do not fill a file."""

CLOSING_BATCHES = 2
"""An open hour is *closing* when the watermark, moving as in the last batch, passes its end within this many."""

SLACK_FILES = 2
"""Files a complete hour may hold beyond ``ceil(records / max_events_per_file)`` (late files counted)."""

MAX_GENERATION = MAX_SHARD - MERGED_SHARD_BASE
"""Merges an hour can have (the last shard number); an hour past it keeps its files as they are."""


def _kind(entry: FileEntry) -> tuple[bool, str, str]:
    return entry.late, entry.schema_fingerprint, entry.format  # files of two formats merge apart


def merge_groups(entries: Iterable[FileEntry], max_events: int, *, final: bool,
                 max_files: int = ROLLING_FILES) -> list[tuple[FileEntry, ...]]:
    """The groups of an hour's files to merge now, each in name order (the order of their records).

    Only small files (fewer than ``max_events`` records) are merged; full files, and files an
    earlier release wrote (no schema fingerprint in their entry), stay as they are.  A kind's
    small files are merged when there are two or more of them and, unless ``final`` (the hour
    is about to be marked), when together they fill at least one file or are ``max_files`` or more.
    A ``final`` merge is left out when the hour already holds no more files than :func:`file_bound`."""
    if max_events < 1:
        raise ValueError(f"max_events must be positive, not {max_events}")
    entries = list(entries)
    if final and len(entries) <= file_bound(sum(e.records for e in entries), max_events):
        return []
    kinds: dict[tuple[bool, str, str], list[FileEntry]] = {}
    for e in entries:
        # a file without a schema fingerprint in its entry was written by release 0.1.0 (before an upgrade):
        # it stays as it is, byte for byte, as the upgrade promises
        if e.records < max_events and e.schema_fingerprint:
            kinds.setdefault(_kind(e), []).append(e)
    out = []
    for kind in sorted(kinds):
        small = sorted(kinds[kind], key=lambda e: e.name)
        if len(small) < 2:
            continue
        if final or sum(e.records for e in small) >= max_events or len(small) >= max_files:
            out.append(tuple(small))
    return out


def merged_file_name(members: Sequence[FileEntry], generation: int, seq: int, writer: str = "") -> str:
    """The name of the ``seq``-th file a merge of ``members`` (one hour's files) writes."""
    if not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"merge generation {generation} out of range 0..{MAX_GENERATION}")
    parsed = [parse_data_file_name(e.name) for e in members]
    hours = {p.hour_start for p in parsed}
    if len(hours) != 1 or len({(p.late, p.fmt) for p in parsed}) != 1:
        raise ValueError(f"members of a merge must be one hour's files of one kind: {[e.name for e in members]}")
    return data_file_name(hours.pop(), max(p.batch_id for p in parsed), MERGED_SHARD_BASE + generation, seq,
                          late=parsed[0].late, writer=writer, fmt=parsed[0].fmt)


def is_merged_name(name: str) -> bool:
    """Whether ``name`` is a merged file's name (see :func:`merged_file_name`)."""
    try:
        return parse_data_file_name(name).shard >= MERGED_SHARD_BASE
    except ValueError:
        return False


def apply_merges(entries: Iterable[FileEntry], merges: Iterable[tuple[Sequence[str], Sequence[FileEntry]]]
                 ) -> list[FileEntry]:
    """The hour's files: the batches' ``entries`` with each recorded merge ``(member names, merged files)``
    applied in order (its members replaced by its files), sorted by name."""
    files = {e.name: e for e in entries}
    for members, merged in merges:
        for name in members:
            files.pop(name, None)
        for e in merged:
            files[e.name] = e
    return [files[n] for n in sorted(files)]


def file_bound(records: int, max_events: int) -> int:
    """The most data files a complete hour of ``records`` may hold: ``ceil(records / max_events)``, plus
    :data:`SLACK_FILES` (late files counted; a final merge leaves a kind ``ceil(its records / max_events)``
    files, so with ``part-`` and ``late-`` files it leaves at most one more than the ceiling)."""
    return math.ceil(records / max_events) + SLACK_FILES


def closing_soon(hour_start: int, watermark: int | None, advance: int, batches: int = CLOSING_BATCHES) -> bool:
    """Whether the hour starting at ``hour_start`` (ms) will be complete within ``batches`` batches, if the
    watermark keeps moving ``advance`` ms a batch, as it did in the last one.  A watermark that did not move
    (a quiet source; an idle advance will close the hour) says nothing: False."""
    if watermark is None or advance <= 0:
        return False
    return is_complete(hour_start, watermark + batches * advance)
