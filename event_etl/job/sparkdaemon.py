"""PySpark's worker daemon for local jobs, deaf to SIGINT, SIGTERM and SIGHUP (``spark.python.daemon.module``).

systemd's default ``KillMode=control-group`` sends SIGTERM to every process of a unit:
the job's driver, which then stops and drains (:mod:`event_etl.job.stopping`), its JVM, which
ignores it (:mod:`event_etl.job.session`), and PySpark's daemon and workers, which would die
on it (``pyspark.daemon`` installs its own SIGTERM handler and resets it in every worker it
forks) and fail the batch in flight.  This entry runs ``pyspark.daemon`` unchanged except
that SIGINT, SIGTERM and SIGHUP stay ignored, as the JVM left them.  Spark does not need them: it
stops the daemon by closing its stdin and a worker with SIGKILL (through the daemon), and a
worker ends when its socket to the JVM closes.  Used for local masters only, where the
workers are the job's own processes (:func:`event_etl.job.session.get_session`).

It also imports, once, what every worker would import again after each fork: PySpark's
worker, event_etl's task and source modules and pyarrow (with numpy; about a third of a second of
CPU per worker, which the job's profile showed as most of its workers' busy time).  PySpark
itself imports worker modules only after the fork, because a module that starts a thread
at import must not be imported before a fork; so this imports only modules that start none
(numpy's OpenBLAS is kept to one thread, i.e. none of its own, and pyarrow's jemalloc starts no
background thread: the workers allocate Arrow buffers with the system allocator), and checks
that the daemon still has a single thread before it forks anything: if not, it says so on
stderr and the workers are still correct, since nothing that runs them was shared.

And it imports PySpark from the installed package rather than from the ``pyspark.zip`` that Spark
puts first on a worker's ``PYTHONPATH``: modules in a zip have no cached bytecode, so every daemon
compiled PySpark's sources again (~0.7 s of CPU at the start of a job's first batch, before any
task could start).  Only when that zip is the one inside the installed package (``pip install
pyspark``: the same release, byte for byte); the zips stay on the path, behind it.

Last, it moves everything it has loaded into the garbage collector's permanent generation
(``gc.freeze()``, as Python's documentation advises before forking): PySpark's worker runs a full
``gc.collect()`` after every task, which otherwise walked every object of those modules in each
worker (~30 ms of CPU a task, for tasks that may take less) and wrote to their pages, so that
copy-on-write gave each worker its own copy of them.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

_signal = signal.signal
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _keep_ignored(signalnum: int | signal.Signals, handler: _Handler) -> _Handler:
    """``signal.signal`` for the daemon's process and its forks: SIGINT, SIGTERM and SIGHUP stay ignored."""
    if signalnum in _IGNORED:
        handler = signal.SIG_IGN
    return _signal(signalnum, handler)


WARM_MODULES = ("pyspark.worker", "event_etl.task.executor", "pyarrow", "pyarrow.compute", "pyarrow.json",
                "event_etl.task.dedupe", "event_etl.storage", "fsspec", "fsspec.implementations.local")
"""Imported by the daemon before it forks workers: none of them starts a thread at import."""


def installed_first(path: list[str], package_dir: str | None) -> list[str]:
    """``path`` (``sys.path``) with the zips of ``<package_dir>/python/lib`` (``pyspark.zip``, ``py4j-*.zip``)
    moved to its end, where ``package_dir`` is the installed ``pyspark`` package, found elsewhere on ``path``.

    Unchanged when PySpark is found only in a zip, or when the zips are another Spark's
    (``SPARK_HOME`` elsewhere): their PySpark may be another release than the installed one."""
    if package_dir is None:
        return list(path)
    lib = os.path.realpath(os.path.join(package_dir, "python", "lib"))

    def bundled(entry: str) -> bool:
        return entry.endswith(".zip") and os.path.dirname(os.path.realpath(entry)) == lib

    return [p for p in path if not bundled(p)] + [p for p in path if bundled(p)]


def installed_pyspark(path: list[str]) -> str | None:
    """The folder of the ``pyspark`` package found on ``path`` outside any zip, or None."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("pyspark", [p for p in path if not p.endswith(".zip")])
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def ready(rows: Iterable[Any]) -> Iterator[int]:
    """A task that does nothing: run once per core when a local job starts (:mod:`event_etl.job.session`),
    so that Spark starts this daemon and forks the workers before the first batch needs them."""
    return iter([os.getpid()])


def threads() -> int:
    """The threads of this process, native ones included (Linux; 1 where that cannot be told)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def warm(modules: Iterable[str] = WARM_MODULES) -> list[str]:
    """Import ``modules`` in the daemon, so that forked workers find them loaded; returns those imported.

    Stops at the first module after which the process has more than one thread (it is kept, since it
    cannot be unloaded, and reported on stderr): a fork must not copy a thread's locks."""
    import importlib
    import sys

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS starts no threads of its own
    # pyarrow's bundled jemalloc starts a background thread when pyarrow is loaded; the workers' Arrow
    # buffers come from the system allocator (ARROW_DEFAULT_MEMORY_POOL=system), so it has nothing to do
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    done = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a worker imports it again itself, and fails there with the cause
            print(f"event_etl daemon: could not import {name} before forking: {err}", file=sys.stderr)
            continue
        if threads() > 1:
            print(f"event_etl daemon: importing {name} started a thread; importing nothing more before forking",
                  file=sys.stderr)
            break
        done.append(name)
    return done


if __name__ == "__main__":  # pragma: no cover - started by Spark as `python -m event_etl.job.sparkdaemon`
    signal.signal = _keep_ignored
    for sig in _IGNORED:
        _signal(sig, signal.SIG_IGN)
    import sys

    sys.path[:] = installed_first(sys.path, installed_pyspark(sys.path))
    warm()
    gc.freeze()  # see the module docstring
    from pyspark.daemon import manager

    manager()
