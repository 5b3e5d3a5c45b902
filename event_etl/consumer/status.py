"""Where an hour stands, from a consumer's point of view.

The job writes exactly one ``_COMPLETE`` marker per hour, in order, for every hour from
the first one that received data up to the watermark (hours without events included).
So the state of an hour follows from its folder and from the first hour that has a marker:

==================  ===========================================================================
state               when
==================  ===========================================================================
``complete``        the folder has its ``_COMPLETE`` marker; the hour will never change
``audited``         complete, and an audit found the source's count (``_AUDIT``, result match)
``mismatch``        complete, and an audit found another count than the source's
``open``            no marker yet, and the folder holds data files: the job is writing it
``not started``     no marker and no data files, and no later hour is complete: nothing
                    arrived yet (a quiet hour still gets its marker when the watermark passes)
``never``           no marker, but it lies before the first hour that has one: markers come
                    in order, so this hour was before the job's first hour and no marker will
                    ever come (files in such a folder are late records the job put there
                    before its first hour; ``event-etl verify`` of later hours is unaffected)
==================  ===========================================================================

:func:`classify_hour` is the rule, over plain values.  :func:`hour_status` and
:func:`hour_statuses` read the sink (the marker by name; the folder listing only when
there is no marker) and apply it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from event_etl.consumer.audit_record import AuditRecord, AuditResult
from event_etl.consumer.errors import HourNeverCompleteError, HourNotCompleteError
from event_etl.consumer.hours import HourLike, hour_ms, hour_range, hour_text
from event_etl.consumer.sink import (
    AUDIT_NAME,
    EventTypeLike,
    HourFolder,
    SinkLike,
    first_complete_hour,
    last_hour_folder,
    open_sink,
    require_type_data,
    type_name,
)
from event_etl.rules.buckets import MARKER_NAME
from event_etl.rules.manifest import DATA_EXTENSIONS, Manifest
from event_etl.storage import Storage
from event_etl.timeutil import HOUR_MS, hour_floor, to_datetime

__all__ = ["HourState", "HourStatus", "classify_hour", "hour_status", "hour_statuses", "require_complete"]


class HourState(str, enum.Enum):
    """Where an hour stands (see the module docstring)."""

    NOT_STARTED = "not started"
    OPEN = "open"
    COMPLETE = "complete"
    AUDITED = "audited"
    MISMATCH = "mismatch"
    NEVER = "never"

    @property
    def is_complete(self) -> bool:
        """True when the hour has its marker (audited or not): it can be read, and will not change."""
        return self in (HourState.COMPLETE, HourState.AUDITED, HourState.MISMATCH)

    def __str__(self) -> str:
        return self.value


def classify_hour(
    hour: int, *, has_marker: bool, data_files: int, audit_matched: bool | None, first_complete: int | None
) -> HourState:
    """The state of ``hour`` (ms) from what its folder holds and the first hour that has a marker.

    ``audit_matched`` is ``None`` when the hour has no audit record.  ``first_complete`` is
    only consulted for an hour without a marker.
    """
    if has_marker:
        if audit_matched is None:
            return HourState.COMPLETE
        return HourState.AUDITED if audit_matched else HourState.MISMATCH
    if first_complete is not None and hour < first_complete:
        return HourState.NEVER
    return HourState.OPEN if data_files else HourState.NOT_STARTED


@dataclass(frozen=True)
class HourStatus:
    """One hour's state, with its manifest and audit when it has them."""

    event_type: str
    hour: datetime
    state: HourState
    data_files: int
    manifest: Manifest | None = None
    audit: AuditRecord | None = None
    first_complete: datetime | None = None

    @property
    def is_complete(self) -> bool:
        return self.state.is_complete

    @property
    def records(self) -> int | None:
        """Records in the hour's files (late ones included); ``None`` until the hour is complete."""
        return None if self.manifest is None else self.manifest.records

    @property
    def late_records(self) -> int | None:
        return None if self.manifest is None else self.manifest.late_records

    @property
    def completed_at(self) -> datetime | None:
        """When the marker was written."""
        return None if self.manifest is None else to_datetime(self.manifest.completed_at)

    @property
    def marker_delay(self) -> timedelta | None:
        """How long after the end of the hour the marker was written."""
        return None if self.manifest is None else timedelta(milliseconds=self.manifest.marker_delay_ms)

    def describe(self) -> str:
        """One line for people: ``page_view 2026-11-21T13:00:00Z open (3 data files)``."""
        head = f"{self.event_type} {hour_text(self.hour)} {self.state}"
        if self.manifest is not None:
            return f"{head} (records {self.records:,}, late {self.late_records:,}, files {self.data_files})"
        if self.state is HourState.NEVER:
            return f"{head} (before the first marked hour, {hour_text(self.first_complete)})"
        return f"{head} ({self.data_files} data files, no {MARKER_NAME} marker)"


