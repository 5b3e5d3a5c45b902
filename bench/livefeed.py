"""A producer for the live benchmarks: JSON-lines files dropped into a folder at a fixed wall-clock rate.

Arrival is a wall-clock instant here, which is what makes latency measurable: file ``k``
is renamed into the source folder at its scheduled time, with its modification time set to
that same instant (event_etl's directory source takes a file's mtime as the arrival of its
payloads).  All of a file's events arrive together; a producer batching ``interval``
seconds of events per file is a fair picture of a bus sink writing files.

To keep the producer off the CPU while the job runs (the machine has two cores), every file
is written beforehand into a staging folder on the same file system; during the run the
producer only renames.

Event time runs ``speedup`` times faster than the wall clock (so hours close within a short
run) and starts far enough in the past that it never passes the clock (no event is
``future``).  File ``k`` carries the event-time slice ``[k, k+1) * interval * speedup`` after
``event_start``, each event up to 60 s of event time behind its slot (mild disorder, well
within the 2-minute out-of-orderness bound: every event is timely).  The top 32 bits of each
event's UUID are ``k``, so any output record can be traced back to its input file and
arrival.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.datagen import encode_line, make_record

__all__ = ["FedFile", "Feed", "file_index_of"]

HOUR_MS = 3_600_000
_DISORDER_MS = 60_000


def file_index_of(event_id: str) -> int:
    """The input file an event came from (the top 32 bits of its UUID)."""
    return int(event_id[:8], 16)


@dataclass
class FedFile:
    """One input file: how many events, their largest event time, and when it arrived (``time.time()``)."""

    index: int
    events: int
    max_event_time: int
    arrival: float | None = None


class Feed:
    """Files ``0..files-1`` of ``events_per_file`` events each, staged in ``stage`` and dropped into ``source``."""

    def __init__(self, source: Path, stage: Path, *, files: int, events_per_file: int, interval: float,
                 speedup: float, event_start: int, seed: int = 7, shape: str = "page_view") -> None:
        self.source, self.stage = source, stage
        self.files, self.per_file, self.interval = files, events_per_file, interval
        self.speedup, self.event_start, self.seed, self.shape = speedup, event_start, seed, shape
        self.fed: list[FedFile] = []

    @staticmethod
    def event_start_for(now_ms: int, *, files: int, interval: float, speedup: float) -> int:
        """An hour boundary early enough that the whole feed's event time stays behind the clock."""
        span = int((files + 2) * interval * speedup * 1000)
        t = now_ms - span - HOUR_MS
        return t - t % HOUR_MS

    def _name(self, k: int) -> str:
        return f"events-{k:06d}.jsonl"

    def stage_all(self) -> None:
        """Write every file into the staging folder (before the job starts)."""
        self.source.mkdir(parents=True, exist_ok=True)
        self.stage.mkdir(parents=True, exist_ok=True)
        rng = random.Random(self.seed)
        slot = self.interval * self.speedup * 1000 / self.per_file
        for k in range(self.files):
            lines, max_t = [], 0
            for j in range(self.per_file):
                t = self.event_start + int((k * self.per_file + j) * slot) - rng.randint(0, _DISORDER_MS)
                rec = make_record(self.shape, j, t, rng)
                rec["event_id"] = str(uuid.UUID(int=(k << 96) | rng.getrandbits(96), version=4))
                lines.append(encode_line(rec))
                max_t = max(max_t, t)
            (self.stage / self._name(k)).write_bytes(b"\n".join(lines) + b"\n")
            self.fed.append(FedFile(k, self.per_file, max_t))

    def drop(self, k: int) -> float:
        """Make file ``k`` arrive now: mtime = now, then rename into the source folder.  Returns the arrival."""
        staged = self.stage / self._name(k)
        now = time.time()
        os.utime(staged, (now, now))
        os.rename(staged, self.source / self._name(k))
        self.fed[k].arrival = now
        return now

    def run(self, first: int, *, start: float) -> None:
        """Drop files ``first..`` one every ``interval`` s from wall time ``start``, on schedule (no drift)."""
        for k in range(first, self.files):
            due = start + (k - first) * self.interval
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            self.drop(k)
