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
"""

from __future__ import annotations

import os
import signal

_signal = signal.signal
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _keep_ignored(signum, handler):
    """``signal.signal`` for the daemon's process and its forks: SIGINT, SIGTERM and SIGHUP stay ignored."""
    if signum in _IGNORED:
        handler = signal.SIG_IGN
    return _signal(signum, handler)


WARM_MODULES = ("pyspark.worker", "event_etl.task.executor", "event_etl.sources.spark", "pyarrow", "pyarrow.compute",
                "pyarrow.json")
"""Imported by the daemon before it forks workers: none of them starts a thread at import."""


def threads() -> int:
    """The threads of this process, native ones included (Linux; 1 where that cannot be told)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def warm(modules=WARM_MODULES) -> list[str]:
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
    warm()
    from pyspark.daemon import manager

    manager()
