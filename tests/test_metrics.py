"""Metrics: counters equal the events fed through the real executor and controller, gauges are
computed at scrape time, exporters (Prometheus, OTLP, history) and their absence."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from event_etl.errors import UsageError
from event_etl.job.controller import BatchEvent
from event_etl.job.setup import RunOptions
from event_etl.metrics import (
    METRICS,
    OUTCOMES,
    JobMetrics,
    MetricsHistory,
    OtlpExport,
    PrometheusEndpoint,
    backlog_from_progress,
    exported_series,
    job_metrics,
)
from event_etl.rules.reasons import Reason
from event_etl.rules.watermark import WatermarkState
from event_etl.task.executor import DELAY_BUCKETS_S
from event_etl.task.report import BatchResult
from tests.lib.harness import FakeClock, click, make_event_type, read_deadletter, read_sink, t
from tests.lib.metrics import Job, feed_known_mix, samples, value

POLICY_SERIES = ("event_etl_policy_runs_total", "event_etl_policy_failures_total", "event_etl_policy_backlog_markers")
"""Exported only by a job whose type has commit policies (tests/test_policies.py scrapes them)."""


def test_counters_equal_the_events_fed_through_the_real_executor_and_controller(tmp_path):
    job = Job(tmp_path)
    expected = feed_known_mix(job)
    s = job.scrape()
    for outcome in OUTCOMES:
        assert value(s, "event_etl_events_total", event_type="click", outcome=outcome) == expected.get(outcome,
                                                                                                       0), outcome
    # What the counters say is what is on disk.
    content = read_sink(job.p.sink, "click")
    assert sum(len(hc.timely) for hc in content.values()) == expected["timely"]
    assert sum(len(hc.late) for hc in content.values()) == expected["late"]
    dl = Counter(r["reason"] for r in read_deadletter(job.p.sink, "click"))
    assert sum(dl.values()) == expected["too_late"] + expected["future"] + expected["invalid"]
    for reason in Reason:
        assert value(s, "event_etl_deadletter_records_total", event_type="click",
                     reason=reason.value) == dl[reason.value]
    files = [f for f in (job.p.sink / "click").glob("dt=*/hour=*/*.avro")]
    # merged files counted as written, their members as merged: what is left is what is on disk
    assert value(s, "event_etl_merged_files_total", event_type="click") > 0
    assert value(s, "event_etl_written_files_total", event_type="click") - \
        value(s, "event_etl_merged_files_total", event_type="click") == len(files)
    assert value(s, "event_etl_written_bytes_total", event_type="click") - \
        value(s, "event_etl_merged_bytes_total", event_type="click") == sum(f.stat().st_size for f in files)
    markers = list((job.p.sink / "click").glob("dt=*/hour=*/_COMPLETE"))
    assert value(s, "event_etl_markers_written_total", event_type="click") == len(markers) == 1
    assert value(s, "event_etl_batches_total", event_type="click", replayed="false") == 2
    assert value(s, "event_etl_batches_total", event_type="click", replayed="true") == 0
    # Every written event (timely or late) is in the delay histogram, once.
    written = expected["timely"] + expected["late"]
    assert value(s, "event_etl_event_delay_seconds_count", event_type="click") == written
    assert value(s, "event_etl_event_delay_seconds_bucket", event_type="click", le="+Inf") == written
    job.metrics.shutdown()


def test_delay_histogram_buckets_and_sum_are_exact(tmp_path):
    job = Job(tmp_path)
    job.clock.now = t("13:10")
    # Delays of 0.05 s, 3 s, 45 s, 45 s and 20 min.
    job.p.batch([click("a", t("13:10") - 50), click("b", t("13:10") - 3_000), click("c", "13:09:15"),
                 click("d", "13:09:15"), click("e", "12:50")], shards=2)
    s = job.scrape()

    def le(bound: str) -> float:
        return value(s, "event_etl_event_delay_seconds_bucket", event_type="click", le=bound)

    assert [le(b) for b in ("0.1", "2.5", "5", "30", "60", "600", "1800", "86400", "+Inf")] == [1, 1, 2, 2, 4, 4, 5,
                                                                                                5, 5]
    assert value(s, "event_etl_event_delay_seconds_sum", event_type="click") == pytest.approx(0.05 + 3 + 45 + 45 + 1200)
    assert len([k for k in s if k[0] == "event_etl_event_delay_seconds_bucket"]) == len(DELAY_BUCKETS_S) + 1
    job.metrics.shutdown()


def test_a_replayed_batch_is_counted_by_the_new_process_and_flagged(tmp_path):
    job = Job(tmp_path)
    lines = [click("a", "14:01"), click("b", "14:02")]
    job.p.batch(lines)
    job.restart()  # as if the process died after the batch was durable, before Spark committed it
    job.p.batch(lines, batch_id=0)
    s = job.scrape()
    assert value(s, "event_etl_batches_total", event_type="click", replayed="true") == 1
    assert value(s, "event_etl_batches_total", event_type="click", replayed="false") == 0
    assert value(s, "event_etl_events_total", event_type="click", outcome="timely") == 2  # counters are per process
    assert not value(s, "event_etl_batch_duration_seconds_count", event_type="click")  # its start: the first attempt
    job.metrics.shutdown()


def test_every_series_is_there_from_the_start_with_zero(tmp_path):
    job = Job(tmp_path)
    s = job.scrape()
    for outcome in OUTCOMES:
        assert value(s, "event_etl_events_total", event_type="click", outcome=outcome) == 0
    assert "duplicate" in OUTCOMES
    for reason in Reason:
        assert value(s, "event_etl_deadletter_records_total", event_type="click", reason=reason.value) == 0
    assert value(s, "event_etl_heartbeat_timestamp_seconds", event_type="click") == t("14:10") / 1000
    assert value(s, "event_etl_watermark_timestamp_seconds", event_type="click") is None  # no event yet, no watermark
    job.metrics.shutdown()


def test_duplicates_dropped_by_the_pipeline_are_counted(tmp_path):
    job = Job(tmp_path)  # dedupe by id within dedupe_window (default 10m)
    job.clock.now = t("14:10")
    job.p.batch([click(f"x{i}", f"14:0{i}") for i in range(5)])
    job.clock.now = t("14:11")
    job.p.batch([click(f"x{i}", f"14:0{i}") for i in range(3)] + [click("y", "14:09")], shards=2)
    s = job.scrape()
    assert value(s, "event_etl_events_total", event_type="click", outcome="duplicate") == 3
    assert value(s, "event_etl_events_total", event_type="click", outcome="timely") == 6
    assert sum(len(hc.timely) for hc in read_sink(job.p.sink, "click").values()) == 6
    job.metrics.shutdown()


def test_the_scrape_shows_exactly_the_registered_series(tmp_path, monkeypatch):
    """The registry in event_etl.metrics (which the dashboard and alerts are checked against) is what a scrape shows."""
    monkeypatch.setenv("EVENT_ETL_METRICS_OLD_NAMES", "0")
    job = Job(tmp_path)
    feed_known_mix(job)
    job.metrics.observe_progress({"sources": [{"endOffset": '{"files": 3}', "latestOffset": '{"files": 5}'}]})
    fams = {f.name: f for f in text_string_to_metric_families(job.prom.text())}
    shown = {s.name for f in fams.values() for s in f.samples} - {"target_info"}
    # a directory source tells files, not events, and has no partitions: the events backlog and the Kafka lag are
    # absent, as documented
    absent = {"event_etl_input_backlog_events", "event_etl_kafka_lag_records",  # a folder: no events, no Kafka
              "event_etl_bus_unclaimed_records_total", *POLICY_SERIES}  # no bus, no commit policy
    assert shown == exported_series() - absent
    for m in METRICS:
        if m.name in absent:
            continue
        base = m.name.removesuffix("_total")
        assert fams[base].type == str(m.kind), m.name
        labels = {k for s in fams[base].samples for k in s.labels} - {"le"}
        assert labels == set(m.attributes), m.name
    job.metrics.shutdown()


def test_watermark_lag_and_marker_pending_are_computed_when_scraped(tmp_path):
    job = Job(tmp_path)
    job.clock.now = t("14:10")
    job.p.batch([click("a", "14:07")])  # watermark 14:05
    s = job.scrape()
    assert value(s, "event_etl_watermark_timestamp_seconds", event_type="click") == t("14:05") / 1000
    assert value(s, "event_etl_watermark_lag_seconds", event_type="click") == 300
    assert value(s, "event_etl_marker_pending_seconds", event_type="click") == 0  # hour 14 still runs
    job.clock.now = t("15:40")  # no batch since: the lag grows, hour 14 is 40 minutes overdue
    s = job.scrape()
    assert value(s, "event_etl_watermark_lag_seconds", event_type="click") == 95 * 60
    assert value(s, "event_etl_marker_pending_seconds", event_type="click") == 40 * 60
    job.metrics.shutdown()


def test_heartbeat_follows_batches_and_idle_advances(tmp_path):
    job = Job(tmp_path, idle_timeout="5m")
    hb = lambda: value(job.scrape(), "event_etl_heartbeat_timestamp_seconds", event_type="click")  # noqa: E731
    assert hb() == t("14:10") / 1000  # the job's start
    assert value(job.scrape(), "event_etl_last_batch_timestamp_seconds", event_type="click") is None
    job.clock.now = t("14:11")
    job.p.batch([click("a", "14:10")])
    assert hb() == t("14:11") / 1000
    assert value(job.scrape(), "event_etl_last_batch_timestamp_seconds", event_type="click") == t("14:11") / 1000
    job.clock.now = t("14:15")
    job.p.controller.tick()  # not idle long enough: no progress
    assert hb() == t("14:11") / 1000
    job.clock.now = t("14:20")
    job.p.controller.tick()  # idle: the watermark follows the clock, the job is alive
    assert hb() == t("14:20") / 1000
    assert value(job.scrape(), "event_etl_last_batch_timestamp_seconds", event_type="click") == t("14:11") / 1000
    job.metrics.shutdown()


def test_batch_duration_resolves_sub_second_batches():
    prom = PrometheusEndpoint()
    m = JobMetrics("click", clock=FakeClock(t("14:00")), exports=[prom])
    for ms in (30, 300, 300, 1200):
        m.listeners[0]("batch", BatchEvent(0, BatchResult(), WatermarkState(), [], t("14:00"), t("14:00") + ms, False))
    s = samples(prom.text())
    got = {le: value(s, "event_etl_batch_duration_seconds_bucket", event_type="click", le=le)
           for le in ("0.025", "0.05", "0.25", "0.5", "1", "1.5")}
    assert got == {"0.025": 0, "0.05": 1, "0.25": 1, "0.5": 3, "1": 3, "1.5": 4}
    assert value(s, "event_etl_batch_duration_seconds_sum", event_type="click") == pytest.approx(1.83)
    m.shutdown()


def test_marker_delay_is_recorded_per_hour_and_never_negative(tmp_path):
    job = Job(tmp_path)
    job.clock.now = t("14:10")
    job.p.batch([click("a", "13:30"), click("b", "14:07")])  # hour 13 marked at 14:10: 10 minutes after its end
    job.p.controller.drain()  # hour 14 marked at 14:10, before it ends: 0
    s = job.scrape()
    assert value(s, "event_etl_marker_delay_seconds_count", event_type="click") == 2
    assert value(s, "event_etl_marker_delay_seconds_sum", event_type="click") == 600
    assert value(s, "event_etl_marker_delay_seconds_bucket", event_type="click", le="600") == 2
    assert value(s, "event_etl_markers_written_total", event_type="click") == 2
    job.metrics.shutdown()


@pytest.mark.parametrize("progress, expected", [
    (None, None),
    ({}, None),
    ({"sources": []}, None),
    ({"sources": [{"endOffset": '{"files": 3}', "latestOffset": '{"files": 10}'}]}, {"files": 7}),
    ({"sources": [{"endOffset": {"files": 3}, "latestOffset": {"files": 3}}]}, {"files": 0}),
    ({"sources": [{"endOffset": '{"n": 1000, "t0": 5, "p": {}}', "latestOffset": '{"n": 4500, "t0": 5, "p": {}}'}]},
     {"events": 3500}),
    ({"sources": [{"endOffset": '{"files": 3}', "latestOffset": "null"}]}, None),  # no reportLatestOffset
    ({"sources": [{"endOffset": '{"files": 3}', "latestOffset": None}]}, None),
    ({"sources": [{"endOffset": '{"acks": "x"}', "latestOffset": '{"acks": "y"}'}]}, None),  # a source that cannot tell
    ({"sources": [{"endOffset": "not json", "latestOffset": '{"files": 1}'}]}, None),
    ({"sources": [{"endOffset": {"topic": "t", "partitions": {"0": 5, "1": 9}},  # Kafka: a new partition 2 counts
                   "latestOffset": {"topic": "t", "partitions": {"0": 15, "1": 9, "2": 4}}}]}, {"events": 14}),
])
def test_backlog_from_spark_progress(progress, expected):
    assert backlog_from_progress(progress) == expected


def test_backlog_is_exported_in_its_unit_and_absent_otherwise():
    prom = PrometheusEndpoint()
    m = JobMetrics("click", clock=FakeClock(t("14:00")), exports=[prom])
    backlog = ("event_etl_input_backlog_events", "event_etl_input_backlog_files", "event_etl_input_backlog")
    assert not [k for k in samples(prom.text()) if k[0] in backlog]
    m.observe_progress({"sources": [{"endOffset": '{"n": 10}', "latestOffset": '{"n": 25}'}]})
    assert value(prom.text(), "event_etl_input_backlog_events", event_type="click") == 15
    assert not [k for k in samples(prom.text()) if k[0] == "event_etl_input_backlog_files"]
    m.observe_progress(None)  # between progress reports: keep what we know
    assert value(prom.text(), "event_etl_input_backlog_events", event_type="click") == 15
    m.observe_progress({"sources": [{"endOffset": '{"files": 1}', "latestOffset": '{"files": 4}'}]})
    assert value(prom.text(), "event_etl_input_backlog_files", event_type="click") == 3
    m.observe_progress({"sources": [{"endOffset": '{"n": 10}', "latestOffset": "null"}]})
    assert not [k for k in samples(prom.text()) if k[0] in backlog]
    m.shutdown()


def test_renamed_metrics_keep_their_old_names_for_one_release(tmp_path, monkeypatch):
    """0.1's dashboards and alerts keep working: the old names carry the same values, unless turned off."""
    from event_etl.metrics import RENAMED

    job = Job(tmp_path)
    job.clock.now = t("14:10")
    job.p.batch([click("a", "13:07"), click("b", "14:07")])  # watermark 14:05: hour 13 marked
    job.metrics.observe_progress({"sources": [{"endOffset": '{"files": 3}', "latestOffset": '{"files": 5}'}]})
    s = job.scrape()
    assert value(s, "event_etl_watermark_seconds", event_type="click") == \
        value(s, "event_etl_watermark_timestamp_seconds", event_type="click") == t("14:05") / 1000
    assert value(s, "event_etl_hours_completed_total", event_type="click") == \
        value(s, "event_etl_markers_written_total", event_type="click") == 1
    assert value(s, "event_etl_input_backlog", event_type="click", unit="files") == \
        value(s, "event_etl_input_backlog_files", event_type="click") == 2
    assert {m.name for m in RENAMED} == {"event_etl_watermark_seconds", "event_etl_hours_completed_total",
                                         "event_etl_input_backlog"}
    job.metrics.shutdown()
    monkeypatch.setenv("EVENT_ETL_METRICS_OLD_NAMES", "0")
    job = Job(tmp_path / "off")
    job.clock.now = t("14:10")
    job.p.batch([click("a", "13:07"), click("b", "14:07")])
    assert not {k[0] for k in job.scrape()} & {m.name for m in RENAMED}
    job.metrics.shutdown()


