"""monitoring/: the Prometheus config and alert rules pass promtool, the dashboard is importable and
grouped by concern, and everything (dashboard, alerts, graphs, the README's table) names only metrics
the job really exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from event_etl.metrics import METRICS, exported_series
from event_etl.metrics.graphs import PROMQL
from tests.lib.metrics import promtool

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "monitoring"
DASHBOARD = MONITORING / "grafana" / "event_etl.json"

# Series Prometheus itself adds for every target (not the job's to export).
PROMETHEUS_SERIES = {"up"}
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)")  # a name right before {matchers} or [range]
_OUR_NAME = re.compile(r"\bevent_etl_[a-zA-Z0-9_]+")


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([promtool(), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"
    return r


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


def alert_exprs() -> list[str]:
    doc = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def names_used(expr: str) -> set[str]:
    return set(_OUR_NAME.findall(expr)) | {n for n in _SELECTOR.findall(expr) if not n.startswith("$")}


def test_alert_rules_pass_promtool_check():
    out = run_promtool("check", "rules", "alerts.yml").stdout
    assert "SUCCESS: 9 rules found" in out


def test_alert_rules_fire_when_they_should():
    run_promtool("test", "rules", "alerts_test.yml")


def test_prometheus_config_is_valid_and_loads_the_rules():
    out = run_promtool("check", "config", "prometheus.yml").stdout
    assert "SUCCESS" in out and "WARNING" not in out
    doc = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "event_etl" and doc["rule_files"] == ["alerts.yml"]
    assert all(t.startswith("127.0.0.1:") for sc in job["static_configs"] for t in sc["targets"])


def test_the_five_concerns_are_alerted_on():
    doc = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert set(rules) == {"EventEtlWatermarkLagHigh", "EventEtlLateEventsSurge", "EventEtlNoHeartbeat",
                          "EventEtlJobDown", "EventEtlDeadLetterRate", "EventEtlMarkerOverdue",
                          "EventEtlInputLost",  # and input a source deleted unread (Kafka's retention)
                          "EventEtlSourceDown",  # and a source that cannot deliver (Pub/Sub's spool disk full)
                          "EventEtlUnclaimedMessages"}  # and a bus's messages no type claims
    for name, r in rules.items():
        assert r.get("for"), f"{name} needs a `for:` so that one bad scrape does not page"
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]


@pytest.mark.parametrize("where, exprs", [("dashboard", dashboard_exprs), ("alert rules", alert_exprs),
                                          ("graphs", lambda: list(PROMQL.values()))])
def test_only_metrics_the_job_exports_are_queried(where, exprs):
    exported = exported_series()
    used = set().union(*(names_used(e) for e in exprs()))
    assert used, f"no metric found in the {where}"
    unknown = used - exported - PROMETHEUS_SERIES
    assert not unknown, f"the {where} query metrics the job does not export: {sorted(unknown)}"


def test_dashboard_is_importable_with_a_row_per_concern_and_templated_on_event_type():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 30 and "id" not in doc
    rows = [p["title"].split(":")[0].lower() for p in doc["panels"] if p["type"] == "row"]
    assert rows == ["liveness", "throughput", "lateness", "completeness", "dead-letter"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("event_type", "env", "job"):
        assert variables[name]["multi"] and variables[name]["includeAll"]
    for name in ("env", "job"):  # "All" also matches series without the label (a target without env)
        assert variables[name]["allValue"] == ".*"
    assert "env" in variables["env"]["query"]["query"] and '$job' in variables["env"]["query"]["query"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in doc["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
            for target in p["targets"]:
                for var in ("$event_type", "$env", "$job"):
                    assert var in target["expr"], f"{p['title']!r} ignores the {var} variable"


def _metric_table() -> list[list[str]]:
    """The rows of the one table in monitoring/README.md whose header starts with `metric`."""
    lines = (MONITORING / "README.md").read_text().splitlines()
    tables, current = [], None
    for line in lines:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = [cells]
                tables.append(current)
            elif not set("".join(cells)) <= set("-: "):
                current.append(cells)
        else:
            current = None
    metric_tables = [t for t in tables if t[0][0] == "metric"]
    assert len(metric_tables) == 1, "monitoring/README.md must document the metrics in ONE table"
    return metric_tables[0][1:]


def test_the_readme_table_documents_every_metric_as_the_code_exports_it():
    rows = {r[0].strip("`"): r for r in _metric_table()}
    assert list(rows) == [m.name for m in METRICS]
    for m in METRICS:
        name, kind, unit, attributes, meaning, otel_name = rows[m.name]
        assert kind == str(m.kind), m.name
        assert unit.strip("`") == m.unit, m.name
        assert [a.strip() for a in attributes.split(",")] == list(m.attributes), m.name
        assert otel_name.strip("`") == m.otel_name, m.name
        assert len(meaning) > 20, m.name


def test_the_readme_links_the_metric_table():
    readme = (ROOT / "README.md").read_text()
    assert "monitoring/README.md" in readme


def test_every_alert_has_a_runbook_section():
    doc = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    headings = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    for g in doc["groups"]:
        for r in g["rules"]:
            url = r["annotations"]["runbook_url"]
            path, _, anchor = url.partition("#")
            assert path == "docs/runbook.md" and anchor == r["alert"].lower(), url
            assert anchor in headings, f"docs/runbook.md has no section {r['alert']}"


def test_promtool_check_metrics_passes_on_a_real_scrape(tmp_path, monkeypatch):
    """A job's /metrics (every metric present) passes promtool's lint; with the 0.1 names still exported
    (the default for one release) only the deprecated hours counter is flagged."""
    from tests.lib.metrics import Job, feed_known_mix

    def lint(text: str) -> subprocess.CompletedProcess:
        return subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)

    monkeypatch.setenv("EVENT_ETL_METRICS_OLD_NAMES", "0")
    job = Job(tmp_path / "new")
    feed_known_mix(job)
    job.metrics.observe_progress({"sources": [{"endOffset": '{"files": 3}', "latestOffset": '{"files": 5}'}]})
    r = lint(job.prom.text())
    job.metrics.shutdown()
    assert r.returncode == 0, r.stdout + r.stderr
    monkeypatch.setenv("EVENT_ETL_METRICS_OLD_NAMES", "1")
    job = Job(tmp_path / "old")
    feed_known_mix(job)
    r = lint(job.prom.text())
    job.metrics.shutdown()
    flagged = {line.split()[0] for line in (r.stdout + r.stderr).splitlines() if line.startswith("event_etl_")}
    assert flagged == {"event_etl_hours_completed_total"}, r.stdout + r.stderr
