"""The driver of a job started by ``event-etl submit``: ``event-etl run``, inside spark-submit.

spark-submit starts it on the cluster's driver (this machine in client mode) with the job
bundle (:mod:`event_etl.bundle`) on its Python path, so ``event_etl`` is imported from the
bundle.  It takes the options of ``run`` (without ``--master``: spark-submit has set it)
and then:

1. **Event types** come from the bundle, extracted to a local folder: the driver loads
   exactly the types the submitting side checked, wherever it runs.
2. **The session** is the one spark-submit configured (master, deploy mode, ``--conf``),
   with the job's defaults of ``run`` on top (:func:`event_etl.sparkutil.get_session`).
   Two corrections for a bundle: the executors' JVM log configuration is left to the
   cluster (the job's own file lies inside the zip), and the bundle is put on the Python
   path of the source's planner process, which Spark starts on the driver without
   ``--py-files``.
3. **Preflight** (cluster masters only): one small Spark job asks the executors whether
   they can import event_etl and its dependencies, and whether they see the local folders
   they read or write (a local sink, the input folder of a directory source, the
   checkpoint's Pub/Sub spool).  On a multi-node cluster these must be shared mounts; a
   driver-only folder fails here with the fix, not later in the middle of a batch.  The
   check reaches the executors running at start-up, so it is a strong hint, not a proof.
4. :func:`event_etl.runner.run_job`, exactly as ``run`` calls it: same progress lines,
   signals, drain and summary.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import click

from event_etl.cli import _load_type, handles_errors, job_options, job_run_options
from event_etl.errors import EventEtlError, UsageError

__all__ = ["main", "ENV_DRIVER_PIDFILE", "ENTRY_SCRIPT", "SharedFolder", "shared_folders", "executor_report",
           "preflight"]

ENV_DRIVER_PIDFILE = "EVENT_ETL_DRIVER_PIDFILE"
"""Where the driver writes its pid, so that ``event-etl submit`` can pass Ctrl-C and SIGTERM on to it."""

ENTRY_SCRIPT = '''"""Driver entry of `event-etl submit` (generated): event_etl comes from the bundle on --py-files."""
from event_etl.submit_main import main

main()
'''
"""spark-submit runs a Python file, not a module: this is the file (see :func:`event_etl.submit.write_entry_script`)."""

EXECUTOR_MODULES = ("event_etl.executor", "event_etl.payload", "event_etl.dedupe", "pyarrow", "pandas", "numpy",
                    "fastavro", "orjson", "xxhash", "cramjam", "fsspec")
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


def shared_folders(event_type, options, *, token: str) -> list[SharedFolder]:
    """The local folders the executors of this job read or write (a gs:// sink is none of them)."""
    from event_etl.runner import default_checkpoint, resolve_sink
    from event_etl.sources import parse_source
    from event_etl.timeutil import now_millis

    probe = f".event_etl-probe-{token}"
    out = []
    sink = resolve_sink(options.sink)
    if "://" not in sink:
        out.append(SharedFolder("sink", sink, probe=probe,
                                fix="mount it at the same path on every node (NFS, Filestore...), or write to "
                                    "Cloud Storage: --sink gs://bucket/prefix"))
    spec = parse_source(options.source or event_type.source, now=now_millis(),
                        default_subscription=event_type.pubsub.get("subscription"))
    if spec.kind == "dir":
        path = spec.params["path"]
        out.append(SharedFolder("input folder", path, names=tuple(sorted(os.listdir(path))[:20]),
                                fix="the executors read the input files themselves: mount the folder at the same "
                                    "path on every node"))
    elif spec.kind == "pubsub":
        out.append(SharedFolder("checkpoint", os.path.abspath(options.checkpoint or default_checkpoint(event_type.name)),
                                probe=probe,
                                fix="the executors read the Pub/Sub spool (etl/source/pubsub/spool/) from the "
                                    "checkpoint: put --checkpoint on a shared mount (NFS, Filestore...) at the same "
                                    "path on every node"))
    return out


def executor_report(modules: tuple[str, ...], folders: tuple[SharedFolder, ...], _rows: Any = None) -> Iterator[dict]:
    """Run on an executor: where it is, which modules it cannot import, which folders it does not see."""
    import importlib

    missing = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing[name] = err.name or str(err)
    yield {"host": socket.gethostname(), "python": sys.executable, "version": sys.version.split()[0],
           "missing": missing, "unseen": [f.what for f in folders if not f.seen_here()]}


def preflight(spark, event_type, options) -> list[dict]:
    """Ask the executors running now whether they can run this job; raise with the fix if not.  Returns their reports."""
    folders = shared_folders(event_type, options, token=uuid.uuid4().hex)
    modules = EXECUTOR_MODULES + (("gcsfs",) if options.sink.startswith("gs://") else ())
    written = []
    try:
        for f in folders:
            if f.probe is not None:
                os.makedirs(f.path, exist_ok=True)
                Path(f.path, f.probe).write_bytes(b"probe")
                written.append(Path(f.path, f.probe))
        sc = spark.sparkContext
        tasks = max(2, sc.defaultParallelism) * 2
        try:
            reports = sc.parallelize(range(tasks), tasks).mapPartitions(
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


def _judge(reports: list[dict], folders: list[SharedFolder]) -> None:
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


def _write_pidfile() -> None:
    path = os.environ.get(ENV_DRIVER_PIDFILE)
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        Path(tmp).write_text(str(os.getpid()))
        os.replace(tmp, path)


def _is_local(master: str) -> bool:
    return master.startswith("local")


def _expose_bundle_to_planner(spark, archive: Path) -> None:
    """Put the bundle on the PYTHONPATH of the Python processes Spark starts for the source.

    Spark runs the streaming source's planner (offsets, partitions) in a Python process on
    the driver and gives it the job's ``--py-files`` from a folder where they are not, so
    it could not import event_etl.  The session's environment reaches that process (and
    the executors, where a path of the driver's is harmlessly absent); run_job registers
    the source again after this, with the environment.
    """
    env = spark.sparkContext.environment
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(archive), env.get("PYTHONPATH", "")) if p)


