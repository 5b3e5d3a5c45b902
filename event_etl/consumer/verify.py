"""Verifying a complete hour: does the folder still hold exactly what its manifest vouches for?

For every file the manifest lists, the file is read by name and its size, sha256 and
number of records (counted from the Avro blocks, or a Parquet file's footer) are recomputed.
The folder listing is used for one thing only: finding data files (``.avro``, ``.parquet``)
the manifest does not list.  The result
names each difference:

- **missing**: listed in the manifest, not in the folder;
- **extra**: an ``.avro`` or ``.parquet`` file in the folder that the manifest does not list;
- **corrupted**: listed and present, but its size, sha256 or record count differs, it is
  not a readable data file of its format, or its entry contradicts its name (another hour, a ``late``
  flag that does not match a ``late-`` name).

:func:`compare_hour` is the rule over plain values; :func:`verify_hour` and
:func:`verify_hours` read the sink and apply it.  :func:`complete_hours_from` finds the complete
hours a range left out at its end (``verify --since`` without ``--until`` ends at the wall clock's
hour, and a generator's event time runs ahead of it): the command says which.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fastavro

from event_etl.consumer.hours import MAX_RANGE_HOURS, HourLike, hour_ms, hour_text
from event_etl.consumer.sink import EventTypeLike, HourFolder, SinkLike, last_hour_folder, open_sink, type_name
from event_etl.consumer.status import HourState, HourStatus, hour_status, hour_statuses, require_complete
from event_etl.rules.buckets import parse_data_file_name
from event_etl.rules.manifest import Manifest, compare_listing, file_format
from event_etl.storage import Storage
from event_etl.timeutil import HOUR_MS, iso

__all__ = ["FileFacts", "FileProblem", "VerifyReport", "compare_hour", "file_facts", "verify_hour", "verify_hours",
           "complete_hours_from", "left_out_text"]


@dataclass(frozen=True)
class FileFacts:
    """What a data file really is: its size, sha256, and records (``None`` if it is no readable Avro file)."""

    bytes: int
    sha256: str
    records: int | None
    error: str | None = None


def file_facts(data: bytes, name: str = "") -> FileFacts:
    """Recompute the facts of a data file from its bytes (records counted per Avro block without decoding them, or
    from a Parquet file's footer when ``name`` ends with ``.parquet``)."""
    digest = hashlib.sha256(data).hexdigest()
    try:
        if file_format(name) == "parquet":
            from event_etl.storage.parquetio import parquet_rows

            records = parquet_rows(data)
        else:
            records = sum(block.num_records for block in fastavro.block_reader(io.BytesIO(data)))
    except Exception as err:  # noqa: BLE001 - any failure to parse means "not a readable data file"; it is reported
        return FileFacts(len(data), digest, None, f"{type(err).__name__}: {err}")
    return FileFacts(len(data), digest, records)


@dataclass(frozen=True)
class FileProblem:
    """One way a listed file differs from its manifest entry."""

    name: str
    what: str
    expected: Any
    found: Any

    def describe(self) -> str:
        if self.what == "unreadable":
            return f"{self.name}: not a readable {'Parquet' if file_format(self.name) == 'parquet' else 'Avro'} file " \
                   f"({self.found})"
        return f"{self.name}: {self.what} {self.found}, manifest says {self.expected}"


@dataclass(frozen=True)
class VerifyReport:
    """The verification of one hour.  ``checked`` is False for an hour that is not complete (nothing to verify)."""

    event_type: str
    hour: datetime
    state: HourState
    files: int = 0
    records: int | None = None
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    corrupted: tuple[FileProblem, ...] = ()

    @property
    def checked(self) -> bool:
        return self.state.is_complete

    @property
    def ok(self) -> bool:
        """True when the hour was checked and its folder holds exactly what its manifest says."""
        return self.checked and not (self.missing or self.extra or self.corrupted)

    def problems(self) -> list[str]:
        """Every difference, one line each."""
        return ([f"{n}: missing" for n in self.missing] + [f"{n}: not in the manifest" for n in self.extra]
                + [p.describe() for p in self.corrupted])

    def describe(self) -> str:
        head = f"{self.event_type} {hour_text(self.hour)}"
        if not self.checked:
            return f"{head}: {self.state}, not verified"
        if self.ok:
            return f"{head}: ok ({self.files} files, {self.records:,} records)"
        return f"{head}: FAILED: " + "; ".join(self.problems())


def _entry_problems(manifest: Manifest) -> list[FileProblem]:
    out = []
    for f in manifest.files:
        try:
            parsed = parse_data_file_name(f.name)
        except ValueError:
            out.append(FileProblem(f.name, "name", "an event_etl data file name", f.name))
            continue
        if parsed.hour_start != manifest.hour:
            out.append(FileProblem(f.name, "hour in name", iso(manifest.hour), iso(parsed.hour_start)))
        if parsed.late != f.late:
            out.append(FileProblem(f.name, "late flag", parsed.late, f.late))
    return out


def compare_hour(
    manifest: Manifest, listing: Mapping[str, int], facts: Mapping[str, FileFacts | None]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[FileProblem, ...]]:
    """``(missing, extra, corrupted)`` of an hour.

    ``listing`` is the folder's ``{name: size}``; ``facts`` has, for every file of the
    manifest, what reading it found (``None``: absent).
    """
    missing = tuple(f.name for f in manifest.files if facts.get(f.name) is None)
    extra = compare_listing(manifest.files, dict(listing)).extra
    corrupted = _entry_problems(manifest)
    for f in manifest.files:
        got = facts.get(f.name)
        if got is None:
            continue
        if got.records is None:
            corrupted.append(FileProblem(f.name, "unreadable", None, got.error))
        elif got.records != f.records:
            corrupted.append(FileProblem(f.name, "records", f.records, got.records))
        if got.bytes != f.bytes:
            corrupted.append(FileProblem(f.name, "bytes", f.bytes, got.bytes))
        if got.sha256 != f.sha256:
            corrupted.append(FileProblem(f.name, "sha256", f.sha256, got.sha256))
    return missing, extra, tuple(corrupted)


def _check(storage: Storage, status: HourStatus) -> VerifyReport:
    manifest = status.manifest
    if manifest is None:
        return VerifyReport(status.event_type, status.hour, status.state)
    folder = HourFolder(storage, status.event_type, manifest.hour)
    listing = folder.listing()
    facts = {}
    for f in manifest.files:
        data = folder.read_optional(f.name)
        facts[f.name] = None if data is None else file_facts(data, f.name)
    missing, extra, corrupted = compare_hour(manifest, listing, facts)
    return VerifyReport(status.event_type, status.hour, status.state, len(manifest.files), manifest.records,
                        missing, extra, corrupted)


def verify_hour(sink: SinkLike, event_type: EventTypeLike, hour: HourLike) -> VerifyReport:
    """Verify one complete hour.  An hour that is not complete raises ``HourNotCompleteError``."""
    storage = open_sink(sink)
    status = hour_status(storage, event_type, hour)
    require_complete(status)
    return _check(storage, status)


def verify_hours(sink: SinkLike, event_type: EventTypeLike, since: HourLike, until: HourLike) -> list[VerifyReport]:
    """Verify every complete hour in ``[since, until)``; hours that are not complete are reported unchecked."""
    storage = open_sink(sink)
    return [_check(storage, status) for status in hour_statuses(storage, event_type, since, until)]


def complete_hours_from(sink: SinkLike, event_type: EventTypeLike, since: HourLike) -> list[datetime]:
    """The complete hours of ``event_type`` from ``since`` on (up to the latest hour folder, at most a year of hours):
    what a range ending at ``since`` leaves out."""
    storage, name = open_sink(sink), type_name(event_type)
    start = hour_ms(since, what="since")
    last = last_hour_folder(storage, name)
    if last is None or last < start:
        return []
    end = min(last + HOUR_MS, start + MAX_RANGE_HOURS * HOUR_MS)
    return [s.hour for s in hour_statuses(storage, event_type, hour_text(start), hour_text(end)) if s.is_complete]


def left_out_text(hours: list[datetime], until: HourLike) -> str:
    """The line saying which complete hours a range ending at ``until`` (by default: the wall clock's hour) left
    out, and how to verify them."""
    first, last = hour_text(hours[0]), hour_text(hours[-1])
    which = first if len(hours) == 1 else f"{first} .. {last}"
    return (f"left out: {len(hours)} complete hour{'s' if len(hours) != 1 else ''} from {hour_text(hour_ms(until))} on "
            f"({which}), not verified: without --until the range ends at the current hour by the wall clock, and "
            "these were marked before it (their event time runs ahead of the wall clock, or a drain closed them); "
            f"pass --until {hour_text(hour_ms(hours[-1]) + HOUR_MS)} to verify them")
