"""``dir:PATH``: newline-delimited files in a folder, in file-name order.

Every time the engine asks for the latest offset, the folder is listed and the files not
seen before are appended, sorted by name, to a durable log in the checkpoint, with
their size and their arrival time: when the job first listed them.  (Not the file's
modification time: its producer controls that, ``cp -p`` keeps an old one and a host
with a wrong clock writes a wrong one, and an arrival in the future would let events
from the future count.)  Entries logged by release 0.1.0 kept the modification time as
their arrival; they keep it, so that a batch replayed across an upgrade is judged as it
was the first time.  An offset is
a position in that log, so a replayed batch reads exactly the same bytes even if the
folder changed meanwhile, and a file whose name sorts before files already read is
still read, after them.

Producers should make a file appear complete (write it under a name starting with
``.`` or ``_``, then rename it): such names are ignored, and bytes appended after a
file was found are not read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from event_etl.errors import SourceError
from event_etl.sources.face import OpenRequest, PlannedSession, Source
from event_etl.sources.splits import Split
from event_etl.storage.atomic import fsync_dir, makedirs_durable, write_json_atomic

__all__ = ["DirectoryPlanner", "DirectorySource", "align_ranges"]


def _next_line_start(fh: BinaryIO, pos: int, size: int) -> int:
    """The first line start at or after ``pos`` (``size`` if none)."""
    if pos <= 0:
        return 0
    fh.seek(pos - 1)
    base = pos - 1
    while True:
        chunk = fh.read(65536)
        if not chunk:
            return size
        i = chunk.find(b"\n")
        if i >= 0:
            return min(size, base + i + 1)
        base += len(chunk)


def align_ranges(path: str, size: int, split_bytes: int) -> list[tuple[int, int]]:
    """Cut ``[0, size)`` into about equal ranges of at most ~``split_bytes`` that start and end on line boundaries."""
    if size <= 0:
        return []
    pieces = -(-size // split_bytes)
    cuts = [0]
    with open(path, "rb") as fh:
        for k in range(1, pieces):
            nxt = _next_line_start(fh, max(size * k // pieces, cuts[-1] + 1), size)
            if nxt >= size:
                break
            cuts.append(nxt)
    cuts.append(size)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


SPLIT_PLAN = 2
"""How a new checkpoint's batches are cut (``split_plan`` in its ``job.json``): 2, whole rounds of tasks
(:func:`plan_tasks`); 1 (no ``split_plan``, event_etl 0.2.0 and before), as many tasks as the batch's size needs."""


