"""The table of every metric a job exports (pure data: no OpenTelemetry here).

Every metric is listed once, in :data:`METRICS` (name, type, unit, attributes, meaning);
``monitoring/README.md`` shows the same table and a test keeps the two, the dashboard and
the alert rules in step with it.  Every series carries the attribute ``event_type``.
:data:`RENAMED` are the names of release 0.1, still exported for one release.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from event_etl.rules.judge import OUTCOMES
from event_etl.settings import ENV_METRICS_JOB, ENV_METRICS_OLD_NAMES, current_settings
from event_etl.task.report import DELAY_BUCKETS_S

__all__ = ["METRICS", "MetricSpec", "MetricKind", "RENAMED", "BY_OTEL_NAME", "OUTCOMES", "SCOPE",
           "BATCH_DURATION_BUCKETS_S", "MARKER_DELAY_BUCKETS_S", "DELAY_BUCKETS_S", "ENV_OLD_NAMES", "ENV_JOB",
           "old_names_exported", "exported_series"]

SCOPE = "event_etl"
"""The instrumentation scope of the job's metrics."""

BATCH_DURATION_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30, 60, 120, 300, 600)
"""Micro-batch duration buckets: sub-second resolution where batches of a live job fall."""

MARKER_DELAY_BUCKETS_S = (30, 60, 120, 180, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
"""Marker delay buckets: a marker is normally due out_of_orderness (+ idle_timeout) after its hour."""

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
               "Events read, by outcome: timely, late, too_late, future, before_backfill, invalid, duplicate."),
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
    MetricSpec("event_etl_clock_steps_total", "event_etl.clock.steps", MetricKind.COUNTER, "{step}", _ET,
               "Steps of the wall clock seen by the job (a jump of more than 1 s against the monotonic clock, e.g. "
               "NTP correcting a wrong clock); idle time is measured on the monotonic clock, so a step moves nothing."),
    MetricSpec("event_etl_batches_total", "event_etl.batches", MetricKind.COUNTER, "{batch}",
               ("event_type", "replayed"),
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
    MetricSpec("event_etl_input_lost_records_total", "event_etl.input.lost.records", MetricKind.COUNTER, "{record}",
               _ET, "Input records the source deleted before the job read them, skipped (Kafka: retention passed the "
               "checkpoint's offset, EVENT_ETL_KAFKA_ON_DATA_LOSS=skip); 0 for other sources."),
    MetricSpec("event_etl_source_down", "event_etl.source.down", MetricKind.GAUGE, "1", _ET,
               "1 while the source says it cannot deliver what its input holds (Pub/Sub: the spool's disk full, a "
               "pull stream stopped, the service unreachable), else 0; the watermark does not follow the clock "
               "meanwhile."),
    MetricSpec("event_etl_policy_runs_total", "event_etl.policy.runs", MetricKind.COUNTER, "{run}",
               ("event_type", "policy"), "Complete hours a commit policy finished (a message published, a lineage "
               "event emitted); again after a restart for an hour whose record was not saved.  Absent without commit "
               "policies."),
    MetricSpec("event_etl_policy_failures_total", "event_etl.policy.failures", MetricKind.COUNTER, "{failure}",
               ("event_type", "policy"), "Failed attempts of a commit policy (each retried with a backoff; the hour "
               "and its marker stay as they are).  Absent without commit policies."),
    MetricSpec("event_etl_policy_backlog_markers", "event_etl.policy.backlog.markers", MetricKind.GAUGE, "{marker}",
               ("event_type", "policy"), "Markers written that a commit policy has not done yet (absent without "
               "commit policies)."),
    MetricSpec("event_etl_kafka_lag_records", "event_etl.kafka.lag.records", MetricKind.GAUGE, "{record}",
               ("event_type", "topic", "partition"),
               "Kafka: a partition's high watermark minus the offset the job committed (absent for other sources)."),
    MetricSpec("event_etl_bus_unclaimed_records_total", "event_etl.bus.unclaimed.records", MetricKind.COUNTER,
               "{record}", ("event_type", "bus"),
               "A bus's messages no type claimed, kept in <sink>/_unclaimed/<bus>/ (counted once, on the bus's first "
               "type by name; absent for a type on no bus)."),
)

ENV_OLD_NAMES = ENV_METRICS_OLD_NAMES
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

ENV_JOB = ENV_METRICS_JOB
"""The ``service.name`` of the metrics (default ``event_etl``): the ``job`` label OTLP receivers give them."""


def old_names_exported() -> bool:
    return current_settings().metrics_old_names

BY_OTEL_NAME: dict[str, MetricSpec] = {m.otel_name: m for m in METRICS + RENAMED}


def exported_series() -> frozenset[str]:
    """Every series name a job's Prometheus endpoint can show (what dashboards and alerts may use)."""
    return frozenset(s for m in METRICS for s in m.series)