def _status(storage: Storage, event_type: str, hour: int, first_complete: Callable[[], int | None],
            has_data: Callable[[], None] | None = None) -> HourStatus:
    folder = HourFolder(storage, event_type, hour)
    manifest = folder.manifest()
    if manifest is None:
        listing = folder.listing()
        if MARKER_NAME in listing:  # the marker appeared between the two reads
            manifest = folder.manifest()
    if manifest is not None:
        audit = _audit(folder)
        state = classify_hour(hour, has_marker=True, data_files=len(manifest.files),
                              audit_matched=None if audit is None else audit.result is AuditResult.MATCH,
                              first_complete=None)
        return HourStatus(event_type, to_datetime(hour), state, len(manifest.files), manifest, audit)
    files = sum(1 for name in listing if name.endswith(DATA_EXTENSIONS))  # .avro, .parquet
    first = first_complete()
    if first is None and not listing:  # nothing marked, nothing here: is there anything at all?
        (has_data or (lambda: require_type_data(storage, event_type)))()
    state = classify_hour(hour, has_marker=False, data_files=files, audit_matched=None, first_complete=first)
    return HourStatus(event_type, to_datetime(hour), state, files,
                      first_complete=None if first is None else to_datetime(first))


def _audit(folder: HourFolder) -> AuditRecord | None:
    data = folder.read_optional(AUDIT_NAME)
    return None if data is None else AuditRecord.from_bytes(data, path=folder.display(AUDIT_NAME))


def _first_complete_once(storage: Storage, event_type: str) -> Callable[[], int | None]:
    cache: list[int | None] = []

    def get() -> int | None:
        if not cache:
            cache.append(first_complete_hour(storage, event_type))
        return cache[0]

    return get


def _checked_once(storage: Storage, event_type: str) -> Callable[[], None]:
    done: list[bool] = []

    def check() -> None:
        if not done:
            require_type_data(storage, event_type)
            done.append(True)

    return check


def hour_status(sink: SinkLike, event_type: EventTypeLike, hour: HourLike) -> HourStatus:
    """The state of one hour of ``event_type`` in ``sink``.

    Raises :class:`~event_etl.consumer.errors.CouldNotCheckError` when the sink cannot be
    read, and :class:`~event_etl.errors.NoDataError` when ``<sink>/<event_type>/`` holds
    nothing at all (a wrong sink or type): neither is ever reported as "not started".
    """
    storage, name, h = open_sink(sink), type_name(event_type), hour_ms(hour)
    return _status(storage, name, h, _first_complete_once(storage, name))


def default_window(sink: SinkLike, event_type: EventTypeLike, *, now: int, hours: int = 24) -> tuple[int, int]:
    """The hours ``event-etl hours`` shows when asked for none: ``hours`` hours up to the current one, or up to the
    latest hour holding data when that is later (a generator's event clock runs ahead of the wall clock), and none
    before the job's first hour ("never" rows would hide the ones that matter)."""
    storage, name = open_sink(sink), type_name(event_type)
    last = last_hour_folder(storage, name)
    until = max(hour_floor(now), last if last is not None else hour_floor(now)) + HOUR_MS
    since = until - hours * HOUR_MS
    first = first_complete_hour(storage, name)
    if first is not None and since < first < until:
        since = first
    return since, until


def hour_statuses(sink: SinkLike, event_type: EventTypeLike, since: HourLike, until: HourLike) -> list[HourStatus]:
    """The states of the hours in ``[since, until)`` (half-open), oldest first."""
    storage, name = open_sink(sink), type_name(event_type)
    first, has_data = _first_complete_once(storage, name), _checked_once(storage, name)
    return [_status(storage, name, h, first, has_data) for h in hour_range(since, until)]


def require_complete(status: HourStatus) -> Manifest:
    """The manifest of a complete hour; otherwise the error that says why it cannot be used (yet)."""
    if status.manifest is not None:
        return status.manifest
    where = f"{status.event_type} {hour_text(status.hour)}"
    if status.state is HourState.NEVER:
        first = status.first_complete
        assert first is not None  # an hour is "never" only before the first hour the job marked
        raise HourNeverCompleteError(
            f"{where} will never be complete: it lies before {hour_text(first)}, the first hour the "
            "job marked (markers are written in order from the job's first hour)",
            event_type=status.event_type, hour=status.hour, first_complete=first,
            fix=f"ask for {hour_text(first)} or a later hour",
        )
    raise HourNotCompleteError(
        f"{where} is not complete: {status.state} ({status.data_files} data files, no {MARKER_NAME} marker)",
        event_type=status.event_type, hour=status.hour,
        fix=f"wait for it first: event-etl wait {status.event_type} {hour_text(status.hour)}",
    )