def test_no_exporter_by_default_and_no_global_state(tmp_path, capsys):
    from opentelemetry import metrics as otel_metrics
    from prometheus_client import REGISTRY

    before = {f.name for f in REGISTRY.collect()}
    m = job_metrics(make_event_type(tmp_path), RunOptions(), clock=FakeClock(t("14:00")))
    assert m.exports == [] and m.history is None and m.urls == []
    assert capsys.readouterr().out == ""
    m.shutdown()
    m.shutdown()  # twice is fine
    assert {f.name for f in REGISTRY.collect()} == before
    assert type(otel_metrics.get_meter_provider()).__name__.startswith(("_Proxy", "NoOp"))


def test_prometheus_endpoint_on_localhost_any_free_port(tmp_path, capsys):
    m = job_metrics(make_event_type(tmp_path), RunOptions(metrics_port=0), clock=FakeClock(t("14:00")),
                    controller_state=lambda: WatermarkState(watermark=t("13:58")))
    (url,) = m.urls
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    assert f"[click] Prometheus metrics {url}" in capsys.readouterr().out
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = resp.read().decode()
    assert value(body, "event_etl_watermark_lag_seconds", event_type="click") == 120
    m.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_a_taken_port_is_a_usage_error_with_the_fix(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UsageError) as err:
            job_metrics(make_event_type(tmp_path), RunOptions(metrics_port=port), clock=FakeClock(t("14:00")))
    assert f"--metrics-port {port}" in err.value.message and "--metrics-port 0" in err.value.fix


