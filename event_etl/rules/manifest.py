"""The ``_COMPLETE`` marker: a JSON manifest of a finished hour.

Example::

    {
      "manifest_version": 3,
      "event_type": "page_view",
      "hour": "2026-11-21T13:00:00Z",
      "hour_end": "2026-11-21T14:00:00Z",
      "watermark": "2026-11-21T14:00:07Z",
      "completed_at": "2026-11-21T14:02:11.305Z",
      "records": 120345,
      "late_records": 12,
      "late_event_hours": {"2026-11-21T11:00:00Z": 9, "2026-11-21T12:00:00Z": 3},
      "schema_fingerprint": "crc64avro:5c1a1e3d0f1e4b7a",
      "files": [
        {"name": "part-2026112113-b0000000042-s0000-0000.avro",
         "records": 60000, "bytes": 5812345, "sha256": "...", "late": false,
         "schema_fingerprint": "crc64avro:5c1a1e3d0f1e4b7a"},
        ...
      ]
    }

``records`` counts every record in the hour's files, ``late_records`` those in ``late-``
files (records whose own hour was already complete when they arrived).  ``files`` lists
exactly the ``.avro`` files of the folder, sorted by name.

Versions: 1 (event_etl 0.1.0) has no ``schema_fingerprint`` per file: every file is in the
hour's ``schema_fingerprint``.  2 adds each file's ``schema_fingerprint`` (the schema it is
written in), so an hour whose files were written before and after a schema change says so;
the hour's own ``schema_fingerprint`` is the schema of the job that marked it.  3 adds
``late_event_hours``: how many of the hour's late records belong to each event hour (the hours
they were too late for), so that a consumer that processed those hours knows which to revisit
(``event-etl late``).  Late files written by a release before 3 are not counted there: their
records are the difference ``late_records - sum(late_event_hours.values())``.  4 is the version of a manifest listing a
Parquet file (a type of ``format = "parquet"``, ``.parquet`` names): each such file's entry says
``"format": "parquet"`` (an entry without ``format`` is an Avro container file), so that a reader
of versions 1 to 3, which reads every file as Avro, refuses the hour instead of misreading it; a
manifest of Avro files only stays version 3, byte for byte as before.  Readers accept 1 to 4 and
refuse a newer version (:class:`~event_etl.errors.CheckpointFormatError`).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from event_etl.errors import CheckpointFormatError
from event_etl.timeutil import HOUR_MS, iso, parse_hour, to_millis

__all__ = ["FileEntry", "Manifest", "build_manifest", "compare_listing", "MANIFEST_VERSION", "READABLE_VERSIONS",
           "PARQUET_MANIFEST_VERSION", "DATA_EXTENSIONS", "event_hours_of", "sum_event_hours", "file_format"]

MANIFEST_VERSION = 3
"""The version of the manifests of Avro files this release writes."""
PARQUET_MANIFEST_VERSION = 4
"""The version of a manifest that lists a Parquet file (its entry says ``"format": "parquet"``)."""
READABLE_VERSIONS = (1, 2, 3, 4)
"""The versions this release reads."""


DATA_EXTENSIONS = (".avro", ".parquet")
"""The extensions of data files: a folder listing counts these names."""


def file_format(name: str) -> str:
    """A data file's format by its name: ``parquet`` for a ``.parquet`` name, else ``avro``."""
    return "parquet" if name.endswith(".parquet") else "avro"


