"""The one face every kind of source shows the engine: :class:`Source` opens a type's :class:`SourceSession`.

The job layer (:mod:`event_etl.job`) uses a source through this face only.  A kind of source is registered in
:data:`event_etl.sources.registry.SOURCES` by the dotted name of its :class:`Source` class, imported when a job of
that kind opens (as fsspec's ``known_implementations`` name a file system's class: a kind's modules may need an
extra, Pub/Sub's client or Kafka's).  What a job needs before it opens its source (parsing a ``--source``, the
identity a checkpoint remembers, the check before Spark starts) stays in the registry's :class:`SourceKind`.

A session is one type's hold on its source for a run, with the few verbs the engine and the type's controller
need:

- **planning** (the engine's :class:`~event_etl.job.lane.Lane`, under Spark's micro-batch rule: an offset is
  durable before its batch runs): :meth:`~SourceSession.initial_offset`, :meth:`~SourceSession.offer` (the end
  of the next batch from a start, at most a cap; what it says of the source is kept for :meth:`activity`),
  :meth:`~SourceSession.splits` (the tasks' work), :meth:`~SourceSession.commit` (a batch's state is saved: the
  source may let go of what it read), :meth:`~SourceSession.latest` (the backlog metric);
- **the controller's hooks** (:class:`SourceHooks`, given to it once, when it is built):
  :meth:`~SourceSession.activity` (whether input waits, for the idle rule), :meth:`~SourceSession.acknowledge`
  (Pub/Sub: what a saved batch read is acknowledged), :meth:`~SourceSession.lost` (Kafka: what retention deleted
  unread);
- **draining and stopping**: :attr:`~SourceSession.spooled` (its input's only copy may be a spool a drain must
  read dry), :meth:`~SourceSession.settling`, :meth:`~SourceSession.drained` (no more pulling: what is spooled is
  all there is), :meth:`~SourceSession.oldest_spooled`, :meth:`~SourceSession.stop`.

The session holds what the kind needs (a planner; for Pub/Sub also the fetcher pulling into the spool) and no
module of :mod:`event_etl.job` reaches past it.  Two later steps lean on the face: an application of a thousand
types shares pullers, timers and leases between their sessions, and a bus gives several types' lanes one session
(:meth:`Source.open` is the one place that decides what a type's session shares).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from event_etl.rules.watermark import SourceActivity
from event_etl.sources.activity import observe
from event_etl.sources.splits import Split

__all__ = ["Offset", "Planner", "Routing", "SourceHooks", "Hooks", "OpenRequest", "SourceSession", "PlannedSession",
           "Source", "Spooled", "Split", "source_class"]

Offset = Any
"""A source's offset, as its planner makes it: JSON-able, read and written whole (None: none yet)."""


class Planner(Protocol):
    """What a kind's planner answers (:mod:`event_etl.sources.directory`, ``generate``, ``pubsub``, ``kafka``)."""

    def initial_offset(self) -> Offset: ...

    def prepare_available_now(self) -> None: ...

    def latest_offset(self, start: Offset, cap: int | None) -> Offset: ...

    def backlog(self, start: Offset) -> dict[str, int]: ...

    def splits(self, start: Offset, end: Offset) -> list[Split]: ...

    def commit(self, end: Offset) -> None: ...


class Routing(Protocol):
    """A bus as the engine sees it (:class:`event_etl.bus.session.Bus`): its id, its router (given to the tasks),
    and where it counts the messages no type claimed."""

    @property
    def id(self) -> str: ...

    @property
    def router(self) -> Any: ...

    def note_unclaimed(self, n: int) -> None: ...

    def listen(self, fn: Callable[[int], None]) -> None: ...


class SourceHooks(Protocol):
    """What a type's controller asks of its source (:class:`~event_etl.job.controller.Controller`)."""

    def activity(self) -> SourceActivity | None:
        """What the source last said of its backlog and health; None: nothing yet (batches alone tell)."""

    def acknowledge(self, keys: set[str]) -> bool | None:
        """A batch's state is saved: let go of what it read (``keys``: its inputs).  True when all of it was let
        go in time, False when redeliveries are to be expected; None: a source with nothing to acknowledge."""

    def lost(self, batch_id: int) -> dict[int, int]:
        """Input the source lost before batch ``batch_id`` could read it, by partition (empty for most kinds)."""


