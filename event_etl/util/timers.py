"""One scheduler for the periodic duties of every type a process runs (issue 58: a thousand types in one application).

A type's job has duties that come back on a period: its lease's renewal, its fetcher's check for old segments.  A
thread each costs a thousand types two thousand threads, and duties on the same period all fire at once (hundreds
of lease renewals in the same second, each with an fsync).  :class:`Timers` runs them all from one thread that sleeps
until the next is due and hands it to workers; each duty's first turn is spread over its period by its name
(:func:`spread`), so that a thousand renewals every 15 s are 67 a second, not a thousand at once.

**Fixed rate.**  A duty's next turn is due a period after its last one *began*, not after it ended: a renewal that
takes most of its period still comes every period (after its end, a slow sink stretched every type's period by the
renewals' time, and by the time of every renewal queued before it).  A turn that is overdue runs as soon as a worker
is free; turns missed meanwhile are not made up (one renewal brings a lease current), so a duty never has more than
one turn queued or under way, and one that fell behind runs once, then a period later.

**Workers.**  A renewal waits on the sink (a read and a compare-and-swap), not on a core, so the workers grow with
the duties (:func:`workers_for`: one for every five, at least 4, at most 32), and are made only when a due turn finds
none free: a job of a few types runs one or two, a thousand types at most 32 (and the scheduling thread).  A worker
idle for :data:`IDLE_S` ends.

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
from collections import deque
from collections.abc import Callable

__all__ = ["Timers", "Timer", "shared_timers", "spread", "workers_for", "WORKERS_MIN", "WORKERS_MAX",
           "DUTIES_PER_WORKER", "IDLE_S"]

log = logging.getLogger(__name__)

WORKERS_MIN = 4
"""Duties that may run at once however few there are (made only when turns overlap: one type runs one or two)."""
WORKERS_MAX = 32
"""Duties run at once at most, however many there are: 33 threads at a thousand types (the fleet's goal is 200
driver threads at most; ~100 at the peak of a 1,000-type drain with the former 4 workers)."""
DUTIES_PER_WORKER = 5
"""A worker for every this many duties.  A lease renewed every period P whose renewal takes L holds a worker L / P of
the time, so N leases need N x L / P workers: one for every five keeps them on time while a renewal takes up to P / 5
(1 s at the 20 s lease of the campaigns, 3 s at the default 60 s), and a lease is lost only at three times that (TTL
less the margin is three periods).  Four workers for a hundred types had their leases lost at 0.6 s at the 20 s lease
(issue 58); twenty keep them on time up to 1 s.  Past 160 duties the workers stay 32: a thousand leases at the default
TTL are on time up to 0.48 s a renewal and lost past 1.44 s (past 0.18 s with four)."""
IDLE_S = 60.0
"""A worker that found no turn to run for this long ends (made again when turns overlap again)."""


def workers_for(duties: int) -> int:
    """How many of ``duties`` a scheduler runs at once at most: one worker for every :data:`DUTIES_PER_WORKER`,
    between :data:`WORKERS_MIN` and :data:`WORKERS_MAX`."""
    return min(WORKERS_MAX, max(WORKERS_MIN, -(-duties // DUTIES_PER_WORKER)))


def spread(name: str, period: float) -> float:
    """Where in ``period`` a duty named ``name`` first runs: a stable point between 0 and the period (the same name
    lands at the same point, different names spread over it)."""
    return period * (zlib.crc32(name.encode("utf-8")) % 10_000) / 10_000


class Timer:
    """One duty's place in the schedule."""

    def __init__(self, timers: Timers, fn: Callable[[], bool | None], period: float, name: str) -> None:
        self.timers, self.fn, self.period, self.name = timers, fn, period, name
        self.cancelled = False
        self._idle = threading.Event()  # set while no turn is queued or under way
        self._idle.set()

    def cancel(self) -> None:
        """No more turns (a turn under way finishes: :meth:`join` waits for it)."""
        self.cancelled = True
        self.timers._ended(self)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a turn under way to end; True if none is under way now."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        began = time.monotonic()
        try:
            if self.cancelled:
                return
            again = self.fn()
            if again is False:
                self.cancelled = True
        except Exception:  # one duty's failure must not stop the others; it runs again next turn
            log.exception("%s failed; it runs again at its next turn, a period after this one began", self.name)
        finally:
            self._idle.set()
            if self.cancelled:
                self.timers._ended(self)
            else:  # fixed rate: a period after this turn began (overdue if it took longer: then at once, once)
                self.timers._schedule(self, began + self.period)


