"""Exceptions of event_etl.  Each says what is wrong and how to fix it, and carries its facts as fields.

The command line turns them into an error message and an exit code; library users can
catch them by class.
"""

from __future__ import annotations

import re

from event_etl.exitcodes import ExitCode

_SECRETS = [
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1***:***@"),  # user:password@ in URLs
    (re.compile(r"(?i)(bearer\s+)[a-z0-9._~+/=-]+"), r"\1***"),
    (re.compile(r"(?i)([\"']?(?:access_token|refresh_token|id_token|client_secret|private_key|password|token|"
                r"api[_-]?key)[\"']?\s*[:=]\s*[\"']?)[^\"'\s,&}]+"), r"\1***"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S), "***private key***"),
]


def redact(text: str) -> str:
    """``text`` with credentials blanked: passwords in URLs, bearer tokens, token=..., private keys."""
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text

__all__ = [
    "redact",
    "unwrap_task_error",
    "EventEtlError",
    "ConfigError",
    "UsageError",
    "CheckpointMismatchError",
    "CheckpointFormatError",
    "StorageError",
    "IntegrityError",
    "SourceError",
    "SchemaRegistryDown",
    "LeaseHeldError",
    "NoDataError",
]


class EventEtlError(Exception):
    """Base of every error event_etl raises on purpose.  ``fix`` tells the user what to do."""

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message + (f"\n  fix: {fix}" if fix else ""))


class UsageError(EventEtlError):
    """A command-line value is malformed (an hour, a duration, a source URL...)."""

    exit_code = ExitCode.USAGE


class ConfigError(EventEtlError):
    """An event type's ``schema.avsc`` or ``etl.toml`` is broken.  Raised when the type is loaded."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, file: str, field: str | None = None, fix: str | None = None) -> None:
        self.file = file
        self.field = field
        where = f"{file}" + (f": {field}" if field else "")
        super().__init__(f"{where}: {message}", fix=fix)


class CheckpointMismatchError(EventEtlError):
    """A checkpoint belongs to another event type, sink or source than the one asked for."""

    exit_code = ExitCode.USAGE


class CheckpointFormatError(EventEtlError):
    """A checkpoint (or a manifest) is in a format this release does not know: written by a newer one."""

    exit_code = ExitCode.USAGE


class StorageError(EventEtlError):
    """Reading or writing the sink failed (after retries), or the sink cannot be used."""


class IntegrityError(EventEtlError):
    """What is in a bucket does not match what the job wrote (a foreign writer, a lost file...).

    The job stops rather than mark an hour whose content it cannot vouch for.
    """


class SourceError(EventEtlError):
    """The source cannot be read (missing directory, unknown subscription, no permission...)."""


class SchemaRegistryDown(SourceError):
    """A type's schema registry could not be reached for the whole outage bound while a batch needed a writer
    schema from it (``EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS``): the batch fails, nothing was dead-lettered for it,
    and it is replayed on the next run."""


class LeaseHeldError(EventEtlError):
    """Another live job already writes this event type to this sink or checkpoint.

    Exit code 7 (``BUSY``; release 0.1.0 used 3, which now means "not yet" for every command:
    see :mod:`event_etl.exitcodes`)."""

    exit_code = ExitCode.BUSY


class NoDataError(EventEtlError):
    """``<sink>/<event_type>/`` holds nothing at all: a wrong sink or event type, or no job ever wrote there.

    Never taken for "not started yet": that answer needs a folder the job has written to.
    """

    exit_code = ExitCode.NO_DATA

    def __init__(self, message: str, *, sink: str, event_type: str, fix: str | None = None) -> None:
        self.sink = sink
        self.event_type = event_type
        super().__init__(message, fix=fix)


_TASK_ERROR_RE = re.compile(r"event_etl\.errors\.(\w+Error): (.*?)(?:\n\s+fix: (.*?))?\n", re.S)


def unwrap_task_error(err: BaseException) -> BaseException:
    """An executor task's event_etl error arrives wrapped in Spark's; give it back its own class and fix."""
    m = _TASK_ERROR_RE.search(str(err) + "\n")
    if m is None:
        return err
    cls = globals().get(m.group(1))
    if cls is None or not isinstance(cls, type) or not issubclass(cls, EventEtlError) or cls is ConfigError:
        return err
    return cls(m.group(2).strip(), fix=(m.group(3) or "").strip() or None)
