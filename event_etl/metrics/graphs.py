"""Graphs of a job without Grafana: PNG charts from Prometheus or from the job's local metrics history.

``event-etl graphs EVENT_TYPE`` draws, for one event type and one time range:

- **watermark lag**: now minus the watermark;
- **events per second**: timely and late, in two panels (late events are usually a
  hundredth of the timely ones and would vanish on a shared scale);
- **event delay**: arrival minus event time, median, 95th and 99th percentile;
- **files per second** written into hour folders;
- **marker delay**: when each hour's ``_COMPLETE`` was written, after the end of the hour;

one PNG per chart and ``EVENT_TYPE-overview.png`` with every panel stacked.  Rates and
percentiles are computed like Spotify's graphs: over a window (default 5 minutes) ending
at every step (default 1 minute).  Times are UTC on every axis; durations are shown in
seconds, minutes or hours, whichever reads best.

Two sources give the same charts:

- :class:`PrometheusSource` asks a Prometheus server's HTTP API (``/api/v1/query_range``)
  the queries in :data:`PROMQL`;
- :class:`HistorySource` reads the JSON lines a job appends with ``--metrics-history``
  (see :class:`event_etl.metrics.history.MetricsHistory`) and computes the same figures: the
  events of the batches that finished within the window, divided by the window.

The arithmetic (windows, percentiles of bucketed counts, unit choice) is pure and
tested on its own; only :func:`render` touches matplotlib (its Agg canvas, no global
backend state).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from event_etl.errors import EventEtlError, UsageError
from event_etl.metrics.history import read_history
from event_etl.timeutil import format_duration, parse_duration

"""The format of a ``--metrics-history`` file (:class:`event_etl.metrics.history.MetricsHistory` writes it).
Here, not in :mod:`event_etl.metrics`, so ``event-etl graphs`` needs matplotlib ([graphs]) only."""

__all__ = [
    "TimeRange",
    "Series",
    "Panel",
    "Chart",
    "PROMQL",
    "QUANTILES",
    "PrometheusSource",
    "HistorySource",
    "history_charts",
    "parse_range",
    "parse_time",
    "histogram_quantile",
    "windowed_sums",
    "seconds_scale",
    "render",
    "make_graphs",
]

QUANTILES = (0.5, 0.95, 0.99)
_UTC = UTC

# The queries behind the charts; {sel} is the event_type matcher, {w} the window.
PROMQL: dict[str, str] = {
    "watermark_lag": "max(event_etl_watermark_lag_seconds{{{sel}}})",
    "events": 'sum by (outcome) (rate(event_etl_events_total{{{sel},outcome=~"timely|late"}}[{w}]))',
    "event_delay": "histogram_quantile({q}, sum by (le) (rate(event_etl_event_delay_seconds_bucket{{{sel}}}[{w}])))",
    "files": "sum(rate(event_etl_written_files_total{{{sel}}}[{w}]))",
    "marker_delay": ("sum(increase(event_etl_marker_delay_seconds_sum{{{sel}}}[{w}])) / "
                     "sum(increase(event_etl_marker_delay_seconds_count{{{sel}}}[{w}]))"),
}


# -- the data model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TimeRange:
    """What to draw: ``start``..``end`` (aware UTC), a point every ``step``, each over the ``window`` before it."""

    start: datetime
    end: datetime
    step: timedelta
    window: timedelta

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            v = getattr(self, name)
            if v.tzinfo is None or v.utcoffset() is None:
                raise ValueError(f"TimeRange.{name} must be timezone-aware (UTC), got {v!r}")

    @property
    def steps(self) -> list[float]:
        """The evaluation times, in seconds since the epoch, aligned on multiples of ``step``."""
        a, b, s = self.start.timestamp(), self.end.timestamp(), self.step.total_seconds()
        t = math.ceil(a / s) * s
        out = []
        while t <= b + 1e-9:
            out.append(t)
            t += s
        return out

    def describe(self) -> str:
        fmt = "%Y-%m-%d %H:%M"
        return (f"{self.start.astimezone(_UTC).strftime(fmt)} to {self.end.astimezone(_UTC).strftime(fmt)} UTC, "
                f"{format_duration(self.window.total_seconds() * 1000)} windows every "
                f"{format_duration(self.step.total_seconds() * 1000)}")


@dataclass(frozen=True)
class Series:
    """One line: ``(seconds since the epoch, value)`` points."""

    label: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Panel:
    """One pair of axes: a quantity, its unit (``s`` is scaled to min or h when long) and its series."""

    quantity: str
    unit: str
    series: tuple[Series, ...] = ()
    style: str = "line"  # "line" or "points"
    log: bool = False  # for durations that span orders of magnitude (median 1 s, p99 1 h)

    @property
    def has_data(self) -> bool:
        return any(s.points for s in self.series)


@dataclass(frozen=True)
class Chart:
    """One PNG: ``key`` names the file, ``title`` heads it."""

    key: str
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)

    @property
    def has_data(self) -> bool:
        return any(p.has_data for p in self.panels)


def _charts(lag: Sequence[Series], timely: Sequence[Series], late: Sequence[Series], delay: Sequence[Series],
            files: Sequence[Series], marker: Sequence[Series]) -> list[Chart]:
    """The five charts, in order, from their series (both sources end here)."""
    return [
        Chart("watermark-lag", "watermark lag (now minus watermark)", (Panel("watermark lag", "s", tuple(lag)),)),
        Chart("events", "late vs timely events per second", (
            Panel("timely events", "events/s", tuple(timely)),
            Panel("late events", "events/s", tuple(late)),
        )),
        Chart("event-delay", "event delay (arrival minus event time)",
              (Panel("event delay", "s", tuple(delay), log=True),)),
        Chart("files", "files written per second", (Panel("files written", "files/s", tuple(files)),)),
        Chart("marker-delay", "marker delay (_COMPLETE written after the end of its hour)",
              (Panel("marker delay", "s", tuple(marker), style="points"),)),
    ]


def _quantile_label(q: float) -> str:
    return "median" if q == 0.5 else f"p{q * 100:g}"


# -- pure arithmetic ------------------------------------------------------------------------------
def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """The ``q``-quantile of bucketed counts, as Prometheus' ``histogram_quantile`` computes it.

    ``counts`` are per bucket (not cumulative), one per bound plus the overflow bucket.
    Linear interpolation within the bucket that holds the rank (from 0 for the first
    bucket); a rank in the overflow bucket gives the highest bound.  ``None`` when empty.
    """
    total = sum(counts)
    if total <= 0 or not bounds:
        return None
    rank = q * total
    cumulative = 0.0
    for i, n in enumerate(counts):
        if cumulative + n >= rank and n > 0:
            if i >= len(bounds):
                return float(bounds[-1])
            if i == 0 and bounds[0] <= 0:
                return float(bounds[0])
            lower = 0.0 if i == 0 else float(bounds[i - 1])
            return lower + (float(bounds[i]) - lower) * (rank - cumulative) / n
        cumulative += n
    return float(bounds[-1])


def windowed_sums(times: Sequence[float], values: Sequence[Sequence[float]], steps: Sequence[float],
                  window: float) -> list[list[float]]:
    """For each step ``t``: the element-wise sum of ``values[i]`` whose ``times[i]`` is in ``(t - window, t]``.

    ``times`` must be sorted.
    """
    width = len(values[0]) if values else 0
    prefix = [[0.0] * width]
    for v in values:
        prefix.append([a + b for a, b in zip(prefix[-1], v)])
    out = []
    for t in steps:
        lo, hi = bisect_right(times, t - window), bisect_right(times, t)
        out.append([b - a for a, b in zip(prefix[lo], prefix[hi])])
    return out


def seconds_scale(values: Iterable[float]) -> tuple[float, str]:
    """``(divisor, unit)`` to show durations in seconds: under 3 minutes in s, under 3 hours in min, else h."""
    biggest = max((abs(v) for v in values), default=0.0)
    if biggest < 180:
        return 1.0, "s"
    if biggest < 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def parse_time(text: str, *, now: datetime) -> datetime:
    """``now``, an ISO-8601 time (``2026-11-21T13:00Z``; without an offset it is read as UTC) or ``-2h`` (ago)."""
    s = text.strip()
    if s == "now":
        return now
    if s.startswith("-"):
        try:
            return now - timedelta(milliseconds=parse_duration(s[1:]))
        except ValueError as err:
            raise UsageError(f"{text!r}: {err}", fix="write e.g. -2h, now, or 2026-11-21T13:00Z") from err
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as err:
        raise UsageError(f"{text!r} is not a time", fix="write it in ISO-8601, e.g. 2026-11-21T13:00Z, or -2h") from err
    return dt.replace(tzinfo=_UTC) if dt.tzinfo is None else dt.astimezone(_UTC)


def parse_range(*, since: str | None, until: str | None, last: str | None, step: str, window: str,
                now: datetime) -> TimeRange:
    """The :class:`TimeRange` of the command-line options (``--last`` defaults to 1h)."""
    if since is not None and last is not None:
        raise UsageError("--since and --last both give the start", fix="use one of them")

    def dur(opt: str, text: str) -> timedelta:
        try:
            ms = parse_duration(text)
        except ValueError as err:
            raise UsageError(f"{opt}: {err}", fix=f"e.g. {opt} 5m") from err
        if ms <= 0:
            raise UsageError(f"{opt} must be positive", fix=f"e.g. {opt} 5m")
        return timedelta(milliseconds=ms)

    end = parse_time(until, now=now) if until else now
    start = parse_time(since, now=now) if since else end - dur("--last", last or "1h")
    if start >= end:
        raise UsageError(f"the range starts ({start.isoformat()}) after it ends ({end.isoformat()})",
                         fix="give --since before --until")
    rng = TimeRange(start, end, dur("--step", step), dur("--window", window))
    if len(rng.steps) > 11_000:
        raise UsageError(f"{len(rng.steps)} points per line are too many", fix="use a longer --step or a shorter range")
    return rng


# -- Prometheus ----------------------------------------------------------------------------------
def _promql_string(value: str) -> str:
    return json.dumps(value)  # a PromQL double-quoted string has JSON's escapes


class PrometheusSource:
    """Charts from a Prometheus server's HTTP API."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                doc = json.load(resp)
        except urllib.error.HTTPError as err:
            try:
                detail = json.load(err).get("error", "")
            except ValueError:
                detail = ""
            raise EventEtlError(f"Prometheus at {self.url} answered {err.code} to {params.get('query', path)!r}: "
                                f"{detail or err.reason}",
                                fix="check the URL (the server's root, e.g. http://127.0.0.1:9090)") from err
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise EventEtlError(f"cannot read from Prometheus at {self.url}: {getattr(err, 'reason', err)}",
                                fix="start Prometheus (see monitoring/README.md) or draw from the job's "
                                    "--metrics-history file with --history FILE") from err
        if doc.get("status") != "success":
            raise EventEtlError(f"Prometheus at {self.url}: {doc.get('error', doc)}")
        return doc["data"]

    def query_range(self, promql: str, rng: TimeRange) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """``[(labels, [(t, value), ...]), ...]``; NaN and infinite values are left out."""
        data = self._get("/api/v1/query_range", {
            "query": promql, "start": rng.start.timestamp(), "end": rng.end.timestamp(),
            "step": rng.step.total_seconds(),
        })
        out = []
        for r in data.get("result", []):
            pts = [(float(t), float(v)) for t, v in r["values"]]
            out.append((r["metric"], [(t, v) for t, v in pts if math.isfinite(v)]))
        return out

    def event_types(self) -> list[str]:
        return sorted(self._get("/api/v1/label/event_type/values", {}))

    def charts(self, event_type: str, rng: TimeRange) -> list[Chart]:
        sel = f"event_type={_promql_string(event_type)}"
        w = f"{int(rng.window.total_seconds())}s"

        def one(key: str, label: str, **kw: Any) -> list[Series]:
            res = self.query_range(PROMQL[key].format(sel=sel, w=w, **kw), rng)
            return [Series(label, tuple(pts)) for _, pts in res]

        by_outcome = {m.get("outcome"): pts for m, pts in self.query_range(PROMQL["events"].format(sel=sel, w=w), rng)}
        return _charts(
            lag=one("watermark_lag", "watermark lag"),
            timely=[Series("timely", tuple(by_outcome.get("timely", ())))],
            late=[Series("late", tuple(by_outcome.get("late", ())))],
            delay=[s for q in QUANTILES for s in one("event_delay", _quantile_label(q), q=q)],
            files=one("files", "files"),
            marker=one("marker_delay", "marker delay"),
        )


