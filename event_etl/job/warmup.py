"""Building the JVM class archive of :mod:`event_etl.job.jvmarchive` (``event-etl warmup``): a small local job
in a process of its own whose JVM dumps its classes when it exits.  Apart from the archive's naming and use
(:mod:`~event_etl.job.jvmarchive`, which :mod:`~event_etl.job.session` reads when it starts a JVM), since
building it needs a session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from event_etl.job.jvmarchive import QUIET, archive_path, forget_unused

__all__ = ["build_archive"]


def build_archive(*, timeout: float = 600.0) -> Path:
    """Build the archive of this machine's ``java`` and Spark (in a process of its own); returns its path.

    Raises :class:`~event_etl.errors.EventEtlError` when the JVM wrote none."""
    from event_etl.errors import EventEtlError
    from event_etl.job.session import check_java

    java = check_java()
    final = archive_path(java)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    try:
        r = subprocess.run([sys.executable, "-m", "event_etl.job.warmup", str(tmp)], capture_output=True,
                           text=True, timeout=timeout, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
        if r.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
            raise EventEtlError(f"the JVM wrote no class archive to {tmp} (exit code {r.returncode}): {tail}",
                                fix="jobs run as before without it; check that Java 17+ and Spark start "
                                    "(event-etl run page_view --once), then run event-etl warmup again")
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    forget_unused(final.parent, keep=final)
    return final


def _dump(path: str) -> None:  # pragma: no cover - runs in the process build_archive starts
    """Start a local session whose JVM dumps its classes at exit into ``path``, run a job through a Python
    worker (the classes every job loads), stop it and wait for the JVM to finish writing."""
    from event_etl.job.session import check_java, driver_java_options, get_session, stop_session

    options = [*driver_java_options("local[1]", check_java(), archive=False), f"-XX:ArchiveClassesAtExit={path}",
               *QUIET]
    spark = get_session("local[1]", {"spark.driver.extraJavaOptions": " ".join(options)},
                        app_name="event_etl:warmup")
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).collect()
    stop_session(spark, timeout=600.0)


if __name__ == "__main__":  # pragma: no cover
    _dump(sys.argv[1])
