"""The metrics of one job run: OpenTelemetry instruments fed by the controller's events.

Exactly once, across Spark's driver and executors
-------------------------------------------------
Executor tasks count what they do (events by outcome, dead-letter reasons, files, bytes,
event delays) and return the counts inside their split's report, the small JSON row that
``collect()`` brings back to the driver; Spark keeps the rows of exactly one successful
attempt of every task.  The driver's :class:`~event_etl.job.controller.Controller` adds up the
reports of a batch and, once the batch is durable, emits one ``("batch", BatchEvent)``.
:class:`JobMetrics` records from that event only, on the driver, so each batch's counts
reach the exporters exactly once per process; nothing is ever recorded on an executor.

Counters are per process and start at 0 (Prometheus' ``rate``/``increase`` handle the
reset of a restart).  A batch that Spark replays after a crash is counted by the new
process; if the process that died had already emitted it, that batch is counted twice
across the two processes.  Replays are rare and visible: ``event_etl_batches_total``
has ``replayed="true"`` for them.

With no exporter nothing leaves the process; the history is a local file (in the job's checkpoint unless
``--metrics-history`` names another).  Each job has its own
``MeterProvider``, shut down with the job: no global OpenTelemetry or prometheus_client
state is touched, so many jobs can run one after another (or side by side) in one process.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypedDict

from opentelemetry.metrics import CallbackOptions, Counter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from event_etl import __version__
from event_etl.errors import EventEtlError
from event_etl.metrics.exporters import OtlpExport, PrometheusEndpoint
from event_etl.metrics.histograms import PreBucketedHistogram
from event_etl.metrics.history import MetricsHistory, default_history_path
from event_etl.metrics.spec import (
    BATCH_DURATION_BUCKETS_S,
    BY_OTEL_NAME,
    DELAY_BUCKETS_S,
    MARKER_DELAY_BUCKETS_S,
    OUTCOMES,
    SCOPE,
    old_names_exported,
)
from event_etl.rules.manifest import Manifest
from event_etl.rules.reasons import Reason
from event_etl.rules.watermark import WatermarkState
from event_etl.settings import current_settings
from event_etl.sources.kafka_offsets import as_offset
from event_etl.timeutil import HOUR_MS, iso

__all__ = ["JobMetrics", "job_metrics", "backlog_from_progress", "kafka_lag_from_progress", "marker_pending_ms"]

_log = logging.getLogger(__name__)

_HISTORY_IDLE_EVERY_MS = 60_000


class _InstrumentArgs(TypedDict):
    """What a meter's ``create_*`` takes to name an instrument."""

    name: str
    unit: str
    description: str


_OFFSET_UNITS = (("files", "files"), ("n", "events"))  # directory {"files": n}; generator {"n": n, ...}


