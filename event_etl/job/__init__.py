"""The streaming job on the driver: the runner (the query, signals, summary), the controller
(per batch: intent, ledger, markers, state; idle ticks; drain), a fleet of jobs, progress lines,
``event-etl status``, the checkpoint, the Spark session and stopping on signals."""
