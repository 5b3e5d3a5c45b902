"""Metrics of a job (OpenTelemetry).  Placeholder: see issue 5; ``job_metrics`` returns no listener yet."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["job_metrics"]


class JobMetrics:
    """What the runner needs from the metrics layer: controller listeners and a shutdown."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[str, Any], None]] = []

    def observe_progress(self, progress: dict | None) -> None:
        """Called by the runner between batches with Spark's ``query.lastProgress`` (or None)."""

    def shutdown(self) -> None:
        pass


def job_metrics(event_type, options, *, clock: Callable[[], int], controller_state: Callable[[], Any] | None = None,
                backlog: Callable[[], dict | None] | None = None) -> JobMetrics:
    """Metrics for one job run, configured from ``options`` (``metrics_port``, ``metrics_host``, ``otlp_endpoint``)."""
    return JobMetrics()