def backlog_from_progress(progress: Any) -> dict[str, int] | None:
    """Input not yet read, from Spark's ``query.lastProgress``: ``latestOffset - endOffset`` of its source.

    Returns ``{"files": n}`` or ``{"events": n}`` (Kafka: summed over its partitions), or ``None`` where the
    source does not tell
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
    end, latest = as_offset(src.get("endOffset")), as_offset(src.get("latestOffset"))
    if end is None or latest is None:
        return None
    if isinstance(end.get("topics"), dict) and isinstance(latest.get("topics"), dict):  # kafka:re:PATTERN
        from event_etl.sources.kafka_offsets import lag_by_partition

        lag = lag_by_partition(end, latest)
        return {"events": sum(lag.values())} if lag is not None else None
    if isinstance(end.get("partitions"), dict) and isinstance(latest.get("partitions"), dict):  # Kafka
        try:
            return {"events": sum(max(0, int(n) - int(end["partitions"].get(p, 0)))
                                  for p, n in latest["partitions"].items())}
        except (TypeError, ValueError):
            return None
    for key, unit in _OFFSET_UNITS:
        if key in end and key in latest:
            try:
                return {unit: max(0, int(latest[key]) - int(end[key]))}
            except (TypeError, ValueError):
                return None
    return None


def kafka_lag_from_progress(progress: Any) -> dict[tuple[str, int], int] | None:
    """Each Kafka partition's lag, ``{(topic, partition): records}``, from Spark's ``query.lastProgress`` (its
    source's ``latestOffset``, the high watermarks, minus its ``endOffset``, what the job committed); None for
    another source or no progress (see :func:`event_etl.sources.kafka_offsets.lag_by_partition`)."""
    from event_etl.sources.kafka_offsets import lag_by_partition

    try:
        src = progress["sources"][0]
    except (KeyError, IndexError, TypeError):
        return None
    return lag_by_partition(src.get("endOffset"), src.get("latestOffset"))


class JobMetrics:
    """The metrics of one job run: a listener for its controller, gauges read at collection time.

    ``exports`` are :class:`PrometheusEndpoint` / :class:`OtlpExport` objects (none: nothing
    leaves the process); ``history`` a :class:`MetricsHistory`.  ``clock`` gives wall time
    in ms; ``controller_state`` the controller's current
    :class:`~event_etl.rules.watermark.WatermarkState` (else the last one a listener event
    carried); ``backlog`` a callable returning ``{unit: amount}`` that overrides what
    :meth:`observe_progress` derives.

    ``event_clock`` (the generator's :class:`~event_etl.job.progress.GeneratorClock`, which
    may not know the time yet: None) is the source's own clock, when it is not the wall clock:
    the history's lag and marker delay are then measured against it, as the progress lines are,
    and its lines say so (``"clock": "generator"``, :attr:`event_clock_name`).  The Prometheus gauges keep the
    wall clock.
    """

    event_clock_name = "generator"
    """The name the history gives the ``event_clock``: the generator's is the only source clock there is (the
    source registry's ``event_clock``)."""

    def __init__(
        self,
        event_type: str,
        *,
        clock: Callable[[], int],
        controller_state: Callable[[], WatermarkState | None] | None = None,
        backlog: Callable[[], dict[str, int] | None] | None = None,
        exports: Sequence[PrometheusEndpoint | OtlpExport] = (),
        history: MetricsHistory | None = None,
        policies: Sequence[str] = (),
        event_clock: Callable[[], int | None] | None = None,
    ) -> None:
        self.event_type = event_type
        self.policies = tuple(policies)  # names of the type's commit policies: their series exist from the start
        self.policy_pending: Callable[[], dict[str, int]] | None = None  # set once the policies run
        self.clock = clock
        self._controller_state = controller_state
        self._backlog_fn = backlog
        self.exports = list(exports)
        self.history = history
        self.attrs = {"event_type": event_type}
        self.event_clock = event_clock
        self.started_at = clock()
        self._history_since = self.started_at  # the start of the time the next batch line covers
        self.last_batch_at: int | None = None
        self.source_down: str | None = None  # why the source cannot deliver, while it says so
        self.heartbeat_at = self.started_at
        self._state: WatermarkState | None = None
        self._backlog: dict[str, int] | None = None
        self._kafka_lag: dict[tuple[str, int], int] | None = None
        self._last_history_watermark_at: int | None = None
        self._closed = False
        self.errors = 0
        self.delay = PreBucketedHistogram(BY_OTEL_NAME["event_etl.event.delay"], DELAY_BUCKETS_S, self.attrs)
        readers: list[MetricReader] = []
        try:
            for e in self.exports:
                readers.append(e.open([self.delay]))
            self.provider = MeterProvider(
                resource=Resource.create({"service.name": current_settings().metrics_job,
                                          "service.version": __version__,
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
        meter = self.provider.get_meter(SCOPE, __version__)

        def spec(name: str) -> _InstrumentArgs:
            s = BY_OTEL_NAME[name]
            return {"name": s.otel_name, "unit": s.unit, "description": s.description}

        self.events = meter.create_counter(**spec("event_etl.events"))
        self.deadletter = meter.create_counter(**spec("event_etl.deadletter.records"))
        self.files = meter.create_counter(**spec("event_etl.written.files"))
        self.bytes = meter.create_counter(**spec("event_etl.written.bytes"))
        self.merged_files = meter.create_counter(**spec("event_etl.merged.files"))
        self.merged_bytes = meter.create_counter(**spec("event_etl.merged.bytes"))
        self.merged_files.add(0, self.attrs)  # exported from the start: 0 until a merge happens
        self.clock_steps = meter.create_counter(**spec("event_etl.clock.steps"))
        self.clock_steps.add(0, self.attrs)
        self.merged_bytes.add(0, self.attrs)
        self.batches = meter.create_counter(**spec("event_etl.batches"))
        self.lost = meter.create_counter(**spec("event_etl.input.lost.records"))
        self.unclaimed = meter.create_counter(**spec("event_etl.bus.unclaimed.records"))
        self.hours = meter.create_counter(**spec("event_etl.markers.written"))
        self.old_names = old_names_exported()
        self.hours_old: Counter | None = (meter.create_counter(**spec("event_etl.hours.completed"))
                                          if self.old_names else None)
        self.policy_runs = meter.create_counter(**spec("event_etl.policy.runs"))
        self.policy_failures = meter.create_counter(**spec("event_etl.policy.failures"))
        for policy in self.policies:
            for c in (self.policy_runs, self.policy_failures):
                c.add(0, {**self.attrs, "policy": policy})
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
            "event_etl.kafka.lag.records": self._observe_kafka_lag,
            "event_etl.policy.backlog.markers": self._observe_policy_backlog,
            "event_etl.source.down": lambda o: [Observation(1 if self.source_down else 0, self.attrs)],
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
        for counter in (self.files, self.bytes, self.hours, self.hours_old, self.lost):
            if counter is not None:
                counter.add(0, self.attrs)

    # -- gauges, computed when collected -------------------------------------------------------
    def state(self) -> WatermarkState | None:
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

    def _observe_kafka_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {**self.attrs, "topic": topic, "partition": str(p)})
                for (topic, p), n in sorted((self._kafka_lag or {}).items())]

    def _observe_policy_backlog(self, _options: CallbackOptions) -> Iterable[Observation]:
        pending = self.policy_pending() if self.policy_pending is not None else {}
        return [Observation(n, {**self.attrs, "policy": name}) for name, n in pending.items()]

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
            elif kind == "clock_step":
                self.clock_steps.add(1, self.attrs)
            elif kind == "source_down":
                self.source_down = payload
            elif kind == "policy_done":
                self.policy_runs.add(1, {**self.attrs, "policy": payload[0]})
            elif kind == "policy_failed":
                self.policy_failures.add(1, {**self.attrs, "policy": payload[0]})
        except Exception:  # noqa: BLE001 - the data is safe; the numbers are not worth a failed batch
            self.errors += 1
            if self.errors <= 3:
                _log.exception("event_etl metrics: could not record a %s event of %s", kind, self.event_type)

    def _on_merged(self, m: Any) -> None:
        """``m``: a :class:`~event_etl.job.merges.Merge` (of a higher layer: not imported here)."""
        self.files.add(m.files_written, self.attrs)
        self.bytes.add(m.bytes_written, self.attrs)
        self.merged_files.add(m.files_merged, self.attrs)
        self.merged_bytes.add(m.bytes_merged, self.attrs)

    def _on_batch(self, ev: Any) -> None:
        """``ev``: a :class:`~event_etl.job.controller.BatchEvent` (of a higher layer: not imported here)."""
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
        lost = sum((getattr(ev, "lost", None) or {}).values())
        if lost:
            self.lost.add(int(lost), self.attrs)
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
            since, self._history_since = self._history_since, max(self._history_since, now)
            self.history.write({
                "kind": "batch", "event_type": self.event_type, "t": now / 1000.0, "time": iso(now),
                "since": min(since, now) / 1000.0,
                "batch_id": ev.batch_id, "replayed": bool(ev.replayed), "duration_seconds": duration_s,
                "events": {o: int(r.counts.get(o, 0)) for o in sorted({*OUTCOMES, *r.counts})},
                "deadletter": {k: int(v) for k, v in sorted(r.reasons.items()) if v},
                "files": r.files_written, "bytes": r.bytes_written,
                "delay": {"bounds": list(DELAY_BUCKETS_S), "counts": list(r.delay_buckets or []),
                          "sum_seconds": delay_sum_s},
                "watermark": None if wm is None else wm / 1000.0,
                **self._lag_fields("watermark_lag_seconds", now, wm),
                "marked": len(ev.marked),
            })

    def _on_marker(self, m: Manifest) -> None:
        self.hours.add(1, self.attrs)
        if self.hours_old is not None:
            self.hours_old.add(1, self.attrs)
        delay_ms = m.marker_delay_ms
        self.marker_delay.record(max(0, delay_ms) / 1000.0, self.attrs)  # OpenTelemetry histograms take no negatives
        if self.history is not None:
            now = self.clock()
            if self.event_clock is None:
                delay: dict[str, Any] = {"marker_delay_seconds": delay_ms / 1000.0}
            else:
                delay = self._lag_fields("marker_delay_seconds", now, m.hour + HOUR_MS)
            self.history.write({
                "kind": "marker", "event_type": self.event_type, "t": m.completed_at / 1000.0,
                "time": iso(m.completed_at), "hour": iso(m.hour), "hour_end": (m.hour + HOUR_MS) / 1000.0,
                **delay, "records": m.records, "late_records": m.late_records,
                "files": len(m.files), "written_at": now / 1000.0,
                "closed_by": (getattr(m, "extra", None) or {}).get("closed_by"),
            })

    def _on_watermark(self, why: str, state: WatermarkState) -> None:
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
            "watermark": state.watermark / 1000.0, **self._lag_fields("watermark_lag_seconds", now, state.watermark),
        })

    def _lag_fields(self, key: str, wall_now: int, since: int | None) -> dict[str, Any]:
        """``{key: seconds from since to now}`` for a history line: now is the wall clock's, or the event clock's
        (then with ``"clock"``; None while that clock is not known yet)."""
        if self.event_clock is None:
            return {key: None if since is None else (wall_now - since) / 1000.0}
        now = self.event_clock()
        return {key: None if since is None or now is None else (now - since) / 1000.0, "clock": self.event_clock_name}

    # -- the runner's hooks --------------------------------------------------------------------
    def count_unclaimed(self, bus: str, n: int) -> None:
        """``n`` more messages of ``bus`` that no type claimed (0: the series exists from then on)."""
        self.unclaimed.add(int(n), {**self.attrs, "bus": bus})

    def observe_progress(self, progress: Any) -> None:
        """Called by the runner between batches with Spark's ``query.lastProgress`` (or None)."""
        if progress is None:
            return
        try:
            self._backlog = backlog_from_progress(progress)
            self._kafka_lag = kafka_lag_from_progress(progress)
        except Exception:  # noqa: BLE001 - an unexpected progress shape must not stop the job
            _log.debug("event_etl metrics: unreadable progress", exc_info=True)
            self._backlog = self._kafka_lag = None

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