# -- the local history ---------------------------------------------------------------------------
class HistorySource:
    """Charts from a ``--metrics-history`` file (JSON lines; see :class:`event_etl.metrics.history.MetricsHistory`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def records(self) -> list[dict[str, Any]]:
        return read_history(self.path)

    def event_types(self) -> list[str]:
        return sorted({r.get("event_type") for r in self.records()} - {None})

    def charts(self, event_type: str, rng: TimeRange) -> list[Chart]:
        return history_charts([r for r in self.records() if r.get("event_type") == event_type], rng)


def history_charts(records: Sequence[dict[str, Any]], rng: TimeRange) -> list[Chart]:
    """The charts of one event type's history records (pure)."""
    a, b = rng.start.timestamp(), rng.end.timestamp()
    window = rng.window.total_seconds()
    recs = sorted(records, key=lambda r: r["t"])
    batches = [r for r in recs if r["kind"] == "batch"]
    in_range = lambda t: a <= t <= b  # noqa: E731
    lag = tuple(
        (r["t"], r["watermark_lag_seconds"])
        for r in recs
        if r["kind"] in ("batch", "watermark") and r.get("watermark_lag_seconds") is not None and in_range(r["t"])
    )
    marker = tuple((r["t"], r["marker_delay_seconds"]) for r in recs if r["kind"] == "marker" and in_range(r["t"]))
    timely = late = files = ()
    delay: list[Series] = []
    if batches:
        first, last = batches[0]["t"], batches[-1]["t"]
        steps = [t for t in rng.steps if first <= t <= last + window]
        times = [r["t"] for r in batches]
        sums = windowed_sums(times, [(r["events"].get("timely", 0), r["events"].get("late", 0), r["files"])
                                     for r in batches], steps, window)
        timely = tuple((t, s[0] / window) for t, s in zip(steps, sums))
        late = tuple((t, s[1] / window) for t, s in zip(steps, sums))
        files = tuple((t, s[2] / window) for t, s in zip(steps, sums))
        with_delay = [r for r in batches if r["delay"]["counts"]]
        if with_delay:
            bounds = with_delay[0]["delay"]["bounds"]
            dsums = windowed_sums([r["t"] for r in with_delay], [r["delay"]["counts"] for r in with_delay], steps,
                                  window)
            for q in QUANTILES:
                pts = [(t, histogram_quantile(q, bounds, c)) for t, c in zip(steps, dsums)]
                delay.append(Series(_quantile_label(q), tuple((t, v) for t, v in pts if v is not None)))
    return _charts(lag=[Series("watermark lag", lag)], timely=[Series("timely", timely)],
                   late=[Series("late", late)], delay=delay, files=[Series("files", files)],
                   marker=[Series("marker delay", marker)])


