"""One source session shared by the types of a bus; each type's lane reads it through a :class:`BusView`.

The bus opens its source once (a Pub/Sub subscription's spool and puller, a Kafka topic's planner) in a folder of
its own (``<checkpoint root>/_bus/<bus id>``).  Each type keeps its own offset and commit logs, in the bus's offsets,
and its own batches; what the engine asks a type's view it answers from the one session:

- **offer**: once per round for every type that is caught up (they share the batch's end, hence its splits, and
  the engine's job reads each split once for all of them: :mod:`event_etl.bus.task`); a type behind the bus (its
  batch replayed after a quarantine, or a run that stopped between two types' commits) catches up to where the bus
  is, without asking the source for more;
- **commit**: the source lets go (Pub/Sub deletes spooled segments, Kafka's group offsets move) only up to what
  **every** type of the bus has committed: a quarantined type's messages stay in the spool (Kafka: uncommitted)
  until it comes back, bounded by the spool's room (Kafka: the topic's retention);
- **activity**: the bus's, for every type: a type that receives nothing while the bus is busy still closes its
  hours by its idle rule once the bus is caught up (docs/design.md);
- **stop**: the session stops once the last view stopped.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from event_etl.rules.routing import BusPlan, Namer, Router
from event_etl.rules.watermark import SourceActivity
from event_etl.sources.face import Offset, SourceSession, Split

__all__ = ["Bus", "BusHub", "BusView", "behind", "earliest", "BUS_STATE_FORMAT"]

BUS_STATE_FORMAT = 1
"""The format of a bus's ``bus.json`` (``released``: the offset the source was last told it may let go of)."""


def _kind(offset: Offset) -> str:
    if isinstance(offset, dict) and "topics" in offset:
        return "pattern"  # kafka:re:PATTERN: a Kafka offset per topic
    return "kafka" if isinstance(offset, dict) and "partitions" in offset else "pubsub"


def _partitions(offset: Offset) -> dict[str, int]:
    return {str(p): int(n) for p, n in offset.get("partitions", {}).items()}


def _spool_position(offset: Offset) -> tuple[int, int]:
    return int(offset.get("spool", 0)), int(offset.get("seg", 0))


def behind(a: Offset, b: Offset) -> bool:
    """Whether offset ``a`` lies before ``b`` (pure): Pub/Sub's spool positions compared; a Kafka offset is behind
    when it is not the same and no partition of it is ahead of ``b``'s."""
    if a is None or b is None or a == b:
        return False
    if _kind(a) == "pattern":
        ta, tb = a["topics"], b.get("topics", {})
        return set(ta) <= set(tb) and all(ta[t] == tb[t] or behind(ta[t], tb[t]) for t in ta)
    if _kind(a) == "kafka":
        pa, pb = _partitions(a), _partitions(b)
        return pa != pb and all(n <= pb.get(p, n) for p, n in pa.items()) and set(pa) <= set(pb)
    return _spool_position(a) < _spool_position(b)


def earliest(offsets: list[Offset]) -> Offset:
    """The offset every one of ``offsets`` has passed (pure): the least spool position; for Kafka, each partition at
    its least offset, a partition some offset does not know left out (nothing of it is committed)."""
    if _kind(offsets[0]) == "pattern":
        common = set.intersection(*(set(o["topics"]) for o in offsets))
        return {**offsets[0], "topics": {t: earliest([o["topics"][t] for o in offsets]) for t in sorted(common)}}
    if _kind(offsets[0]) == "kafka":
        parts = [_partitions(o) for o in offsets]
        common = set.intersection(*(set(p) for p in parts))
        out = dict(offsets[0])
        out.pop("begin", None)
        out.pop("lost", None)
        out["partitions"] = {p: min(pp[p] for pp in parts) for p in sorted(common, key=int)}
        return out
    return min(offsets, key=_spool_position)


