"""What a drain does before it closes any hour: one type or a fleet, either engine (issue 47, item 6).

A drain moves a type's watermark past the last hour holding data and marks every hour up to it.  A Pub/Sub type
acknowledges a message once it is in the checkpoint's spool (``EVENT_ETL_PUBSUB_ACK=spooled``), and from then until
its batch commits the spool is its only copy.  Were an hour marked while such messages waited in an open segment,
or in a closed one no batch had read, the next run would write them as ``late-`` records of an hour already
complete.  (With ``committed`` the spool holds messages not yet acknowledged, which Pub/Sub would deliver again,
as late, all the same.)  So before a drain closes any hour, for every type whose source has a fetcher:

1. it waits until the source no longer settles (messages a killed run left leased have had their time to come
   back), pulling as before (what comes back must be pulled to be read: so this comes before pulling stops) and with
   batches still reading the spool meanwhile, so that a long wait does not fill the spool to its bound and stop the
   pulls; one line says how long it waits;
2. pulling stops: the fetcher closes its open segments, for the batches to read;
3. batches run until the planner has offered, and the job committed, every segment the spool holds;
4. the drain runs only if that is so (:func:`drain_job`): otherwise the type is not drained, saying what the spool
   still holds, its hours stay open, and the next run reads the spool before it closes them.

:func:`rounds_before_drain` does steps 1 to 3 with the shared engine (one type or a fleet), and
:func:`queries_before_drain` with a streaming query per type (``--engine queries``), whose own triggers read the
spool.  :func:`drain_job` is every drain's step 4, whichever engine ran the batches.  A second SIGINT or SIGTERM
while any of it waits stops at once, as during any drain (:mod:`event_etl.job.stopping`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.errors import IntegrityError
from event_etl.job.shared import SharedEngine, SparkLog
from event_etl.job.stopping import (
    PENDING_REPLAY_TIMEOUT_S,
    POLL_S,
    Escalated,
    StopSignals,
    run_watched,
    say,
    wait_for,
)
from event_etl.sources.spool import FENCED_SUFFIX, OPEN_SUFFIX, segment_count

__all__ = ["rounds_before_drain", "queries_before_drain", "drain_job", "spool_left", "needs_batches_to_drain"]


def needs_batches_to_drain(job: Any) -> bool:
    """Whether a type must run batches before it can drain even when the stop came before it ran any: a batch a
    crash left unfinished is replayed first, and a spool is read first."""
    return job.controller.pending_batch is not None or job.fetcher is not None


def rounds_before_drain(engine: SharedEngine, members: list[Any], stops: StopSignals, *,
                        on_failure: Callable[[Any, BaseException], None], trigger_ms: int,
                        quiet: bool = False) -> None:
    """With the shared engine: what the drain of ``members`` needs done before it closes any hour.

    The steps of the module docstring for every type with a fetcher, running or not (a quarantined type stops
    pulling too, and its drain then says what its spool still holds): the settling waited out with a round over the
    running ones every ``trigger_ms`` (at once again after a round that read something), pulling stopped, then rounds
    until each running one's spool is read and committed.  Those rounds also replay, as it was planned, every running
    type's batch that a crash left unfinished.  A batch that fails goes to ``on_failure``, as in
    :func:`event_etl.job.shared.run_rounds`."""
    fetching = [m for m in members if m.job is not None and m.job.fetcher is not None]
    spooled = {m.name for m in fetching}

    def running_fetching() -> list[str]:
        return [m.name for m in fetching if m.state == "running"]

    def one_round(todo: list[str]) -> bool:
        """A round over the types ``todo``; whether it ran any batch."""
        rnd = run_watched(lambda: engine.run(engine.plan(todo)), stops, name="event_etl-round")
        for name, err in rnd.failed.items():
            on_failure(engine.members[name], err)
        return bool(rnd.work)

    def read_meanwhile(left: float) -> None:
        todo = running_fetching()
        if not todo or not one_round(todo):
            stops.sleep(min(trigger_ms / 1000.0, left))

    _settle([(m.name, m.job.fetcher) for m in fetching], stops, quiet=quiet, meanwhile=read_meanwhile)
    for m in fetching:
        m.job.fetcher.stop()  # no more pulls; every open segment closed
    want = {m.name for m in members if m.state == "running" and m.lane.pending is not None} | set(running_fetching())
    while want:
        todo = sorted(n for n in want if engine.members[n].state == "running")
        if not todo:
            return
        one_round(todo)
        # a type whose replay is done is finished, unless its spool still holds what no batch has offered
        want = {n for n in todo if engine.lanes[n].pending is not None
                or (n in spooled and not engine.lanes[n].exhausted)}


def queries_before_drain(running: list[tuple[Any, Any]], stops: StopSignals, *, quiet: bool = False,
                         timeout: float = PENDING_REPLAY_TIMEOUT_S) -> None:
    """With a streaming query per type: what the drain of the types of ``running`` (``(job, query or None)``)
    needs done before it closes any hour, the queries' own triggers reading the spools.

    The steps of the module docstring for every type with a fetcher: the settling waited out (the queries run on
    meanwhile), pulling stopped, then a wait (at most ``timeout`` seconds) until every active query has committed
    what its spool holds.  Whatever is left then, :func:`drain_job` refuses to drain over."""
    fetching = [(job, q) for job, q in running if job is not None and job.fetcher is not None]
    if not fetching:
        return
    _settle([(job.prepared.event_type.name, job.fetcher) for job, _ in fetching], stops, quiet=quiet,
            meanwhile=lambda left: stops.sleep(min(POLL_S, left)))
    for job, _ in fetching:
        job.fetcher.stop()  # no more pulls; every open segment closed

    def read() -> bool:
        return all(q is None or not q.isActive or spool_left(job.fetcher, job.prepared.ckpt.spark_dir) is None
                   for job, q in fetching)

    wait_for(read, stops, timeout=timeout)


def _settle(fetchers: list[tuple[str, Any]], stops: StopSignals, *, quiet: bool,
            meanwhile: Callable[[float], object]) -> None:
    """Wait until none of ``fetchers`` (``(type name, fetcher)``) settles any more, calling ``meanwhile(seconds
    left)`` until then; one line per type says how long.  Raises :class:`Escalated` on a second signal."""
    settling = [(name, f) for name, f in fetchers if f.settling()]
    if not settling:
        return
    if not quiet:
        for name, f in settling:
            say(f"[{name}] before the drain marks hours: waiting {max(0.0, f.settle_until - time.monotonic()):.0f} s "
                "for messages a killed run left leased to come back")
    while any(f.settling() for _, f in settling):
        if stops.escalation is not None:
            raise Escalated(stops.escalation)
        meanwhile(max(POLL_S, max(f.settle_until for _, f in settling) - time.monotonic()))


def drain_job(job: Any) -> list[Any]:
    """Drain one type (:meth:`~event_etl.job.controller.Controller.drain`), unless its source's spool still holds
    what no committed batch has read: then it raises, the hours stay open, and the next run reads the spool first.
    The one drain of the runner and the fleet, whichever engine ran the batches before it."""
    if job.fetcher is not None:
        left = spool_left(job.fetcher, job.prepared.ckpt.spark_dir)
        if left is not None:
            raise IntegrityError(
                f"cannot drain: the spool still holds {left} that no batch has read, acknowledged to Pub/Sub (the "
                "spool is their only copy); the hours stay open, or those messages would be late records of the next "
                "run", fix="run the same command again: it reads the spool before it closes any hour (then stop it "
                           "with SIGTERM, or run it with --once --drain)")
    return job.controller.drain()


def spool_left(fetcher: Any, spark_dir: str | os.PathLike[str]) -> str | None:
    """What the fetcher's spool holds that no committed batch has read, in words (None: nothing).

    Open segments (and fenced ones, being finished) count, and so does every segment whose place in the planner's
    log is not before the end offset of the type's last committed batch (``spark_dir``: its Spark offset and
    commit logs), or that the log does not name yet.  The segments are listed before the log is read: a segment
    whose log file is gone meanwhile was committed (the planner deletes a log file only after its segments)."""
    segdir = getattr(fetcher, "segdir", None)
    if segdir is None:
        return None
    segdir = Path(segdir)
    opened = [p.name for suffix in (OPEN_SUFFIX, FENCED_SUFFIX) for p in segdir.glob("*" + suffix)]
    closed = sorted(p.name for p in segdir.glob("*.seg"))
    place: dict[str, int] = {}
    for p in (segdir.parent / "log").glob("*.json"):
        if not p.stem.isdigit():
            continue
        try:
            names = json.loads(p.read_text())
        except FileNotFoundError:
            continue  # its segments were committed and deleted first
        place.update((name, int(p.stem) + i) for i, name in enumerate(names))
    log = SparkLog(spark_dir)
    last = log.latest_commit()
    end = log.end_offset(last) if last is not None else None
    read_up_to = int(end["seg"]) if end is not None and "seg" in end else -1
    unread = [n for n in closed if place.get(n, read_up_to) >= read_up_to and (segdir / n).exists()]
    if not opened and not unread:
        return None
    parts = []
    if unread:
        messages = sum(segment_count(n) for n in unread)
        parts.append(f"{len(unread)} segment{'s' if len(unread) != 1 else ''} ({messages:,} messages)")
    if opened:
        parts.append(f"{len(opened)} open segment{'s' if len(opened) != 1 else ''}")
    return " and ".join(parts)
