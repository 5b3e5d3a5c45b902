"""What every step of one event type's job works with: :class:`TypeContext`.

The :class:`~event_etl.job.controller.Controller` builds it once (its ``ctx``) and hands it to each of its steps,
:class:`~event_etl.job.markers.MarkerWriter`, :class:`~event_etl.job.rewrites.Rewriter`,
:class:`~event_etl.job.rewrites.Duplicates` and :class:`~event_etl.job.merges.Merger`, and to the type's
:class:`~event_etl.job.policies.PolicyChain`, instead of the same arguments to each.  Not to be confused with a
batch's :class:`~event_etl.task.executor.BatchContext` (what its executor tasks are handed): this one is the same
for every batch of the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from event_etl.eventtypes import EventType
from event_etl.job.checkpoint import Checkpoint
from event_etl.storage import Storage

__all__ = ["TypeContext", "Writer"]


def _nothing(*_args: Any) -> None:
    return None


@dataclass(frozen=True)
class TypeContext:
    """One event type's job as its steps see it: the type, the sink it writes, its checkpoint, the writer's name
    (in the files it names), its clock (ms since the epoch), and two callbacks.

    ``guard`` raises if the job may no longer write (it lost its lease): every step calls it before a write.
    ``emit(kind, payload)`` tells the job's listeners (progress lines, metrics) what a step did.  The controller
    hands in its own ``_guard`` and ``_emit``, which read the guard and the listeners a job sets after
    construction."""

    event_type: EventType
    storage: Storage
    checkpoint: Checkpoint
    clock: Callable[[], int]
    writer: str = ""
    guard: Callable[[], None] = _nothing
    emit: Callable[[str, Any], None] = _nothing


@dataclass(frozen=True)
class Writer:
    """One type's job as a writer of its sink, as its :class:`~event_etl.job.controller.Controller` is given it:
    ``name`` (the writer bound in the checkpoint, in the name of every file the job writes), ``guard`` (raises once
    the job may no longer write, having lost its lease: called before every write) and ``fence`` (what the job's
    executor tasks check before they write, see :class:`event_etl.storage.lease.Fence`).  The last two are the
    lease's (:meth:`~event_etl.storage.lease.Lease.guard`, :meth:`~event_etl.storage.lease.Lease.fence`); a job
    without a lease (tests) has neither."""

    name: str = ""
    guard: Callable[[], None] | None = None
    fence: dict[str, Any] | None = None
