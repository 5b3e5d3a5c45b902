"""What a batch consumer can be told, as exceptions, and the exit codes the command line turns them into.

Every answer about an hour is one of a few kinds, and each kind has one exit code, so a
shell scheduler can tell them apart without reading messages:

====  =====================  ==========================================================
code  name                   meaning
====  =====================  ==========================================================
0     ``OK``                 complete (``wait``, ``cat``), verified, audited
2     ``USAGE``              malformed HOUR, unknown event type, bad options, an hour the
                             job never marks (before its first hour), a bad count file
3     ``NOT_COMPLETE``       timeout: the hour is still not complete (or, for ``audit``,
                             the result cannot be final yet); try again later
4     ``COULD_NOT_CHECK``    the sink could not be read (network, permission, a file
                             where a folder should be): neither "complete" nor "absent"
5     ``FAILED``             verification failed, audit mismatch, a damaged marker or file
6     ``NO_DATA``            nothing at all under ``<sink>/<event_type>/``: a wrong sink or
                             type (:class:`~event_etl.errors.NoDataError`), never "not yet"
====  =====================  ==========================================================

The table of every command's codes is :mod:`event_etl.exitcodes`.

"Absent" and "could not check" are different answers: storage failures are never turned
into "not complete".  :class:`CouldNotCheckError` is a
:class:`~event_etl.errors.StorageError`, so ``except StorageError`` catches it too.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from event_etl.errors import EventEtlError, NoDataError, StorageError, UsageError
from event_etl.exitcodes import EXIT_CODE_MEANINGS as _MEANINGS
from event_etl.exitcodes import ExitCode as _ExitCode

if TYPE_CHECKING:
    from event_etl.rules.compat import Problem

__all__ = [
    "EXIT_CODE_MEANINGS",
    "ExitCode",
    "AuditConflictError",
    "CorruptHourError",
    "CouldNotCheckError",
    "CountFileError",
    "HourNeverCompleteError",
    "HourNotCompleteError",
    "IncompatibleSchemaError",
    "NoDataError",
    "UnsupportedSchemaError",
    "WaitTimeoutError",
]


ExitCode = _ExitCode
"""The exit codes (one table for every command: :mod:`event_etl.exitcodes`)."""

EXIT_CODE_MEANINGS = _MEANINGS
"""What each exit code means, for help texts."""


class CouldNotCheckError(StorageError):
    """The sink could not be read, so nothing can be said about the hour (not even "absent")."""

    exit_code = ExitCode.COULD_NOT_CHECK

    @classmethod
    def from_storage(cls, err: StorageError) -> CouldNotCheckError:
        return cls(err.message, fix="check the sink URL, credentials, permissions and network, then ask again: "
                   "the hour's state is unknown, not absent")


class HourNotCompleteError(EventEtlError):
    """The hour has no ``_COMPLETE`` marker (yet): it cannot be read, verified or audited."""

    exit_code = ExitCode.NOT_COMPLETE

    def __init__(self, message: str, *, event_type: str, hour: datetime, fix: str | None = None) -> None:
        self.event_type = event_type
        self.hour = hour
        super().__init__(message, fix=fix)


class WaitTimeoutError(HourNotCompleteError):
    """``wait`` gave up: the hour was never seen complete within the timeout.  ``status`` is the last one seen (an
    :class:`~event_etl.consumer.status.HourStatus`: that module raises these errors, this one does not import it)."""

    def __init__(
        self, message: str, *, event_type: str, hour: datetime, timeout: float, status: Any, fix: str | None = None
    ) -> None:
        self.timeout = timeout
        self.status = status
        super().__init__(message, event_type=event_type, hour=hour, fix=fix)


class HourNeverCompleteError(UsageError):
    """The hour lies before the first hour the job marked: no marker will ever come, so waiting is pointless."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, event_type: str, hour: datetime, first_complete: datetime,
                 fix: str | None = None) -> None:
        self.event_type = event_type
        self.hour = hour
        self.first_complete = first_complete
        super().__init__(message, fix=fix)


class CorruptHourError(EventEtlError):
    """A marker that is not a valid manifest of its hour, or a listed file that is missing or differs from it."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, path: str, fix: str | None = None) -> None:
        self.path = path
        super().__init__(message, fix=fix)


class AuditConflictError(EventEtlError):
    """The hour was already audited against another expected count (``_AUDIT`` is written once)."""

    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, recorded: int, asked: int, fix: str | None = None) -> None:
        self.recorded = recorded
        self.asked = asked
        super().__init__(message, fix=fix)


class CountFileError(UsageError):
    """A publisher's count file is missing, malformed, of another event type, or has no count for the hour."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, path: str, fix: str | None = None) -> None:
        self.path = path
        super().__init__(message, fix=fix)


class UnsupportedSchemaError(UsageError):
    """An Avro type that has no Arrow counterpart here (a union of several non-null types)."""

    exit_code = ExitCode.USAGE


class IncompatibleSchemaError(UsageError):
    """The reader schema cannot read a file of the hour by Avro's resolution rules; ``problems`` says which fields."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, path: str, problems: tuple[Problem, ...] = (), fix: str | None = None) -> None:
        self.path = path
        self.problems = tuple(problems)
        super().__init__(message, fix=fix)
