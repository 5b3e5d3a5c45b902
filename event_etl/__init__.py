"""event_etl: hourly event-time buckets from a message bus, on Apache Spark (micro-batches planned in the driver).

A job reads an event type's payloads (Pub/Sub, Kafka, a folder of files, or the built-in
generator), writes each micro-batch as deterministically named Avro files into the bucket of
each event's UTC hour, and closes an hour with a ``_COMPLETE`` manifest once the watermark has
passed it.  One driver (:mod:`event_etl.job.driver`) runs 1..N types through the shared engine
(:mod:`event_etl.job.engine`): every trigger it plans each type's batch and runs one Spark job
for all of them, no streaming query; one type is a round of one, several share one Spark
application as a fleet.  See README.md for the semantics and the commands.

The rules live in :mod:`event_etl.rules` (pure functions); Spark, storage and sources
are a thin shell around them.

The packages are layers.  A module imports modules of its own layer or of lower ones, never
of a higher one (``tests/test_layers.py`` checks every import, at any depth of a module), and
nothing but the command line imports :mod:`event_etl.cli`.  Lowest first:

1. **base**: :mod:`~event_etl.errors`, :mod:`~event_etl.exitcodes`, :mod:`~event_etl.timeutil`,
   :mod:`~event_etl.settings` (every ``EVENT_ETL_*`` variable), :mod:`~event_etl.faults`,
   :mod:`event_etl.util` (backoff and retries, adapters to other libraries' private parts).
2. **rules**: :mod:`event_etl.rules`, the pure core: buckets, watermark, judge, manifest, completeness.
3. **storage and types**: :mod:`event_etl.storage` (the sink, Avro I/O, dead letters, the lease,
   atomic local writes, locations), :mod:`~event_etl.eventtypes`, :mod:`~event_etl.bundled`,
   :mod:`event_etl.payloads` (producers' dialects: frames, Protobuf, a schema registry's client).
4. **sources, tasks, consumers**: :mod:`event_etl.sources` (planners, the generator, the
   source registry, a type's Pub/Sub topic and subscription), :mod:`event_etl.task` (what an executor task does:
   decode, judge, deduplicate, write), :mod:`event_etl.consumer` (reading a sink without Spark,
   the recipes, the Airflow sensor; ``event_etl.recipes`` and ``event_etl.airflow`` are the
   paths of 0.3, kept until 0.5).
5. **metrics**: :mod:`event_etl.metrics` (the spec table, histograms, exporters, history, the
   job's metrics, the fleet endpoint, the graphs).
6. **job**: :mod:`event_etl.job` (the driver, the shared engine, controller, fleet, progress,
   status, checkpoint, Spark session, stopping).
7. **cluster**: :mod:`event_etl.cluster` (submit, bundle, preflight, the local cluster).
8. **testing**: :mod:`event_etl.testing` (the event-time transcripts harness, the load generator
   behind ``event-etl publish``, which stops as a job does).
9. **cli**: :mod:`event_etl.cli` (the ``event-etl`` commands, the driver of a submitted job,
   ``bin/spark-cluster``), with the entry points ``python -m event_etl`` and
   :mod:`event_etl.submit_main`.
"""

__version__ = "0.3.0.dev0"

__all__ = ["__version__"]
