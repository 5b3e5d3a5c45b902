"""``event-etl submit``: run a job on a Spark cluster (standalone, YARN, Kubernetes) through spark-submit."""

from __future__ import annotations

import sys
from typing import Any

import click

from event_etl.cli.options import (
    check_master,
    event_types_option,
    handles_errors,
    job_options,
    load_type,
    refuse_removed_engine,
)
from event_etl.cluster.submit import DEFAULT_BUNDLE_DIR, SubmitOptions, submit_job
from event_etl.errors import UsageError
from event_etl.settings import ENV_SPARK_SUBMIT


@click.command("submit")
@click.argument("event_types", nargs=-1, metavar="EVENT_TYPE...")
@click.option("--all", "all_types", is_flag=True, help="Run every event type of --event-types (a fleet).")
@job_options(master=click.option("--master", required=True, callback=check_master,
                                 help="The cluster: spark://HOST:PORT (standalone), yarn, k8s://https://HOST:PORT; "
                                 "local[N] tries the bundle without one."))
@click.option("--deploy-mode", type=click.Choice(["client", "cluster"]), default="client", show_default=True,
              help="client: the driver runs here; cluster: on the cluster (YARN, Kubernetes; not standalone).")
@click.option("--python", "python", default=None, metavar="PATH",
              help="The Python of the executors (spark.pyspark.python), with event_etl's dependencies, at this path on "
              "every node (and here, in client mode). Default: this Python when the master runs on this machine, "
              "else the cluster's default.")
@click.option("--python-env", default=None, metavar="ARCHIVE", type=click.Path(exists=True, dir_okay=False),
              help="A packed environment (venv-pack, conda-pack) shipped with --archives as the executors' and the "
              "driver's Python (with --deploy-mode cluster).")
@click.option("--spark-submit", default=None, metavar="PATH", envvar=ENV_SPARK_SUBMIT,
              help="The spark-submit to run. Default: the one of the installed pyspark.")
@click.option("--bundle-dir", default=DEFAULT_BUNDLE_DIR, show_default=True, type=click.Path(file_okay=False),
              help="Where the bundle (event_etl + event types, a zip) is built and kept.")
@click.option("--dry-run", is_flag=True, help="Build the bundle and print the spark-submit command; do not run it.")
@event_types_option
@handles_errors
def submit_cmd(event_types: tuple[str, ...], all_types: bool, event_types_dir: str | None, deploy_mode: str,
               python: str | None, python_env: str | None, spark_submit: str | None, bundle_dir: str, dry_run: bool,
               **job: Any) -> None:
    """Run the streaming job of EVENT_TYPE on a Spark cluster (several types, or --all: a fleet, as with `run`).

    Takes every option of `run`. Packs event_etl and the event types into one zip (kept in
    --bundle-dir, rebuilt only when they change) and runs spark-submit with it on --py-files;
    the executors need Python and event_etl's dependencies, not event_etl. Local paths
    (sink, checkpoint, input folder) must be the same folder on every node: a shared mount, or
    gs:// for the sink. In client mode Ctrl-C and SIGTERM reach the driver as with `run`.
    """
    from event_etl.eventtypes import load_event_types, resolve_event_types_dir

    refuse_removed_engine(job)  # --engine queries: removed in 0.4; shared is not passed on
    if all_types == bool(event_types):
        raise UsageError("name the event types to submit, or --all (not both)",
                         fix="e.g. event-etl submit page_view --master URL, or event-etl submit --all --master URL")
    if all_types:  # fail here, before Spark starts, on a broken type
        types = list(load_event_types(resolve_event_types_dir(event_types_dir)).values())
    else:
        types = [load_type(event_types_dir, name) for name in event_types]
    for et in types:
        et.check_versions()  # and on a schema that cannot read its registered versions
    fleet = all_types or len(types) > 1
    opts = SubmitOptions(master=job.pop("master"), deploy_mode=deploy_mode, python=python, python_env=python_env,
                         spark_submit=spark_submit, bundle_dir=bundle_dir)
    from event_etl.cli.submitted import main as driver

    code = submit_job(
        None if fleet else types[0],
        resolve_event_types_dir(event_types_dir),
        job,
        opts,
        driver_params=driver.params,
        dry_run=dry_run,
        echo=lambda line: click.echo(line, err=True),
        fleet=(["--all"] if all_types else [et.name for et in types]) if fleet else None,
    )
    if code:
        sys.exit(code)
