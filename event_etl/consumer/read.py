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

Both file formats read alike: a type of ``format = "parquet"`` writes Parquet files that carry
the Avro schema they were written in (:mod:`event_etl.storage.parquetio`); each is read back into
the same Avro records (and resolved into a reader schema, written out as JSON lines or Avro) as
an Avro file of the same records would be.  An hour whose files are of both formats (the type's
format changed within it) reads as one.  :func:`read_table` reads a Parquet file's columns with pyarrow as they
are, cast to the Arrow types its Avro schema maps to (no record is made), when the file is written in the reader
schema (or there is none); only a file that must be resolved into another schema goes through its records.

Ranges and schema changes: ``until=`` reads every hour of ``[hour, until)`` (each must be
complete) in one go.  An event type's schema may change between hours, or within one (the
job restarted with a new compatible schema: the manifest gives each file's
``schema_fingerprint``).  Every record is then read into one *reader schema*, by Avro's
resolution rules (a field a file does not have takes its default): ``reader_schema=`` (a
schema or the path of an ``.avsc`` file), else the :class:`~event_etl.eventtypes.EventType`'s
current schema when one is passed, else the newest schema the files were written in (each
Avro file carries its writer schema, so no ``event_types`` folder is needed).  A reader
schema that cannot read a file is refused before any record is handed out
(:class:`~event_etl.consumer.errors.IncompatibleSchemaError`, naming the fields and why).
When the reader schema is the one a file was written in, the file is read as it is.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import io
import itertools
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TextIO, Union, cast

import fastavro

from event_etl.consumer.errors import CorruptHourError, IncompatibleSchemaError
from event_etl.consumer.hours import HourLike, hour_ms, hour_text
from event_etl.consumer.sink import EventTypeLike, HourFolder, SinkLike, open_sink, type_name
from event_etl.consumer.status import hour_status, hour_statuses, require_complete
from event_etl.errors import UsageError
from event_etl.eventtypes import EventType
from event_etl.rules.buckets import parse_data_file_name
from event_etl.rules.manifest import FileEntry, Manifest

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["hour_files", "writer_schema", "read_records", "records_of", "read_table", "record_json", "write_avro",
           "write_jsonl",
           "ReaderSchemaLike"]

ReaderSchemaLike = Union[dict[str, Any], str, "os.PathLike[str]", None]
"""A reader schema: an Avro record schema (its JSON as a dict), or the path of an ``.avsc`` file."""


def hour_files(manifest: Manifest, *, include_late: bool = True) -> tuple[FileEntry, ...]:
    """The files of a complete hour to read, in the manifest's order (by name)."""
    return tuple(f for f in manifest.files if include_late or not f.late)


def _complete_folder(sink: SinkLike, event_type: EventTypeLike, hour: HourLike) -> tuple[HourFolder, Manifest]:
    storage = open_sink(sink)
    status = hour_status(storage, event_type, hour)
    manifest = require_complete(status)
    return HourFolder(storage, status.event_type, manifest.hour), manifest


@dataclass
class _Part:
    """One file to read: its hour's folder and manifest, and its entry."""

    folder: HourFolder
    manifest: Manifest
    entry: FileEntry

    @property
    def fingerprint(self) -> str:
        return self.manifest.file_fingerprint(self.entry)


def _parts(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, until: HourLike | None,
           include_late: bool) -> list[_Part]:
    """The files of the complete hour, or of every hour of ``[hour, until)`` (all must be complete), in order: in
    each hour its own files first, then its late files (records of earlier hours), each in the manifest's order."""
    if until is None:
        pairs = [_complete_folder(sink, event_type, hour)]
    else:
        storage = open_sink(sink)
        pairs = []
        for status in hour_statuses(storage, event_type, hour, until):
            manifest = require_complete(status)
            pairs.append((HourFolder(storage, status.event_type, manifest.hour), manifest))
    return [_Part(folder, m, f) for folder, m in pairs
            for f in sorted(hour_files(m, include_late=include_late), key=lambda f: f.late)]


def writer_schema(sink: SinkLike, event_type: EventTypeLike, hour: HourLike) -> dict[str, Any] | None:
    """The schema the newest file of a complete hour is written in (files carry it); ``None`` without files."""
    parts = _parts(sink, event_type, hour, None, True)
    if not parts:
        return None
    newest = max(parts, key=_age)
    data = newest.folder.checked_file(newest.entry)
    schema: dict[str, Any] = json.loads(_open(data, newest.folder.display(newest.entry.name)).metadata["avro.schema"])
    return schema