def _submitted_conf():
    """What spark-submit configured (master, deploy mode, --conf): the system properties of its JVM."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, as the session would
    return SparkConf()


def _session(event_type, options, archive: Path | None, submitted):
    from event_etl.sparkutil import get_session

    if archive is not None:
        # get_session points the executors' log4j at the job's file, which lies inside the zip here:
        # keep what spark-submit configured (the cluster's logging) instead.
        options.conf.setdefault("spark.executor.extraJavaOptions", submitted.get("spark.executor.extraJavaOptions", ""))
    # Which Python the executors run was decided by spark-submit (spark.pyspark.python sets PYSPARK_PYTHON
    # for this process); without it Spark's default holds, not this driver's own interpreter path.
    os.environ.setdefault("PYSPARK_PYTHON", "python3")
    spark = get_session(options.master, options.conf, app_name=f"event_etl:{event_type.name}")
    if archive is not None:
        _expose_bundle_to_planner(spark, archive)
    return spark


@click.command("event-etl-driver", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("event_type")
@job_options(master=None)
@handles_errors
def main(event_type: str, **job: Any) -> None:
    """The driver of EVENT_TYPE's job under spark-submit (started by `event-etl submit`)."""
    from event_etl.bundle import bundled_event_types, package_archive
    from event_etl.eventtypes import resolve_event_types_dir
    from event_etl.runner import run_job

    _write_pidfile()
    archive = package_archive()
    types_dir = (bundled_event_types(archive) if archive is not None else None) or resolve_event_types_dir(None)
    et = _load_type(str(types_dir), event_type)
    submitted = _submitted_conf()
    if not submitted.contains("spark.master"):
        raise UsageError("no Spark master: this is the driver of `event-etl submit`, started by spark-submit",
                         fix=f"run `event-etl submit {event_type} --master URL` (or `event-etl run` without a cluster)")
    options = job_run_options(master=submitted.get("spark.master"), **job)
    spark = _session(et, options, archive, submitted)
    try:
        if not _is_local(options.master):
            reports = preflight(spark, et, options)
            if not options.quiet:
                executors = sorted({f"{r['host']} (Python {r['version']} {r['python']})" for r in reports})
                print(f"[{et.name}] on {options.master}: event_etl from {archive.name if archive else 'installed files'}; "
                      f"executors checked on {', '.join(executors)}", flush=True)
        run_job(et, options, spark=spark)
    finally:
        spark.stop()