def plan_tasks(files: list[tuple[str, int, int]], *, tasks: int, max_bytes: int,
               min_bytes: int = 4 << 20, whole_rounds: bool = False) -> list[list[tuple[str, int, int, int]]]:
    """Cut a batch's files (``[(path, size, arrival)]``, in order) into about equal tasks of whole lines.

    As many tasks as ``tasks`` (the cluster's parallelism) while each keeps at least
    ``min_bytes``, more when one would exceed ``max_bytes``: with ``whole_rounds``, then a
    multiple of ``tasks``, so that the cores finish together (11 equal tasks on 2 cores keep
    one core idle for the last of them; 12 smaller ones do not).  A task may span the end of
    one file and the start of the next: a Spark task costs a fixed overhead, so a batch of
    many small files does not become many small tasks.  Pure function of its arguments,
    so a replayed batch gets the same tasks.
    """
    total = sum(size for _, size, _ in files)
    if total <= 0:
        return []
    n = max(-(-total // max_bytes), min(tasks, max(1, total // min_bytes)))
    if whole_rounds and n > tasks:
        n = -(-n // tasks) * tasks
    # global cut positions -> (file index, offset), moved to line starts
    bounds: list[tuple[int, int]] = [(0, 0)]
    starts = []
    acc = 0
    for _, size, _ in files:
        starts.append(acc)
        acc += size
    fi = 0
    for k in range(1, n):
        g = total * k // n
        while fi + 1 < len(files) and starts[fi + 1] <= g:
            fi += 1
        path, size, _ = files[fi]
        with open(path, "rb") as fh:
            off = _next_line_start(fh, g - starts[fi], size)
        cut = (fi, off) if off < size else (fi + 1, 0)
        if cut > bounds[-1] and cut < (len(files), 0):
            bounds.append(cut)
    bounds.append((len(files), 0))
    out = []
    for (f0, o0), (f1, o1) in zip(bounds, bounds[1:]):
        ranges = []
        for i in range(f0, min(f1, len(files) - 1) + 1):
            path, size, arrival = files[i]
            s = o0 if i == f0 else 0
            e = o1 if i == f1 else size
            if e > s:
                ranges.append((path, s, e, arrival))
        if ranges:
            out.append(ranges)
    return out


class DirectoryPlanner:
    """Plans micro-batches over a folder of files (runs in the driver, asked by the engine's lane)."""

    def __init__(
        self, path: str, log_dir: str, *, split_bytes: int, max_files: int, clock: Callable[[], int],
        tasks_per_batch: int = 2, split_plan: int = 1,
    ) -> None:
        self.path = path
        self.tasks_per_batch = max(1, tasks_per_batch)
        self.split_plan = split_plan  # 2: whole rounds of tasks (see plan_tasks); fixed in the checkpoint's job.json
        self.log_dir = Path(log_dir)
        self.split_bytes = split_bytes
        self.max_files = max_files
        self.clock = clock
        self.target: int | None = None
        self.entries: list[dict[str, Any]] = []
        self.seen: set[str] = set()
        self._load()

    def _load(self) -> None:
        # The log's folder durable before the log is written into it (a power cut would take the log with it),
        # also when the job made it without a sync (Checkpoint.source_dir): once a start.
        makedirs_durable(self.log_dir)
        fsync_dir(self.log_dir.parent)
        for seg in sorted(self.log_dir.glob("*.json")):
            first = int(seg.stem)
            items = json.loads(seg.read_text())
            if first != len(self.entries):
                raise SourceError(
                    f"file log {self.log_dir} is inconsistent at segment {seg.name}",
                    fix="the checkpoint was edited; restore it or start with a new --checkpoint",
                )
            self.entries.extend(items)
        self.seen = {e["name"] for e in self.entries}

    def discover(self) -> int:
        """List the folder and log new files durably.  Returns how many were added."""
        try:
            names = os.listdir(self.path)
        except OSError as err:
            raise SourceError(
                f"cannot list source folder {self.path}: {err}", fix="check that it exists and is readable"
            ) from err
        now = self.clock()
        new: list[dict[str, Any]] = []
        for name in sorted(names):
            if name in self.seen or name.startswith((".", "_")):
                continue
            full = os.path.join(self.path, name)
            if not os.path.isfile(full):
                continue
            st = os.stat(full)
            # A file's payloads arrived when this job first saw it (``found`` keeps its mtime, for people).
            new.append({"name": name, "size": st.st_size, "found": int(st.st_mtime * 1000), "listed": now,
                        "arrival": now})
        if new:
            write_json_atomic(self.log_dir / f"{len(self.entries):012d}.json", new)
            self.entries.extend(new)
            self.seen.update(e["name"] for e in new)
        return len(new)

    # -- the streaming-source protocol ------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        return {"files": 0}

    def prepare_available_now(self) -> None:
        self.discover()
        self.target = len(self.entries)

    def latest_offset(self, start: dict[str, Any], max_files: int | None) -> dict[str, Any]:
        if self.target is None:
            self.discover()
        avail = len(self.entries) if self.target is None else self.target
        n = int(start["files"])
        end = avail if max_files is None else min(avail, n + max_files)
        return {"files": max(n, end)}

    def reported_latest(self) -> dict[str, Any]:
        return {"files": len(self.entries) if self.target is None else self.target}

    def backlog(self, start: dict[str, Any]) -> dict[str, int]:
        n = int(start["files"])
        rest = self.entries[n:]
        return {"files": len(rest), "bytes": sum(e["size"] for e in rest)}

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        files = []
        for e in self.entries[int(start["files"]) : int(end["files"])]:
            full = os.path.join(self.path, e["name"])
            if not os.path.isfile(full) or os.path.getsize(full) < e["size"]:
                raise SourceError(
                    f"input file {full} is gone or shorter than when it was found",
                    fix="input files must stay in place, unchanged, until their batch is committed",
                )
            files.append((full, int(e["size"]), int(e.get("arrival", e["found"]))))
        tasks = plan_tasks(files, tasks=self.tasks_per_batch, max_bytes=self.split_bytes,
                           whole_rounds=self.split_plan >= 2)
        return [Split.of_files(i, ranges) for i, ranges in enumerate(tasks)]

    def commit(self, end: dict[str, Any]) -> None:
        pass


class DirectorySource(Source):
    """``dir:PATH``: the engine plans the folder itself, at every round (no fetcher)."""

    @classmethod
    def open(cls, request: OpenRequest) -> PlannedSession:
        spec = request.spec
        return PlannedSession(DirectoryPlanner(
            spec["params"]["path"], spec["log_dir"], split_bytes=int(spec["split_bytes"]),
            max_files=int(spec["max_files_per_batch"]), clock=request.clock,
            tasks_per_batch=int(spec.get("tasks_per_batch", 2)), split_plan=int(spec.get("split_plan", 1)),
        ))
