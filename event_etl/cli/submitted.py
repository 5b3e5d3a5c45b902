"""The driver of a job started by ``event-etl submit``: ``event-etl run``, inside spark-submit.

spark-submit starts it on the cluster's driver (this machine in client mode) with the job
bundle (:mod:`event_etl.cluster.bundle`) on its Python path, so ``event_etl`` is imported from the
bundle.  It takes the options of ``run`` (without ``--master``: spark-submit has set it)
and then:

1. **Event types** come from the bundle, extracted to a local folder: the driver loads
   exactly the types the submitting side checked, wherever it runs.
2. **The session** is the one spark-submit configured (master, deploy mode, ``--conf``),
   with the job's defaults of ``run`` on top (:func:`event_etl.job.session.get_session`).
   Two corrections for a bundle: the executors' JVM log configuration is left to the
   cluster (the job's own file lies inside the zip), and the bundle is put on the Python
   path of the source's planner process, which Spark starts on the driver without
   ``--py-files``.
3. **Preflight** (cluster masters only, :mod:`event_etl.cluster.preflight`): the executors must be
   able to import event_etl's dependencies and see the local folders they use.
4. :func:`event_etl.job.driver.run`, exactly as ``run`` calls it: same progress lines,
   signals, drain and summary.  The signals (forwarded by ``event-etl submit``) are
   recorded from the very start (:mod:`event_etl.job.stopping`), before the pid file tells
   ``event-etl submit`` where to send them; the session is stopped before the driver exits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from event_etl.cli.options import (
    handles_errors,
    job_options,
    job_run_options,
    load_type,
    reads_settings_once,
    refuse_removed_engine,
)
from event_etl.errors import UsageError
from event_etl.settings import current_settings

if TYPE_CHECKING:
    from event_etl.job.setup import RunOptions

__all__ = ["main"]


def _write_pidfile() -> None:
    """Tell `event-etl submit` (our grandparent, through spark-submit) where to send Ctrl-C and SIGTERM."""
    path = current_settings().driver_pidfile
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        Path(tmp).write_text(str(os.getpid()))
        os.replace(tmp, path)


def _is_local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def _expose_bundle(spark: Any, archive: Path) -> None:
    """Put the bundle on the PYTHONPATH of the Python processes Spark starts from the session's environment.

    A local master's worker daemon (:mod:`event_etl.job.sparkdaemon`) imports event_etl before any task has
    the job's ``--py-files`` on its path; on a cluster's executors the driver's path is harmlessly absent.
    """
    env = spark.sparkContext.environment
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(archive), env.get("PYTHONPATH", "")) if p)


def _submitted_conf() -> Any:
    """What spark-submit configured (master, deploy mode, --conf): the system properties of its JVM."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, as the session would
    return SparkConf()


def _session(label: str, options: RunOptions, archive: Path | None, submitted: Any) -> Any:
    from event_etl.job.session import get_session

    if archive is not None:
        # get_session points the executors' log4j at the job's file, which lies inside the zip here:
        # keep what spark-submit configured (the cluster's logging) instead.
        options.conf.setdefault("spark.executor.extraJavaOptions", submitted.get("spark.executor.extraJavaOptions", ""))
    # Which Python the executors run was decided by spark-submit (spark.pyspark.python sets PYSPARK_PYTHON
    # for this process); without it Spark's default holds, not this driver's own interpreter path.
    os.environ.setdefault("PYSPARK_PYTHON", "python3")
    spark = get_session(options.master, options.conf, app_name=f"event_etl:{label}")
    if archive is not None:
        _expose_bundle(spark, archive)
    return spark


def _member_options(options: RunOptions, name: str) -> RunOptions:
    """A fleet member's options as preflight checks them: its own checkpoint (the fleet's is their folder)."""
    from dataclasses import replace

    from event_etl.job.fleet import member_checkpoint

    return replace(options, checkpoint=member_checkpoint(options, name))


@click.command("event-etl-driver", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("event_types", nargs=-1, metavar="EVENT_TYPE...")
@click.option("--all", "all_types", is_flag=True, help="Every event type of the bundle (a fleet).")
@job_options(master=None)
@handles_errors
@reads_settings_once
def main(event_types: tuple[str, ...], all_types: bool, **job: Any) -> None:
    """The driver of EVENT_TYPE's job (several types, --all: a fleet's) under spark-submit (started by
    `event-etl submit`)."""
    from event_etl.cluster.bundle import bundled_event_types, package_archive
    from event_etl.eventtypes import resolve_event_types_dir
    from event_etl.job.driver import run
    from event_etl.job.session import stop_session
    from event_etl.job.stopping import Interrupted, StopSignals, say

    refuse_removed_engine(job)  # --engine queries: removed in 0.4
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set by spark-submit for the Python it starts
        what = "--all" if all_types else " ".join(event_types)
        raise UsageError("this is the driver of `event-etl submit`, and runs under spark-submit only",
                         fix=f"run `event-etl submit {what} --master URL` (or `event-etl run` without a cluster)")
    stops = StopSignals().install()  # before the pid file: a forwarded signal is recorded, never lost
    try:
        _write_pidfile()
        archive = package_archive()
        types_dir = (bundled_event_types(archive) if archive is not None else None) or resolve_event_types_dir(None)
        if all_types:
            from event_etl.eventtypes import load_event_types

            types = list(load_event_types(types_dir).values())
        else:
            types = [load_type(str(types_dir), name) for name in event_types]
        fleet = all_types or len(types) > 1
        label = "fleet" if fleet else types[0].name
        submitted = _submitted_conf()
        options = job_run_options(master=submitted.get("spark.master"), **job)
        spark = _session(label, options, archive, submitted)
        try:
            stops.install()  # once more, now that the SparkContext exists
            if stops.escalation is not None:
                raise Interrupted(stops.escalation, f"[{label}] stopped at once while Spark was starting")
            if not _is_local(options.master) and not stops.requested:
                from event_etl.cluster.preflight import preflight

                for et in types:
                    reports = preflight(spark, et, options if not fleet else _member_options(options, et.name))
                if not options.quiet:
                    executors = sorted({f"{r['host']} (Python {r['version']} {r['python']})" for r in reports})
                    print(f"[{label}] on {options.master}: event_etl from "
                          f"{archive.name if archive else 'installed files'}; executors checked on "
                          f"{', '.join(executors)}", flush=True)
            summaries = run(types, options, fleet=fleet, spark=spark, stops=stops, install_signals=False, echo=say)
            if fleet:  # as `run` ends a fleet: its lines, and exit 1 if a type could not be drained
                from event_etl.job.fleet import report_fleet

                report_fleet(summaries, again="submit the fleet again", echo=click.echo)
        finally:
            stop_session(spark)
    finally:
        stops.restore()
