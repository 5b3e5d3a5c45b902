"""The engine: 1..N event types through one micro-batch loop, one Spark job per trigger.

Every job runs here (``event-etl run TYPE``, a fleet: ``run T1 T2 ...``, ``--all``, ``submit``), driven by
:mod:`event_etl.job.driver`; a single type is a round of one.
There is no streaming query and no Python source process per type: every trigger interval
the driver asks each type's source session (:mod:`event_etl.sources.face`) what is new,
writes that type's offsets, and then runs **one** Spark job over the splits of every type
that has input.  Each type's controller then finishes its own batch (ledger, watermark,
markers, state), as if it ran alone.  Each type keeps everything of its own: checkpoint, batch numbers, watermark,
markers, dead-letter area, lease, metrics label and status.

**Offsets.**  A type's offsets and commits are kept in its ``spark/offsets`` and
``spark/commits``, in Spark's own format (:class:`SparkLog`), under the rule of Spark's
micro-batch engine: a batch's end offset is durable before its splits are planned, its
commit is written after the controller saved its state, and a batch with an offset and no
commit is replayed -- over the same range, under the same number -- when the type runs
next.  So a type moves between a run of its own (``event-etl run TYPE``) and a fleet, both
ways, and a checkpoint a streaming query wrote (``--engine queries``, removed in 0.4) goes on
where it stopped: nothing is read twice or skipped.

**Quarantine** (a fleet's; a single type's run ends with the error).  A type whose source or batch fails is
quarantined: its status says
``quarantined`` with the error, its unfinished batch stays pending, and the other types go
on.  It is tried again after a backoff (5 s, doubled up to 5 minutes:
:func:`event_etl.job.fleet.backoff_seconds`); its pending batch is replayed first, so once
the cause is fixed (the folder back, the sink writable again) nothing is lost.

**Stopping** follows :mod:`event_etl.job.stopping`, as for one type: SIGINT, SIGTERM and SIGHUP
stop after the round in flight (every type's batch in it finishes) and mark no hour the
watermark has not passed; a drain (SIGUSR1, ``event-etl drain``; SIGTERM and SIGHUP under
``--drain-on-stop``) then drains every type, each on its own, after :func:`rounds_before_drain`;
a second SIGINT or SIGTERM cancels the round's Spark jobs and stops at once (its batches are
replayed on the next run).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from event_etl.errors import EventEtlError
from event_etl.job.lane import Lane, Pending, SparkLog
from event_etl.job.member import FleetMember
from event_etl.job.phases import Phases, Tasks
from event_etl.job.stopping import POLL_S, Echo, Escalated, StopSignals, run_watched, say, signal_name
from event_etl.sources.face import Routing, SourceSession, Split

__all__ = ["SparkLog", "Lane", "Pending", "Engine", "Supervisor", "run_rounds", "rounds_before_drain", "round_summary",
           "FleetMember"]  # SparkLog, Lane, Pending: event_etl.job.lane; FleetMember: event_etl.job.member

Offset = Any
"""A source's offset, as its session makes it: JSON-able, read and written whole (None: none yet)."""

PLANNERS = 16  # types whose sources are asked for offsets at a time
HISTORY = 10_000  # rounds whose timings are kept for the summary (about 14 hours at a 5-s trigger)

# The SQL settings Spark records with every offset (OffsetSeqMetadata.relevantSQLConfs): a query of the
# type's own that takes over the log reads them back.
_RECORDED_CONFS = (
    "spark.sql.shuffle.partitions",
    "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.streaming.multipleWatermarkPolicy",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion",
    "spark.sql.streaming.aggregation.stateFormatVersion",
    "spark.sql.streaming.join.stateFormatVersion",
    "spark.sql.streaming.stateStore.compression.codec",
)


@contextmanager
def _failures_kept(controller: Any, rnd: Round, name: str) -> Iterator[None]:
    """A type's turn in the round (the controller held from its batch's begin to its commit); an error of the
    turn itself fails the type only."""
    try:
        with controller.turn():
            yield
    except BaseException as err:  # noqa: BLE001 - this type is quarantined; the others go on
        rnd.failed.setdefault(name, err)


def _task_error(batch: int, name: str, parts: tuple[str, str, str | None]) -> BaseException:
    from event_etl import errors

    cls_name, message, fix = parts
    cls = getattr(errors, cls_name, None)
    if isinstance(cls, type) and issubclass(cls, errors.EventEtlError) and cls is not errors.ConfigError:
        return cls(message, fix=fix)
    return EventEtlError(f"[{name}] a task of batch {batch} failed: {message}",
                         fix="see the executor's log; the batch is replayed when the type is tried again")