def test_jobs_in_one_process_keep_their_own_metrics():
    clock = FakeClock(t("14:00"))
    a, b = PrometheusEndpoint(), PrometheusEndpoint()
    ma = JobMetrics("alpha", clock=clock, exports=[a])
    mb = JobMetrics("beta", clock=clock, exports=[b])
    ma.listeners[0]("batch", BatchEvent(0, BatchResult(counts=Counter(timely=4)), WatermarkState(), [], 0, 0, False))
    assert value(a.text(), "event_etl_events_total", event_type="alpha", outcome="timely") == 4
    assert value(b.text(), "event_etl_events_total", event_type="beta", outcome="timely") == 0
    assert "alpha" not in b.text()
    ma.shutdown()
    again = PrometheusEndpoint()
    mc = JobMetrics("alpha", clock=clock, exports=[again])  # the same type again, as a test suite does
    assert value(again.text(), "event_etl_events_total", event_type="alpha", outcome="timely") == 0
    assert value(b.text(), "event_etl_events_total", event_type="beta", outcome="timely") == 0
    mb.shutdown()
    mc.shutdown()


def test_a_metrics_failure_never_fails_the_batch(tmp_path, caplog):
    job = Job(tmp_path)
    bad = BatchResult(counts=Counter(timely=1), delay_buckets=[1, 2, 3])  # not the executor's bucket layout
    job.metrics.listeners[0]("batch", BatchEvent(0, bad, WatermarkState(), [], 0, 0, False))
    assert job.metrics.errors == 1 and "could not record" in caplog.text
    job.p.batch([click("a", "14:01")])  # and the job goes on
    assert value(job.scrape(), "event_etl_events_total", event_type="click", outcome="timely") == 2
    job.metrics.shutdown()


