"""The metrics history: one JSON line per batch, per marker and per idle advance of the watermark.

``--metrics-history FILE`` appends to it (:class:`MetricsHistory`); ``event-etl graphs
--history FILE`` reads it (:func:`read_history`) without Prometheus.  This module needs
no OpenTelemetry.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from event_etl.errors import UsageError

__all__ = ["HISTORY_VERSION", "MetricsHistory", "read_history"]

HISTORY_VERSION = 1
"""The ``v`` of every line; a reader refuses another."""


class MetricsHistory:
    """Appends one JSON object per line to a local file (the format :mod:`event_etl.metrics.graphs` reads).

    Lines (``"v": 1``), each with ``kind``, ``event_type``, ``t`` (seconds since the epoch)
    and ``time`` (ISO UTC):

    - ``batch``: ``batch_id``, ``replayed``, ``duration_seconds``, ``events`` (by outcome),
      ``deadletter`` (by reason), ``files``, ``bytes``, ``delay`` (``bounds``, per-bucket
      ``counts`` with the overflow last, ``sum_seconds``), ``watermark``,
      ``watermark_lag_seconds``, ``marked``: the batch's own figures, not totals;
    - ``marker``: ``hour``, ``hour_end`` (seconds), ``marker_delay_seconds``, ``records``,
      ``late_records``, ``files``;
    - ``watermark``: ``watermark``, ``watermark_lag_seconds``, ``why`` (``idle`` or ``drain``).
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run, closed by close()
        except OSError as err:
            raise UsageError(f"--metrics-history {path}: cannot append to it: {err.strerror or err}",
                             fix="give a file in a folder you can write to") from err
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"v": HISTORY_VERSION, **record}, separators=(",", ":"))
        with self._lock:
            if self._fh is not None:
                self._fh.write(line + "\n")
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def read_history(path: str) -> list[dict[str, Any]]:
    """The records of a history file, in order (a last line being written is left out)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"--history {path}: {err.strerror or err}",
                         fix="give the file the job wrote with --metrics-history") from err
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as err:
            if i == len(lines):
                break  # a line being written as we read
            raise UsageError(f"{path}:{i}: not a JSON line ({err})",
                             fix="give the file the job wrote with --metrics-history") from err
        if rec.get("v") != HISTORY_VERSION:
            raise UsageError(f"{path}:{i}: history version {rec.get('v')!r} is not known",
                             fix="draw it with the event_etl version that wrote it")
        out.append(rec)
    return out