# -- rendering ------------------------------------------------------------------------------------
_COLORS = {"timely": "#1f77b4", "late": "#d62728", "median": "#2ca02c", "p95": "#ff7f0e", "p99": "#d62728"}


_DURATION_TICKS_S = (0.01, 0.1, 1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400)


def _draw_panel(ax, panel: Panel, xlim: tuple[datetime, datetime]) -> None:
    import matplotlib.dates as mdates
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    values = [v for s in panel.series for _, v in s.points]
    log = panel.log and any(v > 0 for v in values)
    if log:
        divisor, unit = 1.0, "log scale"
    elif panel.unit == "s":
        divisor, unit = seconds_scale(values)
    else:
        divisor, unit = 1.0, panel.unit
    for s in panel.series:
        pts = [(t, v) for t, v in s.points if not log or v > 0]
        if not pts:
            continue
        xs = [datetime.fromtimestamp(t, _UTC) for t, _ in pts]
        ys = [v / divisor for _, v in pts]
        color = _COLORS.get(s.label)
        if panel.style == "points":
            ax.plot(xs, ys, "o", markersize=5, label=s.label, color=color)
        else:
            ax.plot(xs, ys, "-", linewidth=1.6, label=s.label, color=color, marker="." if len(xs) < 40 else None)
    ax.set_ylabel(f"{panel.quantity} ({unit})")
    ax.grid(True, alpha=0.3)
    ax.set_xlim(*xlim)
    if log:
        ax.set_yscale("log")
        lo, hi = min(v for v in values if v > 0), max(values)
        ticks = [x for x in _DURATION_TICKS_S if lo / 10 <= x <= hi * 10]
        ax.set_ylim(min(ticks[0], lo) * 0.8, max(ticks[-1], hi) * 1.25)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_duration(v * 1000)))
    elif panel.has_data:
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(0.0, lo), hi if hi > 0 else 1.0)
    if panel.has_data:
        if len([s for s in panel.series if s.points]) > 1:
            ax.legend(loc="upper left", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data in this range", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_ylim(0, 1)
    locator = mdates.AutoDateLocator(tz=_UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=_UTC))


