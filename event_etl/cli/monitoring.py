"""``event-etl graphs``: PNG charts of a job for operators, from Prometheus or a local metrics history.

The command parses its options and calls :func:`event_etl.metrics.graphs.make_graphs`; see that
module for what is drawn and how.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click
from click.core import ParameterSource

from event_etl.cli.options import handles_errors
from event_etl.cli.params import DURATION, Duration, require_extra
from event_etl.settings import ENV_PROMETHEUS_URL

__all__ = ["graphs_cmd"]


@click.command("graphs")
@click.argument("event_type")
@click.option("--prometheus", "prometheus_url", envvar=ENV_PROMETHEUS_URL, default=None, metavar="URL",
              help="Prometheus server to ask (its root, e.g. http://127.0.0.1:9090). Default: "
                   "$EVENT_ETL_PROMETHEUS_URL.")
@click.option("--history", "history_file", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw from the file a job wrote with --metrics-history instead (no Prometheus needed).")
@click.option("--checkpoint", "checkpoint", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Draw from the metrics history the job of this checkpoint keeps in it (DIR/metrics-history.jsonl). "
                   "Default, with neither --prometheus nor --history: ./checkpoints/EVENT_TYPE.")
@click.option("--last", default=None, type=DURATION, help="The range ends now (or at --until) and lasts this long. "
              "Default: 1h; from a history, the whole history.")
@click.option("--since", default=None, metavar="TIME", help="Start of the range: ISO-8601 (UTC if no offset), or -2h.")
@click.option("--until", default=None, metavar="TIME", help="End of the range (default: now).")
@click.option("--step", default=None, type=DURATION, help="A point every STEP. Default: 1m; for a whole history, "
              "about 60 points over it.")
@click.option("--window", default="5m", show_default=True, type=DURATION,
              help="Rates and percentiles over the WINDOW before each "
              "point (at least two scrape intervals). A whole history drawn at a longer step: the step.")
@click.option("--out", "out_dir", default="./graphs", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the PNG files.")
@handles_errors
def graphs_cmd(event_type: str, prometheus_url: str | None, history_file: str | None, checkpoint: str | None,
               last: Duration | None, since: str | None, until: str | None, step: Duration | None, window: Duration,
               out_dir: str) -> None:
    """Draw PNG charts of EVENT_TYPE's job: watermark lag, timely and late events per second,
    event delay, files per second and marker delay (on the wall clock, as `event-etl hours` shows
    it), with UTC time axes. A drain is drawn as an event (a marked point named `drain`), and no
    lag or delay below zero.

    From the metrics history a job keeps in its checkpoint (by default; --checkpoint DIR names
    the checkpoint, ./checkpoints/EVENT_TYPE when nothing is said), from the file a job wrote
    with `run --metrics-history FILE` (--history), or from a Prometheus server that scrapes the
    job (--prometheus).  A history is drawn whole unless a range is given (--last, --since,
    --until); from Prometheus the last hour is drawn.  For a job started minutes ago on
    Prometheus, try --last 15m --step 10s --window 1m.
    """
    require_extra("graphs", "`event-etl graphs`")
    from event_etl.metrics.graphs import (
        PrometheusSource,
        describe_drawn,
        drawn_range,
        graphs_range,
        make_graphs,
        open_source,
        parse_positive_duration,
        parse_range,
    )

    ctx = click.get_current_context()
    if (prometheus_url is not None and (history_file is not None or checkpoint is not None)
            and ctx.get_parameter_source("prometheus_url") == ParameterSource.ENVIRONMENT):
        prometheus_url = None  # an option given beats the environment's default
    if prometheus_url is None and history_file is None and checkpoint is None:
        _known_type(event_type)
    source = open_source(event_type, prometheus=prometheus_url, history=history_file, checkpoint=checkpoint)
    if isinstance(source, PrometheusSource) or since is not None or until is not None or last is not None:
        rng = parse_range(since=since, until=until, last=None if last is None else last.text,
                          step="1m" if step is None else step.text, window=window.text, now=datetime.now(UTC))
    else:
        rng = graphs_range(source, event_type,
                           step=None if step is None else parse_positive_duration("--step", step.text),
                           window=parse_positive_duration("--window", window.text)
                           if ctx.get_parameter_source("window") != ParameterSource.DEFAULT else None)
    charts, paths = make_graphs(event_type, rng=rng, out_dir=out_dir, source=source)
    where = f"Prometheus {source.url}" if isinstance(source, PrometheusSource) else f"history {source.path}"
    click.echo(f"{event_type}: {rng.describe()} · {where}")
    click.echo(f"  drawn: {describe_drawn(drawn_range(charts, rng), rng)}")
    by_key = {f"{event_type}-{c.key}.png": c for c in charts}
    for p in paths:
        c = by_key.get(p.name)
        note = "" if c is None or c.has_data else "  (no data in this range)"
        click.echo(f"  wrote {p}{note}")


def _known_type(event_type: str) -> None:
    """With no source named, the type's own checkpoint is read: a name that is neither an event type of the folder
    nor a checkpoint's is a mistyped type, said as such (it used to be blamed on a missing --prometheus)."""
    from pathlib import Path

    from event_etl.cli.options import type_names
    from event_etl.errors import ConfigError, UsageError
    from event_etl.eventtypes import resolve_event_types_dir
    from event_etl.storage.locations import default_checkpoint

    if Path(default_checkpoint(event_type)).exists():
        return
    root = resolve_event_types_dir(None)
    try:
        known = type_names(root)
    except ConfigError:
        return  # no folder of event types here: the checkpoint's absence is what is said
    if event_type not in known:
        raise UsageError(f"no event type {event_type!r} in {root}, and no checkpoint at "
                         f"{default_checkpoint(event_type)}",
                         fix=f"known types: {', '.join(known) or '(none)'}; or name where the metrics are: "
                             "--checkpoint DIR, --history FILE or --prometheus URL")