@dataclass(frozen=True)
class FileEntry:
    """One data file of an hour."""

    name: str
    records: int
    bytes: int
    sha256: str
    late: bool = False
    schema_fingerprint: str = field(default="", compare=False)
    """``crc64avro:<hex>`` of the schema the file is written in; ``""`` when not known (a manifest of
    version 1, a ledger of release 0.1.0: the hour's ``schema_fingerprint`` applies).  Not part of
    equality: the sha256 already pins the file's bytes, its schema included."""
    event_hours: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    """A late file's records by event hour, ``((hour start, records), ...)`` sorted; empty for an on-time file and
    for a late file written before manifest version 3.  Kept in the checkpoint's ledger; a manifest publishes only
    the hour's sum (``late_event_hours``).  A merge of late files gives its group's counts to its first output (the
    records of one member may end in two outputs): the sum over an hour's files is exact, a merged file's own
    counts may not be."""

    @property
    def format(self) -> str:
        """``avro`` or ``parquet`` (by the name's extension: :func:`file_format`)."""
        return file_format(self.name)

    def to_json(self, *, event_hours: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "records": self.records, "bytes": self.bytes, "sha256": self.sha256,
                             "late": self.late}
        if self.format != "avro":  # an Avro file's entry stays as it was (no key): manifests of Avro types unchanged
            d["format"] = self.format
        if self.schema_fingerprint:
            d["schema_fingerprint"] = self.schema_fingerprint
        if event_hours and self.event_hours:
            d["event_hours"] = {str(h): n for h, n in self.event_hours}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileEntry:
        return cls(str(d["name"]), int(d["records"]), int(d["bytes"]), str(d["sha256"]), bool(d.get("late", False)),
                   str(d.get("schema_fingerprint") or ""), event_hours_of(d.get("event_hours")))


def event_hours_of(counts: dict[str, Any] | None) -> tuple[tuple[int, int], ...]:
    """``{"<hour start ms>": records}`` (as a task reports it and the ledger keeps it) as a sorted tuple."""
    if not counts:
        return ()
    return tuple(sorted((int(h), int(n)) for h, n in counts.items() if int(n)))


def sum_event_hours(entries: Iterable[FileEntry]) -> tuple[tuple[int, int], ...]:
    """The records by event hour of several files, added up."""
    total: dict[int, int] = {}
    for e in entries:
        for h, n in e.event_hours:
            total[h] = total.get(h, 0) + n
    return tuple(sorted(total.items()))


