"""Reading a complete hour: exactly the files its manifest lists, each checked before a record is handed out.

A consumer reads an hour once, after its marker appeared.  What it reads is the
manifest's file list, never a listing of the folder: the manifest is what the job vouched
for, and a folder listing on an object store can be stale or include files that are not
part of the hour.  Every file is checked against the manifest's size and sha256 before its
records are decoded; a missing or different file raises
:class:`~event_etl.consumer.errors.CorruptHourError` (``event-etl verify`` tells the whole
story).  An hour without a marker raises
:class:`~event_etl.consumer.errors.HourNotCompleteError`: nothing is read from an hour that
may still change.

``late-`` files hold records that arrived after *their own* hour was complete and were
written into this (then open) hour.  They are included by default, as the manifest counts
them; ``include_late=False`` leaves them out, so an hour then holds only records whose event
time lies in it.

Output forms: Python records (fastavro's values: timestamps as aware UTC datetimes), an
Arrow table (:mod:`event_etl.consumer.arrow`), JSON lines, or one Avro container file.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import io
import itertools
import json
import uuid
from typing import Any, BinaryIO, Iterator, TextIO

import fastavro

from event_etl.consumer.errors import CorruptHourError
from event_etl.consumer.hours import HourLike
from event_etl.consumer.sink import EventTypeLike, HourFolder, SinkLike, open_sink
from event_etl.consumer.status import hour_status, require_complete
from event_etl.errors import UsageError
from event_etl.eventtypes import EventType
from event_etl.rules.manifest import FileEntry, Manifest

__all__ = ["hour_files", "read_records", "records_of", "read_table", "record_json", "write_avro", "write_jsonl"]


def hour_files(manifest: Manifest, *, include_late: bool = True) -> tuple[FileEntry, ...]:
    """The files of a complete hour to read, in the manifest's order (by name)."""
    return tuple(f for f in manifest.files if include_late or not f.late)


def _complete_folder(sink: SinkLike, event_type: EventTypeLike, hour: HourLike) -> tuple[HourFolder, Manifest]:
    storage = open_sink(sink)
    status = hour_status(storage, event_type, hour)
    manifest = require_complete(status)
    return HourFolder(storage, status.event_type, manifest.hour), manifest


def _readers(folder: HourFolder, files: tuple[FileEntry, ...]) -> Iterator[fastavro.reader]:
    for entry in files:
        data = folder.checked_file(entry)
        try:
            yield fastavro.reader(io.BytesIO(data))
        except (ValueError, EOFError, TypeError) as err:  # the bytes match the manifest, yet are no Avro file
            path = folder.display(entry.name)
            raise CorruptHourError(f"{path} is not an Avro container file: {err}", path=path,
                                   fix="the job wrote a damaged file; report it with the file") from err


def records_of(folder: HourFolder, files: tuple[FileEntry, ...]) -> Iterator[dict[str, Any]]:
    """The records of ``files`` of ``folder``, each file checked against its manifest entry first."""
    for reader in _readers(folder, files):
        yield from reader


def read_records(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, *,
                 include_late: bool = True) -> Iterator[dict[str, Any]]:
    """The records of a complete hour, file by file, as fastavro reads them.

    The hour's completeness is checked when this is called (not on the first ``next``):
    ``HourNotCompleteError`` and ``CouldNotCheckError`` come at once.
    """
    folder, manifest = _complete_folder(sink, event_type, hour)
    return records_of(folder, hour_files(manifest, include_late=include_late))


def read_table(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, *, include_late: bool = True):
    """The records of a complete hour as a ``pyarrow.Table``.

    Column types come from the files' Avro schema; for an hour without records, from the
    event type's schema when ``event_type`` is an :class:`~event_etl.eventtypes.EventType`
    (with a name only, such a table has no columns).
    """
    import pyarrow as pa

    from event_etl.consumer.arrow import ArrowConverter

    folder, manifest = _complete_folder(sink, event_type, hour)
    tables, converter = [], None
    for reader in _readers(folder, hour_files(manifest, include_late=include_late)):
        converter = converter or ArrowConverter(reader.writer_schema)
        tables.append(converter.table(reader))
    if tables:
        return pa.concat_tables(tables)
    if isinstance(event_type, EventType):
        return ArrowConverter(event_type.schema).table([])
    return pa.table({})


def write_avro(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, out: BinaryIO, *,
               include_late: bool = True, codec: str = "deflate") -> int:
    """Write the records of a complete hour to ``out`` as one Avro container file; the number of records.

    The schema is the files' writer schema (for an hour without records: the event type's,
    so ``event_type`` must then be an :class:`~event_etl.eventtypes.EventType`).
    """
    folder, manifest = _complete_folder(sink, event_type, hour)
    readers = _readers(folder, hour_files(manifest, include_late=include_late))
    first = next(readers, None)
    if first is not None:
        schema = first.writer_schema
    elif isinstance(event_type, EventType):
        schema = event_type.schema
    else:
        raise UsageError(f"{folder.display()} has no records to take an Avro schema from",
                         fix="pass the EventType (event_etl.eventtypes.load_event_type) instead of its name")
    count = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal count
        for reader in itertools.chain([] if first is None else [first], readers):
            for rec in reader:
                count += 1
                yield rec

    fastavro.writer(out, fastavro.parse_schema(schema), records(), codec=codec)
    return count


def record_json(record: dict[str, Any]) -> str:
    """One record as a line of JSON.

    Values JSON has no type for are written as text: timestamps as ISO-8601 (UTC with
    ``Z``), dates and times as ISO-8601, UUIDs and decimals as strings, bytes as base64.
    """
    return json.dumps(record, default=_json_value, ensure_ascii=False, separators=(",", ":"))


def _json_value(v: Any) -> Any:
    if isinstance(v, _dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(_dt.timezone.utc)
        us = v.microsecond
        text = v.isoformat(timespec="seconds" if not us else "milliseconds" if us % 1000 == 0 else "microseconds")
        return text.replace("+00:00", "Z")
    if isinstance(v, (_dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (uuid.UUID, decimal.Decimal)):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode("ascii")
    raise TypeError(f"cannot write a {type(v).__name__} as JSON")


def write_jsonl(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, out: TextIO, *,
                include_late: bool = True) -> int:
    """Write the records of a complete hour to ``out``, one JSON object per line; the number of records."""
    count = 0
    for rec in read_records(sink, event_type, hour, include_late=include_late):
        out.write(record_json(rec) + "\n")
        count += 1
    return count
