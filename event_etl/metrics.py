"""Metrics of a job: OpenTelemetry instruments, a Prometheus endpoint, OTLP, and a local history.

Every metric is listed once, in :data:`METRICS` (name, type, unit, attributes, meaning);
``monitoring/README.md`` shows the same table and a test keeps the two, the dashboard and
the alert rules in step with it.  Every series carries the attribute ``event_type``.

Exactly once, across Spark's driver and executors
-------------------------------------------------
Executor tasks count what they do (events by outcome, dead-letter reasons, files, bytes,
event delays) and return the counts inside their split's report, the small JSON row that
``collect()`` brings back to the driver; Spark keeps the rows of exactly one successful
attempt of every task.  The driver's :class:`~event_etl.driver.Controller` adds up the
reports of a batch and, once the batch is durable, emits one ``("batch", BatchEvent)``.
:class:`JobMetrics` records from that event only, on the driver, so each batch's counts
reach the exporters exactly once per process; nothing is ever recorded on an executor.

Counters are per process and start at 0 (Prometheus' ``rate``/``increase`` handle the
reset of a restart).  A batch that Spark replays after a crash is counted by the new
process; if the process that died had already emitted it, that batch is counted twice
across the two processes.  Replays are rare and visible: ``event_etl_batches_total``
has ``replayed="true"`` for them.

The event-delay histogram: bucketed on executors
------------------------------------------------
Recording millions of delays one by one on the driver would cost more than the batch.
Executors bucket them instead (bounds :data:`event_etl.executor.DELAY_BUCKETS_S`, plus
an overflow bucket) and report the counts and the sum.  The OpenTelemetry API has no
call that records a pre-aggregated histogram, and its SDK's aggregation state is
private, so :class:`PreBucketedHistogram` keeps the cumulative counts itself and
publishes them as what they are, a cumulative explicit-bucket histogram: to Prometheus
through its own collector in the job's registry (``_bucket{le=...}``, ``_sum``,
``_count``, exactly like the SDK's histograms next to it), and to OTLP as an OpenTelemetry
``Histogram`` data point (public data-model classes) added to every export.  Its
minimum and maximum are unknown and left out.

Exporters
---------
- Prometheus (``--metrics-port``): a registry and an HTTP server of the job's own, on
  ``--metrics-host`` (127.0.0.1 unless told otherwise); port 0 takes any free port.
  The URL is printed on startup.
- OTLP over HTTP (``--otlp-endpoint``), pushed every ``OTEL_METRIC_EXPORT_INTERVAL`` ms
  (default 60 s) and once more at shutdown.
- ``--metrics-history FILE``: one JSON line per batch, per marker and (at most once a
  minute) per idle advance of the watermark, for ``event-etl graphs`` without Prometheus.

With none of them nothing is exported.  Each job has its own ``MeterProvider``, shut
down with the job: no global OpenTelemetry or prometheus_client state is touched, so
many jobs can run one after another (or side by side) in one process.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import (
    Counter,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from event_etl import __version__
from event_etl.errors import EventEtlError, UsageError
from event_etl.executor import DELAY_BUCKETS_S
from event_etl.rules.judge import Outcome
from event_etl.rules.reasons import Reason
from event_etl.timeutil import HOUR_MS, iso

__all__ = [
    "METRICS",
    "MetricSpec",
    "OUTCOMES",
    "BATCH_DURATION_BUCKETS_S",
    "MARKER_DELAY_BUCKETS_S",
    "HISTORY_VERSION",
    "JobMetrics",
    "PreBucketedHistogram",
    "PrometheusEndpoint",
    "OtlpExport",
    "MetricsHistory",
    "MetricKind",
    "RENAMED",
    "ENV_OLD_NAMES",
    "ENV_JOB",
    "backlog_from_progress",
    "exported_series",
    "marker_pending_ms",
    "job_metrics",
]

_log = logging.getLogger(__name__)

OUTCOMES = tuple(o.value for o in Outcome) + ("invalid", "duplicate")
"""Every value of the ``outcome`` attribute; each is exported from the start (0 until it happens)."""

BATCH_DURATION_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Micro-batch duration buckets: sub-second resolution where batches of a live job fall."""

