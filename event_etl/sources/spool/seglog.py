"""The discovery log: the spool's closed segments in the order they were found, and what was offered of them.

The planner offers Spark positions in this log, never file names: an offset ``{"seg": k}``
means the first ``k`` segments the log names, so a replayed batch plans the same segments
whatever the streams wrote since.  The log lies in ``log/`` beside the segments:

- ``<first>.json`` (twelve digits): the names of segments ``first``, ``first + 1``, ... as
  they were found at one look (written atomically, its folder synced, before any offset
  covers them);
- ``offered``: ``{"seg": k}``, the end of the last range offered to Spark (written before
  Spark logs an offset past it);
- ``resume``: the position an offset of release 0.1.0 (which had no ``seg``) resumes from,
  fixed the first time that offset is seen.

Once Spark has committed the batches up to ``k``, :meth:`SegmentLog.forget` deletes their
segments, then the log files whose segments are all deleted (the first one left holds
the log's base).  Both orders matter across a power cut; see the comments there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.errors import SourceError
from event_etl.storage.atomic import fsync_dir, write_json_atomic

__all__ = ["SegmentLog", "OFFERED", "RESUME"]

OFFERED = "offered"
RESUME = "resume"


def _log_files(logdir: Path) -> list[Path]:
    return sorted((p for p in logdir.glob("*.json") if p.stem.isdigit()), key=lambda p: int(p.stem))


class SegmentLog:
    """The spool's discovery log (see the module docstring); opened by :meth:`event_etl.sources.spool.Spool.log`.

    ``delete(name)`` deletes a committed segment (and whatever lies beside it for it): the spool's own."""

    _dirs_synced = False  # whether the spool's folders were synced (the first time the log is written)
    _log_unsynced = True  # whether a log file may have been unlinked since the log's folder was synced (at
    # first: unknown, a run killed before it synced may have)

    def __init__(self, spool_dir: Path, segdir: Path, logdir: Path, delete: Callable[[str], None]) -> None:
        self.dir, self.segdir, self.logdir = spool_dir, segdir, logdir
        self._delete = delete
        self.base = 0  # log index of self.entries[0]
        self.entries: list[str] = []
        files = _log_files(self.logdir)
        if files:
            self.base = int(files[0].stem)
        for p in files:
            first = int(p.stem)
            if first != self.base + len(self.entries):
                raise SourceError(f"segment log {self.logdir} is inconsistent at {p.name}",
                                  fix="the checkpoint was edited; restore it or start with a new --checkpoint")
            self.entries.extend(json.loads(p.read_text()))
        self.seen = set(self.entries)

    @staticmethod
    def holds_any(logdir: Path) -> bool:
        """Whether ``logdir`` holds a log file (a spool an earlier release wrote to)."""
        return any(logdir.glob("*.json"))

    @property
    def end(self) -> int:
        """The position after the last segment logged."""
        return self.base + len(self.entries)

    def names(self, start: int, end: int | None = None) -> list[str]:
        """The segments logged at positions ``start``..``end - 1`` (to the end if None) that are not forgotten."""
        return self.entries[max(0, start - self.base):None if end is None else max(0, end - self.base)]

    def discover(self, found: list[str]) -> None:
        """Log the segments of ``found`` (the closed segments in the spool) that it does not name yet, by name."""
        new = sorted(n for n in found if n not in self.seen)
        if new:
            # Before the log names them, the segments must be durable: the fetcher syncs each after its rename,
            # but may not have yet (it runs beside).  The first time, the folders themselves too: they may be
            # new, and a log in a folder a power cut takes back is lost with it.
            if not self._dirs_synced:
                fsync_dir(self.dir.parent)
                fsync_dir(self.dir)
                self._dirs_synced = True
            fsync_dir(self.segdir)
            write_json_atomic(self.logdir / f"{self.end:012d}.json", new)
            self._log_unsynced = False  # the log's folder was synced with it
            self.entries.extend(new)
            self.seen.update(new)

    def offered(self) -> int:
        """The log position this source last offered Spark (0 if never)."""
        try:
            return int(json.loads((self.logdir / OFFERED).read_text())["seg"])
        except (FileNotFoundError, ValueError, KeyError):
            return 0

    def offer(self, end: int) -> None:
        """Spark is about to be offered the log up to ``end``: recorded first, if it goes past what was offered."""
        if end > self.offered():
            write_json_atomic(self.logdir / OFFERED, {"seg": end})  # before Spark logs an offset past it

    def position(self, offset: dict[str, Any]) -> int:
        """The segment position of an offset.  An offset without one was written by release 0.1.0 (a
        rollback, and an upgrade again): what this source offered before then was saved, or is unacknowledged
        and comes again, so it goes on from there instead of offering the log from its start.  That position
        is fixed the first time such an offset is seen, so a batch's splits are planned as its offsets were."""
        if "seg" in offset:
            return int(offset["seg"])
        path = self.logdir / RESUME
        try:
            resume = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            resume = {}
        key = str(int(offset.get("spool", 0)))
        if key not in resume:
            resume[key] = max(self.base, self.offered())
            write_json_atomic(path, resume)
        return int(resume[key])

    def forget(self, k: int) -> None:
        """Spark committed every batch up to position ``k``: delete their segments, then the log files that name
        only those (the first one stays: it holds the base)."""
        for name in self.entries[:max(0, k - self.base)]:
            self._delete(name)
        files = _log_files(self.logdir)
        segments_synced = False
        for p, nxt in zip(files, files[1:]):
            if int(nxt.stem) <= k:
                drop = int(nxt.stem) - int(p.stem)
                if not segments_synced:
                    # The segments' unlinks before the log's: a segment a power cut brings back that no log
                    # names any more would be discovered, and offered, again (its messages twice).
                    fsync_dir(self.segdir)
                    segments_synced = True
                if self._log_unsynced:
                    # Log files go oldest first, each unlink durable before the next: one brought back after
                    # a later one is gone would leave a gap, and a log that does not load.
                    fsync_dir(self.logdir)
                p.unlink(missing_ok=True)
                self._log_unsynced = True
                self.entries = self.entries[drop:]
                self.base += drop
                self.seen = set(self.entries)
            else:
                break