@dataclass
class Round:
    """One trigger's work: the batch each type with input runs (``{name: (batch, start, end, splits)}``)."""

    work: dict[str, tuple[int, Offset, Offset, list[Split]]] = field(default_factory=dict)
    failed: dict[str, BaseException] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    timings: dict[str, float] = field(default_factory=dict)  # seconds, by phase (ROUND_PHASES)


ROUND_PHASES = (
    ("plan", "planning"),  # asking every source what is new, offsets made durable
    ("begin", "batches starting"),  # each type's intent, up to its splits handed over
    ("job", "Spark job"),  # the one job over every type's splits
    ("end", "batches ending"),  # ledgers, watermarks, merges, markers, state, commits
)


class Engine:
    """Runs the batches of many types' controllers, one round per trigger (see the module docstring).

    ``members`` are :class:`FleetMember` s whose job (controller, metrics,
    printer) is open; ``lanes`` their sources, by name.  The fleet loop calls :meth:`run_round`
    once per trigger and :meth:`tick` between rounds."""

    def __init__(self, spark: Any, members: list[FleetMember], lanes: dict[str, Lane], *,
                 clock: Callable[[], int]) -> None:
        self.spark = spark
        self.members = {m.name: m for m in members}
        self.lanes = lanes
        self.clock = clock
        self.conf = self._recorded_conf(spark)
        self.parallelism = max(1, int(spark.sparkContext.defaultParallelism))
        self.rounds = 0
        self.history: deque[dict[str, float]] = deque(maxlen=HISTORY)  # the last rounds' timings
        self.group = f"event_etl-shared-{uuid.uuid4().hex[:8]}"
        self.pool = ThreadPoolExecutor(max_workers=PLANNERS, thread_name_prefix="event_etl-plan")

    @staticmethod
    def _recorded_conf(spark: Any) -> dict[str, str]:
        out = {}
        for key in _RECORDED_CONFS:
            try:
                value = spark.conf.get(key, None)
            except Exception:  # noqa: BLE001 - a key this Spark does not know: not recorded
                value = None
            if value is not None:
                out[key] = str(value)
        return out

    # -- a round ----------------------------------------------------------------------------
    def plan(self, names: list[str]) -> Round:
        """Ask each named type's source what to run now (a pending batch first); a source that fails fails
        its type only."""
        rnd = Round()
        t0 = time.monotonic()
        now = self.clock()

        def offer(name: str) -> None:
            lane = self.lanes[name]
            try:
                offered = lane.offer(now=now, conf=self.conf)
                if offered is not None:
                    batch, start, end = offered
                    rnd.work[name] = (batch, start, end, lane.session.splits(start, end))
            except Exception as err:  # noqa: BLE001 - this type is quarantined; the others go on
                rnd.failed[name] = err

        # listing folders and making offsets durable wait on the file system: many types at a time
        list(self.pool.map(offer, names))
        rnd.work = dict(sorted(rnd.work.items()))
        rnd.timings["plan"] = time.monotonic() - t0
        return rnd

    def run(self, rnd: Round) -> Round:
        """Run every batch of the round, phase by phase (:mod:`event_etl.job.phases`), all in this thread:

        1. **begin**: each type's batch writes its intent and asks for its tasks;
        2. **tasks**: one Spark job runs the tasks every batch asks for, and again while some ask for more (a
           first batch's or duplicates' rewrites: a few splits);
        3. **mark**: each batch records its ledgers, moves its watermark and writes its markers;
        4. **commit**: only once every batch's markers are out, each saves its state (the batch is done), then
           its after-commit work (merges, the source told what the batch read), and its lane commits.

        A type whose batch fails (at any phase) is recorded in ``rnd.failed`` and leaves the round; the others go
        on.  Each controller is held (:meth:`~event_etl.job.controller.Controller.turn`) from begin to commit."""
        if not rnd.work:
            return rnd
        t0 = time.monotonic()
        first_job, job_s = None, 0.0
        with ExitStack() as turns:
            batches = {}
            for name, (batch, _, _, _) in rnd.work.items():
                controller = self.members[name].opened.controller
                turns.enter_context(_failures_kept(controller, rnd, name))
                batches[name] = controller.batch_phases(batch)
            asks = self._advance(rnd, batches, dict.fromkeys(batches))  # 1. begin
            while tasks := {n: a for n, a in asks.items() if isinstance(a, Tasks)}:  # 2. tasks
                t = time.monotonic()
                first_job = t if first_job is None else first_job
                outputs = self._run_tasks(tasks, rnd)
                job_s += time.monotonic() - t
                asks.update(self._advance(rnd, batches, outputs))  # 3. mark: then each says MARKED
                asks = {n: a for n, a in asks.items() if n not in rnd.failed and n not in rnd.finished}
            for name, ask in self._advance(rnd, batches, dict.fromkeys(asks)).items():  # 4. commit
                rnd.failed[name] = AssertionError(f"[{name}] a batch asked for {ask!r} after its markers")
        for name in sorted(rnd.finished - set(rnd.failed)):
            self.lanes[name].committed()  # its state is saved: now its commit, then the source may let go
        begin = (first_job or time.monotonic()) - t0
        rnd.timings.update(begin=begin, job=job_s, end=time.monotonic() - t0 - begin - job_s)
        self.rounds += 1
        self.history.append(dict(rnd.timings))
        return rnd

    def _advance(self, rnd: Round, batches: dict[str, Phases], sent: dict[str, Any]) -> dict[str, Any]:
        """Send each named batch what it waits for (None, its tasks' outputs, or their error, raised where it
        asked) and run it to what it asks next; returns those asks.  A batch that ends is finished, one that
        fails leaves the round."""
        asks = {}
        for name, value in sent.items():
            phases = batches[name]
            try:
                if isinstance(value, BaseException):
                    asks[name] = phases.throw(value)
                else:
                    asks[name] = phases.send(value) if value is not None else next(phases)
            except StopIteration:
                rnd.finished.add(name)
            except BaseException as err:  # noqa: BLE001 - this type is quarantined; the others go on
                rnd.failed[name] = err
                self.members[name].opened.controller.failure = err
        return asks

    def _run_tasks(self, tasks: dict[str, Tasks], rnd: Round) -> dict[str, Any]:
        """One Spark job over the tasks the batches ask for: all of a batch's splits, or those of some shards."""
        work = {}
        for name, ask in tasks.items():
            splits = rnd.work[name][3]
            work[name] = (ask.ctx, splits if ask.shards is None else [s for s in splits if s.shard in ask.shards])
        try:
            return self._run_splits(work, rnd)
        except Exception as err:  # noqa: BLE001 - the job as a whole failed: every batch in it fails
            return dict.fromkeys(work, err)

    def _run_splits(self, work: dict[str, tuple[Any, list[Split]]], rnd: Round) -> dict[str, Any]:
        """One Spark job over the splits of ``work`` (``{name: (ctx, splits)}``): each type's
        ``[(report, keys)]``, or the error of a type one of whose splits failed."""
        from event_etl.task.executor import BUS_ROW, make_shared_task

        rows, buses = self._rows(work)
        out: dict[str, Any] = {name: [] for name in work}
        if not rows:
            return out
        sc = self.spark.sparkContext
        slices = _balance(rows, self.parallelism)
        sc.setJobGroup(self.group, f"event_etl shared round {self.rounds}: {len(work)} types, {len(rows)} splits",
                       interruptOnCancel=True)
        task = make_shared_task({name: ctx for name, (ctx, _) in work.items()},
                                {bus.id: bus.router for bus in buses.values()})
        got = sc.parallelize(slices, len(slices)).flatMap(lambda s: s).mapPartitions(task).collect()
        for name, _shard, report, keys, error in got:
            if name.startswith(BUS_ROW):  # what a bus's split held that no type claims, kept in its dead letters
                buses[name[len(BUS_ROW):].split("/", 1)[0]].note_unclaimed(int(json.loads(report)["unclaimed"]))
                continue
            if isinstance(out[name], BaseException):
                continue
            if error is not None:
                batch = rnd.work[name][0] if name in rnd.work else -1
                out[name] = _task_error(batch, name, error)
            else:
                out[name].append((json.loads(report), keys or b""))
        return out

    def _rows(self, work: dict[str, tuple[Any, list[Split]]]) -> tuple[list[SplitRow], dict[str, Routing]]:
        """The job's rows: each type's splits, except that a split of a bus that several of its types read in this
        round is one row for all of them (read once: :func:`event_etl.task.executor.bus_row`); and the buses."""
        from event_etl.task.executor import bus_row

        rows: list[SplitRow] = []
        buses: dict[str, Routing] = {}
        shared: dict[tuple[str, tuple[Any, ...]], list[str]] = {}
        for name, (_, splits) in work.items():
            bus = self.lanes[name].session.routing
            if bus is None:
                rows.extend((name, s.as_row()) for s in splits)
                continue
            buses[bus.id] = bus
            for s in splits:
                shared.setdefault((bus.id, s.as_row()), []).append(name)
        rows.extend((bus_row(bus_id, sorted(names)), row) for (bus_id, row), names in shared.items())
        return rows, buses

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def cancel(self) -> None:
        """Stop at once: cancel the round's Spark jobs (their batches are replayed on the next run)."""
        try:
            self.spark.sparkContext.cancelJobGroup(self.group)
        except Exception:  # noqa: BLE001 - the stop goes on regardless
            pass


