"""How the watermark moves.

The watermark is the event time up to which the job believes it has seen everything:
the maximum event time seen minus the type's out-of-orderness bound.  Three things
move it, and it never goes back:

1. **Events** (:func:`watermark_after_batch`): after a micro-batch, to the batch's
   maximum *counted* event time minus the bound.  An event counts at most up to its
   arrival (:func:`counted_time`): a producer whose clock runs ahead (within
   ``max_future_skew``; further ahead it is rejected as ``future``) is written to the hour
   of its own event time, but cannot move the watermark past the real clock, so it
   cannot complete an hour that correct events are still arriving for.
2. **Idleness** (:func:`idle_watermark`): once the source has been quiet for the idle
   timeout, it advances by the time that passes after that, starting from where it stood
   when the source went quiet.  That time is measured on the monotonic clock
   (:func:`quiet_start`): a step of the wall clock (NTP correcting a wrong clock) neither
   lengthens the quiet nor moves the watermark; :func:`clock_step` tells that one happened.
   A quiet live source still closes its hours, and a finished backfill does not jump to
   today.  A source is *not* quiet while it reports a backlog, is retrying (an outage
   is not silence), or has delivered anything (timely, late, invalid or duplicate)
   within the idle timeout: :func:`quiet_since`.
3. **Partitions** (:func:`parts_watermark`): a source read in partitions (Kafka) reports each split's
   partition (its *part*) with the split's largest counted time.  The watermark is then the least over the parts
   heard from within the idle timeout (*live* parts) of each one's largest counted time minus the bound, so a slow
   partition holds the hours it still has data for; a part quiet for the idle timeout (measured on the monotonic
   clock, as the source's own quiet) stops holding it back, as Flink's ``withIdleness``; no live part: the largest
   over all (rule 1).  A part first seen, or heard from again after its quiet, is judged against the watermark as
   it then stands (the batch's intent): its old events are late or too late; it holds the watermark (never moves
   it back) until it catches up or falls quiet again.  A source without parts keeps rule 1 exactly.
4. **Drain** (:func:`drain_watermark`): the end of input is the end of time, so it goes
   to the end of the latest hour holding data: the hour of the latest event seen, or a
   later open hour that received late records.

:class:`WatermarkState` is what the driver persists after every batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from event_etl.timeutil import HOUR_MS

__all__ = ["WatermarkState", "BatchTimes", "SourceActivity", "counted_time", "drain_watermark", "idle_watermark",
           "idle_advance", "parts_watermark", "merge_parts", "quiet_since", "quiet_start", "clock_step",
           "CLOCK_STEP_TOLERANCE_MS", "watermark_after_batch"]

CLOCK_STEP_TOLERANCE_MS = 1_000
"""How far the wall clock may drift from the monotonic clock between two looks before it counts as a step (NTP
slews by at most 0.5 ms a second; a step is a jump)."""


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


def counted_time(event_time: int, arrival: int) -> int:
    """How far an event moves event time: its event time, but never beyond its arrival (the real clock)."""
    return event_time if event_time <= arrival else arrival


def watermark_after_batch(
    wm_start: int | None, batch_max_event_time: int | None, *, out_of_orderness: int
) -> int | None:
    """Watermark after a batch whose accepted events reached ``batch_max_event_time`` (counted times,
    see :func:`counted_time`)."""
    if batch_max_event_time is None:
        return wm_start
    return _max(wm_start, batch_max_event_time - out_of_orderness)


def merge_parts(parts: Mapping[str, int], batch_parts: Mapping[str, int | None]) -> dict[str, int]:
    """Each part's largest counted time after a batch whose splits reported ``batch_parts`` (a part that delivered
    only records that count for nothing, invalid or too late, reports ``None``: it keeps what it had).  Pure."""
    out = dict(parts)
    for part, t in batch_parts.items():
        if t is not None:
            had = out.get(part)
            out[part] = t if had is None or t > had else had
    return dict(sorted(out.items()))


def parts_watermark(parts: Mapping[str, int], quiet_for: Mapping[str, int], *, out_of_orderness: int,
                    idle_timeout: int) -> int | None:
    """The watermark the partitions of a source give (rule 3 of the module docstring), before "never back".

    ``parts``: each part's largest counted time; ``quiet_for``: how long (ms, on the monotonic clock) each part has
    not been heard from (a part missing here counts as just heard from).  The least, over the live parts (quiet for
    less than ``idle_timeout``), of the largest counted time minus ``out_of_orderness``; with no live part, the
    largest over all of them; ``None`` without parts.  Pure function."""
    if not parts:
        return None
    live = [t for p, t in parts.items() if quiet_for.get(p, 0) < idle_timeout]
    return (min(live) if live else max(parts.values())) - out_of_orderness


def idle_watermark(
    watermark: int | None,
    *,
    quiet_since: int,
    watermark_when_quiet: int | None,
    now: int,
    idle_timeout: int,
) -> int | None:
    """Watermark of a source quiet since ``quiet_since`` (wall clock, ms), at wall time ``now``.

    Before the idle timeout has passed nothing changes; after it, the watermark is
    ``watermark_when_quiet`` plus the wall time elapsed beyond the timeout.  A job that
    has never seen an event has no watermark to advance.
    """
    return idle_advance(watermark, quiet_for=now - quiet_since, watermark_when_quiet=watermark_when_quiet,
                        idle_timeout=idle_timeout)


def idle_advance(watermark: int | None, *, quiet_for: int, watermark_when_quiet: int | None,
                 idle_timeout: int) -> int | None:
    """:func:`idle_watermark` for a source quiet for ``quiet_for`` ms (measured on a monotonic clock)."""
    if watermark_when_quiet is None:
        return watermark
    elapsed = quiet_for - idle_timeout
    if elapsed <= 0:
        return watermark
    return _max(watermark, watermark_when_quiet + elapsed)


def quiet_start(since: int, now: int, *, mono_now: float, mono_last_look: float) -> float:
    """The monotonic instant (seconds) at which a source quiet since ``since`` (wall ms) went quiet, seen at wall
    time ``now`` and monotonic time ``mono_now``; ``mono_last_look`` is the monotonic time of the last look, when it
    was not yet quiet since then.

    The wall clock's gap ``now - since`` is trusted only up to the monotonic time since that last look: a step
    of the wall clock in between (forward: a gap of hours in two seconds) cannot make the quiet longer than the
    time that really passed, and a step back makes it no shorter than nothing.  Pure function."""
    gap = max(0, now - since) / 1000
    return mono_now - min(gap, max(0.0, mono_now - mono_last_look))


def clock_step(wall_before: int, mono_before: float, wall_now: int, mono_now: float,
               tolerance_ms: int = CLOCK_STEP_TOLERANCE_MS) -> int:
    """How far (ms, signed) the wall clock jumped between two looks beyond the monotonic time that passed; 0 within
    ``tolerance_ms``.  Pure function."""
    step = (wall_now - wall_before) - round((mono_now - mono_before) * 1000)
    return step if abs(step) > tolerance_ms else 0


def drain_watermark(watermark: int | None, max_event_time: int | None, last_hour: int | None = None) -> int | None:
    """Watermark at the end of input: the end of the latest hour holding data.

    That is the hour of the latest event seen, or ``last_hour`` (the latest hour that
    received a file: the open hour that late records were written into may lie after it).
    """
    latest = _max(None if max_event_time is None else max_event_time - max_event_time % HOUR_MS, last_hour)
    if latest is None:
        return watermark
    return _max(watermark, latest + HOUR_MS)


@dataclass(frozen=True)
class SourceActivity:
    """What a source last reported about itself (all times ms on the wall clock).

    - ``updated_at``: when it reported (it reports whenever the engine asks it for offsets);
    - ``backlog``: input it knows of and has not offered yet (files, events, messages);
    - ``retrying``: it cannot reach its input right now and keeps trying (an outage);
    - ``delivered_at``: when it last offered new input;
    - ``settling``: input that a killed run held may still come back (Pub/Sub leases running
      out): until it stops settling, the watermark holds and no hour is marked;
    - ``down``: why it cannot deliver what its input holds, for people (a full disk, a puller
      that died); ``retrying`` is then true as well.
    """

    updated_at: int
    backlog: int = 0
    retrying: bool = False
    delivered_at: int | None = None
    settling: bool = False
    down: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceActivity:
        return cls(int(data["updated_at"]), int(data.get("backlog") or 0), bool(data.get("retrying")),
                   None if data.get("delivered_at") is None else int(data["delivered_at"]),
                   bool(data.get("settling")), data.get("down"))


def quiet_since(last_input: int, activity: SourceActivity | None, *, now: int, stale_after: int) -> int:
    """Since when the source has been quiet, at ``now``: the idle timer starts there.

    ``last_input`` is when a batch last held any record (timely, late, invalid, duplicate:
    all of it shows the source is alive), or when the job started.  A source that reports a
    backlog, an outage or that it is settling is not quiet at all (``now``); one that has not reported (``None``,
    e.g. while the job starts after a downtime) or whose report is older than ``stale_after``
    cannot tell, and counts as not quiet either: only a source that says so is quiet.  Pure
    function.
    """
    since = last_input
    if (activity is None or activity.retrying or activity.settling or activity.backlog > 0
            or now - activity.updated_at > stale_after):
        return now
    if activity.delivered_at is not None and activity.delivered_at > since:
        since = activity.delivered_at
    return since


@dataclass(frozen=True)
class BatchTimes:
    """What a written batch tells of event time (``BatchResult.times``), summed over its splits.

    - ``max_event_time``: the batch's largest accepted event time, or ``None``.
    - ``max_counted``: its largest counted time (:func:`counted_time`): what the watermark follows.
    - ``min_hour``, ``max_hour``: the earliest and the latest hour it wrote data to.
    - ``parts``: a partitioned source's parts it read, each with its largest counted time (``None``: nothing of it
      counted, see :func:`merge_parts`); empty for a source without parts.
    """

    max_event_time: int | None = None
    max_counted: int | None = None
    min_hour: int | None = None
    max_hour: int | None = None
    parts: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class WatermarkState:
    """What a job knows of event time, persisted after every micro-batch.

    - ``watermark``: ms, or ``None`` before the first event.
    - ``max_event_time``: the largest accepted event time seen.
    - ``max_counted_time``: the largest accepted event time seen, each counted at most up to
      its arrival (:func:`counted_time`): the event clock that the watermark and the dedupe
      window follow.
    - ``first_hour``: the earliest hour that received data (timely records, or late records
      written into the open hour); markers start there.
    - ``last_hour``: the latest hour that received data; a drain closes every hour up to it.
    - ``marked_through``: start of the last hour that has its marker (every hour from
      ``first_hour`` to it has one), or ``None``.
    - ``last_batch_id``: the last micro-batch fully processed (-1: none).
    - ``parts``: a partitioned source's (Kafka's) parts, each with its largest counted time (rule 3 of the module
      docstring); empty for every other source, and then not saved at all (``to_json``).
    """

    watermark: int | None = None
    max_event_time: int | None = None
    first_hour: int | None = None
    marked_through: int | None = None
    last_batch_id: int = -1
    max_counted_time: int | None = None
    last_hour: int | None = None
    parts: dict[str, int] = field(default_factory=dict)

    def after_batch(
        self,
        *,
        batch_id: int,
        wm_start: int | None,
        times: BatchTimes,
        out_of_orderness: int,
        parts_quiet_for: Mapping[str, int] | None = None,
        idle_timeout: int = 0,
    ) -> WatermarkState:
        """State after batch ``batch_id`` (judged against ``wm_start``) was written, with the event ``times`` it saw.

        The watermark follows the batch's largest counted time (``times.max_counted``, :func:`counted_time`), not
        its raw ``times.max_event_time``.  A partitioned source's batch reports its parts (``times.parts``: each
        part's largest counted time, see :func:`merge_parts`); with parts known, the watermark follows
        :func:`parts_watermark` instead (``parts_quiet_for``: how long each part has been quiet, 0 for those of this
        batch)."""
        parts = merge_parts(self.parts, times.parts) if times.parts else self.parts
        if parts:
            wm = _max(_max(wm_start, self.watermark),
                      parts_watermark(parts, parts_quiet_for or {}, out_of_orderness=out_of_orderness,
                                      idle_timeout=idle_timeout))
        else:
            wm = watermark_after_batch(
                _max(wm_start, self.watermark), times.max_counted, out_of_orderness=out_of_orderness
            )
        first = self.first_hour
        if times.min_hour is not None and (first is None or times.min_hour < first):
            first = times.min_hour
        return replace(
            self,
            watermark=wm,
            max_event_time=_max(self.max_event_time, times.max_event_time),
            max_counted_time=_max(self.max_counted_time, times.max_counted),
            first_hour=first,
            last_hour=_max(self.last_hour, times.max_hour),
            last_batch_id=max(self.last_batch_id, batch_id),
            parts=parts,
        )

    @property
    def event_clock(self) -> int | None:
        """The largest counted event time: how far event time has come (for forgetting old keys)."""
        return self.max_counted_time

    def with_watermark(self, watermark: int | None) -> WatermarkState:
        """The same state with the watermark moved forward (never back)."""
        return replace(self, watermark=_max(self.watermark, watermark))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.parts:
            del out["parts"]  # a source without parts saves what it always saved
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WatermarkState:
        """Read a saved state, of this format or an earlier one (without ``parts``: none).

        A state saved before ``max_counted_time`` and ``last_hour`` existed (checkpoint format 1)
        counted every accepted event up to its event time, and drained to the hour of the latest
        event: those are the values it gets."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "max_counted_time" not in data:
            known["max_counted_time"] = data.get("max_event_time")
        if "last_hour" not in data and data.get("max_event_time") is not None:
            known["last_hour"] = data["max_event_time"] - data["max_event_time"] % HOUR_MS
        known["parts"] = {str(p): int(t) for p, t in (data.get("parts") or {}).items()}
        return cls(**known)
