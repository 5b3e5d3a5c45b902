"""The event-delay histogram, bucketed on executors (:class:`PreBucketedHistogram`).

Recording millions of delays one by one on the driver would cost more than the batch.
Executors bucket them instead (bounds :data:`event_etl.task.report.DELAY_BUCKETS_S`, plus
an overflow bucket) and report the counts and the sum.  The OpenTelemetry API has no
call that records a pre-aggregated histogram, and its SDK's aggregation state is
private, so :class:`PreBucketedHistogram` keeps the cumulative counts itself and
publishes them as what they are, a cumulative explicit-bucket histogram: to Prometheus
through its own collector in the job's registry (``_bucket{le=...}``, ``_sum``,
``_count``, exactly like the SDK's histograms next to it), and to OTLP as an OpenTelemetry
``Histogram`` data point (public data-model classes) added to every export.  Its
minimum and maximum are unknown and left out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.metrics.export import AggregationTemporality, HistogramDataPoint, Metric
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

from event_etl.metrics.spec import MetricSpec

if TYPE_CHECKING:
    from prometheus_client.core import HistogramMetricFamily

__all__ = ["PreBucketedHistogram", "PreBucketedCollector"]

def _now_ns() -> int:
    return time.time_ns()


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

    def prometheus_family(self) -> HistogramMetricFamily:
        """The histogram as prometheus_client shows it: ``_bucket{le}`` (cumulative), ``_sum``, ``_count``."""
        from prometheus_client.core import HistogramMetricFamily

        counts, total = self.snapshot()
        labels = sorted(self.attributes)
        fam = HistogramMetricFamily(self.spec.name, self.spec.description, labels=labels)
        cumulative = 0
        buckets: list[tuple[str, float]] = []
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
            # The data model's min and max are optional (OTLP leaves them out when unset); the SDK's dataclass
            # annotates them as float, yet its encoders skip None.
            min=None, max=None,  # type: ignore[arg-type]
        )
        return Metric(name=self.spec.otel_name, description=self.spec.description, unit=self.spec.unit,
                      data=HistogramData(data_points=[point],
                                         aggregation_temporality=AggregationTemporality.CUMULATIVE))


def _le(bound: float) -> str:
    """An ``le`` label as the SDK's histograms and Go clients write it: ``1``, ``0.25``, ``+Inf``."""
    if bound == float("inf"):
        return "+Inf"
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


class PreBucketedCollector:
    """A prometheus_client collector for the pre-bucketed histograms of one job."""

    def __init__(self, histograms: Sequence[PreBucketedHistogram]) -> None:
        self.histograms = histograms

    def describe(self) -> list[HistogramMetricFamily]:
        return []  # names are not known ahead to prometheus_client; nothing collides in a job's own registry

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for h in self.histograms:
            yield h.prometheus_family()
