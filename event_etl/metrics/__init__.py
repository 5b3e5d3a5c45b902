"""Metrics of a job: OpenTelemetry instruments, a Prometheus endpoint, OTLP, and a local history.

One module each:

- :mod:`~event_etl.metrics.spec`: the table of every metric (:data:`METRICS`), pure data;
- :mod:`~event_etl.metrics.histograms`: the event-delay histogram, bucketed on executors;
- :mod:`~event_etl.metrics.exporters`: the job's Prometheus endpoint, OTLP over HTTP;
- :mod:`~event_etl.metrics.history`: the ``--metrics-history`` file (written, and read by
  ``event-etl graphs``; no OpenTelemetry);
- :mod:`~event_etl.metrics.job`: :class:`JobMetrics`, what a job records, exactly once per batch;
- :mod:`~event_etl.metrics.fleet`: one endpoint for the jobs of a fleet.

The names below are importable from here as before (``from event_etl.metrics import
JobMetrics``); each is imported from its module on first use, so importing the package (or
the history alone) needs no OpenTelemetry.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "event_etl.metrics.spec": ("METRICS", "MetricSpec", "MetricKind", "RENAMED", "OUTCOMES", "BATCH_DURATION_BUCKETS_S",
                               "MARKER_DELAY_BUCKETS_S", "DELAY_BUCKETS_S", "ENV_OLD_NAMES", "ENV_JOB",
                               "old_names_exported", "exported_series", "BY_OTEL_NAME", "SCOPE"),
    "event_etl.metrics.histograms": ("PreBucketedHistogram", "PreBucketedCollector"),
    "event_etl.metrics.exporters": ("PrometheusEndpoint", "OtlpExport"),
    "event_etl.metrics.history": ("HISTORY_VERSION", "MetricsHistory", "read_history"),
    "event_etl.metrics.job": ("JobMetrics", "job_metrics", "backlog_from_progress", "marker_pending_ms"),
    "event_etl.metrics.fleet": ("FleetEndpoint",),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