class Timers:
    """A scheduler of periodic duties: one thread that waits for the next turn due, and workers that run them.

    ``workers``: how many turns run at once at most; by default :func:`workers_for` the duties not ended."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)  # the scheduling thread waits on it (the heap changed)
        self._work = threading.Condition(self._lock)  # idle workers wait on it (a turn is ready)
        self._ready: deque[Timer] = deque()  # turns due, in the order they fell due, for the next free worker
        self._live: set[Timer] = set()  # duties not ended
        self._thread: threading.Thread | None = None
        self._threads = 0  # workers alive
        self._waiting = 0  # workers waiting for a turn
        self._names = itertools.count(1)

    def every(self, period: float, fn: Callable[[], bool | None], *, name: str,
              first_in: float | None = None) -> Timer:
        """Run ``fn`` every ``period`` seconds (from the start of one turn to the start of the next), first in
        ``first_in`` seconds (default: its :func:`spread` point in the period); ``fn`` returns False to end."""
        timer = Timer(self, fn, period, name)
        with self._lock:
            self._live.add(timer)
        self._schedule(timer, time.monotonic() + (spread(name, period) if first_in is None else first_in))
        return timer

    def pending(self) -> int:
        """Duties not ended (neither cancelled nor answered False)."""
        with self._lock:
            return len(self._live)

    def max_workers(self) -> int:
        """How many turns run at once at most, now."""
        with self._lock:
            return self._cap()

    def _cap(self) -> int:
        return self.workers if self.workers is not None else workers_for(len(self._live))

    def _ended(self, timer: Timer) -> None:
        with self._lock:
            self._live.discard(timer)

    def _schedule(self, timer: Timer, at: float) -> None:
        with self._lock:
            heapq.heappush(self._heap, (at, next(self._seq), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="event_etl-timers", daemon=True)
                self._thread.start()
            self._due.notify()

    def _loop(self) -> None:
        with self._lock:
            while True:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._due.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                _, _, timer = heapq.heappop(self._heap)
                if timer.cancelled:
                    continue
                timer._idle.clear()  # under the lock: a join from now on waits for this turn
                self._ready.append(timer)
                if len(self._ready) > self._waiting and self._threads < self._cap():  # none free: one more
                    self._threads += 1
                    threading.Thread(target=self._worker, name=f"event_etl-timer-{next(self._names)}",
                                     daemon=True).start()
                else:
                    self._work.notify()

    def _worker(self) -> None:
        self._lock.acquire()
        try:
            while True:
                idle_since = time.monotonic()
                while not self._ready:
                    idle = time.monotonic() - idle_since
                    if idle >= IDLE_S or self._threads > self._cap():  # not needed now (made again when it is)
                        return
                    self._waiting += 1
                    try:
                        self._work.wait(IDLE_S - idle)
                    finally:
                        self._waiting -= 1
                timer = self._ready.popleft()
                self._lock.release()
                try:
                    timer._run()
                finally:
                    self._lock.acquire()
        finally:
            self._threads -= 1
            self._lock.release()


class _Shared:
    timers: Timers | None = None
    lock = threading.Lock()


def shared_timers() -> Timers:
    """The process's scheduler, made on first use."""
    with _Shared.lock:
        if _Shared.timers is None:
            _Shared.timers = Timers()
        return _Shared.timers
