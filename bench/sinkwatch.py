"""When each file of a sink became visible: a thread that lists the sink every ``interval`` seconds.

A data file appears under its final ``.avro`` name only when it is whole (temporary name,
then rename), and ``_COMPLETE`` is created in one step, so the first listing that shows a
name is the moment a consumer could have read it, give or take the polling interval
(0.1 s by default: every figure built on it is late by up to that much, never early).
Listing a few hour folders ten times a second costs the machine next to nothing.

A folder whose ``_COMPLETE`` was seen is not listed again: a marked hour never changes (its
final files are in place before its marker), so a scan lists only the open hours, however
many complete ones the sink holds.  Otherwise a sink of thousands of hours (a hundred types
for half an hour) takes long enough to walk that a marker would be seen a scan late, and
every figure would carry the walk's duration.

With ``keep`` (a folder on the sink's file system), each data file is also hard-linked there
when first seen, so that it can be read after the run even if the job merged it away into a
larger file meanwhile (an hour's small files are merged before its marker).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["SinkWatcher"]


class SinkWatcher:
    """``seen[relative path] = time.time()`` of the first listing that showed it (``.avro`` and ``_COMPLETE``)."""

    def __init__(self, root: Path, *, interval: float = 0.1, keep: Path | None = None) -> None:
        self.root = root
        self.interval = interval
        self.keep = keep
        self.seen: dict[str, float] = {}
        self._complete: set[str] = set()  # folders whose _COMPLETE was seen: never listed again
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SinkWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.scan()  # a last look, so nothing written before the stop is missed
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(self.interval)

    def scan(self) -> None:
        now = time.time()
        for dirpath, dirnames, filenames in os.walk(self.root):
            # skips _deadletter, and the hours already complete
            dirnames[:] = [d for d in dirnames
                           if not d.startswith("_") and os.path.join(dirpath, d) not in self._complete]
            for name in filenames:
                if name.endswith(".avro") or name == "_COMPLETE":
                    rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                    if rel not in self.seen:
                        self.seen[rel] = now
                        if self.keep is not None and name.endswith(".avro"):
                            self._link(rel)
            if "_COMPLETE" in filenames:
                self._complete.add(dirpath)

    def _link(self, rel: str) -> None:
        target = self.keep / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(self.root / rel, target)
        except FileNotFoundError:  # merged away between the listing and now: its records are read in the merged file
            pass
