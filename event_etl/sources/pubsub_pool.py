"""Shared pullers: a few threads pull every Pub/Sub subscription of an application, in turns (issue 58).

A single type's fetcher runs a thread per pull stream (:class:`~event_etl.sources.pubsub_stream.PullStream`),
which waits in its pull while the subscription is quiet.  A fleet of a thousand Pub/Sub types would hold a thousand
such threads, most of them waiting.  In a fleet, the streams of every type take **turns** on one
:class:`PullerPool` instead: a turn is one pull, made durable and acknowledged as a thread's loop does it
(:meth:`PullStream.turn`), and says when the stream's next turn is due: at once while its subscription has a
backlog, later and later (doubling, up to :data:`~event_etl.sources.pubsub_turns.IDLE_CAP` seconds) while it is
quiet.  A turn that finds the
subscription drained for now closes the stream's open segment, so what it pulled is offered at the next trigger
without an age thread of its own.  The pool's threads serve the due streams oldest first, so a type with a backlog
gets a turn after every other due stream: one type's backlog does not starve the others.

The rules of the spool are those of a thread's loop (the same methods run); only who runs them changes.
:class:`PooledRunner` stands in for a stream's thread (``start``, ``is_alive``, ``join``), so the fetcher stops,
drains and reports a pooled stream as it does a thread.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

__all__ = ["PullerPool", "PooledRunner", "shared_pool", "PULLERS"]

PULLERS = 8
"""Threads of the application's pool (``EVENT_ETL_PUBSUB_PULLERS``): turns run at once at most."""


class PooledRunner:
    """A pull stream's place in the pool, shaped as its thread would be (``name``, ``start``, ``is_alive``,
    ``join``).  ``turn()`` returns the seconds until its next turn, or None once it has ended (its stream stopped and
    finished what it held)."""

    def __init__(self, pool: PullerPool, turn: Callable[[], float | None], name: str) -> None:
        self.pool, self.turn, self.name = pool, turn, name
        self.ended = threading.Event()
        self.started = False

    def start(self) -> None:
        self.started = True
        self.pool.schedule(self, 0.0)

    def is_alive(self) -> bool:
        return self.started and not self.ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Wait until it has ended (its next turn is brought forward: a stop is noticed at once)."""
        if self.is_alive():
            self.pool.schedule(self, 0.0)
            self.ended.wait(timeout)


class Holder(Protocol):
    """What the pool asks of a fetcher for the application's flow control."""

    def held_totals(self) -> tuple[int, int]: ...


