"""`event-etl graphs`: the arithmetic behind the charts, the local-history source, the PNG files, the CLI."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.errors import EventEtlError, UsageError
from event_etl.metrics import JobMetrics, MetricsHistory
from event_etl.metrics.graphs import (
    HistorySource,
    PrometheusSource,
    TimeRange,
    histogram_quantile,
    history_charts,
    parse_range,
    parse_time,
    render,
    seconds_scale,
    windowed_sums,
)
from tests.harness import FakeClock, LocalPipeline, click, make_event_type, t

UTC = UTC
NOW = datetime(2026, 11, 21, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize("q, counts, expected", [
    (0.5, [0, 0, 0, 0], None),                 # empty
    (0.5, [10, 0, 0, 0], 0.5),                 # first bucket: from 0 to its bound
    (0.5, [0, 10, 0, 0], 1.5),                 # halfway through (1, 2]
    (0.9, [5, 5, 0, 0], 1.8),
    (1.0, [5, 5, 0, 0], 2.0),
    (0.99, [0, 0, 1, 99], 4.0),                # in the overflow bucket: the highest bound
    (0.25, [0, 4, 0, 4], 1.5),
])
def test_histogram_quantile_as_prometheus_computes_it(q, counts, expected):
    got = histogram_quantile(q, (1, 2, 4), counts)
    assert got == (None if expected is None else pytest.approx(expected))


def test_windowed_sums_take_the_half_open_window_before_each_step():
    times = [10.0, 20.0, 30.0, 95.0]
    values = [(1, 10), (2, 20), (3, 30), (4, 40)]
    assert windowed_sums(times, values, [20.0, 30.0, 60.0, 100.0], 20.0) == [[3, 30], [5, 50], [0, 0], [4, 40]]


@pytest.mark.parametrize("values, expected", [([], (1.0, "s")), ([0.2, 90], (1.0, "s")), ([300], (60.0, "min")),
                                              ([-20000], (3600.0, "h"))])
def test_durations_are_shown_in_the_unit_that_reads_best(values, expected):
    assert seconds_scale(values) == expected


def test_time_range_from_the_options():
    rng = parse_range(since=None, until=None, last=None, step="1m", window="5m", now=NOW)
    assert (rng.start, rng.end) == (NOW - timedelta(hours=1), NOW) and len(rng.steps) == 61
    rng = parse_range(since="2026-11-21T13:00", until="2026-11-21T14:00Z", last=None, step="10s", window="1m", now=NOW)
    assert rng.start == datetime(2026, 11, 21, 13, tzinfo=UTC) and rng.end.tzinfo is not None
    assert parse_time("-2h", now=NOW) == NOW - timedelta(hours=2)
    assert parse_time("2026-11-21T14:00+01:00", now=NOW) == datetime(2026, 11, 21, 13, tzinfo=UTC)
    assert "13:00 to 2026-11-21 14:00 UTC, 1m windows every 10s" in rng.describe()


@pytest.mark.parametrize("kw, fix", [
    ({"since": "-2h", "last": "1h"}, "one of them"),
    ({"since": "yesterday"}, "ISO-8601"),
    ({"last": "soon"}, "--last 5m"),
    ({"step": "0"}, "--step 5m"),
    ({"since": "2026-11-21T16:00Z"}, "--since before --until"),
])
def test_bad_range_options_say_how_to_fix_them(kw, fix):
    args = {"since": None, "until": None, "last": None, "step": "1m", "window": "5m", **kw}
    with pytest.raises(UsageError) as err:
        parse_range(now=NOW, **args)
    assert fix in (err.value.fix or "")


def test_time_range_refuses_naive_datetimes():
    with pytest.raises(ValueError):
        TimeRange(datetime(2026, 11, 21), NOW, timedelta(minutes=1), timedelta(minutes=5))


def make_history(tmp_path, minutes: int = 30):
    """A job's history: a batch a minute of 60 timely events (one a second), 6 late ones in minutes 15-19."""
    et = make_event_type(tmp_path / "types")
    clock = FakeClock(t("13:50"))
    p = LocalPipeline(tmp_path, et, clock)
    path = tmp_path / "metrics.jsonl"
    m = JobMetrics("click", clock=clock, controller_state=lambda: p.controller.state, history=MetricsHistory(str(path)))
    p.controller.listeners.extend(m.listeners)
    for k in range(minutes):
        clock.now = t("13:50") + k * 60_000
        lines = [click(f"e{k}-{i}", clock.now - 30_000 - i * 100) for i in range(60)]
        if 15 <= k < 20:  # hour 13 is complete from about 14:03
            lines += [click(f"late{k}-{i}", "13:20") for i in range(6)]
        p.batch(lines)
    m.shutdown()
    return path, datetime.fromtimestamp(clock.now / 1000, UTC)


