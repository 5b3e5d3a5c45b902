"""event_etl: hourly event-time buckets from a message bus, on Spark Structured Streaming.

One streaming job per event type reads payloads (Pub/Sub, a folder of files, or the
built-in generator), writes each micro-batch as deterministically named Avro files into
the bucket of each event's UTC hour, and closes an hour with a ``_COMPLETE`` manifest
once the watermark has passed it.  See README.md for the semantics and the commands.

The rules live in :mod:`event_etl.rules` (pure functions); Spark, storage and sources
are a thin shell around them.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
