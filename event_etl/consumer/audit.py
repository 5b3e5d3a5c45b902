"""Auditing an hour against the source's count, and recording the result next to its marker.

Grab ran hourly count checks against the source; this is that check for event_etl.  The
source (the publisher) counts the events it sent **by their event hour**.  A complete
hour's manifest counts something else: the records **written into its folder**.  The two
differ by late records:

- the hour's folder holds, in ``late-`` files, late records of *earlier* hours;
- late records *of this hour* (arrived after it was complete) were written, in ``late-``
  files, into the hours that were open when they arrived: from the next hour up to the
  hour holding ``hour end + allowed_lateness`` (the **lateness horizon**; later than that
  they are dead-lettered as ``too_late``).

So the audit compares the source's count with

    counted = records of the hour's ``part-`` files
            + records in the ``late-`` files of the later complete hours, up to the
              lateness horizon, whose event time lies in the hour.

Every file read is checked against its manifest entry (size and sha256).  Records that went
to the dead-letter area (invalid, ``too_late``, ``future``, ``before_backfill``) are not in the sink and are not
counted: a mismatch caused by them is a real one (``event-etl deadletter`` shows them).
For an event type whose event time does not come from the record (``time_attribute`` or
``publish_time_fallback``), late records cannot be attributed to their hour: only the
``part-`` records are counted, and ``late_records_found`` is ``null``.

The verdict (:func:`audit_verdict`):

- ``match`` when ``counted == expected``;
- ``mismatch`` when ``counted > expected`` (records only ever get added), or when the
  lateness horizon is complete (no late record of the hour can come any more), or when late
  records cannot be attributed;
- ``inconclusive`` otherwise: fewer records than expected while late records of the hour
  may still arrive.  This result is *not* recorded; audit again later.

A conclusive result is written once, create-only, as ``_AUDIT`` in the hour's folder (see
:mod:`event_etl.consumer.audit_record`); the hour's status then reads ``audited`` or
``mismatch``.  Auditing again with the same expected count returns the recorded result;
with another count it is refused (:class:`~event_etl.consumer.errors.AuditConflictError`).

The publisher's count file (``--count-file``)::

    {"event_type": "page_view", "counts": {"2026-11-21T13:00:00Z": 1234, ...}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from event_etl.consumer.audit_record import AuditRecord, AuditResult
from event_etl.consumer.errors import AuditConflictError, CountFileError
from event_etl.consumer.hours import HourLike, hour_ms, hour_text
from event_etl.consumer.read import records_of
from event_etl.consumer.sink import AUDIT_NAME, HourFolder, SinkLike, could_not_check, open_sink, type_name
from event_etl.consumer.status import hour_status, require_complete
from event_etl.errors import UsageError
from event_etl.eventtypes import EventType
from event_etl.storage import Storage
from event_etl.timeutil import HOUR_MS, hour_floor, iso, parse_hour, to_datetime

__all__ = [
    "audit_hour",
    "audit_verdict",
    "lateness_horizon",
    "parse_count_file",
    "read_count_file",
]


def lateness_horizon(hour: int, allowed_lateness: int) -> int:
    """The last hour (start, ms) into which late records of ``hour`` can be written."""
    return hour_floor(hour + HOUR_MS + allowed_lateness)


def audit_verdict(*, expected: int, counted: int, final: bool) -> AuditResult:
    """Match, mismatch, or inconclusive (fewer records while late ones may still come)."""
    if counted == expected:
        return AuditResult.MATCH
    if counted > expected or final:
        return AuditResult.MISMATCH
    return AuditResult.INCONCLUSIVE


def parse_count_file(data: bytes, *, event_type: str, hour: int, path: str) -> int:
    """The source's count for ``hour`` from a publisher's count file; :class:`CountFileError` if there is none."""
    fix = 'a count file is JSON: {"event_type": "page_view", "counts": {"2026-11-21T13:00:00Z": 1234}}'
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CountFileError(f"{path} is not JSON: {err}", path=path, fix=fix) from err
    if not isinstance(doc, dict) or not isinstance(doc.get("counts"), dict):
        raise CountFileError(f"{path} has no \"counts\" object", path=path, fix=fix)
    if doc.get("event_type") != event_type:
        raise CountFileError(f"{path} counts {doc.get('event_type')!r}, not {event_type!r}", path=path,
                             fix=f"use the count file the publisher of {event_type} wrote")
    counts: dict[int, Any] = {}
    for key, value in doc["counts"].items():
        try:
            counts[parse_hour(key)] = value
        except ValueError as err:
            raise CountFileError(f"{path}: {err}", path=path, fix=fix) from err
    if hour not in counts:
        raise CountFileError(f"{path} has no count for {iso(hour)}", path=path,
                             fix="wait until the publisher has written the hour's count, or pass --expected N")
    value = counts[hour]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CountFileError(f"{path}: the count of {iso(hour)} is {value!r}, not a whole number", path=path, fix=fix)
    return value


def read_count_file(path: str | os.PathLike[str], *, event_type: str | EventType, hour: HourLike) -> int:
    """The source's count for ``hour`` from the count file at ``path`` (a local path or ``gs://`` URL)."""
    text = os.fspath(path)
    parent, _, name = text.rstrip("/").rpartition("/")
    if not name:
        raise CountFileError(f"{text!r} names no file", path=text, fix="give the path of the count file")
    data = None
    with could_not_check():
        try:
            data = open_sink(parent or ".").read(name)
        except FileNotFoundError:
            pass
    if data is None:
        raise CountFileError(f"there is no count file at {text}", path=text,
                             fix="check the path, or pass the count with --expected N")
    return parse_count_file(data, event_type=type_name(event_type), hour=hour_ms(hour), path=text)


