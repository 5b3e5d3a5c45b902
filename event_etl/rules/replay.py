"""Which dead letters a replay sends (``event-etl deadletter TYPE --replay-to ...``), as plain rules.

A dead letter is named by a *key*, ``<dt=day>/<file>#<n>`` (its dead-letter file and its place in it): a
replayed batch rewrites the same file with the same records, so the key stays.  A replay record lists the keys
it sent; a key listed by an earlier replay is not sent again unless asked (``again``).

An event is *too late again* when the live job's watermark is more than ``allowed_lateness`` past the end of its
hour: sent back, the job would dead-letter it as ``too_late`` once more (the rule of
:func:`event_etl.rules.judge.make_judge` for a job with a watermark).  A replay says how many before sending and
sends them only if asked.  An event without an event time (``invalid_json``, ``missing_time``...) is never too
late: the job decides once it can read it.

An event is *future again* when its event time is still more than ``max_future_skew`` ahead of now, when it would
arrive: sent back, the job would dead-letter it as ``future`` once more (the rule of
:func:`event_etl.rules.judge.make_judge`).  A replay says how many, and until when, and sends them only if asked.

Milliseconds since the epoch, UTC; no clock read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from event_etl.timeutil import HOUR_MS

__all__ = ["Candidate", "Selection", "select", "too_late_again", "split_too_late", "future_again", "split_future"]


class Candidate(Protocol):
    """What the selection looks at in a dead letter."""

    @property
    def key(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def event_time(self) -> int | None: ...


C = TypeVar("C", bound=Candidate)


@dataclass
class Selection(Generic[C]):
    """What a replay would send, and what it left out and why."""

    chosen: list[C] = field(default_factory=list)
    """In the dead letters' order (oldest day and batch first)."""
    already_sent: int = 0
    """Matched, but an earlier replay sent them (and ``again`` was not given)."""
    no_event_time: int = 0
    """Matched the reasons, but an hour range was given and they have no event time to place in it."""
    beyond_limit: int = 0
    """Matched, not sent before, past the limit."""


def select(candidates: Iterable[C], *, reasons: Sequence[str] = (), since: int | None = None,
           until: int | None = None, limit: int | None = None, sent: frozenset[str] | set[str] = frozenset(),
           again: bool = False) -> Selection[C]:
    """The dead letters a replay sends: of any of ``reasons`` (any string: none given, every reason), whose event
    time's hour is in ``[since, until)`` (hour starts; either may be None: open), not sent by an earlier replay
    (unless ``again``), at most ``limit`` of them (None: all), first ones first."""
    out: Selection[C] = Selection()
    wanted = set(reasons)
    for c in candidates:
        if wanted and c.reason not in wanted:
            continue
        if since is not None or until is not None:
            if c.event_time is None:
                out.no_event_time += 1
                continue
            hour = c.event_time - c.event_time % HOUR_MS
            if (since is not None and hour < since) or (until is not None and hour >= until):
                continue
        if not again and c.key in sent:
            out.already_sent += 1
            continue
        if limit is not None and len(out.chosen) >= limit:
            out.beyond_limit += 1
            continue
        out.chosen.append(c)
    return out


def too_late_again(event_time: int | None, watermark: int | None, allowed_lateness: int) -> bool:
    """Whether an event sent back now would be too late for the live job at ``watermark`` (None: the job has none
    yet, nothing is too late): the watermark is more than ``allowed_lateness`` past the end of its hour."""
    if event_time is None or watermark is None:
        return False
    hour = event_time - event_time % HOUR_MS
    return watermark - (hour + HOUR_MS) > allowed_lateness


def split_too_late(chosen: Iterable[C], watermark: int | None, allowed_lateness: int) -> tuple[list[C], list[C]]:
    """``chosen`` as (in time: the job takes them, timely or late; too late again), each in its order."""
    ok: list[C] = []
    late: list[C] = []
    for c in chosen:
        (late if too_late_again(c.event_time, watermark, allowed_lateness) else ok).append(c)
    return ok, late


def future_again(event_time: int | None, now: int, max_future_skew: int) -> bool:
    """Whether an event sent back at ``now`` would be ``future`` for the live job again: its event time is still more
    than ``max_future_skew`` ahead of its arrival (now, or a little later: never earlier)."""
    return event_time is not None and event_time > now + max_future_skew


def split_future(chosen: Iterable[C], now: int, max_future_skew: int) -> tuple[list[C], list[C]]:
    """``chosen`` as (in time or late: the job takes them; future again), each in its order."""
    ok: list[C] = []
    ahead: list[C] = []
    for c in chosen:
        (ahead if future_again(c.event_time, now, max_future_skew) else ok).append(c)
    return ok, ahead
