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
    Series,
    TimeRange,
    figures,
    histogram_quantile,
    history_charts,
    history_range,
    parse_range,
    parse_time,
    render,
    seconds_scale,
    windowed_rates,
    windowed_sums,
)
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

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
    assert ("13:00 to 2026-11-21 14:00 UTC, a point every 10s; rates and event delays over the 1m before each point"
            in rng.describe())


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


def test_graphs_command_errors_name_the_fix(tmp_path, monkeypatch):
    path, _ = make_history(tmp_path, minutes=2)
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)  # no ./checkpoints/page_view here
    res = runner.invoke(main, ["graphs", "page_view"], env={"EVENT_ETL_PROMETHEUS_URL": None})
    assert res.exit_code == 2 and "--prometheus URL or --history FILE" in res.output and "fix:" in res.output
    assert "a job keeps its history in its checkpoint" in res.output and "--checkpoint DIR" in res.output
    assert str(tmp_path / "checkpoints" / "page_view" / "metrics-history.jsonl") in res.output
    # a type that is neither in the folder of event types nor a checkpoint's: said as such (issue 60 item 3)
    res = runner.invoke(main, ["graphs", "nosuch"], env={"EVENT_ETL_PROMETHEUS_URL": None})
    assert res.exit_code == 2 and "no event type 'nosuch'" in res.output and "--prometheus URL or" not in res.output
    assert "known types: db_change, page_view, payment_authorization" in res.output
    res = runner.invoke(main, ["graphs", "click", "--checkpoint", str(tmp_path / "nowhere")],
                        env={"EVENT_ETL_PROMETHEUS_URL": None})
    assert res.exit_code == 2 and "no metrics history there" in res.output and "fix:" in res.output
    res = runner.invoke(main, ["graphs", "click", "--history", str(path), "--checkpoint", str(tmp_path)],
                        env={"EVENT_ETL_PROMETHEUS_URL": None})
    assert res.exit_code == 2 and "give one of them" in res.output
    res = runner.invoke(main, ["graphs", "clik", "--history", str(path), "--since", "2026-11-21T13:00Z",
                               "--until", "2026-11-21T15:00Z", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "no metrics of event type 'clik'" in res.output and "click" in res.output
    (tmp_path / "broken.jsonl").write_text('{"v": 1, "kind": "batch"\n{"v": 1}\n')
    res = runner.invoke(main, ["graphs", "click", "--history", str(tmp_path / "broken.jsonl")])
    assert res.exit_code == 2 and "broken.jsonl:1" in res.output


def test_graphs_help():
    res = CliRunner().invoke(main, ["graphs", "--help"])
    assert res.exit_code == 0
    for opt in ("--prometheus", "--history", "--checkpoint", "--last", "--since", "--until", "--step", "--window",
                "--out"):
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


# -- issue 41: the demo's first ten minutes -------------------------------------------------------
DEMO_START = t("2026-11-22T10:59:00")


def demo_history(path, *, seconds: int = 90, rate: int = 3325, trigger: int = 5, speedup: int = 120,
                 late_per_batch: int = 20) -> dict:
    """What `event-etl run page_view` writes into its checkpoint's history: the generator at ``rate`` events a second,
    a batch every ``trigger`` seconds for ``seconds``, its event clock ``speedup`` times faster than the wall clock
    from 2h15m before the hour.  The listener gets what the controller hands it (batches, markers)."""
    from collections import Counter
    from types import SimpleNamespace

    from event_etl.job.controller import BatchEvent
    from event_etl.metrics.spec import DELAY_BUCKETS_S
    from event_etl.rules.watermark import WatermarkState
    from event_etl.task.report import BatchResult

    wall = [DEMO_START]
    gen_start = DEMO_START - DEMO_START % 3_600_000 - 2 * 3_600_000 - 15 * 60_000
    event_clock = lambda: gen_start + (wall[0] - DEMO_START) * speedup  # noqa: E731
    m = JobMetrics("page_view", clock=lambda: wall[0], history=MetricsHistory(str(path)), event_clock=event_clock)
    marked_through = None
    for k in range(1, seconds // trigger + 1):
        wall[0] = DEMO_START + k * trigger * 1000
        n = rate * trigger
        wm = event_clock() - 150_000
        buckets = [0] * (len(DELAY_BUCKETS_S) + 1)
        buckets[5] = n  # (2.5 s, 5 s]
        m._on_event("batch", BatchEvent(k - 1, BatchResult(counts=Counter(timely=n - late_per_batch,
                                                                          late=late_per_batch),
                                                           files_written=4, bytes_written=10**6,
                                                           delay_buckets=buckets, delay_sum_ms=n * 4000),
                                        WatermarkState(watermark=wm), [], wall[0] - 1500, wall[0], False))
        hour = (marked_through + 3_600_000) if marked_through is not None else gen_start - gen_start % 3_600_000
        if wm >= hour + 3_600_000:
            m._on_event("marker", SimpleNamespace(hour=hour, completed_at=wall[0], marker_delay_ms=wall[0] - hour,
                                                  records=n, late_records=3, files=[1, 2]))
            marked_through = hour
    m.shutdown()
    return {"end": wall[0], "event_clock": event_clock}


def _all_points(charts, key: str) -> list[tuple[float, float]]:
    c = next(c for c in charts if c.key == key)
    return [pt for p in c.panels for s in p.series for pt in s.points]


def test_windowed_rates_divide_by_the_time_the_data_covers():
    # three batches of 10 s each, 100 events each (10/s), then the job stops at t=30
    intervals, values = [(0.0, 10.0), (10.0, 20.0), (20.0, 30.0)], [(100,), (100,), (100,)]
    got = windowed_rates(intervals, values, [10.0, 30.0, 300.0, 329.0, 331.0], 300.0)
    assert got[:4] == [[10.0], [10.0], [10.0], [10.0]]  # a 5-minute window over 30 s of data: 10/s, not 1/s
    assert got[4] is None  # a window after the data
    # idle between two batches: the second covers 60 s with 60 events; a window inside it shows 1/s, not nothing
    got = windowed_rates([(0.0, 10.0), (10.0, 70.0)], [(100,), (60,)], [40.0], 20.0)
    assert got == [[pytest.approx(1.0)]]
    # a batch of no length (a job that started as its first batch ended) counts whole, and covers nothing
    assert windowed_rates([(0.0, 0.0), (0.0, 10.0)], [(50,), (100,)], [0.0, 10.0], 60.0) == [None, [15.0]]


def test_the_rate_of_a_short_run_is_the_runs_rate_whatever_the_window(tmp_path):
    """The demo: 90 s at 3,325 events/s, drawn with the default 5-minute window."""
    path = tmp_path / "h.jsonl"
    demo = demo_history(path)
    source = HistorySource(str(path))
    for rng in (history_range(source.of_type("page_view")),  # no range option: the history drawn whole
                parse_range(since=None, until=None, last="1h", step="1m", window="5m",  # the last hour
                            now=datetime.fromtimestamp(demo["end"] / 1000, UTC) + timedelta(seconds=30))):
        charts = source.charts("page_view", rng)
        timely = dict(charts[1].panels[0].series[0].points)
        late = dict(charts[1].panels[1].series[0].points)
        assert timely, rng
        for ts, v in timely.items():
            assert v + late[ts] == pytest.approx(3325, rel=0.03), (ts, v)
        files = [v for _, v in _all_points(charts, "files")]
        assert files and all(v == pytest.approx(4 / 5, rel=0.03) for v in files)


def test_a_history_is_drawn_whole_when_no_range_is_given(tmp_path):
    path = tmp_path / "h.jsonl"
    demo_history(path)
    recs = HistorySource(str(path)).of_type("page_view")
    rng = history_range(recs)
    first = min(r.get("since", r["t"]) for r in recs)
    last = max(r["t"] for r in recs)
    assert rng.start.timestamp() < first and rng.end.timestamp() > last
    assert (rng.end - rng.start).total_seconds() <= (last - first) * 1.1  # a small margin, not the last hour
    assert 30 <= len(rng.steps) <= 120 and rng.window == timedelta(minutes=5)
    assert history_range(recs, step=timedelta(seconds=10)).step == timedelta(seconds=10)
    # a long history: points an hour or more apart, each over the time since the one before
    days = [{**r, "t": r["t"] + k * 3600.0, "since": r["t"] + k * 3600.0 - 5} for k, r in enumerate(recs * 3)]
    long = history_range(days)
    assert long.step >= timedelta(hours=1) and long.window == long.step
    assert history_range(days, window=timedelta(minutes=5)).window == timedelta(minutes=5)


def test_lag_against_the_generator_clock_is_labelled_so(tmp_path):
    path = tmp_path / "h.jsonl"
    demo_history(path)
    recs = HistorySource(str(path)).of_type("page_view")
    assert all(r["clock"] == "generator" for r in recs if "watermark_lag_seconds" in r or r["kind"] == "marker")
    assert {r["watermark_lag_seconds"] for r in recs if r["kind"] == "batch"} == {150.0}  # not -5 h
    marker = next(r for r in recs if r["kind"] == "marker")
    generator_then = (DEMO_START - DEMO_START % 3_600_000 - 8_100_000 + (marker["t"] * 1000 - DEMO_START) * 120) / 1000
    assert marker["marker_delay_seconds"] == generator_then - marker["hour_end"] == 300  # 5 min on its clock
    assert marker["t"] - marker["hour_end"] > 2 * 3600  # on the wall clock: hours
    charts = history_charts(recs, history_range(recs))
    lag, marker_panel = charts[0].panels[0], charts[4].panels[0]
    assert lag.quantity == "watermark lag (generator clock)" and "generator clock minus watermark" in charts[0].title
    # the marker delay is the manifest's, on the wall clock, as `hours` and `wait` show it (issue 50 item 4)
    assert marker_panel.quantity == "marker delay (wall clock)" and "wall clock" in charts[4].title
    assert dict(marker_panel.series[0].points)[marker["t"]] == marker["t"] - marker["hour_end"]
    figs = dict(figures(charts, event_type="page_view", rng=history_range(recs)))
    assert figs["page_view-watermark-lag.png"].axes[0].get_ylabel() == "watermark lag (generator clock, s)"
    # a job on the wall clock: no note
    path2, _ = make_history(tmp_path / "wall")
    wall = history_charts(HistorySource(str(path2)).of_type("click"), history_range(HistorySource(str(path2))
                                                                                    .of_type("click")))
    assert wall[0].panels[0].quantity == "watermark lag" and wall[0].title == "watermark lag (now minus watermark)"


def _figures_of_every_kind(tmp_path):
    """Figures of the demo (90 s, drawn whole), of a 30-minute history drawn in a wider range, and of a history over
    two days (ticks a day apart cross midnight)."""
    out = []
    path = tmp_path / "demo.jsonl"
    demo_history(path)
    src = HistorySource(str(path))
    rng = history_range(src.of_type("page_view"))
    out.append((rng, figures(src.charts("page_view", rng), event_type="page_view", rng=rng)))
    path2, end = make_history(tmp_path / "click")
    rng = parse_range(since=None, until=None, last="1h", step="1m", window="5m", now=end)
    out.append((rng, figures(HistorySource(str(path2)).charts("click", rng), event_type="click", rng=rng)))
    long = tuple((t("2026-11-21T20:00") / 1000 + k * 1800.0, -3600.0 * (5 + k % 5)) for k in range(50))  # -5 to -9 h
    charts = _charts_of(lag=[Series("watermark lag", long)],
                        marker=[Series("marker delay", ((t("2026-11-22T09:00") / 1000, 600.0),))])
    rng = parse_range(since="2026-11-21T19:00Z", until="2026-11-23T00:00Z", last=None, step="30m", window="1h",
                      now=NOW)
    out.append((rng, figures(charts, event_type="click", rng=rng)))
    return out


def _charts_of(**series):
    from event_etl.metrics.graphs import ChartData, _charts

    return _charts(ChartData(**series))


def test_y_limits_hold_every_point_with_a_margin_below_and_above(tmp_path):
    for _rng, figs in _figures_of_every_kind(tmp_path):
        for name, fig in figs:
            for ax in fig.axes:
                ys = [float(y) for line in ax.get_lines() for y in line.get_ydata()]
                if not ys:
                    continue
                lo, hi = ax.get_ylim()
                if ax.get_yscale() == "log":
                    assert lo < min(ys) and max(ys) < hi, (name, ax.get_ylabel())
                    continue
                margin = 0.03 * (hi - lo)
                assert lo + margin <= min(ys) and max(ys) <= hi - margin, (name, ax.get_ylabel(), (lo, hi), ys)


def test_time_tick_labels_are_all_written_alike_and_the_date_is_said_once(tmp_path):
    import re

    formats = set()
    for _rng, figs in _figures_of_every_kind(tmp_path):
        for name, fig in figs:
            fig.canvas.draw()
            ax = fig.axes[-1]
            labels = [lab.get_text() for lab in ax.get_xticklabels() if lab.get_text()]
            assert len(labels) >= 3 and len(set(labels)) == len(labels), (name, labels)
            shapes = {re.sub(r"\d", "9", lab) for lab in labels}
            assert len(shapes) == 1, (name, labels)  # not "10:59" beside "15" and "30"
            formats |= shapes
            assert re.search(r"\d{4}-\d\d-\d\d", ax.get_xlabel()), ax.get_xlabel()
            assert not any(re.search(r"\d{4}", lab) for lab in labels), labels
    assert formats == {"99:99:99", "99:99", "99-99 99:99"}  # seconds for the 90-s run; the day for two days


def test_the_title_states_the_range_of_the_time_axis(tmp_path):
    import re

    import matplotlib.dates as mdates

    for rng, figs in _figures_of_every_kind(tmp_path):
        for name, fig in figs:
            title = fig.get_suptitle()
            m = re.search(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d(?::\d\d)?) to (\d{4}-\d\d-\d\d )?(\d\d:\d\d(?::\d\d)?) UTC",
                          title)
            assert m, title
            day, a, day2, b = m.groups()
            said = (datetime.fromisoformat(f"{day}T{a}+00:00"),
                    datetime.fromisoformat(f"{(day2 or day).strip()}T{b}+00:00"))
            axis = tuple(mdates.num2date(x, tz=UTC) for x in fig.axes[0].get_xlim())
            assert said == axis, (name, title, axis)
            assert all(ax.get_xlim() == fig.axes[0].get_xlim() for ax in fig.axes)
            if (axis[1] - axis[0]) < 0.9 * (rng.end - rng.start):  # drawn narrower than asked: both are said
                assert "where the data is, within" in title, title


def test_graphs_without_options_draw_the_history_a_job_keeps_in_its_checkpoint(tmp_path, monkeypatch):
    from event_etl.metrics.graphs import make_graphs

    work = tmp_path / "work"
    ck = work / "checkpoints" / "page_view"
    ck.mkdir(parents=True)
    demo_history(ck / "metrics-history.jsonl")
    monkeypatch.chdir(work)
    charts, paths = make_graphs("page_view", out_dir=work / "graphs")
    assert len(paths) == 6 and all(c.has_data for c in charts)
    res = CliRunner().invoke(main, ["graphs", "page_view"], env={"EVENT_ETL_PROMETHEUS_URL": None})
    assert res.exit_code == 0, res.output
    assert f"history {ck / 'metrics-history.jsonl'}" in res.output and res.output.count("wrote") == 6
    assert "(no data in this range)" not in res.output
    # another checkpoint, named; an option given beats $EVENT_ETL_PROMETHEUS_URL
    other = tmp_path / "elsewhere"
    other.mkdir()
    (ck / "metrics-history.jsonl").rename(other / "metrics-history.jsonl")
    res = CliRunner().invoke(main, ["graphs", "page_view", "--checkpoint", str(other), "--out", str(tmp_path / "o")],
                             env={"EVENT_ETL_PROMETHEUS_URL": "http://127.0.0.1:9"})
    assert res.exit_code == 0, res.output
    assert len(list((tmp_path / "o").glob("page_view-*.png"))) == 6


def test_graphs_read_a_rotated_history(tmp_path):
    path = tmp_path / "h.jsonl"
    demo_history(path)
    lines = path.read_text().splitlines(keepends=True)
    (tmp_path / "h.jsonl.1").write_text("".join(lines[: len(lines) // 2]))
    path.write_text("".join(lines[len(lines) // 2:]))
    src = HistorySource(str(path))
    assert len(src.records()) == len(lines)
    rng = history_range(src.of_type("page_view"))
    assert rng.start.timestamp() < DEMO_START / 1000 + 1


def test_the_title_names_a_history_in_the_working_folder_by_its_relative_path(tmp_path, monkeypatch):
    from event_etl.metrics.graphs import _short_path

    monkeypatch.chdir(tmp_path)
    assert _short_path(str(tmp_path / "checkpoints" / "page_view" / "metrics-history.jsonl")) == \
        "checkpoints/page_view/metrics-history.jsonl"
    long = "/" + "/".join(["folder"] * 20) + "/metrics-history.jsonl"
    assert _short_path(long).startswith("…") and _short_path(long).endswith("/metrics-history.jsonl")
    assert len(_short_path(long)) == 70


# -- issue 50 item 4: graphs after a drain ----------------------------------------------------------
def drained_history(tmp_path, minutes: int = 30):
    """``make_history``'s job (a batch a minute, the wall clock at 13:50 + k minutes), then drained: the drain moves
    the watermark to the end of the open hour 14:00, 15:00, ahead of the clock (~14:19), and marks it."""
    et = make_event_type(tmp_path / "types")
    clock = FakeClock(t("13:50"))
    p = LocalPipeline(tmp_path, et, clock)
    path = tmp_path / "metrics.jsonl"
    m = JobMetrics("click", clock=clock, controller_state=lambda: p.controller.state, history=MetricsHistory(str(path)))
    p.controller.listeners.extend(m.listeners)
    for k in range(minutes):
        clock.now = t("13:50") + k * 60_000
        p.batch([click(f"e{k}-{i}", clock.now - 30_000 - i * 100) for i in range(60)])
    clock.now += 5_000
    marked = p.controller.drain()
    m.shutdown()
    assert [m.extra["closed_by"] for m in marked] == ["drain"] and marked[0].marker_delay_ms < 0  # the premise
    return path, marked[0]


def test_a_drain_is_an_event_on_the_graphs_not_a_negative_lag_or_marker_delay(tmp_path):
    path, drained = drained_history(tmp_path)
    recs = HistorySource(str(path)).of_type("click")
    drain = next(r for r in recs if r.get("why") == "drain")
    assert drain["watermark_lag_seconds"] < -30 * 60  # what the history holds: the step ahead of the clock
    drained_marker = next(r for r in recs if r["kind"] == "marker" and r["hour"] == "2026-11-21T14:00:00Z")
    assert drained_marker["closed_by"] == "drain"
    charts = {c.key: c for c in history_charts(recs, history_range(recs))}
    lag_panel, marker_panel = charts["watermark-lag"].panels[0], charts["marker-delay"].panels[0]
    lag = [v for s in lag_panel.series for _, v in s.points]
    assert lag and min(lag) >= 0, "the drain's step is no lag sample"
    assert drain["t"] not in {ts for s in lag_panel.series for ts, _ in s.points}
    assert [(e.t, e.name) for e in lag_panel.events] == [(drain["t"], "drain")]
    markers = [v for s in marker_panel.series for _, v in s.points]
    assert markers and min(markers) >= 0, "the drained hour's marker is no negative marker delay"
    assert [(e.t, e.name) for e in marker_panel.events] == [(drain["t"], "drain")]
    # drawn: a marked point with its name, on the zero line, no point below zero
    figs = dict(figures(list(charts.values()), event_type="click", rng=history_range(recs)))
    ax = figs["click-watermark-lag.png"].axes[0]
    assert "drain" in [t.get_text() for t in ax.texts]
    assert "drain" in [line.get_label() for line in ax.get_lines()]
    assert min(float(y) for line in ax.get_lines() for y in line.get_ydata()) >= 0


def test_events_of_a_history_without_closed_by_and_of_a_clock_ahead(tmp_path):
    """Marker lines written before `closed_by` existed: one marked before its hour ended just before a drain line is
    the drain's; one marked early with no drain near is `ahead`. Neither is a marker-delay sample."""
    from event_etl.metrics.graphs import MARKED_AHEAD, history_events

    hour_end = t("2026-11-21T15:00") / 1000
    recs = [
        {"kind": "batch", "t": hour_end - 7200, "since": hour_end - 7205, "events": {"timely": 1}, "files": 1,
         "delay": {"bounds": [1], "counts": []}, "watermark_lag_seconds": 60.0},
        {"kind": "marker", "t": hour_end - 3000, "hour_end": hour_end - 600, "marker_delay_seconds": -2400.0},
        {"kind": "marker", "t": hour_end - 1800, "hour_end": hour_end - 3600, "marker_delay_seconds": 1800.0},
        {"kind": "marker", "t": hour_end - 900, "hour_end": hour_end, "marker_delay_seconds": -900.0},
        {"kind": "watermark", "why": "drain", "t": hour_end - 899, "watermark_lag_seconds": -899.0},
    ]
    rng = history_range(recs)
    events, marker_events = history_events(recs, rng)
    assert [(e.t, e.name) for e in events] == [(hour_end - 899, "drain")]
    assert [(e.t, e.name) for e in marker_events] == [(hour_end - 3000, MARKED_AHEAD)]
    marker = history_charts(recs, rng)[4].panels[0]
    assert [pt for s in marker.series for pt in s.points] == [(hour_end - 1800, 1800.0)]
    assert sorted((e.t, e.name) for e in marker.events) == [(hour_end - 3000, MARKED_AHEAD), (hour_end - 899, "drain")]


def test_negative_lags_from_prometheus_are_drawn_as_events_not_below_zero():
    lag = Series("watermark lag", ((1000.0, 30.0), (1010.0, -20.0)))
    panel = _charts_of(lag=[lag])[0].panels[0]
    assert panel.series[0].points == ((1000.0, 30.0),)
    assert [(e.t, e.name) for e in panel.events] == [(1010.0, "watermark ahead of now")]


def test_one_title_per_panel_saying_what_it_shows_and_no_jargon(tmp_path):
    path, end = make_history(tmp_path)
    rng = parse_range(since=None, until=None, last="40m", step="1m", window="5m", now=end)
    figs = dict(figures(HistorySource(str(path)).charts("click", rng), event_type="click", rng=rng))
    titles = [ax.get_title(loc="left") for ax in figs["click-overview.png"].axes]
    assert titles == ["watermark lag (now minus watermark)", "timely events per second",
                      "late events per second (arrived after their hour was complete)",
                      "event delay (arrival minus event time): median, p95, p99", "files written per second",
                      "marker delay (wall clock): _COMPLETE written after the end of its hour"]
    assert [ax.get_title(loc="left") for ax in figs["click-events.png"].axes] == titles[1:3]
    for name, fig in figs.items():
        sup = fig.get_suptitle()
        assert "windows every" not in sup and "a point every 1m; rates and event delays over the 5m before each " \
                                                "point" in sup, (name, sup)


def test_the_event_delay_legend_is_beside_its_panel_not_on_its_points(tmp_path):
    path, end = make_history(tmp_path)
    rng = parse_range(since=None, until=None, last="40m", step="1m", window="5m", now=end)
    fig = dict(figures(HistorySource(str(path)).charts("click", rng), event_type="click", rng=rng))[
        "click-event-delay.png"]
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["median", "p95", "p99"]
    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1, "the legend covers the panel's points"