def test_history_charts_give_rates_and_percentiles_of_what_the_job_did(tmp_path):
    path, end = make_history(tmp_path)
    rng = parse_range(since=None, until=end.isoformat(), last="40m", step="1m", window="5m", now=end)
    charts = {c.key: c for c in HistorySource(str(path)).charts("click", rng)}
    assert list(charts) == ["watermark-lag", "events", "event-delay", "files", "marker-delay"]
    timely, late = (dict(p.series[0].points) for p in charts["events"].panels)
    steady = [v for ts, v in timely.items() if ts >= t("14:00") / 1000]
    assert steady and all(v == pytest.approx(1.0) for v in steady)  # 60 a minute
    assert max(late.values()) == pytest.approx(6 / 60)  # 6 a minute for 5 minutes: a full window of them
    assert sum(late.values()) * 300 == pytest.approx(30 * 5)  # each of the 30 late events is in 5 windows
    lag = charts["watermark-lag"].panels[0].series[0].points
    assert lag and all(120 <= v <= 160 for _, v in lag)  # out_of_orderness 2m plus the events' 30 s
    median = next(s for s in charts["event-delay"].panels[0].series if s.label == "median")
    assert all(30 <= v <= 60 for _, v in median.points)  # delays of 30-36 s: all in the bucket (30 s, 60 s]
    markers = charts["marker-delay"].panels[0].series[0].points
    assert markers and all(v >= 0 for _, v in markers)


def test_history_of_another_event_type_is_no_data(tmp_path):
    path, end = make_history(tmp_path, minutes=3)
    rng = parse_range(since=None, until=None, last="1h", step="1m", window="5m", now=end)
    assert not any(c.has_data for c in HistorySource(str(path)).charts("page_view", rng))
    assert not any(c.has_data for c in history_charts([], rng))


def test_render_writes_readable_pngs(tmp_path):
    from PIL import Image

    path, end = make_history(tmp_path)
    rng = parse_range(since=None, until=None, last="40m", step="1m", window="5m", now=end)
    charts = HistorySource(str(path)).charts("click", rng)
    paths = render(charts, tmp_path / "out", event_type="click", rng=rng)
    assert [p.name for p in paths] == ["click-watermark-lag.png", "click-events.png", "click-event-delay.png",
                                       "click-files.png", "click-marker-delay.png", "click-overview.png"]
    for p in paths:
        with Image.open(p) as img:
            assert img.format == "PNG" and img.width >= 1000 and img.height >= 300
            assert len(img.convert("L").getcolors(1 << 16)) > 20, f"{p.name} looks blank"


def test_graphs_command_from_a_history(tmp_path):
    path, end = make_history(tmp_path, minutes=10)
    out = tmp_path / "png"
    res = CliRunner().invoke(main, ["graphs", "click", "--history", str(path), "--since", "2026-11-21T13:45Z",
                                    "--until", "2026-11-21T14:05Z", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "click: 2026-11-21 13:45 to 2026-11-21 14:05 UTC" in res.output
    assert len(list(out.glob("click-*.png"))) == 6 and "wrote" in res.output


def test_graphs_command_errors_name_the_fix(tmp_path):
    path, _ = make_history(tmp_path, minutes=2)
    runner = CliRunner()
    res = runner.invoke(main, ["graphs", "click"], env={"EVENT_ETL_PROMETHEUS_URL": None})
    assert res.exit_code == 2 and "--prometheus URL or --history FILE" in res.output and "fix:" in res.output
    res = runner.invoke(main, ["graphs", "clik", "--history", str(path), "--since", "2026-11-21T13:00Z",
                               "--until", "2026-11-21T15:00Z", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no metrics of event type 'clik'" in res.output and "click" in res.output
    (tmp_path / "broken.jsonl").write_text('{"v": 1, "kind": "batch"\n{"v": 1}\n')
    res = runner.invoke(main, ["graphs", "click", "--history", str(tmp_path / "broken.jsonl")])
    assert res.exit_code == 2 and "broken.jsonl:1" in res.output


def test_graphs_help():
    res = CliRunner().invoke(main, ["graphs", "--help"])
    assert res.exit_code == 0
    for opt in ("--prometheus", "--history", "--last", "--since", "--until", "--step", "--window", "--out"):
        assert opt in res.output


def test_unreachable_prometheus_says_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    rng = parse_range(since=None, until=None, last="1h", step="1m", window="5m", now=NOW)
    with pytest.raises(EventEtlError) as err:
        PrometheusSource(f"http://127.0.0.1:{port}", timeout=2).charts("click", rng)
    assert "cannot read from Prometheus" in err.value.message and "--history" in err.value.fix


def test_promql_strings_are_escaped():
    from event_etl.metrics.graphs import _promql_string

    assert _promql_string('a"b\\c') == '"a\\"b\\\\c"'
    assert json.loads(_promql_string("page_view")) == "page_view"
