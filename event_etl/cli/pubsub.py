"""Commands around Pub/Sub: ``setup`` (topic and subscription) and ``publish`` (a load generator)."""

from __future__ import annotations

import json

import click

from event_etl.cli.options import event_types_option, handles_errors, load_type
from event_etl.cli.params import DURATION, Duration, require_extra

_PUBSUB = ("google.cloud.pubsub_v1",)


@click.command("setup")
@click.argument("event_type")
@click.option("--topic", default=None, help="Topic path. Default: [pubsub] topic of the type.")
@click.option("--subscription", default=None, help="Subscription path. Default: [pubsub] subscription of the type.")
@click.option("--ack-deadline", default="60s", show_default=True, type=DURATION,
              help="Ack deadline of a new subscription (10s to 10m, or seconds).")
@event_types_option
@handles_errors
def setup_cmd(event_type: str, topic: str | None, subscription: str | None, ack_deadline: Duration,
              event_types_dir: str | None) -> None:
    """Create EVENT_TYPE's Pub/Sub topic and subscription if missing.

    Works on a real project (Application Default Credentials) or on the emulator
    (set PUBSUB_EMULATOR_HOST=127.0.0.1:8085; no credentials needed).
    """
    if not 10 <= ack_deadline <= 600:
        raise click.BadParameter(f"{ack_deadline:g}s is not from 10s to 10m", param_hint="'--ack-deadline'")
    require_extra("job", "`event-etl setup`", _PUBSUB)
    from event_etl.sources.publisher import pubsub_names, setup_pubsub

    et = load_type(event_types_dir, event_type)
    topic, subscription = pubsub_names(et, topic, subscription)
    done = setup_pubsub(topic, subscription, ack_deadline=int(ack_deadline))
    click.echo(f"topic        {topic}: {done['topic']}")
    click.echo(f"subscription {subscription}: {done['subscription']}")
    click.echo(f"run the job with: event-etl run {event_type} --source pubsub:{subscription}")


@click.command("publish")
@click.argument("event_type")
@click.option("--rate", default=1000.0, show_default=True, type=float, help="Messages per second.")
@click.option("--duration", default="60s", show_default=True, type=DURATION,
              help="How long to publish for (90s, 5m, or seconds).")
@click.option("--topic", default=None, help="Topic path. Default: [pubsub] topic of the type.")
@click.option("--params", default="", help="Generator shares and seed, as for generate: "
              "(e.g. late=0.02,invalid=0.01,duplicate=0.01,seed=7).")
@click.option("--count-file", type=click.Path(dir_okay=False), default=None,
              help="Write the number of valid events published per event hour (for `event-etl audit`).")
@event_types_option
@handles_errors
def publish_cmd(event_type: str, rate: float, duration: Duration, topic: str | None, params: str,
                count_file: str | None, event_types_dir: str | None) -> None:
    """Publish generated EVENT_TYPE events to Pub/Sub at RATE per second for DURATION seconds.

    Events follow the type's schema, with the generator's shares of out-of-order, late,
    too-late, future, invalid and duplicate events; event time is the wall clock.

    Ctrl-C, SIGTERM or SIGHUP stop publishing: the messages already sent are acknowledged, the
    count file counts exactly them, exit code 0 ("stopped_by" in the result). A second Ctrl-C or
    SIGTERM gives up at once (exit code 130 or 143, no count file).
    """
    require_extra("job", "`event-etl publish`", _PUBSUB)
    from event_etl.job.stopping import StopSignals
    from event_etl.sources.publisher import pubsub_names
    from event_etl.testing.publisher import publish_generated, write_count_file

    et = load_type(event_types_dir, event_type)
    topic, _ = pubsub_names(et, topic, et.pubsub.get("subscription") or "-")
    with StopSignals() as stops:
        res = publish_generated(et, topic, rate=rate, duration=float(duration), params=params, stops=stops,
                                progress=lambda n, total: click.echo(f"published {n:,}/{total:,}", err=True))
        if count_file:
            write_count_file(count_file, res)
    shown = ("topic", "published", "seconds", "intents") + (("stopped_by",) if res.get("stopped_by") else ())
    click.echo(json.dumps({k: res[k] for k in shown}, default=str))