MARKER_DELAY_BUCKETS_S = (30, 60, 120, 180, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
"""Marker delay buckets: a marker is normally due out_of_orderness (+ idle_timeout) after its hour."""

from event_etl.graphs import HISTORY_VERSION  # noqa: E402 - the format graphs reads (graphs needs no OpenTelemetry)
_HISTORY_IDLE_EVERY_MS = 60_000
_SCOPE = "event_etl"


class MetricKind(str, enum.Enum):
    """How a metric aggregates (and so which series a scrape shows)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: its names, type, unit, attributes and meaning.

    ``name`` is the name as it appears in PromQL (counters with ``_total``, histograms
    without their ``_bucket``/``_sum``/``_count`` suffixes); ``otel_name`` and ``unit``
    (UCUM) are what OTLP receivers see.
    """

    name: str
    otel_name: str
    kind: MetricKind
    unit: str
    attributes: tuple[str, ...]
    description: str
    replaced_by: str | None = None
    """For a name kept for one release after a rename: the new metric's name."""

    @property
    def series(self) -> tuple[str, ...]:
        """The names of the series a Prometheus scrape shows for this metric."""
        if self.kind is MetricKind.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


_ET = ("event_type",)

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("event_etl_events_total", "event_etl.events", MetricKind.COUNTER, "{event}", ("event_type", "outcome"),
               "Events read, by outcome: timely, late, too_late, future, invalid, duplicate."),
    MetricSpec("event_etl_deadletter_records_total", "event_etl.deadletter.records", MetricKind.COUNTER, "{record}",
               ("event_type", "reason"), "Records written to the dead-letter area, by reason."),
    MetricSpec("event_etl_written_files_total", "event_etl.written.files", MetricKind.COUNTER, "{file}", _ET,
               "Avro data files written into hour folders."),
    MetricSpec("event_etl_written_bytes_total", "event_etl.written.bytes", MetricKind.COUNTER, "By", _ET,
               "Bytes of the Avro data files written."),
    MetricSpec("event_etl_merged_files_total", "event_etl.merged.files", MetricKind.COUNTER, "{file}", _ET,
               "Small data files merged into larger ones and deleted (files in hour folders: written minus merged)."),
    MetricSpec("event_etl_merged_bytes_total", "event_etl.merged.bytes", MetricKind.COUNTER, "By", _ET,
               "Bytes of the small data files merged and deleted."),
    MetricSpec("event_etl_batches_total", "event_etl.batches", MetricKind.COUNTER, "{batch}", ("event_type", "replayed"),
               "Micro-batches finished; replayed=\"true\" for a batch Spark replayed after a restart."),
    MetricSpec("event_etl_markers_written_total", "event_etl.markers.written", MetricKind.COUNTER, "{marker}", _ET,
               "_COMPLETE markers written: hours closed."),
    MetricSpec("event_etl_batch_duration_seconds", "event_etl.batch.duration", MetricKind.HISTOGRAM, "s", _ET,
               "Wall time of a micro-batch, from its intent to its saved state (first attempts only)."),
    MetricSpec("event_etl_event_delay_seconds", "event_etl.event.delay", MetricKind.HISTOGRAM, "s", _ET,
               "Arrival minus event time of the events written (timely and late); bucketed on executors."),
    MetricSpec("event_etl_marker_delay_seconds", "event_etl.marker.delay", MetricKind.HISTOGRAM, "s", _ET,
               "When a _COMPLETE marker was written minus the end of its hour (0 if before it)."),
    MetricSpec("event_etl_watermark_timestamp_seconds", "event_etl.watermark.timestamp", MetricKind.GAUGE, "s", _ET,
               "The watermark, a time in seconds since the epoch (absent before the first event)."),
    MetricSpec("event_etl_watermark_lag_seconds", "event_etl.watermark.lag", MetricKind.GAUGE, "s", _ET,
               "Now minus the watermark, computed when scraped."),
    MetricSpec("event_etl_last_batch_timestamp_seconds", "event_etl.last_batch.timestamp", MetricKind.GAUGE, "s", _ET,
               "When the last micro-batch finished, in seconds since the epoch (absent before the first)."),
    MetricSpec("event_etl_heartbeat_timestamp_seconds", "event_etl.heartbeat.timestamp", MetricKind.GAUGE, "s", _ET,
               "The job's last sign of progress: a finished micro-batch or an idle advance of the watermark "
               "(the job's start until then)."),
    MetricSpec("event_etl_marker_pending_seconds", "event_etl.marker.pending", MetricKind.GAUGE, "s", _ET,
               "How long ago the oldest hour without a _COMPLETE marker ended (0 while it runs; absent before data)."),
    MetricSpec("event_etl_input_backlog_files", "event_etl.input.backlog.files", MetricKind.GAUGE, "{file}", _ET,
               "Input files available but not yet read (directory source; absent where the source does not tell)."),
    MetricSpec("event_etl_input_backlog_events", "event_etl.input.backlog.events", MetricKind.GAUGE, "{event}", _ET,
               "Input events available but not yet read (generator; absent where the source does not tell)."),
)

