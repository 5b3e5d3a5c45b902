"""Sources: where payloads come from, as a Spark streaming source of *splits*.

A source does not push payloads through Spark.  Each micro-batch it hands Spark a few
small rows, *splits*, that say where its payloads are: a byte range of a file, a range
of generator indexes, a spooled block of Pub/Sub messages.  The executor task that gets
a split reads the payloads itself, where they lie, and writes the buckets.  So the
payloads cross no JVM boundary, and a split, being durable and fixed by the batch's
offsets, reads the same payloads when Spark replays the batch.

Source URLs (``--source``; each kind parses its own, :func:`~event_etl.sources.registry.parse_source`):

- ``generate:`` or ``generate:rate=2000,speedup=120,...``: synthetic events
  (see :mod:`event_etl.sources.generator`);
- ``dir:PATH`` or a path without a scheme (``in``, ``./a:b``, ``/tmp/x:y``): newline-delimited files, read in
  file-name order, new files picked up as they appear;
- ``pubsub:projects/P/subscriptions/S`` (or ``pubsub:`` for the type's ``[pubsub]
  subscription``): a Pub/Sub subscription, see :mod:`event_etl.sources.pubsub`;
- ``kafka:TOPIC``: a Kafka topic, the cluster in ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS`` (credentials in the file
  ``EVENT_ETL_KAFKA_PROPERTIES`` names, never in the URL), see :mod:`event_etl.sources.kafka`.

Any other ``scheme:`` at the start (``pubsb:...``, ``s3://...``) is an error that names the nearest known one.
"""

from __future__ import annotations

from event_etl.sources.registry import SourceSpec, parse_source

__all__ = ["SourceSpec", "parse_source"]
