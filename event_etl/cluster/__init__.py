"""Running a job on a Spark cluster: ``event-etl submit`` (spark-submit), the bundle it ships,
the preflight check of the executors, and a standalone cluster on this machine for trying it."""
