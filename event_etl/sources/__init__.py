"""Sources: where payloads come from, as a Spark streaming source of *splits*.

A source does not push payloads through Spark.  Each micro-batch it hands Spark a few
small rows, *splits*, that say where its payloads are: a byte range of a file, a range
of generator indexes, a spooled block of Pub/Sub messages.  The executor task that gets
a split reads the payloads itself, where they lie, and writes the buckets.  So the
payloads cross no JVM boundary, and a split, being durable and fixed by the batch's
offsets, reads the same payloads when Spark replays the batch.

Source URLs:

- ``generate:`` or ``generate:rate=2000,speedup=120,...``: synthetic events
  (see :mod:`event_etl.sources.generator`);
- ``dir:PATH`` or a plain path: newline-delimited files, read in file-name order,
  new files picked up as they appear;
- ``pubsub:projects/P/subscriptions/S`` (or ``pubsub:`` for the type's ``[pubsub]
  subscription``): a Pub/Sub subscription, see :mod:`event_etl.sources.pubsub`;
- ``kafka:TOPIC``: a Kafka topic, the cluster in ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS`` (credentials in the file
  ``EVENT_ETL_KAFKA_PROPERTIES`` names, never in the URL), see :mod:`event_etl.sources.kafka`.
"""

from __future__ import annotations

import os

from event_etl.errors import UsageError
from event_etl.sources.registry import SourceSpec
from event_etl.storage.locations import is_remote

__all__ = ["SourceSpec", "parse_source"]


def parse_source(url: str, *, now: int, default_subscription: str | None = None) -> SourceSpec:
    """Parse a ``--source`` value.  ``now`` fixes relative generator start times; ``pubsub:`` alone
    means ``default_subscription`` (the type's ``[pubsub] subscription``)."""
    if url is None or not str(url).strip():
        raise UsageError("empty --source", fix="use generate:, dir:PATH, pubsub:..., kafka:TOPIC or a folder path")
    url = str(url).strip()
    if url.startswith("generate:") or url == "generate":
        from event_etl.sources.generator import parse_generator_params

        try:
            params = parse_generator_params(url.partition(":")[2], now)
        except ValueError as err:
            raise UsageError(f"--source {url}: {err}", fix="e.g. --source generate:rate=2000,speedup=60") from err
        return SourceSpec("generate", params.to_json(), url)
    if url.startswith("pubsub:"):
        from event_etl.sources.pubsub import parse_subscription

        path = url[len("pubsub:"):].strip() or (default_subscription or "")
        if not path:
            raise UsageError(
                "--source pubsub: names no subscription and the event type has no [pubsub] subscription",
                fix="write --source pubsub:projects/PROJECT/subscriptions/NAME, or set subscription in [pubsub] of "
                "etl.toml",
            )
        try:
            parse_subscription(path)
        except ValueError as err:
            raise UsageError(
                f"--source {url}: {err}", fix="e.g. --source pubsub:projects/my-project/subscriptions/page-view-etl"
            ) from err
        return SourceSpec("pubsub", {"subscription": path}, f"pubsub:{path}")
    if url.startswith("kafka:"):
        return _parse_kafka(url)
    if url.startswith("dir:"):
        path = url[4:]
    elif is_remote(url):
        raise UsageError(f"--source {url}: unknown source kind", fix="use generate:, dir:PATH or a folder path")
    else:
        path = url[7:] if url.startswith("file://") else url
    if not path:
        raise UsageError("--source dir: needs a folder", fix="write dir:/path/to/folder")
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise UsageError(
            f"--source {url}: {path} is not a folder",
            fix="create it, or point --source at the folder holding the newline-delimited files",
        )
    return SourceSpec("dir", {"path": path}, url)


_KAFKA_FIX = ("write --source kafka:TOPIC and set EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS=host:port (credentials, SASL and "
              "SSL go in the librdkafka properties file EVENT_ETL_KAFKA_PROPERTIES names, never in --source)")


def _parse_kafka(url: str) -> SourceSpec:
    """``kafka:TOPIC``; the cluster and its credentials come from the settings, not the URL."""
    import re

    from event_etl.settings import ENV_KAFKA_BOOTSTRAP_SERVERS, current_settings

    topic = url[len("kafka:"):].strip()
    if topic.startswith("//"):  # kafka://user:password@broker/topic: the URL would carry secrets into checkpoints
        raise UsageError(f"--source {url}: a kafka:// URL is not a source; the topic alone is", fix=_KAFKA_FIX)
    if not topic:
        raise UsageError("--source kafka: names no topic", fix=_KAFKA_FIX)
    if len(topic) > 249 or not re.fullmatch(r"[A-Za-z0-9._-]+", topic) or topic in (".", ".."):
        raise UsageError(f"--source {url}: {topic!r} is not a Kafka topic name",
                         fix="a topic name is 1 to 249 of the characters a-z A-Z 0-9 . _ -; " + _KAFKA_FIX)
    if not current_settings().kafka_bootstrap_servers:
        raise UsageError(f"--source {url}: {ENV_KAFKA_BOOTSTRAP_SERVERS} is not set", fix=_KAFKA_FIX)
    return SourceSpec("kafka", {"topic": topic}, f"kafka:{topic}")