def marker_pending_ms(state: WatermarkState | None, now: int) -> int | None:
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


def job_metrics(event_type: Any, options: Any, *, clock: Callable[[], int],
                controller_state: Callable[[], WatermarkState | None] | None = None,
                backlog: Callable[[], dict[str, int] | None] | None = None, serve: bool = True,
                checkpoint: str | None = None,
                event_clock: Callable[[], int | None] | None = None) -> JobMetrics:
    """Metrics for one job run, configured from ``options`` (``metrics_port``, ``metrics_host``,
    ``otlp_endpoint``, ``metrics_history``); prints where the Prometheus endpoint listens.

    The history goes to ``options.metrics_history``, else, given the job's ``checkpoint`` (a local
    folder), to ``<checkpoint>/metrics-history.jsonl`` (:func:`~event_etl.metrics.history.default_history_path`).
    ``event_clock``: the source's own clock, for the history's lag figures (see :class:`JobMetrics`).

    ``serve=False`` keeps the Prometheus registry but serves nothing: a :class:`FleetEndpoint`
    serves the registries of several jobs on one port."""
    name: str = getattr(event_type, "name", event_type)
    exports: list[PrometheusEndpoint | OtlpExport] = []
    if getattr(options, "metrics_port", None) is not None:
        exports.append(PrometheusEndpoint(host=getattr(options, "metrics_host", None) or "127.0.0.1",
                                          port=options.metrics_port if serve else None))
    if getattr(options, "otlp_endpoint", None):
        exports.append(OtlpExport(options.otlp_endpoint))
    history_path = getattr(options, "metrics_history", None)
    history = None
    if history_path:
        history = MetricsHistory(history_path)
    elif checkpoint is not None:
        default = default_history_path(checkpoint)
        if default is not None:
            history = MetricsHistory(default, what=f"the metrics history in the checkpoint, {default}")
    try:
        metrics = JobMetrics(name, clock=clock, controller_state=controller_state, backlog=backlog, exports=exports,
                             history=history,
                             policies=[c["name"] for c in getattr(event_type, "commit_policies", ())],
                             event_clock=event_clock)
    except BaseException:
        if history is not None:
            history.close()
        raise
    for e in exports:
        if e.url:
            what = "Prometheus metrics" if isinstance(e, PrometheusEndpoint) else "OTLP metrics to"
            print(f"[{name}] {what} {e.url}", file=sys.stdout, flush=True)
    return metrics