SplitRow = tuple[str, tuple[Any, ...]]
"""A split of a round's job: its type's name and :meth:`Split.as_row`."""


def _balance(rows: list[SplitRow], parallelism: int) -> list[list[SplitRow]]:
    """Deal the splits into about ``2 x parallelism`` tasks of about equal size (largest first, each to the
    lightest task), so that a big type's splits spread over the cores and the small types' share tasks.
    A pure function of the rows: the same round plans the same tasks."""
    n = max(1, min(len(rows), 2 * parallelism))
    bins: list[list[SplitRow]] = [[] for _ in range(n)]
    load = [0] * n
    # a split row is (shard, kind, uri, start, end, arrival, meta): end - start is its size
    for row in sorted(rows, key=lambda r: (-(int(r[1][4]) - int(r[1][3])), r[0], r[1][0])):
        i = min(range(n), key=lambda k: (load[k], k))
        bins[i].append(row)
        load[i] += max(1, int(row[1][4]) - int(row[1][3]))
    return [b for b in bins if b]


class Supervisor(Protocol):
    """What runs the rounds (the driver), as :func:`run_rounds` sees it: told of each type that failed
    (``on_failure``) and, with ``--once``, of each whose input ended (``on_done``); asked to look after the types
    between rounds (``supervise``: ticks, backlog metrics, a quarantined type tried again)."""

    def on_failure(self, m: FleetMember, err: BaseException) -> None: ...

    def on_done(self, m: FleetMember) -> None: ...

    def supervise(self, engine: Engine) -> None: ...