def _xlim(charts: Sequence[Chart], rng: TimeRange) -> tuple[datetime, datetime]:
    """The span that holds data (all charts share it), else the whole range."""
    ts = [t for c in charts for p in c.panels for s in p.series for t, _ in s.points]
    if not ts:
        return rng.start, rng.end
    lo, hi = min(ts), max(ts)
    pad = max((hi - lo) * 0.02, rng.step.total_seconds())
    return datetime.fromtimestamp(lo - pad, _UTC), datetime.fromtimestamp(hi + pad, _UTC)


def _figure(panels: Sequence[tuple[str, Panel]], title: str, subtitle: str, xlim):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 0.9 + 2.6 * len(panels)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (heading, panel) in zip(axes, panels):
        _draw_panel(ax, panel, xlim)
        if heading:
            ax.set_title(heading, loc="left", fontsize="medium")
    axes[-1].set_xlabel("time (UTC)")
    fig.suptitle(f"{title}\n{subtitle}", fontsize="large")
    return fig


def render(charts: Sequence[Chart], out_dir: str | Path, *, event_type: str, rng: TimeRange,
           source: str = "") -> list[Path]:
    """Write ``EVENT_TYPE-<chart>.png`` for every chart and ``EVENT_TYPE-overview.png``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    xlim = _xlim(charts, rng)
    subtitle = rng.describe() + (f" · {source}" if source else "")
    written = []
    for c in charts:
        heads = [(p.quantity if len(c.panels) > 1 else "", p) for p in c.panels]
        fig = _figure(heads, f"{event_type}: {c.title}", subtitle, xlim)
        path = out / f"{event_type}-{c.key}.png"
        fig.savefig(path)
        written.append(path)
    overview = [(f"{c.title}" + (f": {p.quantity}" if len(c.panels) > 1 else ""), p) for c in charts for p in c.panels]
    fig = _figure(overview, f"{event_type}: overview", subtitle, xlim)
    path = out / f"{event_type}-overview.png"
    fig.savefig(path)
    written.append(path)
    return written


def make_graphs(event_type: str, *, rng: TimeRange, out_dir: str | Path, prometheus: str | None = None,
                history: str | None = None) -> tuple[list[Chart], list[Path]]:
    """Fetch the charts of ``event_type`` from one source and write the PNGs.  Returns ``(charts, paths)``."""
    if (prometheus is None) == (history is None):
        raise UsageError("say where the metrics are: --prometheus URL or --history FILE (one of them)",
                         fix="e.g. --prometheus http://127.0.0.1:9090, or --history metrics.jsonl from a job run "
                             "with --metrics-history metrics.jsonl")
    source = PrometheusSource(prometheus) if prometheus is not None else HistorySource(history)
    charts = source.charts(event_type, rng)
    if not any(c.has_data for c in charts):
        known = source.event_types()
        where = prometheus or history
        if event_type not in known:
            raise UsageError(f"{where} has no metrics of event type {event_type!r}",
                             fix=f"event types there: {', '.join(known) or '(none)'}")
        raise UsageError(f"{where} has no metrics of {event_type} in {rng.describe()}",
                         fix="widen the range (--last 6h, --since ...)")
    paths = render(charts, out_dir, event_type=event_type, rng=rng,
                   source=f"Prometheus {prometheus}" if prometheus else f"history {history}")
    return charts, paths
