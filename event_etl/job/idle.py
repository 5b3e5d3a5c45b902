"""The idle timers of one type's job: how long its source has been quiet, and each of its parts.

:class:`IdleClock` is what :class:`~event_etl.job.controller.Controller` asks between batches (``tick``: has the
source been quiet for the idle timeout, and how far may the watermark go) and tells after each batch (a record came,
a part was heard from).  It keeps two clocks apart: the wall clock (``clock``, milliseconds: when the last record
came, when the source said it went quiet) and a clock that never steps (``monotonic``, seconds: how long it has been
quiet).  A step of the wall clock (NTP, ``date -s``) is seen at a look (:func:`~event_etl.rules.watermark.clock_step`)
and moves what it remembers of the wall clock with it; the quiet time is measured on the monotonic clock, so a step
moves no watermark.  The rules are :mod:`event_etl.rules.watermark`'s; this is their bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from event_etl.rules.watermark import (
    SourceActivity,
    clock_step,
    idle_advance,
    parts_watermark,
    quiet_since,
    quiet_start,
)

__all__ = ["IdleClock", "IdleSettings"]


@dataclass(frozen=True)
class IdleSettings:
    """How a job's idle timers (:class:`IdleClock`) tell the time that passes and the age of what the source says:
    ``monotonic``, seconds on a clock that never steps (``time.monotonic`` in a job; None: the wall clock stands in,
    for tests driving a fake one), and ``activity_stale_ms``, past which a source's report cannot tell what waits."""

    monotonic: Callable[[], float] | None = None
    activity_stale_ms: int = 60_000


class IdleClock:
    """A job's idle timers, from its start (``clock()`` at construction).

    ``monotonic``: seconds on a clock that never steps (``time.monotonic`` in a job); without one (tests driving a
    fake wall clock) the wall clock stands in for it.  ``source_activity``: what the source last said of its backlog
    and health (None: no source reports; batches alone tell).  A report older than ``activity_stale_ms`` cannot tell
    what waits.  ``parts``: the parts (Kafka partitions) the state knows, counted as heard from at the start (as the
    source's own idle timer, the quiet before it is not trusted).  ``watermark``: the watermark at the start.
    ``emit(kind, payload)`` is told of a step of the wall clock (``clock_step``) and of a change of what the source
    says is down (``source_down``)."""

    def __init__(self, *, clock: Callable[[], int], monotonic: Callable[[], float] | None = None,
                 source_activity: Callable[[], SourceActivity | None] | None = None, activity_stale_ms: int = 60_000,
                 parts: Iterable[str] = (), watermark: int | None = None,
                 emit: Callable[[str, Any], None] = lambda kind, payload: None) -> None:
        self.monotonic = monotonic or (lambda: clock() / 1000)
        self.source_activity = source_activity
        self.activity_stale_ms = activity_stale_ms
        self.emit = emit
        started = self.started_at = clock()
        self.last_input = started  # the idle timer runs from the last batch holding any record, or the start
        self.quiet_since = started
        self.wm_when_quiet = watermark
        self.wall_look, self.mono_look = started, self.monotonic()  # the last look at both clocks (a tick)
        self.mono_quiet_start = self.mono_look  # the monotonic instant the source went quiet (see look)
        # the monotonic instant each part (a Kafka partition) was last heard from
        self.part_heard: dict[str, float] = dict.fromkeys(parts, self.mono_look)
        self.clock_steps = 0
        self.source_down: str | None = None  # why the source says it cannot deliver what its input holds

    # -- told by batches -------------------------------------------------------------------
    def heard(self, parts: Iterable[str]) -> float:
        """A batch read ``parts``: heard from now; returns now on the monotonic clock."""
        mono = self.monotonic()
        self.part_heard.update(dict.fromkeys(parts, mono))
        return mono

    def input_seen(self, now: int) -> None:
        """A batch held a record (any: late, invalid and duplicate ones too show the source is alive)."""
        self.last_input = now

    def parts_quiet_for(self, mono: float | None = None) -> dict[str, int]:
        """How long (ms, on the monotonic clock) each part has not been heard from, at ``mono`` (default: now)."""
        mono = self.monotonic() if mono is None else mono
        return {p: int((mono - heard) * 1000) for p, heard in self.part_heard.items()}

    def settling(self) -> bool:
        """Whether the source says input a killed run held may still come back (see SourceActivity.settling)."""
        activity = self.source_activity() if self.source_activity is not None else None
        return bool(activity is not None and activity.settling and activity.updated_at >= self.started_at)

    # -- a tick ----------------------------------------------------------------------------
    def look(self, now: int, watermark: int | None) -> tuple[float, SourceActivity | None]:
        """A tick's look at both clocks and the source, at wall time ``now`` with the state's ``watermark``: a step
        of the wall clock followed, the idle timer started again if the source was not quiet after all.  Returns the
        monotonic now and what the source last said in this run."""
        mono = self.monotonic()
        self._follow_clock_step(now, mono)
        since, activity = self._quiet_since(now)
        if since != self.quiet_since:  # not quiet after all: the idle timer starts again from here
            self.quiet_since = since
            self.wm_when_quiet = watermark
            self.mono_quiet_start = quiet_start(since, now, mono_now=mono, mono_last_look=self.mono_look)
        self.wall_look, self.mono_look = now, mono
        return mono, activity

    def _follow_clock_step(self, now: int, mono: float) -> None:
        """A step of the wall clock since the last look: what this run remembers of the wall clock moves with it
        (quiet_start bounds the rest)."""
        step = clock_step(self.wall_look, self.mono_look, now, mono)
        if step:
            self.clock_steps += 1
            self.started_at += step
            self.quiet_since += step
            self.last_input += step
            self.emit("clock_step", step)

    def _quiet_since(self, now: int) -> tuple[int, SourceActivity | None]:
        """Since when the source has been quiet as this tick sees it, and what it last said in this run."""
        if self.source_activity is None:  # no source reports (tests driving batches by hand): batches only
            return max(self.quiet_since, self.last_input), None
        activity = self.source_activity()
        if activity is not None and activity.updated_at < self.started_at:
            activity = None  # a report of the run before this one says nothing about now
        down = activity.down if activity is not None else None
        if down != self.source_down:  # said when it changes, not at every tick
            self.source_down = down
            self.emit("source_down", down)
        since = quiet_since(self.last_input, activity, now=now, stale_after=self.activity_stale_ms)
        return max(self.quiet_since, since), activity

    def idle_watermark(self, mono: float, watermark: int | None, parts: dict[str, int], *, idle_timeout: int,
                       out_of_orderness: int) -> int | None:
        """The watermark a quiet source gets at ``mono`` (the state's ``watermark`` and ``parts`` now): quiet for
        the monotonic time since it went quiet (a step of the wall clock moves nothing); a partition quiet for the
        idle timeout stops holding it back."""
        wm = idle_advance(
            watermark,
            quiet_for=int((mono - self.mono_quiet_start) * 1000),
            watermark_when_quiet=self.wm_when_quiet,
            idle_timeout=idle_timeout,
        )
        if parts:
            by_parts = parts_watermark(parts, self.parts_quiet_for(mono), out_of_orderness=out_of_orderness,
                                       idle_timeout=idle_timeout)
            if by_parts is not None and (wm is None or by_parts > wm):
                wm = by_parts
        return wm
