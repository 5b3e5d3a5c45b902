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
"""

from __future__ import annotations

import signal

_signal = signal.signal
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _keep_ignored(signum, handler):
    """``signal.signal`` for the daemon's process and its forks: SIGINT, SIGTERM and SIGHUP stay ignored."""
    if signum in _IGNORED:
        handler = signal.SIG_IGN
    return _signal(signum, handler)


if __name__ == "__main__":  # pragma: no cover - started by Spark as `python -m event_etl.job.sparkdaemon`
    signal.signal = _keep_ignored
    for sig in _IGNORED:
        _signal(sig, signal.SIG_IGN)
    from pyspark.daemon import manager

    manager()