ENV_OLD_NAMES = "EVENT_ETL_METRICS_OLD_NAMES"
"""``0``: do not export the names of :data:`RENAMED` (exported by default in this release, dropped in the next)."""

RENAMED: tuple[MetricSpec, ...] = (
    MetricSpec("event_etl_watermark_seconds", "event_etl.watermark", MetricKind.GAUGE, "s", _ET,
               "Old name of event_etl_watermark_timestamp_seconds (a time, not a duration).",
               replaced_by="event_etl_watermark_timestamp_seconds"),
    MetricSpec("event_etl_hours_completed_total", "event_etl.hours.completed", MetricKind.COUNTER, "{hour}", _ET,
               "Old name of event_etl_markers_written_total (promtool check metrics flags 'hours' as a non-base unit).",
               replaced_by="event_etl_markers_written_total"),
    MetricSpec("event_etl_input_backlog", "event_etl.input.backlog", MetricKind.GAUGE, "{item}", ("event_type", "unit"),
               "Old form of event_etl_input_backlog_files and event_etl_input_backlog_events (one metric, two units).",
               replaced_by="event_etl_input_backlog_files, event_etl_input_backlog_events"),
)
"""Metrics renamed in release 0.2: still exported under their old names for one release (dashboards and
alerts of 0.1 keep working), unless ``EVENT_ETL_METRICS_OLD_NAMES=0``."""

ENV_JOB = "EVENT_ETL_METRICS_JOB"
"""The ``service.name`` of the metrics (default ``event_etl``): the ``job`` label OTLP receivers give them."""


def old_names_exported() -> bool:
    return os.environ.get(ENV_OLD_NAMES, "1").strip().lower() not in ("0", "false", "no", "off")

_SPEC = {m.otel_name: m for m in METRICS + RENAMED}


def exported_series() -> frozenset[str]:
    """Every series name a job's Prometheus endpoint can show (what dashboards and alerts may use)."""
    return frozenset(s for m in METRICS for s in m.series)


def _now_ns() -> int:
    return time.time_ns()


# -- the pre-bucketed histogram ------------------------------------------------------------------
class PreBucketedHistogram:
    """A cumulative explicit-bucket histogram fed with counts bucketed elsewhere (see the module docstring).

    ``bounds`` are upper bounds (``le``) in the metric's unit; ``add`` takes one count per
    bound plus the overflow bucket, and the sum of the values.  Thread-safe: batches add
    on the driver's batch thread while scrapes read on the HTTP server's.
    """

    def __init__(self, spec: MetricSpec, bounds: Sequence[float], attributes: dict[str, str]) -> None:
        self.spec = spec
        self.bounds = tuple(float(b) for b in bounds)
        self.attributes = dict(attributes)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.start_ns = _now_ns()
        self._lock = threading.Lock()

    def add(self, counts: Sequence[int], total: float) -> None:
        if not counts or not any(counts):
            return
        if len(counts) != len(self.counts):
            raise ValueError(
                f"{self.spec.name}: got {len(counts)} bucket counts, expected {len(self.counts)} "
                f"({len(self.bounds)} bounds and the overflow bucket)"
            )
        with self._lock:
            for i, n in enumerate(counts):
                self.counts[i] += int(n)
            self.sum += total

    def snapshot(self) -> tuple[tuple[int, ...], float]:
        """Per-bucket counts (not cumulative; last = overflow) and the sum."""
        with self._lock:
            return tuple(self.counts), self.sum

    def prometheus_family(self):
        """The histogram as prometheus_client shows it: ``_bucket{le}`` (cumulative), ``_sum``, ``_count``."""
        from prometheus_client.core import HistogramMetricFamily

        counts, total = self.snapshot()
        labels = sorted(self.attributes)
        fam = HistogramMetricFamily(self.spec.name, self.spec.description, labels=labels)
        cumulative, buckets = 0, []
        for bound, n in zip((*self.bounds, float("inf")), counts):
            cumulative += n
            buckets.append((_le(bound), cumulative))
        fam.add_metric([self.attributes[k] for k in labels], buckets=buckets, sum_value=total)
        return fam

    def otel_metric(self) -> Metric:
        """The histogram as an OpenTelemetry cumulative ``Histogram`` metric (min and max unknown)."""
        counts, total = self.snapshot()
        point = HistogramDataPoint(
            attributes=dict(self.attributes), start_time_unix_nano=self.start_ns, time_unix_nano=_now_ns(),
            count=sum(counts), sum=total, bucket_counts=list(counts), explicit_bounds=list(self.bounds),
            min=None, max=None,
        )
        return Metric(name=self.spec.otel_name, description=self.spec.description, unit=self.spec.unit,
                      data=HistogramData(data_points=[point],
                                         aggregation_temporality=AggregationTemporality.CUMULATIVE))


