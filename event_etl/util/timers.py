"""One scheduler for the periodic duties of every type a process runs (issue 58: a thousand types in one application).

A type's job has duties that come back on a period: its lease's renewal, its fetcher's check for old segments.  A
thread each costs a thousand types two thousand threads, and duties on the same period all fire at once (hundreds
of lease renewals in the same second, each with an fsync).  :class:`Timers` runs them all from one thread that sleeps
until the next is due and hands it to a few workers; each duty's first turn is spread over its period by its name
(:func:`spread`), so that a thousand renewals every 15 s are 67 a second, not a thousand at once.

A duty returns False to end itself; :meth:`Timer.cancel` ends it from outside, and :meth:`Timer.join` waits for a
turn under way.  A duty that raises is logged and runs again at its next turn: what it does must be safe to repeat.
:func:`shared_timers` is the process's scheduler, made on first use (no thread before).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["Timers", "Timer", "shared_timers", "spread"]

log = logging.getLogger(__name__)

WORKERS = 4
"""Duties run at once at most (a slow one, a renewal on an object store, holds a worker, not the schedule)."""


def spread(name: str, period: float) -> float:
    """Where in ``period`` a duty named ``name`` first runs: a stable point between 0 and the period (the same name
    lands at the same point, different names spread over it)."""
    return period * (zlib.crc32(name.encode("utf-8")) % 10_000) / 10_000


class Timer:
    """One duty's place in the schedule."""

    def __init__(self, timers: Timers, fn: Callable[[], bool | None], period: float, name: str) -> None:
        self.timers, self.fn, self.period, self.name = timers, fn, period, name
        self.cancelled = False
        self._idle = threading.Event()  # set while no turn is under way
        self._idle.set()

    def cancel(self) -> None:
        """No more turns (a turn under way finishes: :meth:`join` waits for it)."""
        self.cancelled = True

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a turn under way to end; True if none is under way now."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        try:
            if self.cancelled:
                return
            again = self.fn()
            if again is False:
                self.cancelled = True
        except Exception:  # one duty's failure must not stop the others; it runs again next turn
            log.exception("%s failed; it runs again in %.1f s", self.name, self.period)
        finally:
            self._idle.set()
            if not self.cancelled:
                self.timers._schedule(self, time.monotonic() + self.period)


class Timers:
    """A scheduler of periodic duties: one thread that waits for the next and ``workers`` that run them."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def every(self, period: float, fn: Callable[[], bool | None], *, name: str,
              first_in: float | None = None) -> Timer:
        """Run ``fn`` every ``period`` seconds (from the end of one turn to the start of the next), first in
        ``first_in`` seconds (default: its :func:`spread` point in the period); ``fn`` returns False to end."""
        timer = Timer(self, fn, period, name)
        self._schedule(timer, time.monotonic() + (spread(name, period) if first_in is None else first_in))
        return timer

    def pending(self) -> int:
        """Duties scheduled (cancelled ones drop out at their turn)."""
        with self._cond:
            return sum(1 for _, _, t in self._heap if not t.cancelled)

    def _schedule(self, timer: Timer, at: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), timer))
            if self._thread is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="event_etl-timer")
                self._thread = threading.Thread(target=self._loop, name="event_etl-timers", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                _, _, timer = heapq.heappop(self._heap)
                if timer.cancelled:
                    continue
                timer._idle.clear()  # under the lock: a join from now on waits for this turn
            assert self._pool is not None
            self._pool.submit(timer._run)


class _Shared:
    timers: Timers | None = None
    lock = threading.Lock()


def shared_timers() -> Timers:
    """The process's scheduler, made on first use."""
    with _Shared.lock:
        if _Shared.timers is None:
            _Shared.timers = Timers()
        return _Shared.timers
