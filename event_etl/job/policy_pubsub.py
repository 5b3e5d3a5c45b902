"""Commit policy ``pubsub``: one message per complete hour to a topic, for consumers that start on it.

The message's body is the hour's manifest (the ``_COMPLETE`` marker's bytes, as stored); its attributes
(:attr:`event_etl.job.policies.CompleteHour.attributes`) are ``event_type``, ``hour`` (ISO-8601, UTC),
``records``, ``late_records``, ``marker`` (the marker's URI) and ``sha256`` (of the body).  So a consumer (an
Airflow 3 ``AssetWatcher`` with a ``MessageQueueTrigger`` on a subscription, a Cloud Function, ``event-etl wait
--subscription``) can filter on attributes without parsing the body.

At least once: an hour is published again after a kill between the publish and its record, with the same body
and attributes (the message id differs): a consumer deduplicates by ``(event_type, hour, sha256)`` if it must.
A message is a hint; the marker is the contract (read it before acting).

Like the source, it honours ``PUBSUB_EMULATOR_HOST`` (then no credentials are needed).
"""

from __future__ import annotations

from typing import Any

from event_etl.job.policies import CompleteHour

__all__ = ["PubSubPolicy"]


class PubSubPolicy:
    """Publishes each complete hour to ``config["topic"]``; a publish not confirmed within ``timeout`` fails."""

    kind = "pubsub"

    def __init__(self, config: dict[str, Any]) -> None:
        self.name = str(config["name"])
        self.topic = str(config["topic"])
        self.timeout_s = int(config["timeout"]) / 1000
        self._client: Any = None

    def _publisher(self) -> Any:
        if self._client is None:
            from event_etl.sources.pubsub import publisher_client

            self._client = publisher_client()
        return self._client

    def run(self, hour: CompleteHour) -> None:
        future = self._publisher().publish(self.topic, hour.marker, **hour.attributes)
        try:
            future.result(timeout=self.timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.stop()
