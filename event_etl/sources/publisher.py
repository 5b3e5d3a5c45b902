"""A type's Pub/Sub topic and subscription: their paths, and creating them (``event-etl setup``).

The load generator that publishes to the topic (``event-etl publish``) is :mod:`event_etl.testing.publisher`:
it stops as a job does (:mod:`event_etl.job.stopping`), so it sits above the job layer.
"""

from __future__ import annotations

from event_etl.errors import UsageError
from event_etl.eventtypes import EventType

__all__ = ["pubsub_names", "setup_pubsub"]


def pubsub_names(et: EventType, topic: str | None = None, subscription: str | None = None) -> tuple[str, str]:
    """The type's topic and subscription paths (``[pubsub]`` in etl.toml), unless given."""
    topic = topic or et.pubsub.get("topic")
    subscription = subscription or et.pubsub.get("subscription")
    if not topic or not subscription:
        raise UsageError(
            f"event type {et.name} has no Pub/Sub topic and subscription",
            fix=f'add to {et.settings_file}:\n  [pubsub]\n  topic = "projects/PROJECT/topics/{et.name}"\n'
                f'  subscription = "projects/PROJECT/subscriptions/{et.name}-etl"\nor pass --topic and --subscription',
        )
    return topic, subscription


def setup_pubsub(topic: str, subscription: str, *, ack_deadline: int = 60) -> dict[str, str]:
    """Create the topic and the subscription if missing.  Returns what happened to each."""
    from google.api_core import exceptions as ex

    from event_etl.sources.pubsub import parse_subscription, permanent_error, publisher_client, subscriber_client

    parse_subscription(subscription)
    pub, sub = publisher_client(), subscriber_client()
    out = {}
    try:
        try:
            pub.create_topic(name=topic)
            out["topic"] = "created"
        except ex.AlreadyExists:
            out["topic"] = "exists"
        try:
            sub.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=ack_deadline)
            out["subscription"] = "created"
        except ex.AlreadyExists:
            out["subscription"] = "exists"
    except ex.GoogleAPICallError as err:
        raise permanent_error(subscription, err) from err
    finally:
        sub.close()
    return out
