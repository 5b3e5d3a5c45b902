"""The phase API of a batch: what a batch's phases ask of the engine that runs them.

A batch (:meth:`event_etl.job.controller.Controller.batch_phases`) is a generator.  It yields :class:`Tasks` when it
needs executor tasks run and is sent their outputs; it yields :data:`MARKED` once its markers are written; it
returns its :class:`~event_etl.job.controller.BatchEvent`.  :func:`drive` runs one batch on its own (the tests,
:meth:`~event_etl.job.controller.Controller.finish_batch`); the shared engine (:mod:`event_etl.job.engine`) runs the
batches of every type of a round together, phase by phase: all their tasks in one Spark job, every marker before
any state.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeVar

from event_etl.task.executor import BatchContext

__all__ = ["Tasks", "MARKED", "Phases", "Outputs", "RunTasks", "drive"]

T = TypeVar("T")

Outputs = list[tuple[dict[str, Any], bytes]]
"""What a batch's tasks hand back: each split's report and its key rows (bytes of ``KEY_DTYPE`` rows)."""

RunTasks = Callable[[BatchContext, "set[int] | None"], Outputs]
"""What runs a batch's tasks: with ``ctx``, all of its splits (``None``) or those of the shards given."""


class Tasks(NamedTuple):
    """What a batch's phases ask their engine for: run the executor tasks of the batch's splits with ``ctx``, all of
    them (``shards`` None) or those of ``shards``; the batch is sent back their outputs, ``[(report, keys)]``."""

    ctx: BatchContext
    shards: set[int] | None


MARKED = "marked"
"""What a batch's phases yield once its markers are written (or it completes no hour); it is sent nothing back."""

Phases = Generator["Tasks | str", "Outputs | None", Any]
"""A batch's phases (:meth:`~event_etl.job.controller.Controller.batch_phases`)."""


def drive(phases: Generator[Any, Any, T], run_tasks: RunTasks | None) -> T:
    """Run a batch's phases to their end on their own: each :class:`Tasks` they ask for with ``run_tasks`` (whose
    error is raised inside them, where they asked), :data:`MARKED` passed by.  Returns what they return."""
    try:
        request = next(phases)
        while True:
            if isinstance(request, Tasks):
                assert run_tasks is not None, "these phases run no tasks"
                try:
                    outputs = run_tasks(request.ctx, request.shards)
                except BaseException as err:  # noqa: BLE001 - raised in the phases, where they asked
                    request = phases.throw(err)
                    continue
                request = phases.send(outputs)
            else:
                request = phases.send(None)
    except StopIteration as done:
        value: T = done.value
        return value