@dataclass
class Hooks:
    """:class:`SourceHooks` from plain functions, each optional (tests driving a controller by hand, and a
    controller whose source says nothing)."""

    on_activity: Callable[[], SourceActivity | None] | None = None
    on_acknowledge: Callable[[set[str]], bool] | None = None
    on_lost: Callable[[int], dict[int, int]] | None = None

    def activity(self) -> SourceActivity | None:
        return self.on_activity() if self.on_activity is not None else None

    def acknowledge(self, keys: set[str]) -> bool | None:
        return self.on_acknowledge(keys) if self.on_acknowledge is not None else None

    def lost(self, batch_id: int) -> dict[int, int]:
        return self.on_lost(batch_id) if self.on_lost is not None else {}


@dataclass(frozen=True)
class OpenRequest:
    """What opening one type's source needs (:meth:`Source.open`)."""

    event_type: str
    spec: dict[str, Any]
    """The source's spec: ``kind``, ``params``, ``log_dir`` (the checkpoint's folder for the source) and the limits
    the checkpoint fixed (``split_bytes``, ``tasks_per_batch``, ``split_plan``, ``max_files_per_batch``,
    ``max_events_per_batch``)."""
    clock: Callable[[], int]
    """The job's clock (ms since the epoch, UTC): what the source finds arrives at its time."""
    once: bool = False
    """``--once``: read what is there now, then end."""
    spark_dir: str | None = None
    """The type's Spark offset log (Kafka reads what a batch lost from it)."""
    spark: Any = None
    """The Spark session (Pub/Sub's fetch partitions pull on the executors)."""
    leased_at: float | None = None
    """Monotonic: when the job took its lease (a Pub/Sub restart settles from then)."""
    fence: dict[str, Any] | None = None
    """What executor tasks check before they write (fetch partitions pull under the job's lease)."""
    sink: str | None = None
    """The sink's URL (where the lease the fence names lives)."""
    fleet: bool = False
    """The type runs in a fleet: what its source runs beside the rounds is shared with the fleet's other types where
    the kind can (Pub/Sub: the fleet's pullers)."""


class SourceSession(ABC):
    """One type's hold on its source for a run (see the module docstring)."""

    spooled: bool = False
    """Whether a drain must first read what the source keeps in a spool (Pub/Sub)."""
    event_clock: bool = False

    def start(self) -> None:
        """Start what runs beside the rounds (a fetcher), once the engine's lane is open; nothing for most kinds."""
        return None

    # -- planning -----------------------------------------------------------------------------------------------
    @abstractmethod
    def initial_offset(self) -> Offset: ...

    @abstractmethod
    def prepare_available_now(self) -> None:
        """``--once``: what the source holds now is all a run reads."""

    @abstractmethod
    def offer(self, start: Offset, cap: int | None, *, now: int) -> Offset:
        """The end of the next batch from ``start`` (at most ``cap``; ``start`` itself when nothing is new), asked
        at ``now``; what it says of the source is kept (:meth:`activity`)."""

    @abstractmethod
    def splits(self, start: Offset, end: Offset) -> list[Split]: ...

    @abstractmethod
    def commit(self, end: Offset) -> None:
        """A batch ending at ``end`` is committed: the source may let go of what it read."""

    def latest(self) -> Offset | None:
        """The latest offset the source last reported (for the backlog metric), or None."""
        return None

    @property
    def routing(self) -> Routing | None:
        """A bus's view (:class:`event_etl.bus.session.BusView`): its bus, for the engine to read each split of the
        bus once for every type of it; None for a type that reads its source alone."""
        return None

    # -- the controller's hooks -----------------------------------------------------------------------------------
    @abstractmethod
    def activity(self) -> SourceActivity | None: ...

    def acknowledge(self, keys: set[str]) -> bool | None:
        return None

    def lost(self, batch_id: int) -> dict[int, int]:
        return {}

    # -- draining and stopping ----------------------------------------------------------------------------------
    def settling(self) -> float:
        """Seconds left until what a killed run left leased has had its time to come back (0: not settling)."""
        return 0.0

    def drained(self) -> None:
        """Before a drain: stop pulling (what the spool holds is all a drain reads); nothing for most kinds."""
        return None

    def oldest_spooled(self) -> int | None:
        """The oldest publish time (ms) of what the source's spool holds, or None (none, or no spool): how far back
        a seek must go to bring it all back, which the job writes into its lease for people."""
        return None

    def stop_soon(self) -> None:
        """Ask what runs beside the rounds to stop, without waiting (a fleet asks every session, then waits for each
        in :meth:`stop`: a thousand types stop in parallel); nothing for most kinds."""
        return None

    def summary_line(self, name: str) -> str | None:
        """A line on what the source did in this run, for the end of the job (None: nothing to say)."""
        return None

    def stop(self) -> None:
        """Stop the session: no more pulls; what was pulled and not saved comes again.  A second call does nothing."""
        return None


