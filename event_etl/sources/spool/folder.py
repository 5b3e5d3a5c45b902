"""The spool folder: one owner for every file a Pub/Sub subscription's spool holds.

A Pub/Sub job's spool is its checkpoint's ``etl/source/pubsub/``::

    segments/
        <run>-<stream>-<seq>.open          an open segment: a stream appends its pulls to it (spooled)
        <run>-<stream>-<seq>.fenced        an open segment being finished by a recovery
        <run>-<stream>-<seq>-n<count>.seg  a closed segment: offered to Spark, deleted once its batch commits
        .<segment>.tmp                     a segment being written whole (committed)
        <segment>.acked                    a fetch partition's segment whose messages were acknowledged
        DRAINED                            ``--once``: the subscription was found empty
        STOP                               fetch partitions: stop pulling
    log/                                   the discovery log (:mod:`~event_etl.sources.spool.seglog`)
    run.json                               the run record (:class:`RunRecord`)
    error.json                             the error a fetcher stopped with, for the planner and the driver
    status/<partition>.json                the fetch partitions' reports to the driver
    <n>.avro                               release 0.1.0's spool files, offered before anything else

:class:`Spool` is the one class that knows these names, as Kafka's ``Log`` is for its
segments: the fetchers write through it (:meth:`Spool.open_segment`, :meth:`Spool.write_segment`,
:meth:`Spool.recover`), the planner reads and deletes through it (:meth:`Spool.closed`,
:attr:`Spool.log`, :meth:`Spool.delete_committed`), and ``event-etl status`` opens one read-only
(:meth:`Spool.at`) to ask how far back a seek must go (:meth:`Spool.oldest_publish_ms`).  What a
segment's bytes are, and the rules that make the spool a write-ahead log, are
:mod:`~event_etl.sources.spool.segment`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.errors import SourceError
from event_etl.sources.live import live_error
from event_etl.sources.spool.seglog import SegmentLog
from event_etl.sources.spool.segment import (
    OpenSegment,
    SegmentName,
    _scan,
    ack_ids,
    finish_open_segments,
    holds_messages,
    publish_range,
    segment_count,
    write_segment,
)
from event_etl.storage import atomic

__all__ = ["Spool", "RunRecord", "SEGMENTS", "RUN_FILE", "ERROR_FILE", "DRAINED", "STOP", "ACKED_SUFFIX",
           "MAX_LEASE_SECONDS"]

SEGMENTS = "segments"
LOG = "log"
STATUS = "status"
RUN_FILE = "run.json"
ERROR_FILE = "error.json"
DRAINED = "DRAINED"
STOP = "STOP"
ACKED_SUFFIX = ".acked"
MAX_LEASE_SECONDS = 600
"""The longest ack deadline Pub/Sub grants: what a run assumes when it cannot learn its subscription's."""
EARLIER_RELEASE_LEASE = 60
"""Seconds: how long a release before the run record held what it pulled (``committed``, extended by 60 s)."""


