"""The only part of the consumer API that touches storage: one hour folder, read carefully.

Three answers are kept apart everywhere:

- **present**: the file is there (its bytes, its manifest);
- **absent**: storage said so (``FileNotFoundError``, an empty listing);
- **could not check**: storage could not tell (network, permission, a file where a folder
  should be).  :class:`~event_etl.storage.Storage` raises
  :class:`~event_etl.errors.StorageError`; here it becomes
  :class:`~event_etl.consumer.errors.CouldNotCheckError` (exit code 4), never "absent".

A marker is read by name (one GET, no listing cache involved) and checked to be the
manifest of *this* hour of *this* event type: a marker copied from elsewhere is damage, not
completeness.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from typing import Union

from event_etl.consumer.errors import CorruptHourError, CouldNotCheckError
from event_etl.errors import NoDataError, StorageError, UsageError
from event_etl.eventtypes import EventType
from event_etl.rules.buckets import MARKER_NAME, hour_dir, parse_hour_dir, validate_event_type_name
from event_etl.rules.manifest import FileEntry, Manifest
from event_etl.storage import Storage
from event_etl.storage.locations import resolve_sink
from event_etl.timeutil import iso

__all__ = [
    "AUDIT_NAME",
    "EventTypeLike",
    "HourFolder",
    "SinkLike",
    "could_not_check",
    "event_types_in",
    "first_complete_hour",
    "open_sink",
    "require_type_data",
    "resolve_sink",
    "type_name",
]

AUDIT_NAME = "_AUDIT"
"""The audit record of an hour, next to its marker (create-only, like the marker)."""

SinkLike = Union[str, "os.PathLike[str]", Storage]
"""A sink as the public API accepts it: a local folder, ``gs://bucket/prefix``, or an open :class:`Storage`."""

EventTypeLike = str | EventType
"""An event type by name, or loaded (which also gives its schema and settings)."""


@contextlib.contextmanager
def could_not_check() -> Iterator[None]:
    """Turn a storage failure into :class:`CouldNotCheckError` (exit code 4), keeping the cause."""
    try:
        yield
    except CouldNotCheckError:
        raise
    except StorageError as err:
        raise CouldNotCheckError.from_storage(err) from err


def open_sink(sink: SinkLike) -> Storage:
    """A :class:`Storage` for ``sink``; local paths are made absolute (as ``event-etl run`` does)."""
    if isinstance(sink, Storage):
        return sink
    with could_not_check():
        return Storage(resolve_sink(os.fspath(sink)))


def require_type_data(storage: Storage, event_type: str) -> None:
    """Raise :class:`~event_etl.errors.NoDataError` (exit code 6) when ``<sink>/<event_type>/`` holds nothing.

    A job writes its lease ``<sink>/<event_type>/_LEASE`` before its first batch, so a folder
    with nothing at all means a wrong sink or event type (or no job ever ran there): never
    "not started yet".
    """
    base = validate_event_type_name(event_type)
    with could_not_check():
        if storage.list_dirs(base) or storage.list_files(base):
            return
    others = _root_folders(storage)
    where = storage.display(base)
    hint = (f" (it holds {', '.join(others[:8])})" if others else
            " (the sink itself is empty or missing)" if others is not None else "")
    raise NoDataError(
        f"nothing at {where}/: no event_etl job has written {event_type} to the sink {storage.url}{hint}",
        sink=storage.url, event_type=event_type,
        fix="check --sink (or $EVENT_ETL_SINK) and the event type's name; a job writes its first files "
        "(and its _LEASE) there as soon as it starts",
    )


def type_name(event_type: EventTypeLike) -> str:
    """The event type's name, checked to be a safe folder name."""
    name = event_type.name if isinstance(event_type, EventType) else event_type
    try:
        return validate_event_type_name(name)
    except ValueError as err:
        raise UsageError(str(err), fix="pass the event type's name, e.g. 'page_view'") from err


