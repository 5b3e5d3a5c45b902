"""Where things are written: bucket folders, data file names, dead-letter files.

Layout under a sink root (local path or ``gs://bucket/prefix``)::

    <sink>/<event_type>/dt=YYYY-MM-DD/hour=HH/part-YYYYMMDDHH-w<writer>-b<batch>-s<shard>-<seq>.avro
    <sink>/<event_type>/dt=YYYY-MM-DD/hour=HH/late-YYYYMMDDHH-w<writer>-b<batch>-s<shard>-<seq>.avro
    <sink>/<event_type>/dt=YYYY-MM-DD/hour=HH/_COMPLETE
    (``.parquet`` instead of ``.avro`` for a type of ``format = "parquet"``)
    <sink>/<event_type>/_LEASE
    <sink>/<event_type>/_deadletter/dt=YYYY-MM-DD/dl-w<writer>-b<batch>-s<shard>.avro

File names are a pure function of what identifies a piece of a micro-batch's output
(hour, batch id, shard, sequence, late or not).  A replayed batch therefore produces
the same names, and a name that already exists is never written twice.  Only files
of records that arrived after their hour was complete start with ``late-``; no other
name contains ``late``.  Names never depend on the clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from event_etl.timeutil import HOUR_MS, to_millis

__all__ = [
    "DEADLETTER_DIR",
    "MARKER_NAME",
    "DATA_FORMATS",
    "DataFileName",
    "data_file_name",
    "deadletter_file_path",
    "hour_dir",
    "parse_data_file_name",
    "parse_hour_dir",
    "validate_event_type_name",
]

MARKER_NAME = "_COMPLETE"
DEADLETTER_DIR = "_deadletter"

_EVENT_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_HOUR_DIR_RE = re.compile(r"^([a-z][a-z0-9_]{0,62})/dt=(\d{4})-(\d{2})-(\d{2})/hour=(\d{2})$")
_FILE_RE = re.compile(r"^(part|late)-(\d{10})-(?:w([0-9a-f]{6})-)?b(\d{10})-s(\d{4})-(\d{4})\.(avro|parquet)$")
DATA_FORMATS = ("avro", "parquet")
"""The file formats of data files (``format`` in etl.toml), each the extension of its files' names."""
_WRITER_RE = re.compile(r"^[0-9a-f]{6}$")

MAX_BATCH_ID = 10**10 - 1
MAX_SHARD = 9999
MAX_SEQ = 9999


def validate_event_type_name(name: str) -> str:
    """Return ``name`` if it is a safe event type name, else raise ``ValueError``.

    Names are lower-case letters, digits and ``_``, starting with a letter, at most 63
    characters: they become folder names, metric labels and Pub/Sub ids, so nothing that
    could climb out of the sink (``..``, ``/``) or need quoting is allowed.
    """
    if not isinstance(name, str) or not _EVENT_TYPE_RE.match(name):
        raise ValueError(
            f"{name!r} is not a valid event type name: use lower-case letters, digits and '_', "
            "starting with a letter (for example 'page_view')"
        )
    return name


def _hour_parts(hour_start: int) -> tuple[str, str]:
    if hour_start % HOUR_MS:
        raise ValueError(f"{hour_start} is not the start of an hour")
    dt = datetime.fromtimestamp(hour_start // 1000, tz=UTC)
    return dt.strftime("%Y-%m-%d"), dt.strftime("%H")


def hour_dir(event_type: str, hour_start: int) -> str:
    """Folder of an hour, relative to the sink root: ``page_view/dt=2026-11-21/hour=13``."""
    validate_event_type_name(event_type)
    day, hh = _hour_parts(hour_start)
    return f"{event_type}/dt={day}/hour={hh}"


def parse_hour_dir(rel: str) -> tuple[str, int]:
    """Inverse of :func:`hour_dir`: ``(event_type, hour_start)``; ``ValueError`` if it is not one."""
    m = _HOUR_DIR_RE.match(rel.strip("/"))
    if not m:
        raise ValueError(f"{rel!r} is not an hour folder like 'page_view/dt=2026-11-21/hour=13'")
    y, mo, d, h = (int(g) for g in m.groups()[1:])
    try:
        return m.group(1), to_millis(datetime(y, mo, d, h, tzinfo=UTC))
    except ValueError as err:
        raise ValueError(f"{rel!r} names no real hour: {err}") from err


@dataclass(frozen=True)
class DataFileName:
    """What a data file's name says about it."""

    hour_start: int
    batch_id: int
    shard: int
    seq: int
    late: bool
    writer: str = ""
    fmt: str = "avro"

    @property
    def name(self) -> str:
        return data_file_name(self.hour_start, self.batch_id, self.shard, self.seq, late=self.late, writer=self.writer,
                              fmt=self.fmt)


def data_file_name(hour_start: int, batch_id: int, shard: int, seq: int, *, late: bool, writer: str = "",
                   fmt: str = "avro") -> str:
    """Name of a data file: ``part-2026112113-w3fa9c1-b0000000042-s0003-0000.avro`` (``late-`` for late records).

    ``hour_start`` is the hour the file is written into (for late records, the open hour
    that received them, not the hour of their event time).  ``writer`` (six hex digits, fixed
    when a job's checkpoint is created) keeps two jobs that write the same sink from ever
    producing the same name; it may be empty.  ``fmt`` (:data:`DATA_FORMATS`) is the extension.
    """
    if fmt not in DATA_FORMATS:
        raise ValueError(f"file format {fmt!r} is not one of {', '.join(DATA_FORMATS)}")
    if writer and not _WRITER_RE.match(writer):
        raise ValueError(f"writer id {writer!r} is not six hex digits")
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise ValueError(f"batch id {batch_id} out of range")
    if not 0 <= shard <= MAX_SHARD:
        raise ValueError(f"shard {shard} out of range 0..{MAX_SHARD}")
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"file sequence {seq} out of range 0..{MAX_SEQ}")
    day, hh = _hour_parts(hour_start)
    prefix = "late" if late else "part"
    w = f"w{writer}-" if writer else ""
    return f"{prefix}-{day.replace('-', '')}{hh}-{w}b{batch_id:010d}-s{shard:04d}-{seq:04d}.{fmt}"


def parse_data_file_name(name: str) -> DataFileName:
    """Inverse of :func:`data_file_name`; ``ValueError`` for any other name."""
    m = _FILE_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not an event_etl data file name")
    kind, stamp, writer, batch, shard, seq, fmt = m.groups()
    try:
        hour = to_millis(
            datetime(int(stamp[:4]), int(stamp[4:6]), int(stamp[6:8]), int(stamp[8:10]), tzinfo=UTC)
        )
    except ValueError as err:
        raise ValueError(f"{name!r} names no real hour: {err}") from err
    return DataFileName(hour, int(batch), int(shard), int(seq), kind == "late", writer or "", fmt)


def deadletter_file_path(event_type: str, day_ms: int, batch_id: int, shard: int, *, writer: str = "") -> str:
    """Dead-letter file of one shard of one batch, relative to the sink root.

    ``day_ms`` is any instant of the day the batch started (recorded with the batch, so a
    replay writes the same path).
    """
    validate_event_type_name(event_type)
    day = datetime.fromtimestamp(day_ms // 1000, tz=UTC).strftime("%Y-%m-%d")
    w = f"w{writer}-" if writer else ""
    return f"{event_type}/{DEADLETTER_DIR}/dt={day}/dl-{w}b{batch_id:010d}-s{shard:04d}.avro"
