"""Small helpers of the base layer that any package may use: :mod:`~event_etl.util.retry` (backoff and
retries, on tenacity)."""
