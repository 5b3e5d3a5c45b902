"""Before a submitted job starts: can the executors run it?

One small Spark job asks the executors running now two things:

- **Can they import event_etl and its dependencies?**  event_etl comes from the bundle; the
  dependencies must be installed in the executors' Python (:data:`EXECUTOR_MODULES`).
- **Do they see the local folders they use, as the driver does?**  A local sink (they write
  it), the input folder of a directory source (they read the files), the checkpoint of a
  Pub/Sub job (they read the spool, ``etl/source/pubsub/spool/``).  On a multi-node cluster
  these must be shared mounts at the same path; the driver drops a probe file in each
  folder it may write, and names some files of the input folder, and the executors look.

A problem stops the job before its first batch, with the fix.  The check reaches the
executors running at start-up, so it is a strong hint, not a proof.

This module imports nothing beyond the standard library at import time: an executor
missing a dependency can still run :func:`executor_report` and say which.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from event_etl.errors import EventEtlError, UsageError

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType

__all__ = ["EXECUTOR_MODULES", "SharedFolder", "shared_folders", "executor_report", "preflight"]

EXECUTOR_MODULES = ("event_etl.task.executor", "event_etl.task.payload", "event_etl.task.dedupe", "pyarrow", "pandas",
                    "numpy",
                    "fastavro", "orjson", "xxhash", "cramjam", "fsspec", "tenacity")
"""What an executor task imports: event_etl (from the bundle) and the dependencies it needs installed."""


@dataclass(frozen=True)
class SharedFolder:
    """A local folder the executors use, as the driver sees it.

    ``probe`` names a file the driver writes there for the check; a folder the job must not
    write into (the input folder) is compared by ``names`` (some of its file names) instead.
    """

    what: str
    path: str
    fix: str
    probe: str | None = None
    names: tuple[str, ...] = ()

    def seen_here(self) -> bool:
        """Whether this process sees the folder as the driver does."""
        if not os.path.isdir(self.path):
            return False
        if self.probe is not None:
            return os.path.isfile(os.path.join(self.path, self.probe))
        return all(os.path.exists(os.path.join(self.path, n)) for n in self.names)


class JobPaths(Protocol):
    """What preflight reads of a job's options (:class:`event_etl.job.setup.RunOptions`)."""

    @property
    def source(self) -> str | None: ...

    @property
    def sink(self) -> str: ...

    @property
    def checkpoint(self) -> str | None: ...


def shared_folders(event_type: EventType, options: JobPaths, *, token: str) -> list[SharedFolder]:
    """The local folders the executors of this job read or write (a gs:// sink is none of them)."""
    from event_etl.sources.registry import job_source, source_kind
    from event_etl.storage.locations import default_checkpoint, is_remote, resolve_sink
    from event_etl.timeutil import now_millis

    probe = f".event_etl-probe-{token}"
    out: list[SharedFolder] = []
    sink = resolve_sink(options.sink)
    if not is_remote(sink):
        out.append(SharedFolder("sink", sink, probe=probe,
                                fix="mount it at the same path on every node (NFS, Filestore...), or write to "
                                    "Cloud Storage: --sink gs://bucket/prefix"))
    spec = job_source(event_type, options.source, now=now_millis())
    shared = source_kind(spec.kind).shared
    if shared == "input":
        path = spec.params["path"]
        complete = sorted(n for n in os.listdir(path) if not n.startswith((".", "_")))  # not files being written
        out.append(SharedFolder("input folder", path, names=tuple(complete[:20]),
                                fix="the executors read the input files themselves: mount the folder at the same "
                                    "path on every node"))
    elif shared == "checkpoint":
        out.append(SharedFolder("checkpoint",
                                os.path.abspath(options.checkpoint or default_checkpoint(event_type.name)),
                                probe=probe,
                                fix="the executors read the Pub/Sub spool (etl/source/pubsub/spool/) from the "
                                    "checkpoint: put --checkpoint on a shared mount (NFS, Filestore...) at the same "
                                    "path on every node"))
    return out


def executor_report(modules: tuple[str, ...], folders: tuple[SharedFolder, ...],
                    _rows: Any = None) -> Iterator[dict[str, Any]]:
    """Run on an executor: where it is, which modules it cannot import, which folders it does not see."""
    import importlib

    missing: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing[name] = err.name or str(err)
    yield {"host": socket.gethostname(), "python": sys.executable, "version": sys.version.split()[0],
           "missing": missing, "unseen": [f.what for f in folders if not f.seen_here()]}


def preflight(spark: Any, event_type: EventType, options: JobPaths) -> list[dict[str, Any]]:
    """Ask the executors running now whether they can run this job; raise with the fix if not.
    Returns their reports."""
    from event_etl.sources.registry import kind_of_url

    folders = shared_folders(event_type, options, token=uuid.uuid4().hex)
    modules = EXECUTOR_MODULES + (("gcsfs",) if options.sink.startswith("gs://") else ())
    modules += kind_of_url(str(options.source or event_type.source)).executor_requires  # Kafka: the client
    written: list[Path] = []
    try:
        for f in folders:
            if f.probe is not None:
                os.makedirs(f.path, exist_ok=True)
                Path(f.path, f.probe).write_bytes(b"probe")
                written.append(Path(f.path, f.probe))
        sc = spark.sparkContext
        tasks = max(2, sc.defaultParallelism) * 2
        try:
            reports: list[dict[str, Any]] = sc.parallelize(range(tasks), tasks).mapPartitions(
                functools.partial(executor_report, modules, tuple(folders))).collect()
        except Exception as err:  # a Py4JJavaError carrying the executors' Python traceback
            raise EventEtlError(
                f"the executors could not run a task of event_etl: {_python_error(str(err))}",
                fix="the executors' Python (--python, spark.pyspark.python) must be the driver's Python version with "
                    "event_etl's dependencies installed; see the README, section Running on a cluster",
            ) from err
    finally:
        for p in written:
            p.unlink(missing_ok=True)
    _judge(reports, folders)
    return reports


def _python_error(text: str) -> str:
    """The line of a Spark error that names the Python problem (ModuleNotFoundError..., version mismatch)."""
    lines = [ln.strip() for ln in text.splitlines()]
    for ln in reversed(lines):
        if re.match(r"^(\[PYTHON_VERSION_MISMATCH\]|\w+(Error|Exception): )", ln):
            return ln
    return lines[0] if lines else text


def _judge(reports: list[dict[str, Any]], folders: list[SharedFolder]) -> None:
    missing = {name: err for r in reports for name, err in r["missing"].items()}
    if missing:
        where = sorted({f"{r['host']} ({r['python']})" for r in reports if r["missing"]})
        raise EventEtlError(
            f"the executors on {', '.join(where)} cannot import {', '.join(sorted(set(missing.values())))}",
            fix="install event_etl's dependencies into the executors' Python on every node "
                "(pip install event_etl), or ship a packed environment (venv-pack, conda-pack) with "
                "`event-etl submit --python-env ARCHIVE --deploy-mode cluster`",
        )
    for f in folders:
        hosts = sorted({r["host"] for r in reports if f.what in r["unseen"]})
        if hosts:
            raise UsageError(f"the {f.what} {f.path} is not visible from the executors on {', '.join(hosts)}",
                             fix=f.fix)