class RunRecord:
    """``run.json`` in the spool: the longest lease the current run may grant, and whether the last run stopped
    leaving nothing leased.  A run that finds an unclean stop before it settles for that lease
    (:mod:`event_etl.sources.pubsub_run`); a spool that has no record but holds an earlier release's log or segments
    was written by a release that held every message until its batch was saved (``committed``, 60-s extensions)."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        self.path = Path(spool_dir) / RUN_FILE

    def previous_lease(self, now_ms: int | None = None) -> float:
        """Seconds the last run may have left messages leased for, from now (0: it stopped cleanly, or none ran).

        A run that stopped knowing until when what it left may stay leased (``leased_until``: a pull that failed
        after the service may have served it, messages it could not hand back) is waited for until then, at most
        its lease; one killed before it could say is waited for its whole lease."""
        from event_etl.timeutil import now_millis

        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            d = self.path.parent
            used = any((d / SEGMENTS).glob("*.seg")) or SegmentLog.holds_any(d / LOG)
            return float(EARLIER_RELEASE_LEASE) if used else 0.0
        except ValueError:
            return float(MAX_LEASE_SECONDS)
        if doc.get("clean"):
            return 0.0
        lease = float(doc.get("lease_seconds", MAX_LEASE_SECONDS))
        if doc.get("leased_until") is not None and doc.get("stopped_at") is not None:
            now = now_millis() if now_ms is None else now_ms
            return max(0.0, min(lease, (int(doc["leased_until"]) - now) / 1000))
        return lease

    def begin(self, run: str, ack: str, lease_seconds: int, *, clock: Callable[[], int]) -> None:
        """This run starts: until it ends cleanly, whatever it leases may be left leased for ``lease_seconds``."""
        atomic.write_json_atomic(self.path, {"run": run, "ack": ack, "lease_seconds": lease_seconds,
                                             "started_at": clock(), "clean": False})

    def end(self, run: str, *, clean: bool, clock: Callable[[], int], leased_until: int | None = None) -> None:
        """This run stops; ``clean``: no message it pulled is still leased.  ``leased_until`` (ms, wall clock): an
        unclean run that stopped knows until when what it left may stay leased."""
        try:
            doc = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return
        if doc.get("run") == run:
            extra = {} if clean or leased_until is None else {"leased_until": int(leased_until)}
            kept = {k: v for k, v in doc.items() if k != "leased_until"}
            atomic.write_json_atomic(self.path, {**kept, "clean": clean, "stopped_at": clock(), **extra})


class Spool:
    """The spool in ``directory`` (see the module docstring).  ``create``: make its segments' folder (a fetcher, a
    planner); without it nothing is written by opening it."""

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True) -> None:
        self.dir = Path(directory)
        self.segdir = self.dir / SEGMENTS
        if create:
            self.segdir.mkdir(parents=True, exist_ok=True)
        self.record = RunRecord(self.dir)
        self._log: SegmentLog | None = None
        self._oldest: dict[str, tuple[int, int | None]] = {}  # each segment's (size, oldest publish time) last seen

    @classmethod
    def at(cls, directory: str | os.PathLike[str]) -> Spool | None:
        """The spool in ``directory``, opened read-only (``event-etl status``), or None if it holds none."""
        spool = cls(directory, create=False)
        return spool if spool.segdir.is_dir() else None

    @classmethod
    def of_segments(cls, segdir: str | os.PathLike[str]) -> Spool:
        """The spool whose segments' folder is ``segdir`` (what a fetcher's ``segdir`` names), opened read-only."""
        return cls(Path(segdir).parent, create=False)

    def __repr__(self) -> str:
        return f"Spool({str(self.dir)!r})"

    # -- segments: the writers' side ---------------------------------------------------------------------------
    def open_segment(self, run: str, stream: int, seq: int) -> OpenSegment:
        """A new open segment of stream ``stream`` of run ``run`` (see :class:`OpenSegment`)."""
        return OpenSegment(self.segdir, run, stream, seq)

    def write_segment(self, name: SegmentName, responses: list[bytes]) -> Path:
        """Serialized ``PullResponse`` messages as one closed segment, durably (``committed``)."""
        return write_segment(self.segdir, name, responses)

    def recover(self, keep: Callable[[str, int, int], bool] | None = None) -> list[str]:
        """Finish the open segments a killed writer left (``keep(run, stream, seq)``: only those): fence each, keep
        its longest valid prefix as a segment (:func:`~event_etl.sources.spool.segment.finish_open_segments`)."""
        return finish_open_segments(self.segdir, keep)

    # -- segments: what it holds -------------------------------------------------------------------------------
    def closed(self) -> list[str]:
        """The names of its closed segments (in no order)."""
        return [n for n in os.listdir(self.segdir) if n.endswith(".seg") and not n.startswith(".")]

    def path(self, name: str) -> Path:
        """Where the segment ``name`` lies (what a split names for the executor that reads it)."""
        return self.segdir / name

    def holds(self, name: str) -> bool:
        """Whether the closed segment ``name`` is still in the spool (not deleted by a commit)."""
        return (self.segdir / name).exists()

    def ack_ids(self, name: str) -> list[str]:
        """The acknowledgement ids of the messages of segment ``name`` (``FileNotFoundError`` once it is gone)."""
        return ack_ids(self.segdir / name)

    def earlier_runs(self, run: str) -> tuple[int, int]:
        """Messages and bytes of the closed segments of runs other than ``run`` (no batch of ``run`` saved them)."""
        msgs = size = 0
        for p in self.segdir.glob("*.seg"):
            n = SegmentName.parse(p.name)
            if n is not None and n.run != run:
                msgs += n.count
                try:
                    size += p.stat().st_size
                except FileNotFoundError:
                    continue
        return msgs, size

    def unsaved(self, *, skip_acked: bool) -> tuple[int, int]:
        """Messages and bytes in segments no batch has saved yet (``skip_acked``: but those marked acknowledged),
        open and fenced segments included (spooled: acknowledged messages, unread until they close).

        One listing of the folder, each segment counted once by its run, stream and number whatever its name (a
        close renames ``.open`` to ``.seg``, a retried attempt's finish ``.open`` to ``.fenced`` to ``.seg``): a
        listing per kind missed a segment renamed between two of them, or counted it twice.  A segment that moves
        on (or goes) between the listing and its look is looked for again: the next listing has it as it is now."""
        while True:
            names = set(os.listdir(self.segdir))
            found: dict[str, tuple[int, int]] = {}  # by run-stream-seq: a closed segment's name wins
            moved = False
            for name in names:
                if name.endswith(".seg") and SegmentName.parse(name) is not None:
                    if skip_acked and name + ACKED_SUFFIX in names:
                        continue
                    try:
                        size = (self.segdir / name).stat().st_size
                    except FileNotFoundError:  # deleted once committed (the next look does not list it)
                        moved = True
                        break
                    found[name.rsplit("-n", 1)[0]] = (segment_count(name), size)
                elif name.endswith((".open", ".fenced")):
                    key = name.rsplit(".", 1)[0]
                    try:
                        data = (self.segdir / name).read_bytes()
                    except FileNotFoundError:
                        moved = True  # closed or fenced since the listing
                        break
                    found.setdefault(key, (_scan(data).count, len(data)))
            if not moved:
                return sum(m for m, _ in found.values()), sum(b for _, b in found.values())

    def oldest_publish_ms(self) -> int | None:
        """The oldest publish time (ms) of any message it holds (segments not yet deleted by a commit, open and
        fenced ones), or None: a seek of the subscription to that time brings back every message it holds.

        Kept up to date as segments come and go, not scanned each time (a job writes it into its lease at every
        renewal: a thousand types' renewals must not read a thousand spools): a listing of the folder, and the
        frames' headers of a file only when it is new or has grown since the last look."""
        seen: dict[str, tuple[int, int | None]] = {}
        try:
            entries = list(os.scandir(self.segdir))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if not holds_messages(entry.name):
                continue
            try:
                size = entry.stat().st_size
            except FileNotFoundError:
                continue  # deleted by a commit since the listing
            known = self._oldest.get(entry.name)
            seen[entry.name] = known if known is not None and known[0] == size else (size, publish_range(entry.path))
        self._oldest = seen
        times = [o for _, o in seen.values() if o is not None]
        return min(times) if times else None

    # -- acknowledged marks (fetch partitions) -----------------------------------------------------------------
    def mark_acked(self, name: str) -> None:
        """The messages of segment ``name`` were acknowledged (by the partition that wrote it, or the driver)."""
        (self.segdir / (name + ACKED_SUFFIX)).touch()

    def is_acked(self, name: str) -> bool:
        return (self.segdir / (name + ACKED_SUFFIX)).exists()

    def forget_stale_marks(self) -> None:
        """Delete the marks of segments deleted since (a commit deletes a segment, then its mark)."""
        for p in self.segdir.glob("*" + ACKED_SUFFIX):
            if not (self.segdir / p.name[:-len(ACKED_SUFFIX)]).exists():
                p.unlink(missing_ok=True)

    # -- the run's flags: drained, stop, error ----------------------------------------------------------------
    def drained(self) -> bool:
        """Whether a fetcher with ``once`` found the subscription empty, everything it pulled in a segment."""
        return (self.segdir / DRAINED).exists()

    def mark_drained(self, doc: dict[str, Any]) -> None:
        atomic.write_json_atomic(self.segdir / DRAINED, doc)

    def clear_drained(self) -> None:
        (self.segdir / DRAINED).unlink(missing_ok=True)

    def request_stop(self) -> None:
        """Tell the fetch partitions to stop pulling (they look twice a second)."""
        (self.segdir / STOP).write_text("stop\n")

    def stop_requested(self) -> bool:
        return (self.segdir / STOP).exists()

    def clear_stop(self) -> None:
        (self.segdir / STOP).unlink(missing_ok=True)

    @property
    def error_file(self) -> Path:
        """Where a fetcher leaves the error it stopped with (for messages that name it)."""
        return self.dir / ERROR_FILE

    def error(self) -> SourceError | None:
        """The error a fetcher left for the driver, if any: the fetcher's in this process first (known in memory
        even when a full disk kept the file from being written), then the file a fetcher elsewhere left."""
        live = live_error(self.dir)
        if live is not None:
            return live
        p = self.error_file
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            return None
        except ValueError:  # half-written (a full disk): an error all the same
            return SourceError(f"the Pub/Sub source left an error in {p} that could not be read whole",
                               fix="see the job's log for the cause; the job can be restarted on the same checkpoint")
        return SourceError(d["message"], fix=d.get("fix"))

    def error_left(self) -> bool:
        """Whether a fetcher left an error file (whatever a fetcher of this process knows)."""
        return self.error_file.exists()

    def leave_error(self, err: SourceError) -> None:
        """Leave ``err`` for whoever runs in another process (raises ``OSError`` if it cannot be written)."""
        atomic.write_json_atomic(self.error_file, {"message": err.message, "fix": err.fix})

    def clear_error(self) -> None:
        """An earlier run's error: this run tries again."""
        self.error_file.unlink(missing_ok=True)

    # -- the fetch partitions' reports -------------------------------------------------------------------------
    def begin_statuses(self, *, clear: bool) -> None:
        """Make the folder of the partitions' reports; ``clear``: delete an earlier run's (the driver, at start)."""
        status = self.dir / STATUS
        status.mkdir(exist_ok=True)
        if clear:
            for p in status.glob("*.json"):
                p.unlink(missing_ok=True)

    def write_status(self, partition: int, doc: dict[str, Any]) -> None:
        atomic.write_json_atomic(self.dir / STATUS / f"{partition:04d}.json", doc, durable=False)

    def statuses(self, run: str) -> list[dict[str, Any]]:
        """The last reports of run ``run``'s partitions, by partition (a report being replaced is skipped)."""
        out = []
        for p in sorted((self.dir / STATUS).glob("*.json")):
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if d.get("run") == run:
                out.append(d)
        return out

    # -- the planner's side: the log, commits, release 0.1.0's files --------------------------------------------
    @property
    def log(self) -> SegmentLog:
        """The discovery log (loaded the first time; its folder made)."""
        if self._log is None:
            logdir = self.dir / LOG
            for d in (self.dir, self.segdir, logdir):
                d.mkdir(parents=True, exist_ok=True)
            self._log = SegmentLog(self.dir, self.segdir, logdir, self.delete_committed)
        return self._log

    def delete_committed(self, name: str) -> None:
        """Spark committed the batch that read segment ``name``: delete it (and its mark)."""
        (self.segdir / name).unlink(missing_ok=True)
        (self.segdir / (name + ACKED_SUFFIX)).unlink(missing_ok=True)  # left by the driver for fetch partitions

    def legacy(self) -> list[int]:
        """The numbers of release 0.1.0's spool files still in it, in order."""
        return sorted(int(p.stem) for p in self.dir.glob("*.avro") if p.stem.isdigit())

    def legacy_file(self, n: int) -> Path:
        return self.dir / f"{n:012d}.avro"

    def delete_legacy_before(self, n: int) -> None:
        """Spark committed the batches that read release 0.1.0's spool files before number ``n``."""
        for p in self.dir.glob("*.avro"):
            if p.stem.isdigit() and int(p.stem) < n:
                p.unlink(missing_ok=True)
