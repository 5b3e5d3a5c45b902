"""Kafka as the engine opens it: ``kafka:TOPIC`` (:mod:`event_etl.sources.kafka`, one topic) or ``kafka:re:PATTERN``
(:mod:`event_etl.sources.kafka_pattern`, every topic a pattern matches), registered in
:data:`event_etl.sources.registry.SOURCES` by the name of :class:`KafkaSource`."""

from __future__ import annotations

from typing import Any

from event_etl.sources.face import OpenRequest, PlannedSession, Source
from event_etl.sources.kafka import KafkaPlanner, KafkaSession, check_topic

__all__ = ["KafkaSource"]


class KafkaSource(Source):
    """``kafka:TOPIC``: the cluster and its credentials come from the settings, not the URL."""

    @classmethod
    def open(cls, request: OpenRequest) -> PlannedSession:
        params = request.spec["params"]
        if "pattern" in params:  # kafka:re:PATTERN, every topic it matches
            from event_etl.sources.kafka_pattern import PatternPlanner

            return PlannedSession(PatternPlanner(params["pattern"], event_type=request.spec.get("event_type"),
                                                 clock=request.clock))
        planner = KafkaPlanner(params["topic"], event_type=request.spec.get("event_type"), clock=request.clock)
        return KafkaSession(planner, request.spark_dir)

    @classmethod
    def check(cls, params: dict[str, Any]) -> None:
        if "pattern" in params:
            return  # topics may come later; the job lists them every round
        check_topic(params["topic"])

    @classmethod
    def warning(cls, event_type: str, params: dict[str, Any], log_dir: str) -> str | None:
        """The line a job reading Kafka with ``isolation.level=read_uncommitted`` prints at start (the default,
        ``read_committed``, says nothing): records of aborted transactions are then written too."""
        from event_etl.settings import current_settings

        level = str(current_settings().kafka_config().get("isolation.level", "read_committed")).strip().lower()
        if level != "read_uncommitted":
            return None
        return (f"[{event_type}] warning: the job reads Kafka with isolation.level=read_uncommitted (from "
                "EVENT_ETL_KAFKA_PROPERTIES): records of aborted transactions are written too, and records of open "
                "ones before they commit; fix: remove isolation.level from the properties file to read committed "
                "records only (read_committed, the default)")
