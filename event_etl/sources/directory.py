"""``dir:PATH``: newline-delimited files in a folder, in file-name order.

Every time Spark asks for the latest offset, the folder is listed and the files not
seen before are appended, sorted by name, to a durable log in the checkpoint, with
their size and their arrival time: the file's modification time (when its producer
wrote it; a copy that keeps times keeps it).  An offset is
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
from pathlib import Path
from typing import Any, Callable

from event_etl.checkpoint import write_json_atomic
from event_etl.errors import SourceError
from event_etl.sources.splits import Split

__all__ = ["DirectoryPlanner", "align_ranges"]


def align_ranges(path: str, size: int, split_bytes: int) -> list[tuple[int, int]]:
    """Cut ``[0, size)`` into ranges of about ``split_bytes`` that start and end on line boundaries."""
    if size <= 0:
        return []
    cuts = [0]
    with open(path, "rb") as fh:
        pos = split_bytes
        while pos < size:
            fh.seek(pos - 1)
            while True:
                chunk = fh.read(65536)
                if not chunk:
                    nxt = size
                    break
                i = chunk.find(b"\n")
                if i >= 0:
                    nxt = fh.tell() - len(chunk) + i + 1
                    break
            if nxt >= size:
                break
            if nxt > cuts[-1]:
                cuts.append(nxt)
            pos = max(nxt, pos) + split_bytes
    cuts.append(size)
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


class DirectoryPlanner:
    """Plans micro-batches over a folder of files (runs in Spark's driver-side source process)."""

    def __init__(
        self, path: str, log_dir: str, *, split_bytes: int, max_files: int, clock: Callable[[], int]
    ) -> None:
        self.path = path
        self.log_dir = Path(log_dir)
        self.split_bytes = split_bytes
        self.max_files = max_files
        self.clock = clock
        self.target: int | None = None
        self.entries: list[dict[str, Any]] = []
        self.seen: set[str] = set()
        self._load()

    def _load(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
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
            raise SourceError(f"cannot list source folder {self.path}: {err}", fix="check that it exists and is readable") from err
        now = self.clock()
        new = []
        for name in sorted(names):
            if name in self.seen or name.startswith((".", "_")):
                continue
            full = os.path.join(self.path, name)
            if not os.path.isfile(full):
                continue
            st = os.stat(full)
            # A file's payloads arrived when it was last written (its mtime).
            new.append({"name": name, "size": st.st_size, "found": int(st.st_mtime * 1000), "listed": now})
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

    def backlog(self, start: dict[str, Any]) -> dict[str, int]:
        n = int(start["files"])
        rest = self.entries[n:]
        return {"files": len(rest), "bytes": sum(e["size"] for e in rest)}

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        out: list[Split] = []
        for e in self.entries[int(start["files"]) : int(end["files"])]:
            full = os.path.join(self.path, e["name"])
            try:
                ranges = align_ranges(full, e["size"], self.split_bytes)
            except OSError as err:
                raise SourceError(
                    f"input file {full} cannot be read: {err}",
                    fix="input files must stay in place until their batch is committed",
                ) from err
            for a, b in ranges:
                out.append(Split(len(out), "file", full, a, b, int(e["found"])))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        pass
