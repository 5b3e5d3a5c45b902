"""The graphs leave a gap where the job was stopped (issue 60 item 6): no line drawn across the time between a run's
last line and the next run's start, a shaded band there ("job stopped"), and no rate made up inside it.  Before, a
line went straight from the last point before the stop to the first after it, as if the job had run through it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from event_etl.metrics import JobMetrics, MetricsHistory
from event_etl.metrics.graphs import (
    STOPPED,
    HistorySource,
    Series,
    figures,
    history_stops,
    missing_steps,
    parse_range,
)
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

pytest.importorskip("matplotlib")

STOP, START = t("14:00"), t("14:20")  # the job stopped after its batch of 14:00 and started again at 14:20


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Two runs of one job on one checkpoint, each its own JobMetrics (as a process has), one history file: a batch a
    minute from 13:50 to 14:00, stopped, started again at 14:20, a batch a minute to 14:30."""
    tmp = tmp_path_factory.mktemp("stopped")
    et = make_event_type(tmp / "types")
    clock = FakeClock(t("13:50"))
    p = LocalPipeline(tmp, et, clock)
    path = tmp / "metrics.jsonl"
    for first, last in ((t("13:50"), STOP), (START, t("14:30"))):
        clock.now = first
        p.restart()  # a new process on the same checkpoint
        m = JobMetrics("click", clock=clock, controller_state=lambda: p.controller.state,
                       history=MetricsHistory(str(path)))
        p.controller.listeners.extend(m.listeners)
        for now in range(first + 60_000, last + 1, 60_000):
            clock.now = now
            p.batch([click(f"e{now}-{i}", now - 30_000 - i * 100) for i in range(60)])
        m.shutdown()  # the process ends; the next run's p.restart() is a new controller
    return path


def _charts(path):
    end = datetime.fromtimestamp(t("14:35") / 1000, UTC)
    rng = parse_range(since=None, until=end.isoformat(), last="50m", step="1m", window="5m", now=end)
    return rng, {c.key: c for c in HistorySource(str(path)).charts("click", rng)}


def test_the_history_says_when_the_job_was_stopped(history):
    (stop,) = history_stops([json.loads(line) for line in history.read_text().splitlines()])
    assert stop == (STOP / 1000, START / 1000)


def test_no_rate_or_lag_is_drawn_inside_the_stop_and_every_panel_knows_it(history):
    rng, charts = _charts(history)
    for c in charts.values():
        assert all(p.stopped == ((STOP / 1000, START / 1000),) for p in c.panels), c.key
    timely = charts["events"].panels[0].series[0].points
    assert timely and not [ts for ts, _ in timely if STOP / 1000 < ts < START / 1000]
    assert any(ts <= STOP / 1000 for ts, _ in timely) and any(ts >= START / 1000 for ts, _ in timely)
    lag = charts["watermark-lag"].panels[0].series[0].points
    assert not [ts for ts, _ in lag if STOP / 1000 < ts < START / 1000]


def test_the_lines_break_at_the_stop_and_a_band_says_job_stopped(history):
    rng, charts = _charts(history)
    fig = dict(figures(list(charts.values()), event_type="click", rng=rng))["click-events.png"]
    fig.canvas.draw()
    ax = fig.axes[0]
    runs = [line for line in ax.get_lines() if line.get_color() == ax.get_lines()[0].get_color()]
    assert len(runs) == 2, "the timely rate: one line per run, none across the stop"
    before, after = (line.get_xdata() for line in runs)
    assert max(x.timestamp() for x in before) <= STOP / 1000 and min(x.timestamp() for x in after) >= START / 1000
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["timely", STOPPED]
    assert len([p for p in ax.patches if p.get_label() == STOPPED]) == 1, "one shaded band"


def test_prometheus_series_break_where_the_job_was_not_scraped():
    pts = tuple((float(s), 1.0) for s in [*range(0, 600, 60), *range(1800, 2400, 60)])
    assert missing_steps([Series("watermark lag", pts)], 60.0) == [(540.0, 1800.0)]
    assert missing_steps([Series("watermark lag", pts[:5])], 60.0) == []
