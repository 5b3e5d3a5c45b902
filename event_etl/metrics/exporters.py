"""Where a job's metrics go: its own Prometheus registry and endpoint, or OTLP over HTTP.

- Prometheus (``--metrics-port``): a registry and an HTTP server of the job's own, on
  ``--metrics-host`` (127.0.0.1 unless told otherwise); port 0 takes any free port.
  The URL is printed on startup.
- OTLP over HTTP (``--otlp-endpoint``), pushed every ``OTEL_METRIC_EXPORT_INTERVAL`` ms
  (default 60 s) and once more at shutdown.

Both carry the pre-bucketed histograms (:mod:`event_etl.metrics.histograms`) next to the
SDK's instruments.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics import (
    Counter,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from event_etl import __version__
from event_etl.errors import EventEtlError, UsageError
from event_etl.metrics.histograms import PreBucketedCollector, PreBucketedHistogram
from event_etl.metrics.spec import SCOPE

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = ["PrometheusEndpoint", "OtlpExport"]

_CUMULATIVE: dict[type, AggregationTemporality] = {
    Counter: AggregationTemporality.CUMULATIVE,
    UpDownCounter: AggregationTemporality.CUMULATIVE,
    HistogramInstrument: AggregationTemporality.CUMULATIVE,
    ObservableCounter: AggregationTemporality.CUMULATIVE,
    ObservableUpDownCounter: AggregationTemporality.CUMULATIVE,
    ObservableGauge: AggregationTemporality.CUMULATIVE,
}


class _WithPreBucketed(MetricExporter):
    """Wraps a push exporter: every export also carries the job's pre-bucketed histograms."""

    def __init__(self, inner: MetricExporter, histograms: Sequence[PreBucketedHistogram]) -> None:
        super().__init__(preferred_temporality=_CUMULATIVE)
        self.inner = inner
        self.histograms = histograms

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        return self.inner.export(_add_metrics(metrics_data, [h.otel_metric() for h in self.histograms]),
                                 timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _add_metrics(data: MetricsData, extra: list[Metric]) -> MetricsData:
    """``data`` with ``extra`` added to the job's scope of its first resource (OTLP encoders key scopes by name)."""
    if not extra or not data.resource_metrics:
        return data
    first, *rest = data.resource_metrics
    scopes = list(first.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope.name == SCOPE:
            scopes[i] = ScopeMetrics(scope=sm.scope, metrics=[*sm.metrics, *extra], schema_url=sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(scope=InstrumentationScope(SCOPE, __version__), metrics=extra, schema_url=""))
    first = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
    return MetricsData(resource_metrics=[first, *rest])


class PrometheusEndpoint:
    """The job's own Prometheus registry (SDK instruments + pre-bucketed histograms), optionally served.

    ``port=None`` serves nothing: :meth:`text` still renders what a scrape would show
    (tests use that).  ``port=0`` takes any free port; :attr:`url` tells which.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.url: str | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def open(self, histograms: Sequence[PreBucketedHistogram]) -> MetricReader:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        params = inspect.signature(PrometheusMetricReader.__init__).parameters
        if "registry" not in params or "scope_info_enabled" not in params:
            raise EventEtlError(
                "the installed opentelemetry-exporter-prometheus is too old: it cannot export to a registry of the "
                "job's own",
                fix="pip install -U 'opentelemetry-exporter-prometheus>=0.64b0' (or re-run bin/test or bin/event-etl)",
            )
        reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        self.registry.register(PreBucketedCollector(histograms))
        if self.port is not None:
            try:
                self.serve()
            except UsageError:
                reader.shutdown()
                raise
        return reader

    def serve(self) -> None:
        """Serve the registry over HTTP on host:port (port 0, or None here: any free port; :attr:`url` tells which)."""
        from prometheus_client import start_http_server

        try:
            server, self._thread = start_http_server(self.port or 0, addr=self.host, registry=self.registry)
        except OSError as err:
            raise UsageError(
                f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port}: {err.strerror or err}",
                fix="choose another port (each job needs its own), or --metrics-port 0 for any free port",
            ) from err
        self._server = server
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self.url = f"http://{host}:{server.server_address[1]}/metrics"

    def text(self) -> str:
        """What a scrape returns now (Prometheus text format)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode("utf-8")

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class OtlpExport:
    """Push over OTLP/HTTP (protobuf) to ``endpoint``; ``http://host:4318`` gets ``/v1/metrics`` added."""

    def __init__(self, endpoint: str, *, interval_ms: float | None = None) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"--otlp-endpoint {endpoint!r} is not an http(s) URL",
                             fix="e.g. --otlp-endpoint http://127.0.0.1:4318 (OTLP over HTTP)")
        self.endpoint = endpoint if parts.path not in ("", "/") else endpoint.rstrip("/") + "/v1/metrics"
        self.interval_ms = interval_ms
        self.url = self.endpoint

    def open(self, histograms: Sequence[PreBucketedHistogram]) -> MetricReader:
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as err:
            raise EventEtlError("--otlp-endpoint needs opentelemetry-exporter-otlp-proto-http",
                                fix="pip install opentelemetry-exporter-otlp-proto-http") from err
        inner = OTLPMetricExporter(endpoint=self.endpoint, preferred_temporality=_CUMULATIVE)
        return PeriodicExportingMetricReader(
            _WithPreBucketed(inner, histograms), export_interval_millis=self.interval_ms
        )

    def close(self) -> None:
        pass
