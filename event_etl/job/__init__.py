"""The streaming job on the driver: the one driver (1..N types: leases, session, signals, the end), the engine
(shared: lanes, rounds), the controller (per batch: intent, ledger, markers, state; idle ticks; drain), a fleet's
quarantine and status, progress lines, ``event-etl status``, the checkpoint, the Spark session and stopping on
signals."""
