"""``event-etl graphs``: PNG charts of a job for operators, from Prometheus or a local metrics history.

The command parses its options and calls :func:`event_etl.metrics.graphs.make_graphs`; see that
module for what is drawn and how.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from event_etl.cli.options import handles_errors
from event_etl.cli.params import DURATION, require_extra
from event_etl.settings import ENV_PROMETHEUS_URL

__all__ = ["graphs_cmd"]


@click.command("graphs")
@click.argument("event_type")
@click.option("--prometheus", "prometheus_url", envvar=ENV_PROMETHEUS_URL, default=None, metavar="URL",
              help="Prometheus server to ask (its root, e.g. http://127.0.0.1:9090). Default: "
                   "$EVENT_ETL_PROMETHEUS_URL.")
@click.option("--history", "history_file", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw from the file a job wrote with --metrics-history instead (no Prometheus needed).")
@click.option("--last", default=None, type=DURATION, help="The range ends now (or at --until) and lasts this long. "
              "Default: 1h.")
@click.option("--since", default=None, metavar="TIME", help="Start of the range: ISO-8601 (UTC if no offset), or -2h.")
@click.option("--until", default=None, metavar="TIME", help="End of the range (default: now).")
@click.option("--step", default="1m", show_default=True, type=DURATION, help="A point every STEP.")
@click.option("--window", default="5m", show_default=True, type=DURATION,
              help="Rates and percentiles over the WINDOW before each "
              "point (at least two scrape intervals).")
@click.option("--out", "out_dir", default="./graphs", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the PNG files.")
@handles_errors
def graphs_cmd(event_type, prometheus_url, history_file, last, since, until, step, window, out_dir) -> None:
    """Draw PNG charts of EVENT_TYPE's job: watermark lag, late vs timely events per second,
    event delay, files per second and marker delay, with UTC time axes.

    From a Prometheus server that scrapes the job (--prometheus), or from the metrics history
    the job keeps with `run --metrics-history FILE` (--history).  For a job started minutes
    ago, try --last 15m --step 10s --window 1m.
    """
    require_extra("graphs", "`event-etl graphs`")
    from event_etl.metrics.graphs import make_graphs, parse_range

    rng = parse_range(since=since, until=until, last=None if last is None else last.text, step=step.text,
                      window=window.text, now=datetime.now(UTC))
    charts, paths = make_graphs(event_type, rng=rng, out_dir=out_dir, prometheus=prometheus_url, history=history_file)
    click.echo(f"{event_type}: {rng.describe()}")
    by_key = {f"{event_type}-{c.key}.png": c for c in charts}
    for p in paths:
        c = by_key.get(p.name)
        note = "" if c is None or c.has_data else "  (no data in this range)"
        click.echo(f"  wrote {p}{note}")