class PullerPool:
    """``workers`` threads running the due turns of every registered stream (see the module docstring).

    **Flow control is the application's**, beside each fetcher's own bound: while the fetchers of the pool hold
    ``max_held_messages`` or ``max_held_bytes`` that no batch has saved, a fetcher pulls only while it holds less
    than its fair share of them (the bound divided among the fetchers holding any): a type with a backlog cannot
    take the room the others need, and a type alone takes all of it."""

    def __init__(self, workers: int = PULLERS, *, max_held_messages: int = 1_000_000,
                 max_held_bytes: int = 1 << 30) -> None:
        self.workers = max(1, workers)
        self.max_held = (max_held_messages, max_held_bytes)
        self._holders: dict[int, Holder] = {}
        self._totals: tuple[float, dict[int, tuple[int, int]]] = (0.0, {})  # (when, each fetcher's held)
        self._heap: list[tuple[float, int, PooledRunner]] = []
        self._due: dict[PooledRunner, float] = {}  # each runner's next turn (a runner is queued once)
        self._running: set[PooledRunner] = set()  # turns under way (a runner runs one turn at a time)
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.answered_at = float("-inf")  # monotonic: when the service last answered one of the pool's calls
        self._background: ThreadPoolExecutor | None = None

    # -- the application's flow control ------------------------------------------------------------------------
    def join(self, fetcher: Holder) -> None:
        with self._cond:
            self._holders[id(fetcher)] = fetcher

    def leave(self, fetcher: Holder) -> None:
        with self._cond:
            self._holders.pop(id(fetcher), None)

    def room_for(self, fetcher: Holder) -> bool:
        """Whether ``fetcher`` may pull now under the application's bound (see the class docstring).  What every
        fetcher holds is looked at most every 0.1 s (a thousand fetchers' turns do not each count them all)."""
        now = time.monotonic()
        at, held = self._totals
        if now - at >= 0.1:
            with self._cond:
                holders = list(self._holders.items())
            held = {key: h.held_totals() for key, h in holders}
            self._totals = (now, held)
        msgs = sum(m for m, _ in held.values())
        size = sum(b for _, b in held.values())
        if msgs < self.max_held[0] and size < self.max_held[1]:
            return True
        busy = max(1, sum(1 for m, b in held.values() if m or b))
        mine = held.get(id(fetcher), (0, 0))
        return mine[0] < self.max_held[0] / busy and mine[1] < self.max_held[1] / busy

    def schedule(self, runner: PooledRunner, delay: float) -> None:
        """Run ``runner``'s next turn in ``delay`` seconds (sooner than it was due: brought forward)."""
        at = time.monotonic() + delay
        with self._cond:
            if runner.ended.is_set():
                return
            due = self._due.get(runner)
            if due is not None and due <= at:
                return
            self._due[runner] = at
            if runner not in self._running:
                heapq.heappush(self._heap, (at, next(self._seq), runner))
            self._start_threads()
            self._cond.notify()

    def _start_threads(self) -> None:
        while len(self._threads) < self.workers:
            t = threading.Thread(target=self._work, name=f"pubsub-puller-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _next(self) -> PooledRunner:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap:
                    at, _, runner = self._heap[0]
                    if self._due.get(runner) != at or runner in self._running:  # moved, or its turn runs
                        heapq.heappop(self._heap)
                        continue
                    break
                if self._heap and self._heap[0][0] <= now:
                    _, _, runner = heapq.heappop(self._heap)
                    del self._due[runner]
                    self._running.add(runner)
                    return runner
                self._cond.wait(None if not self._heap else self._heap[0][0] - now)

    def _work(self) -> None:
        while True:
            runner = self._next()
            delay: float | None = None
            try:
                delay = runner.turn()
            finally:
                with self._cond:
                    self._running.discard(runner)
                    if delay is None:
                        runner.ended.set()
                        self._due.pop(runner, None)
                    elif math.isinf(delay):  # suspended: its pull's answer (or a stop) schedules it
                        due = self._due.get(runner)
                        if due is not None:  # brought forward while it ran: look again then
                            heapq.heappush(self._heap, (due, next(self._seq), runner))
                            self._cond.notify()
                    else:
                        again = time.monotonic() + delay
                        due = self._due.get(runner)  # brought forward while it ran: the earlier of the two
                        self._due[runner] = again if due is None else min(due, again)
                        heapq.heappush(self._heap, (self._due[runner], next(self._seq), runner))
                        self._cond.notify()

    def threads(self) -> int:
        return len(self._threads)

    def in_background(self, work: Callable[[], None]) -> None:
        """Run ``work`` on one of a few threads of the pool's own (a fetcher's end of a ``--once`` run, which waits
        for its streams' last turns: a thousand types do not each start a thread for it)."""
        with self._cond:
            if self._background is None:
                self._background = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pubsub-drained")
            pool = self._background
        pool.submit(work)


class _Shared:
    pool: PullerPool | None = None
    lock = threading.Lock()


def shared_pool(workers: int = PULLERS, *, max_held_messages: int = 1_000_000,
                max_held_bytes: int = 1 << 30) -> PullerPool:
    """The application's pool, made on first use (no thread before) with the first caller's settings."""
    with _Shared.lock:
        if _Shared.pool is None:
            _Shared.pool = PullerPool(workers, max_held_messages=max_held_messages, max_held_bytes=max_held_bytes)
        return _Shared.pool
