"""Tools for testing event_etl and jobs built on it: the event-time transcripts
(:mod:`event_etl.testing.transcripts`)."""