def _load_reader_schema(reader_schema: ReaderSchemaLike) -> dict[str, Any] | None:
    if reader_schema is None:
        return None
    if isinstance(reader_schema, (str, os.PathLike)):
        from event_etl.eventtypes import load_schema_file

        return load_schema_file(reader_schema)
    if not isinstance(reader_schema, dict) or reader_schema.get("type") != "record":
        raise UsageError("reader_schema must be an Avro record schema (a dict) or the path of an .avsc file",
                         fix='pass e.g. json.load(open("schema.avsc")) or "schema.avsc"')
    try:
        fastavro.parse_schema(reader_schema, _write_hint=False)
    except Exception as err:  # fastavro raises several kinds for a bad schema
        raise UsageError(f"reader_schema is not a valid Avro schema: {err}",
                         fix="check it against the Avro specification, or pass the type's schema.avsc") from err
    return reader_schema


class _AvroFile(Protocol):
    """What a read takes of a ``fastavro.reader``: the file's header and its records (dicts: every data file holds
    records of a record schema, where fastavro types them as any Avro value)."""

    metadata: dict[str, str]
    writer_schema: Any

    def __iter__(self) -> Iterator[dict[str, Any]]: ...


def _avro_file(fo: BinaryIO, reader_schema: dict[str, Any] | None = None) -> _AvroFile:
    return cast(_AvroFile, fastavro.reader(fo, reader_schema=reader_schema))


def _open(data: bytes, path: str) -> _AvroFile:
    """A fastavro reader of a data file's records: an Avro container file as it is, a Parquet file (a type of
    ``format = "parquet"``) read back into the Avro records it was written from, so that both read alike."""
    return _open_container(_container(data, path), path)


def _container(data: bytes, path: str) -> bytes:
    """A data file as an Avro container file: itself, or a Parquet file's records in one."""
    return _parquet_records(data, path) if path.endswith(".parquet") else data


def _open_container(data: bytes, path: str) -> _AvroFile:
    try:
        return _avro_file(io.BytesIO(data))
    except (ValueError, EOFError, TypeError) as err:  # the bytes match the manifest, yet are no Avro file
        raise CorruptHourError(f"{path} is not an Avro container file: {err}", path=path,
                               fix="the job wrote a damaged file; report it with the file") from err


def _parquet_records(data: bytes, path: str) -> bytes:
    """A Parquet data file as an Avro container of its records (:func:`~.parquetio.parquet_as_container`)."""
    try:
        from event_etl.storage.parquetio import parquet_as_container
    except ModuleNotFoundError as err:  # the light consumer: no pyarrow
        raise UsageError(f"{path} is a Parquet file: reading it needs the Python package 'pyarrow', which is not "
                         "installed", fix="pip install 'event_etl[arrow]'") from err
    try:
        return parquet_as_container(data)
    except Exception as err:  # the bytes match the manifest, yet are no Parquet file of ours
        raise CorruptHourError(f"{path} is not a Parquet data file: {err}", path=path,
                               fix="the job wrote a damaged file; report it with the file") from err


class _Reading:
    """Opens the files of a read, each one read into the reader schema (or as it is, without one)."""

    def __init__(self, reader: dict[str, Any] | None) -> None:
        self.reader = reader
        self.parsed = None if reader is None else fastavro.parse_schema(reader, _write_hint=False)
        self.cache: dict[int, bytes] = {}  # id(part) -> bytes already read (to take a writer schema)

    def bytes_of(self, part: _Part) -> bytes:
        data = self.cache.pop(id(part), None)
        return data if data is not None else part.folder.checked_file(part.entry)

    def open(self, part: _Part, data: bytes | None = None) -> _AvroFile:
        """A fastavro reader of the file, resolving its records into the reader schema if it has another one."""
        path = part.folder.display(part.entry.name)
        data = _container(self.bytes_of(part) if data is None else data, path)  # read again below, resolved
        r = _open_container(data, path)
        if self.reader is None or _same_schema(r.writer_schema, self.parsed):
            return r
        from event_etl.rules.compat import reader_problems

        writer = json.loads(r.metadata["avro.schema"])
        problems = reader_problems(self.reader, writer)
        if problems:
            raise IncompatibleSchemaError(
                f"the reader schema cannot read {path} (written in {part.fingerprint or 'another schema'}): "
                + "; ".join(str(p) for p in problems) + " (old: the file's schema, new: the reader schema)",
                path=path, problems=tuple(problems),
                fix="pass a reader schema that reads every version (reader_schema= or cat --reader-schema FILE), "
                "e.g. the event type's current schema; `event-etl schema check` compares schemas",
            )
        return _avro_file(io.BytesIO(data), reader_schema=self.reader)


