"""A type's place in its source, kept as Spark's micro-batch engine keeps it: its offset and commit logs, its lane.

:class:`SparkLog` is the type's ``spark/offsets`` and ``spark/commits`` in Spark's own format; :class:`Lane` holds
the type's source session (:class:`~event_etl.sources.face.SourceSession`), the offset its next batch starts at and
the batch a crash left to replay.  The engine (:mod:`event_etl.job.engine`) asks each lane for its batch every
round and commits it once the type's controller saved the batch's state.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from event_etl import faults
from event_etl.errors import EventEtlError
from event_etl.sources.face import Offset, SourceSession
from event_etl.storage.atomic import write_text_atomic

__all__ = ["RETAIN_BATCHES", "SparkLog", "Lane", "Pending"]

Pending = tuple[int, Offset, Offset]
"""A batch offered and not committed: ``(batch, start, end)``."""

RETAIN_BATCHES = 100  # as Spark's spark.sql.streaming.minBatchesToRetain


class SparkLog:
    """A type's Spark offset and commit logs (``<checkpoint>/spark/offsets/<n>``, ``commits/<n>``).

    Written in Spark's format (``metadata``: the query's id; an offset: ``v1``, the batch's metadata,
    the source's end offset; a commit: ``v1`` and ``{"nextBatchWatermarkMs":0}``), each file replaced
    whole by a rename, so that a query of the type's own reads them as its own and the other way round."""

    def __init__(self, spark_dir: str | os.PathLike[str]) -> None:
        self.root = Path(spark_dir)
        self.offsets = self.root / "offsets"
        self.commits = self.root / "commits"

    @staticmethod
    def _batches(d: Path) -> list[int]:
        try:
            return sorted(int(f.name) for f in d.iterdir() if f.name.isdigit())
        except FileNotFoundError:
            return []

    def latest_offset_batch(self) -> int | None:
        b = self._batches(self.offsets)
        return b[-1] if b else None

    def latest_commit(self) -> int | None:
        b = self._batches(self.commits)
        return b[-1] if b else None

    def end_offset(self, batch: int) -> Offset:
        """The source's end offset of ``batch`` (the last line of its offset file), or None if there is none."""
        try:
            lines = (self.offsets / str(batch)).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        if len(lines) < 3 or not lines[-1].startswith("{"):
            raise EventEtlError(f"{self.offsets / str(batch)} is not an offset of one source",
                                fix="the checkpoint's spark/ folder was changed by hand; restore it")
        return json.loads(lines[-1])

    @staticmethod
    def _write(path: Path, text: str) -> None:
        write_text_atomic(path, text)

    def write_offset(self, batch: int, end: Offset, *, now: int, conf: dict[str, str]) -> None:
        if not (self.root / "metadata").exists():  # the query's id: Spark refuses a log without one
            self._write(self.root / "metadata", json.dumps({"id": str(uuid.uuid4())}, separators=(",", ":")))
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(now), "conf": conf}
        self._write(self.offsets / str(batch),
                    "v1\n" + json.dumps(meta, separators=(",", ":")) + "\n" + json.dumps(end, sort_keys=True))

    def write_commit(self, batch: int) -> None:
        self._write(self.commits / str(batch), 'v1\n{"nextBatchWatermarkMs":0}')
        for d in (self.offsets, self.commits):  # the batch that falls out of the kept ones (see forget_old)
            (d / str(batch - RETAIN_BATCHES)).unlink(missing_ok=True)

    def forget_old(self) -> None:
        """Forget the batches before the last :data:`RETAIN_BATCHES` (as Spark does): all of them at once when a
        type opens (a log a query of its own wrote, or an older release); then one per commit."""
        last = self.latest_offset_batch()
        if last is None:
            return
        for d in (self.offsets, self.commits):
            for b in self._batches(d):
                if b <= last - RETAIN_BATCHES:
                    (d / str(b)).unlink(missing_ok=True)


@dataclass
class Lane:
    """Where one type's source stands: its session (:class:`~event_etl.sources.face.SourceSession`), the offset the
    next batch starts at, a batch to replay."""

    session: SourceSession
    log: SparkLog
    cap: int | None
    next_batch: int = 0
    start: Offset = None
    pending: Pending | None = None  # (batch, start, end) offered, not committed
    exhausted: bool = False  # --once: nothing more to read

    @classmethod
    def open(cls, session: SourceSession, log: SparkLog, *, cap: int | None, once: bool) -> Lane:
        """Read the type's logs as Spark's engine would on a restart: the batch to replay, or where to go on."""
        lane = cls(session, log, cap)
        log.forget_old()
        last, committed = log.latest_offset_batch(), log.latest_commit()
        if last is None:
            lane.start = session.initial_offset()
        elif committed is not None and committed >= last:
            lane.start = log.end_offset(last)
            lane.next_batch = last + 1
            session.commit(lane.start)  # as Spark does for the last committed batch on a restart
        else:
            before = log.end_offset(last - 1) if last > 0 else None
            lane.start = before if before is not None else session.initial_offset()
            lane.pending = (last, lane.start, log.end_offset(last))
            lane.next_batch = last + 1
        if once:
            session.prepare_available_now()
        return lane

    def offer(self, *, now: int, conf: dict[str, str]) -> Pending | None:
        """The batch to run now: the pending one, or a new one over what arrived (its offset made durable first);
        None when nothing is new."""
        if self.pending is not None:
            return self.pending
        end = self.session.offer(self.start, self.cap, now=now)
        self.exhausted = end == self.start
        if self.exhausted:
            return None
        self.log.write_offset(self.next_batch, end, now=now, conf=conf)
        faults.point("offset_written", str(self.next_batch))
        self.pending = (self.next_batch, self.start, end)
        return self.pending

    def progress(self) -> dict[str, Any] | None:
        """What Spark's ``query.lastProgress`` would say of the source (for the backlog metric), or None."""
        latest = self.session.latest()
        if latest is None or self.start is None:
            return None
        return {"sources": [{"endOffset": self.start, "latestOffset": latest}]}

    def committed(self) -> None:
        """The pending batch's state is saved: commit it, in the log and to the source."""
        if self.pending is None:
            raise AssertionError("a lane commits the batch it offered, and has none")
        batch, _, end = self.pending
        self.log.write_commit(batch)
        self.session.commit(end)
        self.start, self.pending, self.next_batch = end, None, batch + 1
