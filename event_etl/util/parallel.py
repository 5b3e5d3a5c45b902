"""Doing one thing to many items at once, for the steps of a run that wait on I/O for every type (stopping a
thousand types' fetchers, releasing their leases): done one after the other, they would add up to minutes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["in_parallel", "MAX_WORKERS"]

T = TypeVar("T")

MAX_WORKERS = 64
"""Items handled at once at most: what each waits on is a file system, a sink or a thread's end, not a core."""


def in_parallel(fn: Callable[[T], object], items: Iterable[T], *, name: str, workers: int = MAX_WORKERS) -> None:
    """Call ``fn`` on every item, up to ``workers`` at a time, and return once all are done.  Every item is tried
    even when some fail; the first failure (in the items' order) is raised at the end.  One item: called here, in
    this thread."""
    todo = list(items)
    if len(todo) <= 1:
        for item in todo:
            fn(item)
        return
    errors: list[BaseException | None] = [None] * len(todo)

    def call(i: int) -> None:
        try:
            fn(todo[i])
        except BaseException as err:  # noqa: BLE001 - kept and raised once every item was tried
            errors[i] = err

    with ThreadPoolExecutor(max_workers=min(workers, len(todo)), thread_name_prefix=name) as pool:
        list(pool.map(call, range(len(todo))))
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