class PlannedSession(SourceSession):
    """A session over a planner alone (a folder, the generator, Kafka): the engine asks it at every round."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self._activity: SourceActivity | None = None
        self._stopped = False

    def initial_offset(self) -> Offset:
        return self.planner.initial_offset()

    def prepare_available_now(self) -> None:
        self.planner.prepare_available_now()

    def offer(self, start: Offset, cap: int | None, *, now: int) -> Offset:
        end = self.planner.latest_offset(start, cap)
        self._activity = self.observed(start, end, now)
        return end

    def observed(self, start: Offset, end: Offset, now: int) -> SourceActivity:
        """What an answer for offsets says of the source (whether input waits beyond ``end``, when it last
        delivered)."""
        before = self._activity.delivered_at if self._activity is not None else None
        return observe(self.planner, start, end, now=now, delivered_at=before)

    def splits(self, start: Offset, end: Offset) -> list[Split]:
        return self.planner.splits(start, end)

    def commit(self, end: Offset) -> None:
        self.planner.commit(end)

    def latest(self) -> Offset | None:
        report: Callable[[], Offset | None] | None = getattr(self.planner, "reported_latest", None)
        return report() if report is not None else None

    def activity(self) -> SourceActivity | None:
        return self._activity

    def stop(self) -> None:
        """Stop the planner (Kafka: its consumer); once (a fleet's stop and the job's close both ask)."""
        if self._stopped:
            return
        self._stopped = True
        stop: Callable[[], None] | None = getattr(self.planner, "stop", None)
        if stop is not None:
            stop()


@dataclass(frozen=True)
class Spooled:
    """What the spool of a job that is not running holds, as far as a seek needs it (``event-etl status``)."""

    oldest_ms: int | None
    """The oldest publish time (ms) of what it holds; None: it holds nothing."""


class Source(ABC):
    """A kind of source's behaviour, imported when a job of that kind opens (see the module docstring)."""

    @classmethod
    @abstractmethod
    def open(cls, request: OpenRequest) -> SourceSession:
        """One type's session (its fetcher, if it has one, pulling already)."""

    @classmethod
    def check(cls, params: dict[str, Any]) -> None:
        """What must hold before the job starts (raises with the fix); nothing for most kinds."""
        return None

    @classmethod
    def warning(cls, event_type: str, params: dict[str, Any], log_dir: str) -> str | None:
        """A line to print when the job starts, or None."""
        return None

    @classmethod
    def spooled_at(cls, log_dir: str) -> Spooled | None:
        """What the spool in a checkpoint's folder for the kind (``log_dir``) holds, read only (no job need run);
        None: the kind keeps no spool, or this checkpoint holds none."""
        return None


@dataclass
class _Loaded:
    classes: dict[str, type[Source]] = field(default_factory=dict)


_LOADED = _Loaded()


def source_class(path: str) -> type[Source]:
    """The :class:`Source` class a kind registers by its dotted name (``module:Class``), imported once."""
    cls = _LOADED.classes.get(path)
    if cls is None:
        module, _, name = path.partition(":")
        found = getattr(importlib.import_module(module), name)
        if not (isinstance(found, type) and issubclass(found, Source)):
            raise TypeError(f"{path} is not a Source")
        cls = _LOADED.classes[path] = found
    return cls