class _OtlpReceiver(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self):  # http.server's naming
        self.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_otlp_push_carries_the_counters_and_the_pre_bucketed_histogram(tmp_path):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    server = http.server.HTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    _OtlpReceiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        job = Job(tmp_path)
        job.metrics.shutdown()
        otlp = OtlpExport(f"http://127.0.0.1:{server.server_address[1]}")
        assert otlp.endpoint.endswith("/v1/metrics")
        job.metrics = JobMetrics("click", clock=job.clock, controller_state=lambda: job.p.controller.state,
                                 exports=[otlp])
        job.p.controller.listeners[1:] = job.metrics.listeners
        expected = feed_known_mix(job)
        job.metrics.shutdown()  # pushes once more
    finally:
        server.shutdown()
        server.server_close()
    assert _OtlpReceiver.received, "nothing was pushed"
    req = ExportMetricsServiceRequest.FromString(_OtlpReceiver.received[-1])
    metrics = {m.name: m for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    from event_etl.metrics import RENAMED

    no_backlog = {"event_etl.input.backlog", "event_etl.input.backlog.files", "event_etl.input.backlog.events",
                  "event_etl.kafka.lag.records", "event_etl.policy.runs", "event_etl.policy.failures",
                  "event_etl.policy.backlog.markers", "event_etl.bus.unclaimed.records"}  # no policies, no bus
    assert {m.otel_name for m in METRICS + RENAMED} - no_backlog == set(metrics)  # no progress, no backlog
    events = {dict((a.key, a.value.string_value) for a in p.attributes)["outcome"]: p.as_int
              for p in metrics["event_etl.events"].sum.data_points}
    assert events == {o: expected.get(o, 0) for o in OUTCOMES}
    (delay,) = metrics["event_etl.event.delay"].histogram.data_points
    assert delay.count == expected["timely"] + expected["late"] and list(delay.explicit_bounds) == list(DELAY_BUCKETS_S)
    assert metrics["event_etl.event.delay"].unit == "s"


def test_otlp_endpoint_must_be_a_url():
    with pytest.raises(UsageError) as err:
        OtlpExport("collector:4318")
    assert "http://127.0.0.1:4318" in err.value.fix


def test_history_has_a_line_per_batch_and_marker_and_idle_lines_once_a_minute(tmp_path):
    path = tmp_path / "hist" / "metrics.jsonl"
    job = Job(tmp_path, history=path)
    expected = feed_known_mix(job)
    for minute in range(30, 40):  # idle ticks every 10 s for 10 minutes
        for sec in range(0, 60, 10):
            job.clock.now = t(f"14:{minute}:{sec:02d}")
            job.p.controller.tick()
    job.metrics.shutdown()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    kinds = Counter(x["kind"] for x in lines)
    assert kinds["batch"] == 2 and kinds["marker"] >= 1
    assert 9 <= kinds["watermark"] <= 11, kinds
    assert all(x["v"] == 1 and x["event_type"] == "click" for x in lines)
    batches = [x for x in lines if x["kind"] == "batch"]
    for outcome, n in expected.items():
        assert sum(b["events"][outcome] for b in batches) == n
    assert sum(sum(b["delay"]["counts"]) for b in batches) == expected["timely"] + expected["late"]
    marker = next(x for x in lines if x["kind"] == "marker")
    assert marker["hour"] == "2026-11-21T13:00:00Z" and marker["marker_delay_seconds"] == 600


def test_history_file_that_cannot_be_written_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError) as err:
        MetricsHistory(str(tmp_path / "file" / "metrics.jsonl"))
    assert "--metrics-history" in err.value.message


def test_a_fleet_endpoint_serves_every_type_once_per_family():
    from types import SimpleNamespace

    from event_etl.metrics import FleetEndpoint, job_metrics

    opts = SimpleNamespace(metrics_port=0, metrics_host="127.0.0.1", otlp_endpoint=None, metrics_history=None)
    jobs = [job_metrics(name, opts, clock=lambda: 1_795_266_000_000, serve=False) for name in ("clicks", "views")]
    endpoint = FleetEndpoint(port=0)
    try:
        for j in jobs:
            endpoint.add(j)
        text = endpoint.text()
        assert 'event_type="clicks"' in text and 'event_type="views"' in text
        types = [line for line in text.splitlines() if line.startswith("# TYPE event_etl_events_total")]
        assert len(types) == 1, "one family, both types' series in it"
    finally:
        endpoint.close()
        for j in jobs:
            j.shutdown()