class HourFolder:
    """``<sink>/<event_type>/dt=YYYY-MM-DD/hour=HH/``, with reads that keep absent and unknown apart."""

    def __init__(self, storage: Storage, event_type: str, hour: int) -> None:
        self.storage = storage
        self.event_type = event_type
        self.hour = hour
        self.rel = hour_dir(event_type, hour)

    def __repr__(self) -> str:
        return f"HourFolder({self.display()!r})"

    def display(self, name: str | None = None) -> str:
        """The folder's (or one of its files') location, for messages."""
        return self.storage.display(f"{self.rel}/{name}" if name else self.rel)

    def read_optional(self, name: str) -> bytes | None:
        """The bytes of ``name``, or ``None`` if it is absent."""
        with could_not_check():
            try:
                return self.storage.read(f"{self.rel}/{name}")
            except FileNotFoundError:
                return None

    def listing(self) -> dict[str, int]:
        """``{name: size}`` of the folder's files; ``{}`` if the folder is absent."""
        with could_not_check():
            return self.storage.list_files(self.rel)

    def create_only(self, name: str, data: bytes) -> bool:
        """Create ``name`` unless it exists; ``False`` if it already did."""
        with could_not_check():
            return self.storage.create_only(f"{self.rel}/{name}", data)

    def manifest(self) -> Manifest | None:
        """The hour's ``_COMPLETE`` manifest, ``None`` if there is no marker."""
        data = self.read_optional(MARKER_NAME)
        if data is None:
            return None
        path = self.display(MARKER_NAME)
        try:
            m = Manifest.from_bytes(data)
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptHourError(
                f"{path} is not a valid manifest: {err}", path=path,
                fix="the marker was damaged or not written by event_etl; restore it from a backup or the job's logs",
            ) from err
        if m.event_type != self.event_type or m.hour != self.hour:
            raise CorruptHourError(
                f"{path} is the manifest of {m.event_type} {iso(m.hour)}, not of {self.event_type} {iso(self.hour)}",
                path=path, fix="a marker was copied into the wrong folder; move it back where it belongs",
            )
        return m

    def checked_file(self, entry: FileEntry) -> bytes:
        """The bytes of a file the manifest lists, checked against its size and sha256."""
        path = self.display(entry.name)
        data = self.read_optional(entry.name)
        if data is None:
            raise CorruptHourError(f"{path} is listed in the manifest but missing", path=path,
                                   fix=f"restore the file; `event-etl verify {self.event_type} {iso(self.hour)}` "
                                   "shows every difference")
        if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CorruptHourError(
                f"{path} differs from the manifest ({len(data)} bytes, manifest says {entry.bytes}; or another sha256)",
                path=path, fix=f"restore the file; `event-etl verify {self.event_type} {iso(self.hour)}` shows "
                "every difference",
            )
        return data


def _root_folders(storage: Storage) -> list[str] | None:
    """The folders at the sink's root (event types), for a hint; ``None`` if that cannot be told."""
    try:
        if storage.local:
            names = [e.name for e in os.scandir(storage.root) if e.is_dir()] if os.path.isdir(storage.root) else []
        else:
            names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in storage.fs.ls(storage.root, detail=True)
                     if e.get("type") == "directory"]
    except Exception:  # noqa: BLE001 - only a hint; the answer stands without it
        return None
    return sorted(n for n in names if not n.startswith((".", "_")))


def event_types_in(storage: Storage) -> list[str]:
    """The event types a sink holds: the folders at its root whose names are event type names, sorted."""
    with could_not_check():
        if storage.local:
            names = [e.name for e in os.scandir(storage.root) if e.is_dir()] if os.path.isdir(storage.root) else []
        else:
            try:
                names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in storage.fs.ls(storage.root, detail=True)
                         if e.get("type") == "directory"]
            except FileNotFoundError:
                names = []
    out = []
    for n in sorted(names):
        try:
            out.append(validate_event_type_name(n))
        except ValueError:
            continue
    return out


def first_complete_hour(storage: Storage, event_type: str) -> int | None:
    """The earliest hour of ``event_type`` that has a marker, or ``None`` if none has one.

    Markers are written in order from the job's first hour on, so this is the job's first
    hour (or the first one left after old hours were deleted).  Folders are scanned from the
    oldest; usually the first one answers.
    """
    base = validate_event_type_name(event_type)
    with could_not_check():
        for day in storage.list_dirs(base):
            if not day.startswith("dt="):
                continue  # _deadletter and anything else that is not a day
            for hh in storage.list_dirs(f"{base}/{day}"):
                try:
                    _, hour = parse_hour_dir(f"{base}/{day}/{hh}")
                except ValueError:
                    continue
                if MARKER_NAME in storage.list_files(f"{base}/{day}/{hh}"):
                    return hour
    return None


def last_hour_folder(storage: Storage, event_type: str) -> int | None:
    """The latest hour of ``event_type`` that has a folder (data or a marker), or ``None``.

    Folders are scanned from the newest day; the newest usually answers."""
    base = validate_event_type_name(event_type)
    with could_not_check():
        for day in sorted((d for d in storage.list_dirs(base) if d.startswith("dt=")), reverse=True):
            hours = []
            for hh in storage.list_dirs(f"{base}/{day}"):
                try:
                    hours.append(parse_hour_dir(f"{base}/{day}/{hh}")[1])
                except ValueError:
                    continue
            if hours:
                return max(hours)
    return None

