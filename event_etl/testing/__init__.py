"""Tools for testing event_etl and jobs built on it: the event-time transcripts
(:mod:`event_etl.testing.transcripts`) and the load generator behind ``event-etl publish``
(:mod:`event_etl.testing.publisher`)."""
