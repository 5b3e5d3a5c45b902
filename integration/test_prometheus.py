"""A real Prometheus scrapes a running job, as an operator would set it up.

The job is ``event-etl run`` as a process, with ``--metrics-port`` on 127.0.0.1 and a
directory source of crafted files whose late, too-late, future and invalid events are
known (and cross-checked through the real executor and controller in
:class:`tests.lib.harness.LocalPipeline`).  Prometheus (the Debian package) runs with the
shipped ``monitoring/prometheus.yml`` pointed at the job, scraping every second, and
with the shipped alert rules loaded.  PromQL over its HTTP API then returns what the job
did; every dashboard query is accepted; and ``event-etl graphs --prometheus`` draws
PNGs from it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from event_etl.metrics import OUTCOMES
from event_etl.timeutil import HOUR_MS, MINUTE_MS, hour_floor, now_millis
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type
from tests.lib.servers import PrometheusServer, free_port
from tests.lib.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("event-etl"))


def _env():
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}


def craft_inputs(folder: Path, base: int) -> tuple[list[tuple[int, list[bytes]]], dict[str, int]]:
    """Four files, one micro-batch each: ``[(arrival ms, lines)]`` and the outcomes they must get.

    Hour H0 = ``base`` closes when the second batch moves the watermark into H1; every H0
    event that comes after that is late.
    """
    h0, h1 = base, base + HOUR_MS
    m = MINUTE_MS
    batches = [
        (h0 + 58 * m, [click(f"a{i}", h0 + i * 10_000) for i in range(300)] + [click("a-last", h0 + 57 * m)]),
        (h1 + 6 * m, [click(f"b{i}", h1 + i * 1_500) for i in range(200)] + [b"not json", b"{oops", b"nope"]),
        (h1 + 10 * m, [click(f"late-c{i}", h0 + 10 * m + i * 1_000) for i in range(40)]
         + [click(f"c{i}", h1 + 6 * m + i * 1_000) for i in range(100)]),
        (h1 + 20 * m, [click(f"late-d{i}", h0 + 30 * m + i * 1_000) for i in range(25)]
         + [click(f"d{i}", h1 + 10 * m + i * 10_000) for i in range(50)]
         # ahead of the real clock (the job's arrival: when it lists the file), whatever base is
         + [click("fut1", now_millis() + 24 * HOUR_MS), click("fut2", now_millis() + 25 * HOUR_MS)]
         + [click("old1", h0 - 48 * HOUR_MS), click("old2", h0 - 47 * HOUR_MS)]),
    ]
    folder.mkdir(parents=True)
    for k, (arrival, lines) in enumerate(batches):
        f = folder / f"events-{k:02d}.jsonl"
        f.write_bytes(b"\n".join(lines) + b"\n")
        os.utime(f, (arrival / 1000, arrival / 1000))
    expected = {"timely": 301 + 200 + 100 + 50, "late": 40 + 25, "too_late": 2, "future": 2, "before_backfill": 0,
                "invalid": 3, "duplicate": 0}
    return batches, expected


def through_local_pipeline(tmp: Path, et, batches) -> tuple[Counter, int]:
    """The same batches through the real executor and controller: outcomes and the final watermark."""
    clock = FakeClock(batches[0][0])
    p = LocalPipeline(tmp, et, clock)
    totals: Counter = Counter()
    for arrival, lines in batches:
        clock.now = arrival
        totals.update(p.batch(lines).result.counts)
    return totals, p.controller.state.watermark


def shipped_config_pointed_at(port: int) -> dict:
    """monitoring/prometheus.yml with its target replaced by the job and a 1 s scrape (paths made absolute)."""
    doc = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    doc["global"].update(scrape_interval="1s", evaluation_interval="1s")
    doc["rule_files"] = [str(ROOT / "monitoring" / f) for f in doc["rule_files"]]
    (job,) = doc["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"], "labels": {"env": "test"}}]
    for sd in job.get("file_sd_configs", []):
        sd["files"] = [str(ROOT / "monitoring" / f) for f in sd["files"]]
    return doc


def scalar(prom: PrometheusServer, promql: str) -> float | None:
    res = prom.query(promql)
    assert len(res) <= 1, f"{promql}: {res}"
    return float(res[0]["value"][1]) if res else None


@pytest.mark.slow
def test_prometheus_scrapes_a_running_job_and_graphs_draw_from_it(tmp_path):
    from PIL import Image

    et = make_event_type(tmp_path / "types", "click")
    base = hour_floor(now_millis()) - 3 * HOUR_MS  # hours that are over, so the lag is real
    batches, expected = craft_inputs(tmp_path / "in", base)
    local, local_watermark = through_local_pipeline(tmp_path / "local", et, batches)
    assert {o: local.get(o, 0) for o in OUTCOMES} == expected, "the crafted outcomes, per the real rules"

    port = free_port()
    job = subprocess.Popen(
        [EXE, "run", "click", "--event-types", str(tmp_path / "types"), "--source", f"dir:{tmp_path / 'in'}",
         "--sink", str(tmp_path / "sink"), "--checkpoint", str(tmp_path / "ckpt"), "--max-files-per-batch", "1",
         "--trigger-interval", "1s", "--master", "local[2]", "--metrics-port", str(port)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    prom = PrometheusServer(tmp_path / "prometheus", shipped_config_pointed_at(port)).start()
    try:
        sel = 'event_type="click"'
        # All four batches scraped: the late count is the number of late events sent.
        wait_until(lambda: scalar(prom, f'event_etl_events_total{{{sel},outcome="late"}}') == expected["late"],
                   120, "Prometheus to see every late event", proc=job)
        wait_until(lambda: scalar(prom, f'event_etl_batches_total{{{sel},replayed="false"}}') == 4, 30,
                   "the four batches", proc=job)
        by_outcome = {r["metric"]["outcome"]: float(r["value"][1])
                      for r in prom.query(f"sum by (outcome) (event_etl_events_total{{{sel}}})")}
        assert by_outcome == {o: float(n) for o, n in expected.items()}

        reasons = {r["metric"]["reason"]: float(r["value"][1])
                   for r in prom.query(f"event_etl_deadletter_records_total{{{sel}}} > 0")}
        assert reasons == {"invalid_json": 3.0, "future": 2.0, "too_late": 2.0}

        assert scalar(prom, f"event_etl_watermark_timestamp_seconds{{{sel}}}") == local_watermark / 1000
        assert (
            scalar(prom, f"event_etl_watermark_seconds{{{sel}}}") == local_watermark / 1000
        )  # 0.1's name, one release
        lag = scalar(prom, f"event_etl_watermark_lag_seconds{{{sel}}}")
        assert abs(lag - (now_millis() - local_watermark) / 1000) < 30, lag
        assert scalar(prom, f"event_etl_markers_written_total{{{sel}}}") == 1  # H0 only
        assert scalar(prom, f"event_etl_hours_completed_total{{{sel}}}") == 1  # 0.1's name, kept one release
        assert (tmp_path / "sink" / "click").glob("dt=*/hour=*/_COMPLETE")
        avro = list((tmp_path / "sink" / "click").glob("dt=*/hour=*/*.avro"))
        merged = (scalar(prom, f"event_etl_merged_files_total{{{sel}}}"),
                  scalar(prom, f"event_etl_merged_bytes_total{{{sel}}}"))
        assert scalar(prom, f"event_etl_written_files_total{{{sel}}}") - merged[0] == len(avro)
        written_bytes = scalar(prom, f"event_etl_written_bytes_total{{{sel}}}")
        assert written_bytes - merged[1] == sum(f.stat().st_size for f in avro)
        written = expected["timely"] + expected["late"]
        assert scalar(prom, f"event_etl_event_delay_seconds_count{{{sel}}}") == written
        assert scalar(prom, f'event_etl_event_delay_seconds_bucket{{{sel},le="+Inf"}}') == written
        p99 = scalar(prom, f"histogram_quantile(0.99, event_etl_event_delay_seconds_bucket{{{sel}}})")
        # events arrive when the job lists their file: now, up to ~3 hours after their event time; the
        # quantile is interpolated inside the bucket holding that delay, (2 h, 6 h]
        assert (now_millis() - base) / 1000 <= 21600
        assert 60 < p99 <= 21600, p99
        assert scalar(prom, f"event_etl_batch_duration_seconds_count{{{sel}}}") == 4
        assert 0 < scalar(prom, f"time() - event_etl_heartbeat_timestamp_seconds{{{sel}}}") < 120
        assert scalar(prom, f"event_etl_marker_pending_seconds{{{sel}}}") > 3600  # H1 is over, and still open

        # The backlog comes from Spark's progress, read once a tick:
        # it reaches 0 within a tick or two of the last batch.
        def drained():
            rows = prom.query(f"event_etl_input_backlog_files{{{sel}}}")  # a directory source counts files
            return rows if rows and all(float(r["value"][1]) == 0 for r in rows) else None

        wait_until(drained, 15, "an input backlog of 0", proc=job)
        assert prom.query(f"event_etl_input_backlog_events{{{sel}}}") == [], "a directory source tells files only"
        assert scalar(prom, 'up{job="event_etl"}') == 1

        # The shipped rules load and evaluate; every dashboard query is valid PromQL here.
        groups = prom.api_get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        shipped = (ROOT / "monitoring" / "alerts.yml").read_text().count("- alert:")
        assert len(rules) == shipped >= 7 and all(r["health"] == "ok" for r in rules), rules
        dash = json.loads((ROOT / "monitoring" / "grafana" / "event_etl.json").read_text())
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$event_type", "click").replace("$__rate_interval", "1m")
                prom.query(expr)  # raises on a query Prometheus refuses
        # rate() needs two scrapes of the series in its window: wait for them rather than count on the timing
        def late_rate():
            return scalar(prom, f'sum(rate(event_etl_events_total{{{sel},outcome="late"}}[5m]))') or None

        assert wait_until(late_rate, 30, "a late-event rate over at least two scrapes", proc=job) > 0

        # Graphs from Prometheus, as a user runs them.
        out = tmp_path / "graphs"
        r = subprocess.run([EXE, "graphs", "click", "--prometheus", prom.url, "--last", "5m", "--step", "1s",
                            "--window", "10s", "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        pngs = sorted(out.glob("click-*.png"))
        assert [p.name for p in pngs] == sorted(f"click-{k}.png" for k in (
            "watermark-lag", "events", "event-delay", "files", "marker-delay", "overview"))
        for line in r.stdout.splitlines():
            if re.search(r"click-(watermark-lag|events|files|event-delay)\.png", line):
                assert "no data" not in line, line
        for p in pngs:
            assert p.stat().st_size > 10_000, p
            with Image.open(p) as img:
                assert img.width >= 1000 and img.height >= 300
    finally:
        prom.stop()
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)  # stops (no drain: nothing here needs one)
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
    out_text = job.stdout.read()
    assert f"[click] Prometheus metrics http://127.0.0.1:{port}/metrics" in out_text
    assert job.returncode == 0, out_text