class Bus:
    """The shared session of one bus and what its types' views have offered and committed (thread-safe: the engine
    plans many types at a time)."""

    def __init__(self, plan: BusPlan, session: SourceSession, state_file: str | None = None,
                 namer: Namer | None = None) -> None:
        self.plan = plan
        self.session = session
        self.state_file = state_file
        """``<bus folder>/bus.json``: what the source was last told it may let go of (``released``), where a type new
        to the bus starts (see :meth:`initial_offset`)."""
        self.router: Router = plan.router().with_namer(namer)  # namer: a framed payload's record (bus.records)
        self._lock = threading.Lock()
        self._round: int | None = None  # the ``now`` of the round being planned
        self._offered: dict[str, Offset] = {}  # this round: the end offered from each start (by its JSON)
        self.frontier: Offset = None  # the furthest end offered in this run
        self._splits: dict[tuple[str, str], list[Split]] = {}
        self.committed: dict[str, Offset] = {}  # each type's last commit (or where it began)
        self._released: Offset = None  # what the source was last told it may let go of
        self._views: set[str] = set()
        self.closed = False  # its last view stopped, and with it the session
        self._started = False
        self._prepared = False
        self.unclaimed = 0  # messages no type claimed, kept in the bus's dead letters (this run)
        self.listeners: list[Callable[[int], None]] = []

    @property
    def id(self) -> str:
        return self.plan.id

    def view(self, name: str) -> BusView:
        with self._lock:
            self._views.add(name)
        return BusView(self, name)

    # -- planning ---------------------------------------------------------------------------------------------
    def initial_offset(self, name: str) -> Offset:
        """A type new to the bus starts where the bus is (its first hour is its first event's, as max_backfill
        rules): the furthest of what this run offered, what the other types committed, and what the source was told
        it may let go of (kept in the bus's folder: what lies before it is gone); the first type of a new bus at the
        source's beginning."""
        with self._lock:
            start = self.frontier
            if start is None:
                known = [*self.committed.values(), *([] if (r := self._saved_release()) is None else [r])]
                start = _latest(known) if known else self.session.initial_offset()
            self.committed.setdefault(name, start)
            return start

    def _saved_release(self) -> Offset:
        if self.state_file is None:
            return None
        try:
            with open(self.state_file, encoding="utf-8") as fh:
                return json.load(fh).get("released")
        except FileNotFoundError:
            return None

    def _save_release(self, release: Offset) -> None:
        """Before the source lets go: a type new to the bus must never start before it."""
        if self.state_file is None:
            return
        from event_etl.storage.atomic import write_json_atomic

        path = Path(self.state_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"format": BUS_STATE_FORMAT, "bus": self.plan.id, "released": release})

    def prepare_available_now(self) -> None:
        with self._lock:
            if not self._prepared:
                self._prepared = True
                self.session.prepare_available_now()

    def offer(self, start: Offset, cap: int | None, *, now: int) -> Offset:
        with self._lock:
            if self._round != now:
                self._round, self._offered = now, {}
            if self.frontier is not None and behind(start, self.frontier):
                return self.frontier  # catch up to the bus, reading nothing new from the source
            key = json.dumps(start, sort_keys=True)
            if key not in self._offered:
                # each type's batch is bounded by ``cap``: a round of the bus reads up to that for each of its types
                # (ten types at 500,000 read 5,000,000 records in a round, as ten topics of their own would); the
                # tasks still read it in splits of the source's size (Kafka: 125,000 records)
                end = self.session.offer(start, None if cap is None else cap * len(self.plan.names), now=now)
                self._offered[key] = end
                if self.frontier is None or behind(self.frontier, end):
                    self.frontier = end
            end = self._offered[key]
            return end

    def splits(self, start: Offset, end: Offset) -> list[Split]:
        """The same splits for every type asking for the same range (the engine reads them once for all)."""
        key = (json.dumps(start, sort_keys=True), json.dumps(end, sort_keys=True))
        with self._lock:
            if key not in self._splits:
                if len(self._splits) > 64:  # older rounds' ranges: no type asks for them again
                    self._splits.clear()
                self._splits[key] = self.session.splits(start, end)
            return self._splits[key]

    def commit(self, name: str, end: Offset) -> None:
        """``name`` committed a batch ending at ``end``: the source lets go of what every type has committed."""
        with self._lock:
            self.committed[name] = end
            if set(self.plan.names) - set(self.committed):
                return  # a type has not said where it stands yet: nothing is let go
            release = earliest([self.committed[n] for n in self.plan.names])
            if release == self._released:
                return
            self._released = release
            self._save_release(release)
        self.session.commit(release)

    # -- running and stopping ---------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        self.session.start()

    def stopped(self, name: str) -> None:
        """``name``'s view stopped; the last one stops the session."""
        with self._lock:
            self._views.discard(name)
            last = not self._views and not self.closed
            self.closed = self.closed or last
        if last:
            self.session.stop()

    def note_unclaimed(self, n: int) -> None:
        with self._lock:
            self.unclaimed += n
            listeners = list(self.listeners)
        for listen in listeners:
            listen(n)

    def listen(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(n)`` with each count of unclaimed messages (the first type's metrics), once with 0 now."""
        with self._lock:
            self.listeners = [fn]  # one counter for the bus: a type reopened replaces its old one
        fn(0)


def _latest(offsets: list[Offset]) -> Offset:
    out = offsets[0]
    for o in offsets[1:]:
        if behind(out, o):
            out = o
    return out


class BusView(SourceSession):
    """One type's session on a bus (see the module docstring): its verbs answered by the :class:`Bus`."""

    def __init__(self, bus: Bus, name: str) -> None:
        self.bus = bus
        self.name = name
        self.spooled = bus.session.spooled
        self.event_clock = bus.session.event_clock
        self._stopped = False

    @property
    def routing(self) -> Bus:
        return self.bus

    def start(self) -> None:
        self.bus.start()

    def initial_offset(self) -> Offset:
        return self.bus.initial_offset(self.name)

    def prepare_available_now(self) -> None:
        self.bus.prepare_available_now()

    def offer(self, start: Offset, cap: int | None, *, now: int) -> Offset:
        return self.bus.offer(start, cap, now=now)

    def splits(self, start: Offset, end: Offset) -> list[Split]:
        return self.bus.splits(start, end)

    def commit(self, end: Offset) -> None:
        self.bus.commit(self.name, end)

    def latest(self) -> Offset | None:
        return self.bus.session.latest()

    def activity(self) -> SourceActivity | None:
        """The bus's report without when it last delivered: the bus delivers to its busy types, and a type that
        gets nothing is quiet once the bus is caught up (no backlog, no outage) and its own last records are
        ``idle_timeout`` old (:func:`event_etl.rules.watermark.quiet_since`)."""
        activity = self.bus.session.activity()
        return replace(activity, delivered_at=None) if activity is not None else None

    def acknowledge(self, keys: set[str]) -> bool | None:
        """Pub/Sub with ``EVENT_ETL_PUBSUB_ACK=committed``: what a type's saved batch read is acknowledged; its
        segments stay in the bus's spool until every type committed them."""
        return self.bus.session.acknowledge(keys)

    def lost(self, batch_id: int) -> dict[int, int]:
        return {}  # what retention deleted unread is the bus's: said once, by the bus's own line

    def settling(self) -> float:
        return self.bus.session.settling()

    def drained(self) -> None:
        self.bus.session.drained()

    def oldest_spooled(self) -> int | None:
        return self.bus.session.oldest_spooled()

    def stop_soon(self) -> None:
        self.bus.session.stop_soon()

    def summary_line(self, name: str) -> str | None:
        if name != self.bus.plan.names[0]:
            return None  # the bus's line, once
        line = self.bus.session.summary_line(f"bus {self.bus.id}")
        extra = f"[bus {self.bus.id}] {self.bus.unclaimed} unclaimed message(s) kept as dead letters"
        return f"{line}\n{extra}" if line else extra

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.bus.stopped(self.name)



class BusHub:
    """An application's buses (:func:`~event_etl.rules.routing.plan_buses`), each opened when its first type opens
    and again after its last type closed (a quarantined type of a bus of one, reopened)."""

    def __init__(self, plans: list[BusPlan], root: str, namers: Mapping[str, Namer] | None = None) -> None:
        self.root = os.path.abspath(root)  # recorded in the types' checkpoints: the same however it was given
        self.plans = {name: plan for plan in plans for name in plan.names}
        self.namers = dict(namers or {})  # bus id -> what names a framed payload's record (a bus by field)
        self.buses: dict[str, Bus] = {}
        self._lock = threading.Lock()

    def plan_of(self, name: str) -> BusPlan | None:
        return self.plans.get(name)

    def folder(self, plan: BusPlan, kind: str) -> str:
        """Where a bus keeps its source's state (Pub/Sub's spool): ``<root>/_bus/<bus id>/<kind>``, beside its
        types' checkpoints."""
        return os.path.join(self.root, "_bus", plan.id, kind)

    def view(self, name: str, opener: Callable[[], SourceSession]) -> BusView:
        """``name``'s view of its bus, the bus's session opened by ``opener`` if it is not open."""
        plan = self.plans[name]
        with self._lock:
            bus = self.buses.get(plan.id)
            if bus is None or bus.closed:
                state = os.path.join(self.root, "_bus", plan.id, "bus.json")
                bus = self.buses[plan.id] = Bus(plan, opener(), state, self.namers.get(plan.id))
            return bus.view(name)