@dataclass(frozen=True)
class Manifest:
    """The content of a ``_COMPLETE`` marker."""

    event_type: str
    hour: int
    watermark: int
    completed_at: int
    files: tuple[FileEntry, ...]
    schema_fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    recorded_late_hours: tuple[tuple[int, int], ...] | None = field(default=None, compare=False)
    """``late_event_hours`` as read from a marker (None: from the files' own counts, or not recorded: version < 3)."""
    version: int = field(default=MANIFEST_VERSION, compare=False)
    """The version it was written in (read from a marker) or will be written in."""

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)

    @property
    def late_records(self) -> int:
        return sum(f.records for f in self.files if f.late)

    @property
    def late_event_hours(self) -> dict[int, int] | None:
        """How many of the hour's late records belong to each event hour; None for a manifest of version < 3."""
        if self.recorded_late_hours is not None:
            return dict(self.recorded_late_hours)
        if self.version < 3:
            return None
        return dict(sum_event_hours(f for f in self.files if f.late))

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def file_fingerprint(self, entry: FileEntry) -> str:
        """The schema a file of this hour is written in: its own entry's, else the hour's (version 1)."""
        return entry.schema_fingerprint or self.schema_fingerprint

    @property
    def schema_fingerprints(self) -> tuple[str, ...]:
        """The schemas the hour's files are written in, sorted: more than one when the hour spans a change."""
        return tuple(sorted({self.file_fingerprint(f) for f in self.files} - {""}))

    @property
    def marker_delay_ms(self) -> int:
        """How long after the end of its hour the marker was written."""
        return self.completed_at - (self.hour + HOUR_MS)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "manifest_version": (PARQUET_MANIFEST_VERSION if any(f.format != "avro" for f in self.files)
                                 else MANIFEST_VERSION),
            "event_type": self.event_type,
            "hour": iso(self.hour),
            "hour_end": iso(self.hour + HOUR_MS),
            "watermark": iso(self.watermark),
            "completed_at": iso(self.completed_at),
            "records": self.records,
            "late_records": self.late_records,
            "late_event_hours": {iso(h): n for h, n in sorted((self.late_event_hours or {}).items())},
            "bytes": self.bytes,
            "schema_fingerprint": self.schema_fingerprint,
            "files": [f.to_json(event_hours=False) for f in self.files],
        }
        doc.update(self.extra)
        return doc

    def to_bytes(self) -> builtins.bytes:  # builtins.: `bytes` in this class is the property above
        return (json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Manifest:
        from datetime import datetime

        def ms(text: str) -> int:
            return to_millis(datetime.fromisoformat(text.replace("Z", "+00:00")))

        version = doc.get("manifest_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"manifest_version {version!r} is not a version number")
        if version not in READABLE_VERSIONS:
            raise CheckpointFormatError(
                f"the _COMPLETE manifest of {doc.get('event_type', '?')} {doc.get('hour', '?')} is of version "
                f"{version}, written by a newer event_etl; this release reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}",
                fix="upgrade event_etl (pip install -U event_etl) where this runs",
            )

        files = tuple(FileEntry.from_json(f) for f in doc["files"])
        known = {"manifest_version", "event_type", "hour", "hour_end", "watermark", "completed_at", "records",
                 "late_records", "bytes", "schema_fingerprint", "files", "late_event_hours"}
        late_hours = doc.get("late_event_hours")
        m = cls(
            event_type=doc["event_type"],
            hour=parse_hour(doc["hour"]),
            watermark=ms(doc["watermark"]),
            completed_at=ms(doc["completed_at"]),
            files=files,
            schema_fingerprint=doc.get("schema_fingerprint", ""),
            extra={k: v for k, v in doc.items() if k not in known},
            recorded_late_hours=None if late_hours is None else tuple(sorted(
                (parse_hour(h), int(n)) for h, n in late_hours.items())),
            version=version,
        )
        if "records" in doc and int(doc["records"]) != m.records:
            raise ValueError(f"manifest says records={doc['records']} but its files add up to {m.records}")
        return m

    @classmethod
    def from_bytes(cls, data: builtins.bytes) -> Manifest:
        return cls.from_json(json.loads(data.decode("utf-8")))


def build_manifest(
    *,
    event_type: str,
    hour: int,
    files: Iterable[FileEntry],
    watermark: int,
    completed_at: int,
    schema_fingerprint: str = "",
    extra: dict[str, Any] | None = None,
) -> Manifest:
    """The manifest of a complete hour.  Refuses an hour the watermark has not passed."""
    if hour % HOUR_MS:
        raise ValueError(f"{hour} is not the start of an hour")
    if watermark < hour + HOUR_MS:
        raise ValueError(f"hour {iso(hour)} is not complete at watermark {iso(watermark)}")
    by_name: dict[str, FileEntry] = {}
    for f in files:
        if f.name in by_name and by_name[f.name] != f:
            raise ValueError(f"two different entries for file {f.name}")
        by_name[f.name] = f
    return Manifest(
        event_type=event_type,
        hour=hour,
        watermark=watermark,
        completed_at=completed_at,
        files=tuple(by_name[n] for n in sorted(by_name)),
        schema_fingerprint=schema_fingerprint,
        extra=dict(extra or {}),
    )


@dataclass(frozen=True)
class ListingDiff:
    """How a folder's data files (``.avro``, ``.parquet``) differ from a list of file entries."""

    missing: tuple[str, ...]
    extra: tuple[str, ...]
    wrong_size: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.wrong_size)

    def describe(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing {list(self.missing)}")
        if self.extra:
            parts.append(f"unexpected {list(self.extra)}")
        if self.wrong_size:
            parts.append(f"wrong size {list(self.wrong_size)}")
        return "; ".join(parts) or "identical"


def compare_listing(files: Iterable[FileEntry], listing: dict[str, int]) -> ListingDiff:
    """Compare entries with a folder listing ``{name: size}`` (only data files count: :data:`DATA_EXTENSIONS`)."""
    want = {f.name: f.bytes for f in files}
    have = {n: s for n, s in listing.items() if n.endswith(DATA_EXTENSIONS)}
    return ListingDiff(
        missing=tuple(sorted(set(want) - set(have))),
        extra=tuple(sorted(set(have) - set(want))),
        wrong_size=tuple(sorted(n for n in set(want) & set(have) if want[n] != have[n])),
    )
