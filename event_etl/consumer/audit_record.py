"""The ``_AUDIT`` record: the result of comparing an hour's counts with the source's, kept next to its marker.

Example::

    {
      "audit_version": 1,
      "event_type": "page_view",
      "hour": "2026-11-21T13:00:00Z",
      "audited_at": "2026-11-21T15:10:02.118Z",
      "result": "match",
      "expected": 120345,
      "counted": 120345,
      "timely_records": 120333,
      "late_records_found": 12,
      "late_hours_checked": 2,
      "lateness_horizon": "2026-11-22T14:00:00Z",
      "final": false,
      "source": "--expected"
    }

``counted`` is what the sink holds of the hour's events (see :mod:`event_etl.consumer.audit`
for the rule); ``late_records_found`` is ``null`` when late records cannot be attributed to
their event hour.  The record is written create-only, once: the marker and the data files
never change, and neither does the audit of them.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from event_etl.consumer.errors import CorruptHourError
from event_etl.timeutil import iso, parse_hour, to_datetime, to_millis

__all__ = ["AUDIT_VERSION", "AuditRecord", "AuditResult"]

AUDIT_VERSION = 1


class AuditResult(str, enum.Enum):
    """How the hour's count compares with the source's."""

    MATCH = "match"
    MISMATCH = "mismatch"
    INCONCLUSIVE = "inconclusive"
    """Fewer records than expected while late records of the hour can still arrive: not recorded."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class AuditRecord:
    """One audit of one hour.  ``recorded`` tells whether it is (now or before) stored as ``_AUDIT``."""

    event_type: str
    hour: datetime
    audited_at: datetime
    result: AuditResult
    expected: int
    timely_records: int
    late_records_found: int | None
    late_hours_checked: int
    lateness_horizon: datetime
    final: bool
    source: str
    recorded: bool = False

    @property
    def counted(self) -> int:
        """Records in the sink whose event time lies in the hour (see the audit rule)."""
        return self.timely_records + (self.late_records_found or 0)

    @property
    def difference(self) -> int:
        """``counted - expected``: negative when the sink holds fewer records than the source sent."""
        return self.counted - self.expected

    def to_json(self) -> dict[str, Any]:
        return {
            "audit_version": AUDIT_VERSION,
            "event_type": self.event_type,
            "hour": iso(to_millis(self.hour)),
            "audited_at": iso(to_millis(self.audited_at)),
            "result": self.result.value,
            "expected": self.expected,
            "counted": self.counted,
            "timely_records": self.timely_records,
            "late_records_found": self.late_records_found,
            "late_hours_checked": self.late_hours_checked,
            "lateness_horizon": iso(to_millis(self.lateness_horizon)),
            "final": self.final,
            "source": self.source,
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str) -> AuditRecord:
        """Parse an ``_AUDIT`` file; :class:`CorruptHourError` if it is not one."""
        try:
            doc = json.loads(data.decode("utf-8"))
            late = doc["late_records_found"]
            return cls(
                event_type=str(doc["event_type"]),
                hour=to_datetime(parse_hour(doc["hour"])),
                audited_at=datetime.fromisoformat(doc["audited_at"].replace("Z", "+00:00")),
                result=AuditResult(doc["result"]),
                expected=int(doc["expected"]),
                timely_records=int(doc["timely_records"]),
                late_records_found=None if late is None else int(late),
                late_hours_checked=int(doc["late_hours_checked"]),
                lateness_horizon=to_datetime(parse_hour(doc["lateness_horizon"])),
                final=bool(doc["final"]),
                source=str(doc.get("source", "")),
                recorded=True,
            )
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise CorruptHourError(
                f"{path} is not an audit record: {err}",
                path=path,
                fix="it was damaged or not written by event_etl; move it aside and audit again",
            ) from err
