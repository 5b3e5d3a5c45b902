"""A class-data-sharing archive of the driver JVM's classes (AppCDS), so a job's JVM starts sooner.

A local job's JVM spends most of its ~4 s start loading and verifying Spark's classes (the
SparkContext alone loads thousands).  Java 17 can dump the classes a run loaded into an
archive (``-XX:ArchiveClassesAtExit``) and map them at the next start
(``-XX:SharedArchiveFile``): on a 2-core machine that start then takes ~2.5 s instead of ~5 s.

``event-etl warmup`` (also run once by ``bin/``'s first-use install) builds the archive
(:func:`event_etl.job.warmup.build_archive`) for this
machine's Java and Spark: it starts a small local job in a process of its own whose JVM dumps
its classes when it exits, into a temporary file renamed into place only once complete, so a
job never maps a half-written archive (two builds at once each write their own).  The file is
named after what it was made from (the ``java`` binary, the Spark jars, this module's
:data:`ARCHIVE_VERSION`), so an upgrade of either makes a new one instead of using a stale one.
:func:`jvm_options` gives a job the options that use it when it exists.  The JVM checks the
archive itself as well (its own version, the class path) and starts without it, as before,
when it does not match (its messages about that are turned off: the job still runs).

The archive is ~120 MB under ``$EVENT_ETL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/event_etl``,
else ``~/.cache/event_etl``), one per install of Java and Spark (two virtual environments have
two); a build deletes those unused for :data:`UNUSED_DAYS`.  Deleting any is always safe.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = ["ARCHIVE_VERSION", "cache_dir", "archive_path", "jvm_options", "forget_unused"]

ARCHIVE_VERSION = 1
"""Raised when what the archive must hold changes: an older archive is then left unused."""

QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
"""The JVM's messages about an archive it cannot use, or classes it does not archive: not a user's concern."""


def cache_dir() -> Path:
    """Where event_etl keeps what it builds for this machine (``$EVENT_ETL_CACHE_DIR``, else the XDG cache)."""
    from event_etl.settings import current_settings

    own = current_settings().cache_dir
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "event_etl"


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def archive_key(java: str) -> str:
    """What an archive is valid for: the ``java`` binary (its real path, size and time) and Spark's jars."""
    import pyspark

    h = hashlib.sha256(f"v{ARCHIVE_VERSION}\n{pyspark.__version__}\n".encode())
    real = os.path.realpath(java)
    st = os.stat(real)
    h.update(f"{real}\n{st.st_size}\n{int(st.st_mtime)}\n".encode())
    jars = _spark_jars()
    h.update(f"{jars}\n".encode())
    for name in sorted(os.listdir(jars)) if jars.is_dir() else []:
        h.update(f"{name}\n".encode())
    return h.hexdigest()[:16]


def archive_path(java: str) -> Path:
    """The archive of this ``java`` and Spark (it may not exist yet)."""
    return cache_dir() / "jvm" / f"spark-{archive_key(java)}.jsa"


def jvm_options(java: str) -> list[str]:
    """Driver JVM options that map the archive, if it was built for this ``java`` and Spark; else none."""
    try:
        path = archive_path(java)
        if path.is_file() and path.stat().st_size > 0:
            return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *QUIET]
    except OSError:
        pass
    return []


UNUSED_DAYS = 30
"""An archive neither built nor mapped for this long is deleted by the next build (another install's stays)."""


def forget_unused(folder: Path, *, keep: Path, now: float | None = None) -> list[Path]:
    """Delete the archives of ``folder`` not built or mapped (mapping a file updates its access time) for
    :data:`UNUSED_DAYS` (made for a Java or Spark no longer here), and the temporary files of builds killed
    a day ago or more.  Returns those deleted."""
    import time

    now = time.time() if now is None else now
    gone = []
    for old in [*folder.glob("spark-*.jsa"), *folder.glob(".spark-*.tmp")]:
        try:
            st = old.stat()
        except OSError:
            continue
        # a temporary file a day old: its build was killed (its JVM finished writing long ago, or never will)
        limit = 86400 if old.suffix == ".tmp" else UNUSED_DAYS * 86400
        if old != keep and now - max(st.st_atime, st.st_mtime) > limit:
            old.unlink(missing_ok=True)
            gone.append(old)
    return gone
