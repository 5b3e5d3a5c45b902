"""The metrics history: one JSON line per batch, per marker and per idle advance of the watermark.

A job keeps it in its checkpoint, ``<checkpoint>/metrics-history.jsonl`` (:func:`default_history_path`),
or in the file ``--metrics-history FILE`` names (:class:`MetricsHistory`); ``event-etl graphs`` reads it
(:func:`read_history`) without Prometheus.  Past :data:`MAX_HISTORY_BYTES` the file is renamed to
``<file>.1`` (one older file is kept, the one before is dropped) and a new one is begun; a reader reads
``<file>.1``, then ``<file>``.  This module needs no OpenTelemetry.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, TextIO

from event_etl.errors import UsageError
from event_etl.storage.locations import is_remote, local_path

__all__ = ["HISTORY_VERSION", "HISTORY_FILE", "MAX_HISTORY_BYTES", "MetricsHistory", "read_history",
           "default_history_path", "history_files"]

HISTORY_VERSION = 1
"""The ``v`` of every line; a reader refuses another."""

HISTORY_FILE = "metrics-history.jsonl"
"""The name of the history a job keeps in its checkpoint folder."""

MAX_HISTORY_BYTES = 8 * 1024 * 1024
"""Past this size a history file is rotated to ``<file>.1`` (about 8,000 batches' lines, 11 hours of 5-s triggers)."""

ROTATED_SUFFIX = ".1"

_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _path_lock(path: str) -> threading.Lock:
    """One lock per file in this process: the jobs of a fleet given one ``--metrics-history FILE`` share it, and one
    of them at a time checks, rotates and writes."""
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(path, threading.Lock())


def default_history_path(checkpoint: str) -> str | None:
    """``<checkpoint>/metrics-history.jsonl`` of a local checkpoint; None for a remote one (``gs://``): none is kept."""
    if is_remote(checkpoint):
        return None
    return os.path.join(local_path(checkpoint), HISTORY_FILE)


def history_files(path: str) -> list[str]:
    """The files of the history ``path`` that exist, oldest first: ``<path>.1``, then ``<path>``."""
    return [p for p in (path + ROTATED_SUFFIX, path) if os.path.isfile(p)]


def _cut_partial_line(path: str) -> None:
    """Drop an unfinished last line (a writer killed in the middle of one), so that the next line starts its own."""
    try:
        with open(path, "rb+") as fh:
            end = fh.seek(0, os.SEEK_END)
            if end == 0:
                return
            fh.seek(end - 1)
            if fh.read(1) == b"\n":
                return
            pos = end
            while pos > 0:
                start = max(0, pos - 65536)
                fh.seek(start)
                chunk = fh.read(pos - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    fh.truncate(start + nl + 1)
                    return
                pos = start
            fh.truncate(0)
    except FileNotFoundError:
        return


class MetricsHistory:
    """Appends one JSON object per line to a local file (the format :mod:`event_etl.metrics.graphs` reads).

    Lines (``"v": 1``), each with ``kind``, ``event_type``, ``t`` (seconds since the epoch)
    and ``time`` (ISO UTC):

    - ``batch``: ``batch_id``, ``replayed``, ``duration_seconds``, ``events`` (by outcome),
      ``deadletter`` (by reason), ``files``, ``bytes``, ``delay`` (``bounds``, per-bucket
      ``counts`` with the overflow last, ``sum_seconds``), ``watermark``,
      ``watermark_lag_seconds``, ``marked``: the batch's own figures, not totals; ``since``
      (seconds): when the time its figures cover began, the previous batch's ``t`` or the
      job's start (absent in files written before it was added);
    - ``marker``: ``hour``, ``hour_end`` (seconds), ``marker_delay_seconds``, ``records``,
      ``late_records``, ``files``, ``closed_by`` (what moved the watermark past the hour:
      ``watermark``, ``idle`` or ``drain``, as in its manifest; absent in files written before it
      was added);
    - ``watermark``: ``watermark``, ``watermark_lag_seconds``, ``why`` (``idle`` or ``drain``).

    Lag and marker delay are "now" minus the watermark (or the end of the hour).  "Now" is the
    wall clock, except in lines that carry ``clock`` (e.g. ``"clock": "generator"``): the job's
    source has an event clock of its own (the generator's runs ahead of the wall clock), and the
    figures are measured against it, as the job's lag in its progress lines is.  ``t`` is wall time
    in every line: a marker line's ``t`` is its manifest's ``completed_at``, so ``t - hour_end`` is the
    marker delay every command shows (the manifest's, on the wall clock: :mod:`event_etl.rules.delays`),
    and it is what ``event-etl graphs`` draws.  A ``watermark`` line with ``"why": "drain"`` is the
    drain's step to the end of the hours holding data: the graphs draw it as an event, not as a lag.

    The file is rotated past ``max_bytes`` (see the module docstring).  ``what`` names the file in
    an error (``--metrics-history FILE``, or the history in a checkpoint).
    """

    def __init__(self, path: str, *, max_bytes: int = MAX_HISTORY_BYTES, what: str | None = None) -> None:
        self.path = os.path.abspath(path)
        self.max_bytes = max_bytes
        self.what = what or f"--metrics-history {path}"
        self._lock = _path_lock(self.path)
        self._fh: TextIO | None = None
        with self._lock:
            self._open()

    def _open(self) -> None:
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            _cut_partial_line(self.path)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run, closed by close()
        except OSError as err:
            raise UsageError(f"{self.what}: cannot append to it: {err.strerror or err}",
                             fix="give a file in a folder you can write to") from err

    def _size(self) -> int:
        """The size of the file at ``path`` through our handle, reopening it first if another writer rotated it."""
        assert self._fh is not None
        mine = os.fstat(self._fh.fileno())
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            there = None
        if there is None or (there.st_ino, there.st_dev) != (mine.st_ino, mine.st_dev):
            self._fh.close()
            self._open()
            return os.fstat(self._fh.fileno()).st_size
        return mine.st_size

    def _rotate(self) -> None:
        assert self._fh is not None
        self._fh.close()
        os.replace(self.path, self.path + ROTATED_SUFFIX)
        self._open()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"v": HISTORY_VERSION, **record}, separators=(",", ":")) + "\n"
        with self._lock:
            if self._fh is None:
                return
            size = self._size()
            if size > 0 and size + len(line.encode()) > self.max_bytes:
                self._rotate()
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def _read_one(path: str, *, what: str) -> list[dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise UsageError(f"{what} {path}: {err.strerror or err}",
                         fix="give the file the job wrote with --metrics-history, or its checkpoint's "
                             f"{HISTORY_FILE}") from err
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


def read_history(path: str, *, what: str = "--history") -> list[dict[str, Any]]:
    """The records of a history, in order: its rotated file ``<path>.1`` (if any), then ``path`` (a last line being
    written is left out)."""
    files = history_files(path) or [path]  # none: the error names the file asked for
    return [rec for f in files for rec in _read_one(f, what=what)]
