"""A job's metrics as the tests read them: a scrape's samples, a job with its metrics attached, promtool.

- :func:`samples`, :func:`value`: a Prometheus text exposition as ``{(series, labels): value}``, one series' value;
- :class:`Job`: a :class:`~tests.lib.harness.LocalPipeline` with a ``JobMetrics`` attached as the runner attaches
  it (no HTTP server), and :func:`feed_known_mix`: two batches of known outcomes through it;
- :func:`promtool`: Prometheus' ``promtool``, or the test fails with how to install it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from event_etl.metrics import JobMetrics, MetricsHistory, PrometheusEndpoint
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

__all__ = ["Job", "feed_known_mix", "promtool", "samples", "value"]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """``{(series name, labels): value}`` of a Prometheus text exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text_or_samples, name: str, **labels) -> float | None:
    ss = samples(text_or_samples) if isinstance(text_or_samples, str) else text_or_samples
    return ss.get((name, frozenset(labels.items())))


class Job:
    """A LocalPipeline with a JobMetrics attached as the runner attaches it (no HTTP server)."""

    def __init__(self, tmp_path: Path, *, history: Path | None = None, **settings) -> None:
        self.et = make_event_type(tmp_path / "types", **settings)
        self.clock = FakeClock(t("14:10"))
        self.p = LocalPipeline(tmp_path, self.et, self.clock)
        self.history = history
        self.attach()

    def attach(self) -> None:
        self.prom = PrometheusEndpoint()
        self.metrics = JobMetrics(self.et.name, clock=self.clock, controller_state=lambda: self.p.controller.state,
                                  exports=[self.prom],
                                  history=MetricsHistory(str(self.history)) if self.history else None)
        self.p.controller.listeners.extend(self.metrics.listeners)

    def restart(self) -> None:
        """A new process on the same checkpoint: new controller, new metrics (counters from 0)."""
        self.metrics.shutdown()
        self.p.restart()
        self.attach()

    def scrape(self) -> dict:
        return samples(self.prom.text())


def feed_known_mix(job: Job) -> dict[str, int]:
    """Two batches with known outcomes; returns the expected count of each outcome."""
    p, clock = job.p, job.clock
    clock.now = t("14:10")
    first = [click(f"a{i}", f"13:{i:02d}") for i in range(0, 60, 3)] + [click("b1", "14:05"), click("b2", "14:06")]
    first += [b"not json", b"[1, 2]", b'{"id": "no-time"}']
    p.batch(first, shards=5)  # watermark 14:04: hour 13 complete, its 4-5 files over the bound: merged
    clock.now = t("14:20")
    late = [click(f"late{i}", f"13:{30 + i:02d}") for i in range(7)]  # hour 13 is complete: late
    too_late = [click("old1", "2026-11-19T10:00"), click("old2", "2026-11-19T11:00")]
    future = [click("fut", "15:00")]  # 40 minutes after arrival, more than max_future_skew
    timely = [click(f"c{i}", f"14:{10 + i:02d}") for i in range(5)]
    p.batch(late + too_late + future + timely + [b"", b"{broken"], shards=2)
    return {"timely": 22 + 5, "late": 7, "too_late": 2, "future": 1, "invalid": 3 + 2}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: install Prometheus (Debian/Ubuntu: sudo apt-get install -y prometheus); "
                    "bin/test installs it by itself")
    return path
