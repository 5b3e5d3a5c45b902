"""``bin/spark-cluster``: start, show and stop a Spark standalone cluster on 127.0.0.1
(:class:`event_etl.cluster.localcluster.LocalCluster`), for trying ``event-etl submit``."""

from __future__ import annotations

import sys
import urllib.error
from collections.abc import Callable
from typing import Any, TypeVar

import click

from event_etl.cli.options import handles_errors
from event_etl.cluster.localcluster import DEFAULT_DIR, LocalCluster
from event_etl.errors import EventEtlError

__all__ = ["main"]

_F = TypeVar("_F", bound=Callable[..., Any])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A Spark standalone cluster on 127.0.0.1 (master + workers of the pip pyspark), for trying `event-etl submit`."""


def _dir_option(fn: _F) -> _F:
    return click.option("--dir", "state_dir", default=DEFAULT_DIR, show_default=True, type=click.Path(file_okay=False),
                        help="Where the cluster keeps its state and logs.")(fn)


@main.command("start")
@_dir_option
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 16), help="How many workers.")
@click.option("--cores", default=1, show_default=True, type=click.IntRange(1), help="Cores of each worker.")
@click.option("--memory", default="1g", show_default=True, help="Memory of each worker for its executors.")
@click.option(
    "--port", default=7077, show_default=True, type=click.IntRange(0, 65535), help="Master port (0: any free)."
)
@click.option("--webui-port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Master web UI port (0: any free).")
@handles_errors
def start_cmd(state_dir: str, workers: int, cores: int, memory: str, port: int, webui_port: int) -> None:
    """Start a master and --workers workers on 127.0.0.1; return once all are registered."""
    c = LocalCluster(state_dir).start(workers=workers, cores=cores, memory=memory, port=port, webui_port=webui_port)
    click.echo(f"Spark standalone cluster on 127.0.0.1: master {c.master_url}, {workers} workers "
               f"({cores} core{'s' if cores > 1 else ''}, {memory} each)")
    click.echo(f"  web UI  {c.webui_url}")
    click.echo(f"  logs    {c.dir}/*.log (executors: {c.dir}/work/)")
    click.echo(f"  submit  bin/event-etl-submit page_view --master {c.master_url} ...")
    click.echo("  stop    bin/spark-cluster stop" + ("" if state_dir == DEFAULT_DIR else f" --dir {state_dir}"))


@main.command("status")
@_dir_option
@handles_errors
def status_cmd(state_dir: str) -> None:
    """Show the master and its workers (exit code 1 when no cluster runs)."""
    c = LocalCluster(state_dir)
    if not c.state or not c.is_running("master"):
        click.echo(f"no cluster running from {c.dir}")
        sys.exit(1)
    try:
        s = c.status()
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise EventEtlError(
            f"the master (pid {c.pid('master')}) runs but its web UI {c.webui_url} does not answer: {err}",
            fix=f"see {c.dir}/master.log; bin/spark-cluster stop, then start again",
        ) from err
    click.echo(f"master {c.master_url}  {s.get('status')}  web UI {c.webui_url}")
    for w in s.get("workers", []):
        click.echo(f"  worker {w['host']}:{w['port']}  {w['state']}  cores {w['coresused']}/{w['cores']}  "
                   f"memory {w['memoryused']}/{w['memory']} MiB")
    for app in s.get("activeapps", []):
        click.echo(f"  app {app.get('id')}  {app.get('name')}  {app.get('state')}")


@main.command("stop")
@_dir_option
@handles_errors
def stop_cmd(state_dir: str) -> None:
    """Stop the workers (and their executors), then the master."""
    stopped = LocalCluster(state_dir).stop()
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="bin/spark-cluster")
