"""One Prometheus endpoint for the jobs of a fleet, merging their registries."""

from __future__ import annotations

from typing import Any

from event_etl.metrics.exporters import PrometheusEndpoint
from event_etl.metrics.job import JobMetrics

__all__ = ["FleetEndpoint"]

class _MergedCollector:
    """The metric families of several job registries, merged by name (one HELP/TYPE per family)."""

    def __init__(self) -> None:
        self.registries: dict[int, Any] = {}

    def describe(self):
        return []

    def collect(self):
        families: dict[str, Any] = {}
        for registry in list(self.registries.values()):
            for fam in registry.collect():
                have = families.get(fam.name)
                if have is None:
                    families[fam.name] = fam
                else:
                    have.samples.extend(fam.samples)
        yield from families.values()


class FleetEndpoint(PrometheusEndpoint):
    """One Prometheus endpoint for the jobs of a fleet (each job's series carry its ``event_type``)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.merged = _MergedCollector()
        self.registry.register(self.merged)

    def add(self, metrics: JobMetrics) -> None:
        """Serve ``metrics`` (built with ``serve=False``), replacing the metrics of the same type."""
        for e in metrics.exports:
            if isinstance(e, PrometheusEndpoint):
                self.merged.registries[hash(metrics.event_type)] = e.registry