def run_rounds(engine: Engine, members: list[FleetMember], options: Any, stops: StopSignals, *,
               trigger_ms: int, supervisor: Supervisor, deadline: float | None, stop_event: Any = None) -> str | None:
    """The job's loop: a round every trigger interval (at once again if one took longer), the ``supervisor``'s
    turn in between.  Returns what stopped it (a signal's name, ``time limit``) or None: input ended."""
    next_round = time.monotonic()
    next_tick = time.monotonic() + options.tick_seconds
    while True:
        stopped_by = _stop_reason(stops, deadline, stop_event)
        if stopped_by is not None:
            return stopped_by
        if not any(m.state in ("running", "quarantined") for m in members):
            return None
        now = time.monotonic()
        if now >= next_round:
            next_round = now + (0.0 if options.once else trigger_ms / 1000.0)  # --once: rounds back to back
            _round(engine, [m.name for m in members if m.state == "running"], stops, once=options.once,
                   on_failure=supervisor.on_failure, on_done=supervisor.on_done)
            continue
        if now >= next_tick:
            next_tick = now + options.tick_seconds
            supervisor.supervise(engine)
        stops.sleep(min(POLL_S, max(0.0, next_round - time.monotonic())))


def _stop_reason(stops: StopSignals, deadline: float | None, stop_event: Any) -> str | None:
    """What stops the loop now: a signal's name (a set ``stop_event`` counts as SIGINT), ``time limit``, or None."""
    if stop_event is not None and stop_event.is_set() and not stops.requested:
        stops.request(signal.SIGINT)
    if stops.first is not None:
        return signal_name(stops.first)
    if deadline is not None and time.monotonic() >= deadline:
        return "time limit"
    return None


def _round(engine: Engine, names: list[str], stops: StopSignals, *, once: bool,
           on_failure: Callable[[Any, BaseException], None], on_done: Callable[[Any], None]) -> None:
    """Plan and run one round of ``names``, watched (a second signal cancels its Spark jobs); report each type that
    failed, and (``--once``) each whose input has ended."""
    rnd = engine.plan(names)
    try:
        rnd = run_watched(lambda: engine.run(rnd), stops, name="event_etl-round")
    except Escalated:
        engine.cancel()
        raise
    for name, err in rnd.failed.items():
        on_failure(engine.members[name], err)
    if once:
        for name in names:
            lane, m = engine.lanes[name], engine.members[name]
            if m.state == "running" and lane.exhausted and lane.pending is None:
                on_done(m)


