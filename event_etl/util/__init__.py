"""Small helpers of the base layer that any package may use: :mod:`~event_etl.util.retry` (backoff and
retries, on tenacity) and :mod:`~event_etl.util.thirdparty` (the one place event_etl reads other libraries'
private parts: fastavro, gcsfs, PySpark)."""