def _le(bound: float) -> str:
    """An ``le`` label as the SDK's histograms and Go clients write it: ``1``, ``0.25``, ``+Inf``."""
    if bound == float("inf"):
        return "+Inf"
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


class _PreBucketedCollector:
    """A prometheus_client collector for the pre-bucketed histograms of one job."""

    def __init__(self, histograms: Sequence[PreBucketedHistogram]) -> None:
        self.histograms = histograms

    def describe(self):
        return []  # names are not known ahead to prometheus_client; nothing collides in a job's own registry

    def collect(self):
        for h in self.histograms:
            yield h.prometheus_family()


_CUMULATIVE = {
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

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        return self.inner.export(_add_metrics(metrics_data, [h.otel_metric() for h in self.histograms]),
                                 timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _add_metrics(data: MetricsData, extra: list[Metric]) -> MetricsData:
    """``data`` with ``extra`` added to the job's scope of its first resource (OTLP encoders key scopes by name)."""
    if not extra or not data.resource_metrics:
        return data
    first, *rest = data.resource_metrics
    scopes = list(first.scope_metrics)
    for i, sm in enumerate(scopes):
        if sm.scope.name == _SCOPE:
            scopes[i] = ScopeMetrics(scope=sm.scope, metrics=[*sm.metrics, *extra], schema_url=sm.schema_url)
            break
    else:
        scopes.append(ScopeMetrics(scope=InstrumentationScope(_SCOPE, __version__), metrics=extra, schema_url=""))
    first = ResourceMetrics(resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url)
    return MetricsData(resource_metrics=[first, *rest])


# -- exporters -----------------------------------------------------------------------------------
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
        self._server = None
        self._thread = None

    def open(self, histograms: Sequence[PreBucketedHistogram]) -> MetricReader:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        params = inspect.signature(PrometheusMetricReader.__init__).parameters
        if "registry" not in params or "scope_info_enabled" not in params:
            raise EventEtlError(
                "the installed opentelemetry-exporter-prometheus is too old: it cannot export to a registry of the job's own",
                fix="pip install -U 'opentelemetry-exporter-prometheus>=0.64b0' (or re-run bin/test or bin/event-etl)",
            )
        reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        self.registry.register(_PreBucketedCollector(histograms))
        if self.port is not None:
            try:
                self.serve()
            except UsageError:
                reader.shutdown()
                raise
        return reader

    def serve(self) -> None:
        """Serve the registry over HTTP on host:port (port 0: any free port; :attr:`url` tells which)."""
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        except OSError as err:
            raise UsageError(
                f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port}: {err.strerror or err}",
                fix="choose another port (each job needs its own), or --metrics-port 0 for any free port",
            ) from err
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self.url = f"http://{host}:{self._server.server_address[1]}/metrics"

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
        return PeriodicExportingMetricReader(_WithPreBucketed(inner, histograms), export_interval_millis=self.interval_ms)

    def close(self) -> None:
        pass


class MetricsHistory:
    """Appends one JSON object per line to a local file (the format :mod:`event_etl.graphs` reads).

    Lines (``"v": 1``), each with ``kind``, ``event_type``, ``t`` (seconds since the epoch)
    and ``time`` (ISO UTC):

    - ``batch``: ``batch_id``, ``replayed``, ``duration_seconds``, ``events`` (by outcome),
      ``deadletter`` (by reason), ``files``, ``bytes``, ``delay`` (``bounds``, per-bucket
      ``counts`` with the overflow last, ``sum_seconds``), ``watermark``,
      ``watermark_lag_seconds``, ``marked``: the batch's own figures, not totals;
    - ``marker``: ``hour``, ``hour_end`` (seconds), ``marker_delay_seconds``, ``records``,
      ``late_records``, ``files``;
    - ``watermark``: ``watermark``, ``watermark_lag_seconds``, ``why`` (``idle`` or ``drain``).
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--metrics-history {path}: cannot append to it: {err.strerror or err}",
                             fix="give a file in a folder you can write to") from err
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"v": HISTORY_VERSION, **record}, separators=(",", ":"))
        with self._lock:
            if self._fh is not None:
                self._fh.write(line + "\n")
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


# -- backlog -------------------------------------------------------------------------------------
def _offset(value: Any) -> dict | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


_OFFSET_UNITS = (("files", "files"), ("n", "events"))  # directory {"files": n}; generator {"n": n, ...}


def backlog_from_progress(progress: Any) -> dict[str, int] | None:
    """Input not yet read, from Spark's ``query.lastProgress``: ``latestOffset - endOffset`` of its source.

    Returns ``{"files": n}`` or ``{"events": n}``, or ``None`` where the source does not tell
    (no progress yet, no ``latestOffset``, or offsets of another shape).
    """
    if not progress:
        return None
    try:
        sources = progress["sources"]
    except (KeyError, TypeError):
        return None
    if not sources:
        return None
    src = sources[0]
    end, latest = _offset(src.get("endOffset")), _offset(src.get("latestOffset"))
    if end is None or latest is None:
        return None
    for key, unit in _OFFSET_UNITS:
        if key in end and key in latest:
            try:
                return {unit: max(0, int(latest[key]) - int(end[key]))}
            except (TypeError, ValueError):
                return None
    return None


# -- the job's metrics ---------------------------------------------------------------------------
class JobMetrics:
    """The metrics of one job run: a listener for its controller, gauges read at collection time.

    ``exports`` are :class:`PrometheusEndpoint` / :class:`OtlpExport` objects (none: nothing
    leaves the process); ``history`` a :class:`MetricsHistory`.  ``clock`` gives wall time
    in ms; ``controller_state`` the controller's current
    :class:`~event_etl.rules.watermark.WatermarkState` (else the last one a listener event
    carried); ``backlog`` a callable returning ``{unit: amount}`` that overrides what
    :meth:`observe_progress` derives.
    """

    def __init__(
        self,
        event_type: str,
        *,
        clock: Callable[[], int],
        controller_state: Callable[[], Any] | None = None,
        backlog: Callable[[], dict | None] | None = None,
        exports: Sequence[PrometheusEndpoint | OtlpExport] = (),
        history: MetricsHistory | None = None,
    ) -> None:
        self.event_type = event_type
        self.clock = clock
        self._controller_state = controller_state
        self._backlog_fn = backlog
        self.exports = list(exports)
        self.history = history
        self.attrs = {"event_type": event_type}
        self.started_at = clock()
        self.last_batch_at: int | None = None
        self.heartbeat_at = self.started_at
        self._state = None
        self._backlog: dict[str, int] | None = None
        self._last_history_watermark_at: int | None = None
        self._closed = False
        self.errors = 0
        self.delay = PreBucketedHistogram(_SPEC["event_etl.event.delay"], DELAY_BUCKETS_S, self.attrs)
        readers: list[MetricReader] = []
        try:
            for e in self.exports:
                readers.append(e.open([self.delay]))
            self.provider = MeterProvider(
                resource=Resource.create({"service.name": os.environ.get(ENV_JOB) or "event_etl", "service.version": __version__,
                                          "event_etl.event_type": event_type}),
                metric_readers=readers,
                views=[
                    View(instrument_name="event_etl.batch.duration",
                         aggregation=ExplicitBucketHistogramAggregation(BATCH_DURATION_BUCKETS_S)),
                    View(instrument_name="event_etl.marker.delay",
                         aggregation=ExplicitBucketHistogramAggregation(MARKER_DELAY_BUCKETS_S)),
                ],
                shutdown_on_exit=False,  # shutdown() does it; an atexit hook would keep every job's provider alive
            )
        except BaseException:
            for r in readers:
                r.shutdown()
            for e in self.exports:
                e.close()
            raise
        self._instruments()
        self.listeners: list[Callable[[str, Any], None]] = [self._on_event]

    # -- instruments ---------------------------------------------------------------------------
    def _instruments(self) -> None:
        meter = self.provider.get_meter(_SCOPE, __version__)

        def spec(name: str) -> dict[str, str]:
            s = _SPEC[name]
            return {"name": s.otel_name, "unit": s.unit, "description": s.description}

        self.events = meter.create_counter(**spec("event_etl.events"))
        self.deadletter = meter.create_counter(**spec("event_etl.deadletter.records"))
        self.files = meter.create_counter(**spec("event_etl.written.files"))
        self.bytes = meter.create_counter(**spec("event_etl.written.bytes"))
        self.merged_files = meter.create_counter(**spec("event_etl.merged.files"))
        self.merged_bytes = meter.create_counter(**spec("event_etl.merged.bytes"))
        self.merged_files.add(0, self.attrs)  # exported from the start: 0 until a merge happens
        self.merged_bytes.add(0, self.attrs)
        self.batches = meter.create_counter(**spec("event_etl.batches"))
        self.hours = meter.create_counter(**spec("event_etl.markers.written"))
        self.old_names = old_names_exported()
        self.hours_old = meter.create_counter(**spec("event_etl.hours.completed")) if self.old_names else None
        self.batch_duration = meter.create_histogram(**spec("event_etl.batch.duration"))
        self.marker_delay = meter.create_histogram(**spec("event_etl.marker.delay"))
        gauges = {
            "event_etl.watermark.timestamp": self._observe_watermark,
            "event_etl.watermark.lag": self._observe_lag,
            "event_etl.last_batch.timestamp": self._observe_last_batch,
            "event_etl.heartbeat.timestamp": self._observe_heartbeat,
            "event_etl.marker.pending": self._observe_marker_pending,
            "event_etl.input.backlog.files": lambda o: self._observe_backlog_unit("files"),
            "event_etl.input.backlog.events": lambda o: self._observe_backlog_unit("events"),
        }
        if self.old_names:
            gauges["event_etl.watermark"] = self._observe_watermark
            gauges["event_etl.input.backlog"] = self._observe_backlog
        for name, fn in gauges.items():
            meter.create_observable_gauge(callbacks=[fn], **spec(name))
        # Every series exists from the start, so that rate() sees the first increase and
        # dashboards and alerts find 0 rather than nothing.
        for o in OUTCOMES:
            self.events.add(0, {**self.attrs, "outcome": o})
        for r in Reason:
            self.deadletter.add(0, {**self.attrs, "reason": r.value})
        for flag in ("false", "true"):
            self.batches.add(0, {**self.attrs, "replayed": flag})
        for c in (self.files, self.bytes, self.hours, self.hours_old):
            if c is not None:
                c.add(0, self.attrs)

    # -- gauges, computed when collected -------------------------------------------------------
    def state(self):
        """The watermark state now: the controller's, else the last one an event carried."""
        if self._controller_state is not None:
            return self._controller_state()
        return self._state

    def _watermark(self) -> int | None:
        st = self.state()
        return None if st is None else st.watermark

    def _observe_watermark(self, _options: CallbackOptions) -> Iterable[Observation]:
        wm = self._watermark()
        return [] if wm is None else [Observation(wm / 1000.0, self.attrs)]

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        wm = self._watermark()
        return [] if wm is None else [Observation((self.clock() - wm) / 1000.0, self.attrs)]

    def _observe_last_batch(self, _options: CallbackOptions) -> Iterable[Observation]:
        t = self.last_batch_at
        return [] if t is None else [Observation(t / 1000.0, self.attrs)]

    def _observe_heartbeat(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.heartbeat_at / 1000.0, self.attrs)]

    def _observe_marker_pending(self, _options: CallbackOptions) -> Iterable[Observation]:
        pending = marker_pending_ms(self.state(), self.clock())
        return [] if pending is None else [Observation(pending / 1000.0, self.attrs)]

    def _backlog_now(self) -> dict[str, int]:
        return (self._backlog_fn() if self._backlog_fn is not None else self._backlog) or {}

    def _observe_backlog(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(v, {**self.attrs, "unit": u}) for u, v in sorted(self._backlog_now().items())]

    def _observe_backlog_unit(self, unit: str) -> Iterable[Observation]:
        v = self._backlog_now().get(unit)
        return [] if v is None else [Observation(v, self.attrs)]

    # -- listener ------------------------------------------------------------------------------
    def _on_event(self, kind: str, payload: Any) -> None:
        """Controller listener.  A metrics failure is logged, never allowed to fail the job."""
        try:
            if kind == "batch":
                self._on_batch(payload)
            elif kind == "marker":
                self._on_marker(payload)
            elif kind in ("idle", "drain"):
                self._on_watermark(kind, payload)
            elif kind == "merged":
                self._on_merged(payload)
        except Exception:  # noqa: BLE001 - the data is safe; the numbers are not worth a failed batch
            self.errors += 1
            if self.errors <= 3:
                _log.exception("event_etl metrics: could not record a %s event of %s", kind, self.event_type)

    def _on_merged(self, m) -> None:
        self.files.add(m.files_written, self.attrs)
        self.bytes.add(m.bytes_written, self.attrs)
        self.merged_files.add(m.files_merged, self.attrs)
        self.merged_bytes.add(m.bytes_merged, self.attrs)

    def _on_batch(self, ev) -> None:
        r = ev.result
        now = self.clock()
        self._state = ev.state
        for outcome in sorted({*OUTCOMES, *r.counts}):
            n = int(r.counts.get(outcome, 0))
            if n:
                self.events.add(n, {**self.attrs, "outcome": outcome})
        for reason, n in sorted(r.reasons.items()):
            if n:
                self.deadletter.add(int(n), {**self.attrs, "reason": reason})
        self.files.add(r.files_written, self.attrs)
        self.bytes.add(r.bytes_written, self.attrs)
        self.batches.add(1, {**self.attrs, "replayed": "true" if ev.replayed else "false"})
        duration_s = max(0, ev.finished_at - ev.started_at) / 1000.0
        if not ev.replayed:  # a replay's started_at is its first attempt's, before the restart
            self.batch_duration.record(duration_s, self.attrs)
        # Events stamped slightly ahead of their arrival have negative delays; a negative batch
        # sum would make _sum go down, which Prometheus takes for a counter reset.
        delay_sum_s = max(0, int(r.delay_sum_ms or 0)) / 1000.0
        if r.delay_buckets:
            self.delay.add(r.delay_buckets, delay_sum_s)
        self.last_batch_at = ev.finished_at
        self.heartbeat_at = max(self.heartbeat_at, ev.finished_at)
        if self.history is not None:
            wm = ev.state.watermark
            self.history.write({
                "kind": "batch", "event_type": self.event_type, "t": now / 1000.0, "time": iso(now),
                "batch_id": ev.batch_id, "replayed": bool(ev.replayed), "duration_seconds": duration_s,
                "events": {o: int(r.counts.get(o, 0)) for o in sorted({*OUTCOMES, *r.counts})},
                "deadletter": {k: int(v) for k, v in sorted(r.reasons.items()) if v},
                "files": r.files_written, "bytes": r.bytes_written,
                "delay": {"bounds": list(DELAY_BUCKETS_S), "counts": list(r.delay_buckets or []),
                          "sum_seconds": delay_sum_s},
                "watermark": None if wm is None else wm / 1000.0,
                "watermark_lag_seconds": None if wm is None else (now - wm) / 1000.0,
                "marked": len(ev.marked),
            })

    def _on_marker(self, m) -> None:
        self.hours.add(1, self.attrs)
        if self.hours_old is not None:
            self.hours_old.add(1, self.attrs)
        delay_ms = m.marker_delay_ms
        self.marker_delay.record(max(0, delay_ms) / 1000.0, self.attrs)  # OpenTelemetry histograms take no negatives
        if self.history is not None:
            now = self.clock()
            self.history.write({
                "kind": "marker", "event_type": self.event_type, "t": m.completed_at / 1000.0,
                "time": iso(m.completed_at), "hour": iso(m.hour), "hour_end": (m.hour + HOUR_MS) / 1000.0,
                "marker_delay_seconds": delay_ms / 1000.0, "records": m.records, "late_records": m.late_records,
                "files": len(m.files), "written_at": now / 1000.0,
            })

    def _on_watermark(self, why: str, state) -> None:
        now = self.clock()
        self._state = state
        if why == "idle":
            self.heartbeat_at = max(self.heartbeat_at, now)
        if self.history is None or state.watermark is None:
            return
        last = self._last_history_watermark_at
        if why == "idle" and last is not None and now - last < _HISTORY_IDLE_EVERY_MS:
            return  # idle ticks come every second; a line a minute draws the same graph
        self._last_history_watermark_at = now
        self.history.write({
            "kind": "watermark", "event_type": self.event_type, "t": now / 1000.0, "time": iso(now), "why": why,
            "watermark": state.watermark / 1000.0, "watermark_lag_seconds": (now - state.watermark) / 1000.0,
        })

    # -- the runner's hooks --------------------------------------------------------------------
    def observe_progress(self, progress: Any) -> None:
        """Called by the runner between batches with Spark's ``query.lastProgress`` (or None)."""
        if progress is None:
            return
        try:
            self._backlog = backlog_from_progress(progress)
        except Exception:  # noqa: BLE001 - an unexpected progress shape must not stop the job
            _log.debug("event_etl metrics: unreadable progress", exc_info=True)
            self._backlog = None

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.exports if e.url]

    def prometheus_text(self) -> str:
        """What the job's Prometheus endpoint shows now (needs a :class:`PrometheusEndpoint` export)."""
        for e in self.exports:
            if isinstance(e, PrometheusEndpoint):
                return e.text()
        raise EventEtlError("this job has no Prometheus export", fix="run it with --metrics-port")

    def shutdown(self) -> None:
        """Flush pushes (OTLP), stop serving, close the history.  Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.provider.shutdown()
        finally:
            for e in self.exports:
                e.close()
            if self.history is not None:
                self.history.close()


def marker_pending_ms(state: Any, now: int) -> int | None:
    """How long ago the oldest hour without a marker ended (0 while it runs); None before any data."""
    if state is None:
        return None
    if state.marked_through is not None:
        oldest = state.marked_through + HOUR_MS
    elif state.first_hour is not None:
        oldest = state.first_hour
    else:
        return None
    return max(0, now - (oldest + HOUR_MS))


def job_metrics(event_type, options, *, clock: Callable[[], int], controller_state: Callable[[], Any] | None = None,
                backlog: Callable[[], dict | None] | None = None, serve: bool = True) -> JobMetrics:
    """Metrics for one job run, configured from ``options`` (``metrics_port``, ``metrics_host``,
    ``otlp_endpoint``, ``metrics_history``); prints where the Prometheus endpoint listens.

    ``serve=False`` keeps the Prometheus registry but serves nothing: a :class:`FleetEndpoint`
    serves the registries of several jobs on one port."""
    name = getattr(event_type, "name", event_type)
    exports: list[PrometheusEndpoint | OtlpExport] = []
    if getattr(options, "metrics_port", None) is not None:
        exports.append(PrometheusEndpoint(host=getattr(options, "metrics_host", None) or "127.0.0.1",
                                          port=options.metrics_port if serve else None))
    if getattr(options, "otlp_endpoint", None):
        exports.append(OtlpExport(options.otlp_endpoint))
    history_path = getattr(options, "metrics_history", None)
    history = MetricsHistory(history_path) if history_path else None
    try:
        metrics = JobMetrics(name, clock=clock, controller_state=controller_state, backlog=backlog, exports=exports,
                             history=history)
    except BaseException:
        if history is not None:
            history.close()
        raise
    for e in exports:
        if e.url:
            what = "Prometheus metrics" if isinstance(e, PrometheusEndpoint) else "OTLP metrics to"
            print(f"[{name}] {what} {e.url}", file=sys.stdout, flush=True)
    return metrics


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