def _same_schema(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _plan(parts: list[_Part], event_type: EventTypeLike, reader_schema: ReaderSchemaLike) -> _Reading:
    """The reader schema of a read: the one given, the EventType's, or (files of several schemas) the newest."""
    reader = _load_reader_schema(reader_schema)
    if reader is None and isinstance(event_type, EventType):
        reader = event_type.schema
    reading = _Reading(reader)
    if reader is None and len({p.fingerprint for p in parts}) > 1:
        newest = max(parts, key=_age)
        data = newest.folder.checked_file(newest.entry)
        writer = json.loads(_open(data, newest.folder.display(newest.entry.name)).metadata["avro.schema"])
        reading = _Reading(writer)
        reading.cache[id(newest)] = data
    return reading


def _age(part: _Part) -> tuple[int, int, str]:
    """Orders files by when they were written: by hour (late records go to the open hour, the latest), then batch."""
    try:
        batch = parse_data_file_name(part.entry.name).batch_id
    except ValueError:
        batch = -1
    return part.folder.hour, batch, part.entry.name


def _readers(folder: HourFolder, files: tuple[FileEntry, ...]) -> Iterator[_AvroFile]:
    for entry in files:
        yield _open(folder.checked_file(entry), folder.display(entry.name))


def records_of(folder: HourFolder, files: tuple[FileEntry, ...]) -> Iterator[dict[str, Any]]:
    """The records of ``files`` of ``folder``, each file checked against its manifest entry first."""
    for reader in _readers(folder, files):
        yield from reader


def read_records(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, *, include_late: bool = True,
                 until: HourLike | None = None, reader_schema: ReaderSchemaLike = None) -> Iterator[dict[str, Any]]:
    """The records of a complete hour (or of every hour of ``[hour, until)``), file by file.

    Records come in the reader schema (see the module docstring): ``reader_schema``, else the
    EventType's schema when one is passed, else the files' own schema (the newest one when the
    files were written in several).  The hours' completeness is checked when this is called (not
    on the first ``next``): ``HourNotCompleteError`` and ``CouldNotCheckError`` come at once.
    """
    parts = _parts(sink, event_type, hour, until, include_late)
    reading = _plan(parts, event_type, reader_schema)

    def records() -> Iterator[dict[str, Any]]:
        for part in parts:
            yield from reading.open(part)

    return records()


def read_table(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, *, include_late: bool = True,
               until: HourLike | None = None, reader_schema: ReaderSchemaLike = None) -> pa.Table:
    """The records of a complete hour (or of every hour of ``[hour, until)``) as one ``pyarrow.Table``.

    Column types come from the reader schema (see :func:`read_records`), so hours written
    before and after a schema change come out as one table; without a reader schema and with
    files of one schema, from the files' schema.  For a read without records: from the reader
    schema, else the event type's schema when ``event_type`` is an
    :class:`~event_etl.eventtypes.EventType` (with a name only, such a table has no columns).
    """
    try:
        import pyarrow as pa
    except ModuleNotFoundError as err:  # the light consumer: pyarrow (170 MB) only for those who want tables
        raise UsageError("read_table needs the Python package 'pyarrow', which is not installed (it comes with "
                         "the [arrow] extra; read_records, write_jsonl and the commands do without it)",
                         fix="pip install 'event_etl[arrow]'") from err

    from event_etl.consumer.arrow import ArrowConverter

    parts = _parts(sink, event_type, hour, until, include_late)
    reading = _plan(parts, event_type, reader_schema)
    files = [_TableFile(p, reading) for p in parts]  # every file checked (and its schema) before the first record
    if reading.reader is None and len({_key(f.writer) for f in files}) > 1:
        # manifests of version 1 do not say so, but the files are of several schemas: the newest one reads them
        newest = max(range(len(parts)), key=lambda i: _age(parts[i]))
        reading = _Reading(files[newest].writer_json)
    converter = None
    if reading.reader is not None:
        converter = ArrowConverter(reading.reader)
    tables = []
    for f in files:
        converter = converter or ArrowConverter(f.writer_json)
        tables.append(f.table(reading, converter))
    if tables:
        return pa.concat_tables(tables)
    if converter is not None:
        return converter.table([])
    if isinstance(event_type, EventType):
        return ArrowConverter(event_type.schema).table([])
    return pa.table({})


class _TableFile:
    """A file of :func:`read_table`, checked against its manifest entry: a Parquet file's columns as pyarrow reads
    them (no record is made: item 8 of issue 60), an Avro file's records."""

    def __init__(self, part: _Part, reading: _Reading) -> None:
        self.part = part
        self.path = part.folder.display(part.entry.name)
        self.data = reading.bytes_of(part)
        self.columns: pa.Table | None = None
        if self.path.endswith(".parquet"):
            self.columns, self.writer_json = _parquet_columns(self.data, self.path)
            self.writer: Any = fastavro.parse_schema(self.writer_json, _write_hint=False)
        else:
            self.avro = _open_container(self.data, self.path)
            self.writer = self.avro.writer_schema
            self.writer_json = json.loads(self.avro.metadata["avro.schema"])

    def table(self, reading: _Reading, converter: Any) -> pa.Table:
        """The file's rows in the converter's columns: a Parquet file written in the reader schema (or read without
        one) as its columns are; any other file through its records, resolved into the reader schema."""
        if self.columns is not None and (reading.reader is None or _same_schema(self.writer, reading.parsed)):
            return _conform(self.columns, converter.schema, self.path)
        records = self.avro if self.columns is None and reading.reader is None else reading.open(self.part, self.data)
        return cast("pa.Table", converter.table(records))


def _parquet_columns(data: bytes, path: str) -> tuple[pa.Table, dict[str, Any]]:
    from event_etl.storage.parquetio import parquet_table

    try:
        return parquet_table(data)
    except Exception as err:  # the bytes match the manifest, yet are no Parquet file of ours
        raise CorruptHourError(f"{path} is not a Parquet data file: {err}", path=path,
                               fix="the job wrote a damaged file; report it with the file") from err


def _conform(table: pa.Table, schema: pa.Schema, path: str) -> pa.Table:
    """A Parquet file's columns in the Arrow schema its Avro schema maps to (the one its writer used)."""
    try:
        return table.cast(schema)
    except (ValueError, TypeError, NotImplementedError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise CorruptHourError(f"{path}: its columns are not those of the Avro schema it carries: {err}", path=path,
                               fix="the job wrote a damaged file; report it with the file") from err


def _key(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, default=str)


def write_avro(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, out: BinaryIO, *,
               include_late: bool = True, codec: str = "deflate", until: HourLike | None = None,
               reader_schema: ReaderSchemaLike = None) -> int:
    """Write the records of a complete hour (or of ``[hour, until)``) to ``out`` as one Avro container file.

    The file's schema is the reader schema (see :func:`read_records`), else the first file's
    writer schema, into which every other file is then read; for a read without records, the
    event type's (``event_type`` must then be an :class:`~event_etl.eventtypes.EventType`).
    Returns the number of records.
    """
    parts = _parts(sink, event_type, hour, until, include_late)
    reading = _plan(parts, event_type, reader_schema)
    first = reading.open(parts[0]) if parts else None
    if reading.reader is not None:
        schema = reading.reader
    elif first is not None:
        schema = json.loads(first.metadata["avro.schema"])
        reading = _Reading(schema)  # every other file is read into the first one's schema
    else:
        what = f"{type_name(event_type)} {hour_text(hour_ms(hour))}" + (
            f" to {hour_text(hour_ms(until))}" if until is not None else "")
        raise UsageError(f"{what} has no records to take an Avro schema from",
                         fix="pass the EventType (event_etl.eventtypes.load_event_type) instead of its name, "
                         "or a reader_schema")
    count = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal count
        rest = (reading.open(p) for p in parts[1:])
        for reader in itertools.chain([] if first is None else [first], rest):
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
            v = v.astimezone(_dt.UTC)
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
                include_late: bool = True, until: HourLike | None = None,
                reader_schema: ReaderSchemaLike = None) -> int:
    """Write the records of a complete hour (or of ``[hour, until)``) to ``out``, one JSON object per line.

    Records are in the reader schema, as :func:`read_records` gives them.  Returns the number of records."""
    count = 0
    for rec in read_records(sink, event_type, hour, include_late=include_late, until=until,
                            reader_schema=reader_schema):
        out.write(record_json(rec) + "\n")
        count += 1
    return count