def _event_time_of(et: EventType) -> Callable[[dict[str, Any]], int]:
    """The event time (ms) of a record of ``et``, by the type's own rule for its time field."""
    from event_etl.task.payload import Decoder

    # The decoder owns the rule (logical types, epoch millis or seconds, ISO-8601).
    parse, field = Decoder(et).record_time, et.time_field
    return lambda rec: parse(rec[field])


def _late_records_of(storage: Storage, et: EventType, hour: int, horizon: int) -> tuple[int, int, bool]:
    """``(records of hour found in later hours' late files, later hours read, horizon reached)``."""
    event_time = _event_time_of(et)
    found = checked = 0
    for later in range(hour + HOUR_MS, horizon + HOUR_MS, HOUR_MS):
        folder = HourFolder(storage, et.name, later)
        manifest = folder.manifest()
        if manifest is None:  # markers come in order: no later hour is complete either
            return found, checked, False
        late = tuple(f for f in manifest.files if f.late)
        found += sum(1 for rec in records_of(folder, late) if hour_floor(event_time(rec)) == hour)
        checked += 1
    return found, checked, True


def _recorded(existing: AuditRecord, expected: int) -> AuditRecord:
    if existing.expected != expected:
        raise AuditConflictError(
            f"{existing.event_type} {hour_text(existing.hour)} was audited at {hour_text(existing.audited_at)} "
            f"against {existing.expected:,} expected records ({existing.result}), not {expected:,}",
            recorded=existing.expected, asked=expected,
            fix=f"an audit is recorded once; to audit again, move its {AUDIT_NAME} file aside",
        )
    return existing


def audit_hour(sink: SinkLike, event_type: EventType, hour: HourLike, *, expected: int,
               source: str = "--expected", now: datetime | None = None) -> AuditRecord:
    """Audit a complete hour against ``expected`` records from the source (see the module docstring).

    ``event_type`` must be the loaded :class:`EventType` (its time field and allowed lateness
    are part of the rule).  ``now`` (aware; default: the clock) is the audit's time.  The
    returned record says whether it is ``recorded``; an ``inconclusive`` one never is.
    """
    if not isinstance(event_type, EventType):
        raise UsageError(f"audit_hour needs the loaded event type, not {event_type!r}",
                         fix="pass event_etl.eventtypes.load_event_type(<folder of the type>)")
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
        raise UsageError(f"expected count {expected!r} is not a whole number", fix="pass --expected N with N >= 0")
    storage = open_sink(sink)
    status = hour_status(storage, event_type, hour)
    manifest = require_complete(status)
    name, h = status.event_type, manifest.hour
    if status.audit is not None:
        return _recorded(status.audit, expected)
    horizon = lateness_horizon(h, event_type.allowed_lateness)
    if event_type.time_attribute is None and not event_type.publish_time_fallback:
        late, checked, final = _late_records_of(storage, event_type, h, horizon)
    else:
        late, checked, final = None, 0, True
    timely = manifest.records - manifest.late_records
    when = now or datetime.now(UTC)
    if when.tzinfo is None:
        raise UsageError(f"now={when.isoformat()} is a naive datetime", fix="pass an aware datetime (UTC)")
    record = AuditRecord(
        event_type=name, hour=to_datetime(h), audited_at=when.astimezone(UTC),
        result=audit_verdict(expected=expected, counted=timely + (late or 0), final=final),
        expected=expected, timely_records=timely, late_records_found=late, late_hours_checked=checked,
        lateness_horizon=to_datetime(horizon), final=final, source=source,
    )
    if record.result is AuditResult.INCONCLUSIVE:
        return record
    folder = HourFolder(storage, name, h)
    if not folder.create_only(AUDIT_NAME, record.to_bytes()):  # another audit won the race
        return _recorded(
            AuditRecord.from_bytes(folder.read_optional(AUDIT_NAME) or b"", path=folder.display(AUDIT_NAME)), expected
        )
    return replace(record, recorded=True)