def rounds_before_drain(engine: Engine, members: list[FleetMember], stops: StopSignals, *,
                        on_failure: Callable[[Any, BaseException], None], quiet: bool = False,
                        echo: Echo = say) -> None:
    """What a drain needs done before it closes any hour (issue 47).

    Every running type's batch that a crash left unfinished runs first (it is replayed as planned).  A type whose
    source keeps acknowledged input in a spool (Pub/Sub with ``EVENT_ETL_PUBSUB_ACK=spooled``: the spool is then
    that input's only copy) also has all of it read before its hours close, or it would arrive as ``late-`` records
    in the next run: first the messages a killed run may have left leased are waited for (its source settles,
    still pulling: one line says how long), then pulling stops (the fetcher closes its open segments) and rounds run
    until the planner has offered, and the job committed, every segment the spool holds."""
    running = [m for m in members if m.state == "running"]
    spooled = [m for m in running if m.source.session.spooled]
    stop_pulling_for_drain([(m.name, m.source.session) for m in spooled], stops, quiet=quiet, echo=echo)
    want = {m.name for m in running if m.source.pending is not None} | {m.name for m in spooled}
    while want:
        names = [n for n in want if engine.members[n].state == "running"]
        if not names:
            return
        rnd = run_watched(_planned_and_run(engine, names), stops, name="event_etl-round")
        for name, err in rnd.failed.items():
            on_failure(engine.members[name], err)
        # a type whose replay is done is finished unless its spool still holds what no batch has read
        want = {n for n in names if engine.lanes[n].pending is not None
                or (n in {m.name for m in spooled} and not engine.lanes[n].exhausted)}


def _planned_and_run(engine: Engine, names: list[str]) -> Callable[[], Round]:
    return lambda: engine.run(engine.plan(names))


def stop_pulling_for_drain(sessions: list[tuple[str, SourceSession]], stops: StopSignals, *, quiet: bool = False,
                           echo: Echo = say) -> None:
    """Before a drain: wait until no source settles any more (what a killed run left leased has had its time to
    come back, and was pulled: one line per type says how long), then stop their pulling (their open segments
    closed, for the batches that follow to read).  ``sessions``: ``(type name, source session)``.

    The sessions settle side by side (the wait is the longest one's, not their sum), and their pulling stops in
    parallel: every session is asked first (:meth:`~event_etl.sources.face.SourceSession.stop_soon`), then each is
    waited for, many at a time, so that a fleet's drain begins after its slowest type's stop, not after all of them
    one after the other (a hundred types took ten minutes so)."""
    from event_etl.util.parallel import in_parallel

    settling = []
    for name, session in sessions:
        left = session.settling()
        if left > 0:
            settling.append(session)
            if not quiet:
                echo(f"[{name}] before the drain marks hours: waiting {left:.0f} s for messages a killed run left "
                     "leased to come back")
    if settling:
        run_watched(_all_settled(settling), stops, name="event_etl-settle")
    if len(sessions) > 1:
        for _name, session in sessions:
            session.stop_soon()
    in_parallel(lambda item: item[1].drained(), sessions, name="event_etl-drained")  # no more pulls; segments closed


def _all_settled(sessions: list[SourceSession]) -> Callable[[], None]:
    def settle() -> None:
        while any(session.settling() > 0 for session in sessions):
            time.sleep(0.1)

    return settle


def round_summary(history: Iterable[dict[str, float]]) -> str | None:
    """One line on where the rounds' time went (``history``: each round's :attr:`Round.timings`), or None."""
    import numpy as np

    rounds = [t for t in history if "job" in t]
    if not rounds:
        return None

    def p(values: list[float]) -> str:
        p50, p99 = np.percentile(values, [50, 99])
        return f"{p50:.2f}/{p99:.2f}"

    total = [sum(t.values()) for t in rounds]
    parts = ", ".join(f"{label} {p([t.get(key, 0.0) for t in rounds])}" for key, label in ROUND_PHASES)
    return (f"[fleet] {len(rounds)} rounds with input took {p(total)} s (p50/p99), max {max(total):.2f} s; "
            f"by phase (p50/p99 s): {parts}")

