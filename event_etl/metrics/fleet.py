"""One Prometheus endpoint for the jobs of a fleet, merging their registries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from event_etl.metrics.exporters import PrometheusEndpoint
from event_etl.metrics.job import JobMetrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Metric

__all__ = ["FleetEndpoint"]

class _MergedCollector:
    """The metric families of several job registries, merged by name (one HELP/TYPE per family)."""

    def __init__(self) -> None:
        self.registries: dict[int, CollectorRegistry] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
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
