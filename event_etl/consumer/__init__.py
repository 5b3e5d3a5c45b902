"""Batch consumers: wait for an hour to be complete, verify it, read it once.

The streaming job closes every hour with one ``_COMPLETE`` manifest; a batch job
downstream waits for it, then reads exactly the files it lists.  This package is that
consumer, for any sink (a local folder or ``gs://bucket/prefix``)::

    from event_etl.consumer import wait_for_hour, read_table

    manifest = wait_for_hour("gs://events/prod", "page_view", "2026-11-21T13", timeout=3600)
    table = read_table("gs://events/prod", "page_view", "2026-11-21T13", include_late=False)

Hours are aware datetimes at the start of an hour or ISO-8601 UTC strings
(``2026-11-21T13``, ``2026-11-21T13:00Z``); ranges are half-open ``[since, until)``.

Status
    :func:`hour_status`, :func:`hour_statuses` -> :class:`HourStatus` with a
    :class:`HourState`: ``complete`` (``audited`` / ``mismatch`` after an audit), ``open``,
    ``not started``, or ``never`` (before the job's first hour: no marker will come).
Waiting
    :func:`wait_for_hour`, :func:`wait_for_hours` (timeout, poll interval) return the
    manifests; :func:`poke_hour` is one poll, for Airflow's ``PythonSensor``.
Reading
    :func:`read_records`, :func:`read_table`, :func:`write_jsonl`, :func:`write_avro`: only
    the manifest's files, each checked against its size and sha256; ``include_late``.
Verifying
    :func:`verify_hour`, :func:`verify_hours` -> :class:`VerifyReport` (missing, extra,
    corrupted files).
Auditing
    :func:`audit_hour` compares the hour with the source's count and records ``_AUDIT``.

Failures are exceptions with an exit code each (:class:`ExitCode`): not complete /
timeout (3), could not check the sink (4, never mistaken for "absent"), verification
failed or damaged (5), bad input (2).
"""

from event_etl.consumer.audit import audit_hour, audit_verdict, lateness_horizon, parse_count_file, read_count_file
from event_etl.consumer.audit_record import AuditRecord, AuditResult
from event_etl.consumer.errors import (
    AuditConflictError,
    CorruptHourError,
    CouldNotCheckError,
    CountFileError,
    ExitCode,
    HourNeverCompleteError,
    HourNotCompleteError,
    IncompatibleSchemaError,
    UnsupportedSchemaError,
    WaitTimeoutError,
)
from event_etl.consumer.read import hour_files, read_records, read_table, record_json, write_avro, write_jsonl
from event_etl.consumer.status import HourState, HourStatus, classify_hour, hour_status, hour_statuses
from event_etl.consumer.verify import FileProblem, VerifyReport, compare_hour, verify_hour, verify_hours
from event_etl.consumer.wait import poke_hour, wait_for_hour, wait_for_hours

__all__ = [
    "AuditConflictError",
    "AuditRecord",
    "AuditResult",
    "CorruptHourError",
    "CouldNotCheckError",
    "CountFileError",
    "ExitCode",
    "FileProblem",
    "HourNeverCompleteError",
    "HourNotCompleteError",
    "HourState",
    "HourStatus",
    "IncompatibleSchemaError",
    "UnsupportedSchemaError",
    "VerifyReport",
    "WaitTimeoutError",
    "audit_hour",
    "audit_verdict",
    "classify_hour",
    "compare_hour",
    "hour_files",
    "hour_status",
    "hour_statuses",
    "lateness_horizon",
    "parse_count_file",
    "poke_hour",
    "read_count_file",
    "read_records",
    "read_table",
    "record_json",
    "verify_hour",
    "verify_hours",
    "wait_for_hour",
    "wait_for_hours",
    "write_avro",
    "write_jsonl",
]
