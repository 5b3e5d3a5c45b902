"""Graphs of a job without Grafana: PNG charts from Prometheus or from the job's local metrics history.

``event-etl graphs EVENT_TYPE`` draws, for one event type and one time range:

- **watermark lag**: now minus the watermark (now on the generator's clock for a job that reads it);
- **events per second**: timely and late, in two panels (late events are usually a
  hundredth of the timely ones and would vanish on a shared scale);
- **event delay**: arrival minus event time, median, 95th and 99th percentile;
- **files per second** written into hour folders;
- **marker delay**: when each hour's ``_COMPLETE`` was written, after the end of the hour, on the
  wall clock: the manifest's figure, the one `event-etl hours` and `wait` show (:mod:`event_etl.rules.delays`);

one PNG per chart and ``EVENT_TYPE-overview.png`` with every panel stacked, each panel under one
title saying what it shows.  Lags and delays are never drawn below zero: what happened ahead of
"now" is an :class:`Event`, a marked point with its name on the panels it concerns -- a drain (its
last step moves the watermark to the end of the open hour, ahead of the clock: no lag sample), an
hour marked before it ended by the wall clock (``ahead``), a watermark ahead of now.

Rates and percentiles are computed like Spotify's graphs: over a window (default 5 minutes) ending
at every step (default 1 minute; about 60 points over a history drawn whole).  Times are
UTC on every axis; durations are shown in seconds, minutes or hours, whichever reads best.

Two sources give the same charts:

- :class:`PrometheusSource` asks a Prometheus server's HTTP API (``/api/v1/query_range``)
  the queries in :data:`PROMQL`;
- :class:`HistorySource` reads the JSON lines a job appends to its metrics history (in its
  checkpoint, ``<checkpoint>/metrics-history.jsonl``, or the file ``--metrics-history`` names;
  see :class:`event_etl.metrics.history.MetricsHistory`) and computes the same figures: the
  events of the batches within the window, divided by the time they cover within it (a job that
  ran 90 s has 90 s of data in a 5-minute window, not 5 minutes: :func:`windowed_rates`).  Drawn
  without a range, a history is drawn whole (:func:`history_range`).  A history whose lag figures
  were measured against the source's own clock (the generator's) says so on its panels.

With neither source named, ``event-etl graphs TYPE`` draws the history in the type's default
checkpoint (``./checkpoints/TYPE``; ``--checkpoint DIR`` names another): see :func:`open_source`.

The PNGs share one time axis per run of the command, the one their title states: the part of
the range that holds data.  Its ticks are all written alike (``HH:MM``, or ``HH:MM:SS`` when they
are less than a minute apart; the date once, in the axis label), and no point is drawn on the
edge of its panel.

The arithmetic (windows, percentiles of bucketed counts, unit choice) is pure and
tested on its own; only :func:`figures` (and :func:`render`, which saves them) touches
matplotlib (its Agg canvas, no global backend state).
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.parse
import urllib.request
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from event_etl.errors import EventEtlError, UsageError
from event_etl.metrics.history import HISTORY_FILE, default_history_path, history_files, read_history
from event_etl.rules.delays import MARKER_DELAY_NAME
from event_etl.timeutil import format_duration, parse_duration

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_Axes = Any
"""A matplotlib ``Axes``, untyped here: its annotations take numbers for x, where its date converter also takes the
datetimes drawn here."""

"""The format of a ``--metrics-history`` file (:class:`event_etl.metrics.history.MetricsHistory` writes it).
Here, not in :mod:`event_etl.metrics`, so ``event-etl graphs`` needs matplotlib ([graphs]) only."""

__all__ = [
    "TimeRange",
    "Series",
    "Event",
    "Panel",
    "Chart",
    "PROMQL",
    "QUANTILES",
    "PrometheusSource",
    "HistorySource",
    "history_charts",
    "history_events",
    "history_range",
    "auto_step",
    "open_source",
    "drawn_range",
    "span_text",
    "describe_drawn",
    "figures",
    "windowed_rates",
    "parse_range",
    "parse_positive_duration",
    "check_points",
    "parse_time",
    "histogram_quantile",
    "windowed_sums",
    "seconds_scale",
    "render",
    "graphs_range",
    "make_graphs",
    "ChartData",
    "STOPPED",
    "history_stops",
    "missing_steps",
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
                + self.points_text())

    def points_text(self) -> str:
        """``a point every 10s; rates and event delays over the 5m before each point``: what a point of a chart is,
        in words."""
        return (f"a point every {format_duration(self.step.total_seconds() * 1000)}; rates and event delays over the "
                f"{format_duration(self.window.total_seconds() * 1000)} before each point")


@dataclass(frozen=True)
class Series:
    """One line: ``(seconds since the epoch, value)`` points."""

    label: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Event:
    """Something that happened at ``t`` (seconds since the epoch) and is no value of the panel it is drawn on: a
    marked point on its time axis, with its ``name`` (``drain``; ``ahead``: an hour marked, or a watermark, ahead of
    the clock), never a negative lag or delay."""

    t: float
    name: str


DRAIN = "drain"
"""The name of a drain's event: its last step moved the watermark to the end of the open hour and marked it."""
LAG_AHEAD = "watermark ahead of now"
"""The name of the event of a watermark ahead of now (its lag would be negative)."""
MARKED_AHEAD = "marked before its hour ended (ahead of the wall clock)"
"""The name of the event of an hour marked before it ended by the wall clock, other than by a drain."""
STOPPED = "job stopped"
"""The legend of a time the job was not running: a shaded band, where no line is drawn across."""
_STOP_GAP_S = 1.0
"""A run's first batch line covers the time since the run started (``since``); one that starts this much or more
after the line before it (one run's batches follow each other without a gap) follows a stop."""


@dataclass(frozen=True)
class Panel:
    """One pair of axes: a quantity, its unit (``s`` is scaled to min or h when long), its series and events, and the
    one ``title`` that says what it shows."""

    quantity: str
    unit: str
    series: tuple[Series, ...] = ()
    style: str = "line"  # "line" or "points"
    log: bool = False  # for durations that span orders of magnitude (median 1 s, p99 1 h)
    title: str = ""
    events: tuple[Event, ...] = ()
    stopped: tuple[tuple[float, float], ...] = ()
    """The times the job was not running, ``(from, to)`` seconds since the epoch: a shaded band, and no series'
    line is drawn across one (a line from the last point before a stop to the first after it showed a job running
    through the stop)."""

    @property
    def has_data(self) -> bool:
        return any(s.points for s in self.series) or bool(self.events)

    @property
    def heading(self) -> str:
        return self.title or self.quantity


@dataclass(frozen=True)
class Chart:
    """One PNG: ``key`` names the file, ``title`` heads it."""

    key: str
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)

    @property
    def has_data(self) -> bool:
        return any(p.has_data for p in self.panels)


def _not_negative(series: Sequence[Series], ahead: str) -> tuple[tuple[Series, ...], list[Event]]:
    """``series`` without their negative points, and those points as events named ``ahead``: a lag or a delay is
    never drawn below zero."""
    kept: list[Series] = []
    events: list[Event] = []
    for s in series:
        kept.append(Series(s.label, tuple((t, v) for t, v in s.points if v >= 0)))
        events.extend(Event(t, ahead) for t, v in s.points if v < 0)
    return tuple(kept), events


@dataclass(frozen=True)
class ChartData:
    """What a source measured for the five charts, before they are laid out (both sources end here: the charts of
    :class:`PrometheusSource` and :func:`history_charts`): the series of each chart, and what is drawn as events.

    ``lag_clock``: the clock "now" was read on for the lag when it is not the wall clock (``"generator"``): the panel
    and the title say so.  The marker delay is on the wall clock, always (the manifest's figure).  ``events`` (a
    drain) are drawn on the lag and marker-delay panels, ``marker_events`` (hours marked before they ended) on the
    marker-delay panel; a negative point of a lag or a delay is drawn as an event, not below zero."""

    lag: Sequence[Series] = ()
    timely: Sequence[Series] = ()
    late: Sequence[Series] = ()
    delay: Sequence[Series] = ()
    files: Sequence[Series] = ()
    marker: Sequence[Series] = ()
    lag_clock: str | None = None
    events: Sequence[Event] = ()
    marker_events: Sequence[Event] = ()
    stopped: Sequence[tuple[float, float]] = ()
    """The times the job was not running (:attr:`Panel.stopped`), on every panel."""


def _charts(data: ChartData) -> list[Chart]:
    """The five charts, in order, from what a source measured (see :class:`ChartData`)."""
    return [Chart(c.key, c.title, tuple(replace(p, stopped=tuple(data.stopped)) for p in c.panels))
            for c in _laid_out(data)]


def _laid_out(data: ChartData) -> list[Chart]:
    lag_clock, events = data.lag_clock, data.events
    lag_title = f"watermark lag ({lag_clock + ' clock' if lag_clock else 'now'} minus watermark)"
    lag_series, lag_ahead = _not_negative(data.lag, LAG_AHEAD)
    marker_series, marker_ahead = _not_negative(data.marker, MARKED_AHEAD)
    marker_title = f"{MARKER_DELAY_NAME}: _COMPLETE written after the end of its hour"
    return [
        Chart("watermark-lag", lag_title,
              (Panel("watermark lag" + (f" ({lag_clock} clock)" if lag_clock else ""), "s", lag_series,
                     title=lag_title, events=tuple(sorted([*events, *lag_ahead], key=lambda e: e.t))),)),
        Chart("events", "events per second, timely and late", (
            Panel("timely events", "events/s", tuple(data.timely), title="timely events per second"),
            Panel("late events", "events/s", tuple(data.late),
                  title="late events per second (arrived after their hour was complete)"),
        )),
        Chart("event-delay", "event delay (arrival minus event time): median, p95, p99",
              (Panel("event delay", "s", tuple(data.delay), log=True,
                     title="event delay (arrival minus event time): median, p95, p99"),)),
        Chart("files", "files written per second",
              (Panel("files written", "files/s", tuple(data.files), title="files written per second"),)),
        Chart("marker-delay", marker_title,
              (Panel(MARKER_DELAY_NAME, "s", marker_series, style="points", title=marker_title,
                     events=tuple(sorted([*events, *data.marker_events, *marker_ahead], key=lambda e: e.t))),)),
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


def windowed_rates(intervals: Sequence[tuple[float, float]], values: Sequence[Sequence[float]], steps: Sequence[float],
                   window: float) -> list[list[float] | None]:
    """For each step ``t``: the rate of each of ``values`` over the time the data covers in ``(t - window, t]``.

    ``values[i]`` happened within ``intervals[i] = (since, until]`` (a batch: from the previous
    batch's end, or the job's start, to its own end), sorted by ``until``.  Each counts in a window
    in proportion to the part of its interval inside it (an interval of no length: whole, if its
    end is inside), and the sum is divided by the length of the intervals inside the window, not
    by the window: a job that ran 90 s at 3,000 events/s is at 3,000/s in a 5-minute window, and a
    window that holds part of the last batch of a job shows that batch's rate.  Overlapping
    intervals are cut where the one before ends.  ``None`` for a window that no interval covers.
    """
    width = len(values[0]) if values else 0
    clean: list[tuple[float, float]] = []
    prev_end = -math.inf
    for since, until in intervals:
        since = min(until, max(since, prev_end))
        clean.append((since, until))
        prev_end = max(prev_end, until)
    ends = [u for _, u in clean]
    out: list[list[float] | None] = []
    for t in steps:
        a = t - window
        covered = 0.0
        total = [0.0] * width
        hit = False
        for i in range(bisect_right(ends, a), len(clean)):
            since, until = clean[i]
            if since >= t:
                break
            if until <= since:  # no length: whole or nothing
                if a < until <= t:
                    total = [x + v for x, v in zip(total, values[i])]
                    hit = True
                continue
            inside = min(until, t) - max(since, a)
            if inside <= 0:
                continue
            share = inside / (until - since)
            total = [x + v * share for x, v in zip(total, values[i])]
            covered += inside
            hit = True
        out.append([x / covered for x in total] if hit and covered > 0 else None)
    return out


_NICE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600,
                 86400, 2 * 86400, 7 * 86400)


def auto_step(span_seconds: float, points: int = 60) -> timedelta:
    """The step that gives about ``points`` points over ``span_seconds``, rounded up to 1, 2, 5, 10, 15 or 30 s,
    1, 2, 5, ... minutes or hours."""
    want = max(span_seconds, 1.0) / points
    return timedelta(seconds=next((s for s in _NICE_STEPS_S if s >= want), _NICE_STEPS_S[-1]))


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
    end = parse_time(until, now=now) if until else now
    start = parse_time(since, now=now) if since else end - parse_positive_duration("--last", last or "1h")
    if start >= end:
        raise UsageError(f"the range starts ({start.isoformat()}) after it ends ({end.isoformat()})",
                         fix="give --since before --until")
    return check_points(TimeRange(start, end, parse_positive_duration("--step", step),
                                  parse_positive_duration("--window", window)))


def parse_positive_duration(opt: str, text: str) -> timedelta:
    """The duration option ``opt`` (``5m``), which must be positive."""
    try:
        ms = parse_duration(text)
    except ValueError as err:
        raise UsageError(f"{opt}: {err}", fix=f"e.g. {opt} 5m") from err
    if ms <= 0:
        raise UsageError(f"{opt} must be positive", fix=f"e.g. {opt} 5m")
    return timedelta(milliseconds=ms)


def check_points(rng: TimeRange) -> TimeRange:
    """``rng``, unless it has too many points per line to draw (11,000)."""
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
        lag = one("watermark_lag", "watermark lag")
        return _charts(ChartData(
            lag=lag, stopped=missing_steps(lag, rng.step.total_seconds()),
            timely=[Series("timely", tuple(by_outcome.get("timely", ())))],
            late=[Series("late", tuple(by_outcome.get("late", ())))],
            delay=[s for q in QUANTILES for s in one("event_delay", _quantile_label(q), q=q)],
            files=one("files", "files"),
            marker=one("marker_delay", "marker delay"),
        ))


def missing_steps(series: Sequence[Series], step: float) -> list[tuple[float, float]]:
    """Where a Prometheus series a running job always has (its watermark lag) has no point for more than two steps:
    the job was not scraped, it was stopped (pure)."""
    out: list[tuple[float, float]] = []
    for s in series:
        ts = sorted(t for t, _ in s.points)
        out += [(a, b) for a, b in zip(ts, ts[1:]) if b - a > 2 * step]
    return sorted(out)


# -- the local history ---------------------------------------------------------------------------
class HistorySource:
    """Charts from a job's metrics history (JSON lines; see :class:`event_etl.metrics.history.MetricsHistory`):
    ``path`` and its rotated ``path.1``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._records: list[dict[str, Any]] | None = None

    def records(self) -> list[dict[str, Any]]:
        if self._records is None:
            self._records = read_history(self.path)
        return self._records

    def event_types(self) -> list[str]:
        return sorted({r["event_type"] for r in self.records() if r.get("event_type") is not None})

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event_type") == event_type]

    def charts(self, event_type: str, rng: TimeRange) -> list[Chart]:
        return history_charts(self.of_type(event_type), rng)


def _batch_intervals(batches: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """The ``(since, t]`` each batch line covers; a line without ``since`` (written before it existed) covers the
    time since the batch before it, or, first, its own duration."""
    out = []
    for i, r in enumerate(batches):
        since = r.get("since")
        if since is None:
            since = batches[i - 1]["t"] if i else r["t"] - float(r.get("duration_seconds") or 0.0)
        out.append((min(float(since), r["t"]), r["t"]))
    return out


def history_range(records: Sequence[dict[str, Any]], *, step: timedelta | None = None,
                  window: timedelta | None = None) -> TimeRange:
    """The range of a history drawn whole: from its first batch's start to its last line, with a margin of 2 %
    (at least a second) each side; ``step`` None: about 60 points (:func:`auto_step`); ``window`` None: 5 minutes,
    or the step when it is longer (no batch between two points is left out)."""
    if not records:
        raise UsageError("the history has no lines to draw", fix="give a range (--last 1h, --since ...) or draw "
                         "another history")
    ts = [float(r["t"]) for r in records]
    batches = sorted((r for r in records if r.get("kind") == "batch"), key=lambda r: r["t"])
    lo = min([*ts, *(s for s, _ in _batch_intervals(batches))])
    hi = max(ts)
    margin = max((hi - lo) * 0.02, 1.0)
    step = step or auto_step(hi - lo + 2 * margin)
    window = window or max(timedelta(minutes=5), step)
    return TimeRange(datetime.fromtimestamp(lo - margin, _UTC), datetime.fromtimestamp(hi + margin, _UTC), step,
                     window)


def _by_clock(points: Iterable[tuple[dict[str, Any], float, float]], label: str) -> tuple[list[Series], str | None]:
    """Series of ``(record, t, value)`` points split by the clock their line names (none: the wall clock): one series
    and the clock's name when they share one, else one series per clock, each labelled with it."""
    by: dict[str | None, list[tuple[float, float]]] = {}
    for r, t, v in points:
        by.setdefault(r.get("clock"), []).append((t, v))
    if len(by) <= 1:
        clock = next(iter(by), None)
        return [Series(label, tuple(by.get(clock, ())))], clock
    return [Series(f"{label} ({c or 'wall'} clock)", tuple(pts)) for c, pts in sorted(by.items(), key=lambda kv:
                                                                                      kv[0] or "")], None


_DRAIN_MARKERS_WITHIN_S = 60.0
"""A marker line without ``closed_by`` (written before it was added) marked before its hour ended and at most this
long before a drain line: one of the drain's."""


def _marker_delay_s(r: dict[str, Any]) -> float | None:
    """A marker line's marker delay, as every command shows it: its ``t`` (the manifest's ``completed_at``, wall
    clock) minus the end of its hour; a line without ``hour_end``: its ``marker_delay_seconds`` if on the wall
    clock."""
    if r.get("hour_end") is not None:
        return float(r["t"]) - float(r["hour_end"])
    v = r.get("marker_delay_seconds")
    return None if v is None or r.get("clock") else float(v)


def history_events(records: Sequence[dict[str, Any]], rng: TimeRange) -> tuple[list[Event], list[Event]]:
    """``(events, marker_events)`` of one event type's history records in ``rng`` (pure): a drain's step of the
    watermark (a ``watermark`` line with ``"why": "drain"``) is a :data:`DRAIN` event, not a lag sample; an hour marked
    before it ended by the wall clock is no marker delay: a drain's (its manifest's ``closed_by``, or a drain line
    within a minute after it) is the drain's event, any other a :data:`MARKED_AHEAD` event."""
    a, b = rng.start.timestamp(), rng.end.timestamp()
    drains = [float(r["t"]) for r in records if r["kind"] == "watermark" and r.get("why") == "drain"]
    events = [Event(t, DRAIN) for t in sorted(drains) if a <= t <= b]
    marker_events = []
    for r in records:
        if r["kind"] != "marker" or not a <= r["t"] <= b:
            continue
        delay = _marker_delay_s(r)
        if delay is None or delay >= 0:
            continue
        by_drain = r.get("closed_by") == "drain" or (
            r.get("closed_by") is None and any(0 <= d - r["t"] <= _DRAIN_MARKERS_WITHIN_S for d in drains))
        if by_drain and any(abs(e.t - r["t"]) <= _DRAIN_MARKERS_WITHIN_S for e in events):
            continue  # the drain's event says it
        marker_events.append(Event(float(r["t"]), DRAIN if by_drain else MARKED_AHEAD))
    return events, sorted(marker_events, key=lambda e: e.t)


def history_stops(records: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """The times the job of one event type's history was not running (pure): from the last line of a run to the
    start of the next, which its first batch line gives (``since``: a run's batch lines follow each other, each
    ``since`` the ``t`` of the one before).  Lines written before ``since`` existed show no stop."""
    recs = sorted(records, key=lambda r: r["t"])
    batches = [r for r in recs if r["kind"] == "batch"]
    stops = []
    for prev, cur in zip(batches, batches[1:]):
        since = cur.get("since")
        if since is None or float(since) - float(prev["t"]) < _STOP_GAP_S:
            continue
        last = max(float(r["t"]) for r in recs if float(prev["t"]) <= float(r["t"]) < float(since))
        stops.append((last, float(since)))
    return stops


def _running(t: float, stopped: Sequence[tuple[float, float]]) -> bool:
    return not any(a < t < b for a, b in stopped)


def history_charts(records: Sequence[dict[str, Any]], rng: TimeRange) -> list[Chart]:
    """The charts of one event type's history records (pure)."""
    a, b = rng.start.timestamp(), rng.end.timestamp()
    window = rng.window.total_seconds()
    recs = sorted(records, key=lambda r: r["t"])
    batches = [r for r in recs if r["kind"] == "batch"]
    stopped = [(x, y) for x, y in history_stops(recs) if y > a and x < b]

    def in_range(t: float) -> bool:
        return a <= t <= b

    lag, lag_clock = _by_clock(((r, r["t"], r["watermark_lag_seconds"]) for r in recs
                                if r["kind"] in ("batch", "watermark") and r.get("watermark_lag_seconds") is not None
                                and r.get("why") != "drain" and in_range(r["t"])), "watermark lag")
    events, marker_events = history_events(recs, rng)
    marker_pts = [(r["t"], d) for r in recs if r["kind"] == "marker" and in_range(r["t"])
                  and (d := _marker_delay_s(r)) is not None and d >= 0]
    marker = [Series("marker delay", tuple(marker_pts))]
    timely: tuple[tuple[float, float], ...] = ()
    late: tuple[tuple[float, float], ...] = ()
    files: tuple[tuple[float, float], ...] = ()
    delay: list[Series] = []
    if batches:
        intervals = _batch_intervals(batches)
        first, last = intervals[0][0], batches[-1]["t"]
        steps = [t for t in rng.steps if first <= t <= last + window and _running(t, stopped)]
        rates = windowed_rates(intervals,
                               [(r["events"].get("timely", 0), r["events"].get("late", 0), r["files"])
                                for r in batches], steps, window)
        drawn = [(t, r) for t, r in zip(steps, rates) if r is not None]
        timely = tuple((t, r[0]) for t, r in drawn)
        late = tuple((t, r[1]) for t, r in drawn)
        files = tuple((t, r[2]) for t, r in drawn)
        with_delay = [r for r in batches if r["delay"]["counts"]]
        if with_delay:
            bounds = with_delay[0]["delay"]["bounds"]
            dsums = windowed_sums([r["t"] for r in with_delay], [r["delay"]["counts"] for r in with_delay], steps,
                                  window)
            for q in QUANTILES:
                pts = [(t, histogram_quantile(q, bounds, c)) for t, c in zip(steps, dsums)]
                delay.append(Series(_quantile_label(q), tuple((t, v) for t, v in pts if v is not None)))
    return _charts(ChartData(lag=lag, timely=[Series("timely", timely)], late=[Series("late", late)], delay=delay,
                             files=[Series("files", files)], marker=marker, lag_clock=lag_clock, events=events,
                             marker_events=marker_events, stopped=stopped))


# -- rendering ------------------------------------------------------------------------------------
_COLORS = {"timely": "#1f77b4", "late": "#d62728", "median": "#2ca02c", "p95": "#ff7f0e", "p99": "#d62728"}
_EVENT_STYLE = {DRAIN: ("D", "#9467bd"), LAG_AHEAD: ("^", "#7f7f7f"), MARKED_AHEAD: ("^", "#7f7f7f")}
_NAMED_EVENTS = 4  # at most this many events of one name are each written beside their point; more: the legend only


_DURATION_TICKS_S = (0.01, 0.1, 1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400)
_Y_MARGIN = 0.08  # of the span of the values, below and above: no point sits on a panel's edge
_MAX_TIME_TICKS = 8


def _ylabel(quantity: str, unit: str) -> str:
    """``watermark lag (min)``; ``watermark lag (generator clock, min)`` when the quantity has a note of its own."""
    return f"{quantity[:-1]}, {unit})" if quantity.endswith(")") else f"{quantity} ({unit})"


def _linear_ylim(values: Sequence[float]) -> tuple[float, float]:
    """Limits holding 0 and every value, with a margin of :data:`_Y_MARGIN` of their span below and above."""
    lo, hi = min(0.0, *values), max(0.0, *values)
    if hi - lo <= 0:
        hi = 1.0  # all zero
    margin = (hi - lo) * _Y_MARGIN
    return lo - margin, hi + margin


def _time_ticks(lo: float, hi: float) -> tuple[list[float], float]:
    """Tick times (seconds since the epoch) on multiples of a round interval, at most :data:`_MAX_TIME_TICKS` of
    them between ``lo`` and ``hi``; and the interval."""
    for interval in _NICE_STEPS_S:
        first = math.ceil(lo / interval) * interval
        if (hi - first) // interval + 1 <= _MAX_TIME_TICKS:
            break
    ticks: list[float] = []
    t = first
    while t <= hi + 1e-9:
        ticks.append(t)
        t += interval
    return ticks, float(interval)


def _time_format(lo: datetime, hi: datetime, interval: float) -> tuple[str, str]:
    """``(strftime format of every tick, x-axis label)``: the time of day alone when the range lies within one UTC
    day (the date in the label), with seconds when ticks are less than a minute apart."""
    clock = "%H:%M:%S" if interval < 60 else "%H:%M"
    if lo.date() == hi.date():
        return clock, f"time (UTC), {lo:%Y-%m-%d}"
    return f"%m-%d {clock}", f"time (UTC), {lo:%Y-%m-%d} to {hi:%Y-%m-%d}"


def span_text(lo: datetime, hi: datetime) -> str:
    """``2026-11-21 13:45 to 14:05 UTC`` (seconds shown when either end has some; both dates when they differ)."""
    clock = "%H:%M:%S" if lo.second or hi.second else "%H:%M"
    end = hi.strftime(clock if lo.date() == hi.date() else f"%Y-%m-%d {clock}")
    return f"{lo.strftime(f'%Y-%m-%d {clock}')} to {end} UTC"


def _draw_panel(ax: _Axes, panel: Panel, xlim: tuple[datetime, datetime]) -> None:
    import matplotlib.dates as mdates
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    # matplotlib.dates has no type annotations (the rest of matplotlib has): its two converters, typed here
    date2num: Callable[[datetime], float] = mdates.date2num
    num2date: Callable[..., datetime] = mdates.num2date

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
        if pts:
            _draw_series(ax, s.label, pts, divisor, panel)
    _draw_events(ax, panel.events)
    for i, (a, b) in enumerate(panel.stopped):
        ax.axvspan(datetime.fromtimestamp(a, _UTC), datetime.fromtimestamp(b, _UTC), color="#7f7f7f", alpha=0.15,
                   linewidth=0, label=STOPPED if i == 0 else None)
    ax.set_ylabel(_ylabel(panel.quantity, unit))
    ax.grid(True, alpha=0.3)
    ax.set_xlim(*xlim)
    if log:
        ax.set_yscale("log")
        lo, hi = min(v for v in values if v > 0), max(values)
        ticks = [x for x in _DURATION_TICKS_S if lo / 10 <= x <= hi * 10] or [
            min(_DURATION_TICKS_S, key=lambda x: abs(math.log10(x / lo)))]  # below 1 ms: the nearest tick
        ax.set_ylim(min(ticks[0], lo) * 0.8, max(ticks[-1], hi) * 1.25)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_duration(v * 1000)))
    elif panel.has_data:
        ax.set_ylim(*_linear_ylim([v / divisor for v in values] or [0.0]))  # events alone: on the zero line
    if panel.has_data:
        if len([s for s in panel.series if s.points]) + len({e.name for e in panel.events}) + bool(panel.stopped) > 1:
            # beside the panel, not on it: inside it, it covered the first points
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data in this range", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_ylim(0, 1)
    ticks, interval = _time_ticks(xlim[0].timestamp(), xlim[1].timestamp())
    fmt, _label = _time_format(xlim[0], xlim[1], interval)
    ax.xaxis.set_major_locator(FixedLocator([date2num(datetime.fromtimestamp(t, _UTC)) for t in ticks]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: num2date(x, tz=_UTC).strftime(fmt)))


def _draw_series(ax: _Axes, label: str, pts: Sequence[tuple[float, float]], divisor: float, panel: Panel) -> None:
    """One series: points, or a line broken where the job was stopped (one legend entry)."""
    color = _COLORS.get(label)
    if panel.style == "points":
        xs = [datetime.fromtimestamp(t, _UTC) for t, _ in pts]
        ax.plot(xs, [v / divisor for _, v in pts], "o", markersize=5, label=label, color=color)
        return
    runs: list[list[tuple[float, float]]] = [[pts[0]]]
    for p, q in zip(pts, pts[1:]):
        if any(p[0] <= a and q[0] >= b for a, b in panel.stopped):
            runs.append([])
        runs[-1].append(q)
    dots = "." if len(pts) < 40 else None
    for i, run in enumerate(runs):
        line = ax.plot([datetime.fromtimestamp(t, _UTC) for t, _ in run], [v / divisor for _, v in run], "-",
                       linewidth=1.6, label=label if i == 0 else None, color=color,
                       marker=dots if len(run) > 1 else ".")  # a run of one point: a dot, not nothing
        color = color or line[0].get_color()  # every run of a series in its first run's colour


def _draw_events(ax: _Axes, events: Sequence[Event]) -> None:
    """Each event a marked point on the zero line, one legend entry per name, the name written beside the point when
    few events bear it."""
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e.t)
    for name, ts in by_name.items():
        marker, color = _EVENT_STYLE.get(name, ("D", "#9467bd"))
        xs = [datetime.fromtimestamp(t, _UTC) for t in ts]
        ax.plot(xs, [0.0] * len(xs), marker, linestyle="none", markersize=8, color=color, label=name, zorder=3)
        if len(xs) <= _NAMED_EVENTS:
            for x in xs:
                ax.annotate(name, (x, 0.0), xytext=(4, 6), textcoords="offset points", fontsize="small",
                            color=color)


def drawn_range(charts: Sequence[Chart], rng: TimeRange) -> tuple[datetime, datetime]:
    """The time axis of every PNG, and the range their title states: the span that holds data (all charts share
    it), with a margin (3 % of it, at least half a step and a second) each side, else the whole range; its ends
    on whole seconds (whole minutes from ten minutes on)."""
    ts = [t for c in charts for p in c.panels for s in p.series for t, _ in s.points]
    ts += [e.t for c in charts for p in c.panels for e in p.events]
    if ts:
        lo, hi = min(ts), max(ts)
        pad = max((hi - lo) * 0.03, rng.step.total_seconds() / 2, 1.0)
        lo, hi = lo - pad, hi + pad
    else:
        lo, hi = rng.start.timestamp(), rng.end.timestamp()
    unit = 60 if hi - lo >= 600 else 1
    lo, hi = math.floor(lo / unit) * unit, math.ceil(hi / unit) * unit
    return datetime.fromtimestamp(lo, _UTC), datetime.fromtimestamp(hi, _UTC)


def describe_drawn(xlim: tuple[datetime, datetime], rng: TimeRange) -> str:
    """The range of the time axis, as the PNGs' titles state it; when it is much narrower than the range asked for
    (the data fills less than 90 % of it), that range too."""
    zoomed = (xlim[1] - xlim[0]) < 0.9 * (rng.end - rng.start)
    return span_text(*xlim) + (f" (where the data is, within {span_text(rng.start, rng.end)})" if zoomed else "")


def _subtitle(xlim: tuple[datetime, datetime], rng: TimeRange, source: str) -> str:
    return describe_drawn(xlim, rng) + "\n" + rng.points_text() + (f" · {source}" if source else "")


def _figure(panels: Sequence[tuple[str, Panel]], title: str, subtitle: str,
            xlim: tuple[datetime, datetime]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 0.9 + 2.6 * len(panels)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (heading, panel) in zip(axes, panels):
        _draw_panel(ax, panel, xlim)
        if heading:
            ax.set_title(heading, loc="left", fontsize="medium")
    _ticks, interval = _time_ticks(xlim[0].timestamp(), xlim[1].timestamp())
    axes[-1].set_xlabel(_time_format(xlim[0], xlim[1], interval)[1])
    fig.suptitle(f"{title}\n{subtitle}", fontsize="large")
    return fig


def figures(charts: Sequence[Chart], *, event_type: str, rng: TimeRange, source: str = "") -> list[tuple[str, Figure]]:
    """``(file name, matplotlib Figure)`` of every chart (``EVENT_TYPE-<chart>.png``) and of the overview
    (``EVENT_TYPE-overview.png``), all on the time axis :func:`drawn_range` gives."""
    xlim = drawn_range(charts, rng)
    subtitle = _subtitle(xlim, rng, source)
    out: list[tuple[str, Figure]] = []
    for c in charts:
        heads = [(p.heading if len(c.panels) > 1 else "", p) for p in c.panels]
        out.append((f"{event_type}-{c.key}.png", _figure(heads, f"{event_type}: {c.title}", subtitle, xlim)))
    overview = [(p.title or c.title, p) for c in charts for p in c.panels]  # one title a panel: what it shows
    out.append((f"{event_type}-overview.png", _figure(overview, f"{event_type}: overview", subtitle, xlim)))
    return out


def render(charts: Sequence[Chart], out_dir: str | Path, *, event_type: str, rng: TimeRange,
           source: str = "") -> list[Path]:
    """Write ``EVENT_TYPE-<chart>.png`` for every chart and ``EVENT_TYPE-overview.png``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures(charts, event_type=event_type, rng=rng, source=source):
        path = out / name
        fig.savefig(path)
        written.append(path)
    return written


# -- the command's work ---------------------------------------------------------------------------
def open_source(event_type: str, *, prometheus: str | None = None, history: str | None = None,
                checkpoint: str | None = None) -> PrometheusSource | HistorySource:
    """The one source the options name: ``prometheus`` (a URL), ``history`` (a file) or ``checkpoint`` (the history
    a job keeps in it); none of them: the history in the type's default checkpoint, ``./checkpoints/TYPE``, if it
    has one."""
    from event_etl.storage.locations import default_checkpoint

    named = [n for n, v in (("--prometheus", prometheus), ("--history", history), ("--checkpoint", checkpoint))
             if v is not None]
    if len(named) > 1:
        raise UsageError(f"{' and '.join(named)} each say where the metrics are", fix="give one of them")
    if prometheus is not None:
        return PrometheusSource(prometheus)
    if history is not None:
        return HistorySource(history)
    ckpt = checkpoint if checkpoint is not None else default_checkpoint(event_type)
    path = default_history_path(ckpt)
    if path is not None and history_files(path):
        return HistorySource(path)
    if checkpoint is not None:
        raise UsageError(f"--checkpoint {checkpoint}: no metrics history there ({HISTORY_FILE})",
                         fix="a job keeps its history in its checkpoint as it runs (event-etl run TYPE --checkpoint "
                             "DIR); give the checkpoint of a job that has run, or --history FILE, or --prometheus URL")
    raise UsageError("say where the metrics are: --prometheus URL or --history FILE (one of them)",
                     fix=f"a job keeps its history in its checkpoint, and {path or ckpt} is not there: run "
                         f"`event-etl run {event_type}` first, or give --checkpoint DIR (the job's --checkpoint), "
                         "--history FILE (its --metrics-history), or --prometheus http://127.0.0.1:9090")


def graphs_range(source: PrometheusSource | HistorySource, event_type: str, *, step: timedelta | None = None,
                 window: timedelta | None = None, now: datetime | None = None) -> TimeRange:
    """The range drawn when the command names none: a history's own span (:func:`history_range`); from Prometheus,
    the last hour ending ``now`` (default: the time of the call; a point a minute unless ``step`` says)."""
    if isinstance(source, HistorySource):
        recs = source.of_type(event_type)
        if not recs:
            known = source.event_types()
            raise UsageError(f"{source.path} has no metrics of event type {event_type!r}",
                             fix=f"event types there: {', '.join(known) or '(none)'}")
        return check_points(history_range(recs, step=step, window=window))
    end = now if now is not None else datetime.now(_UTC)
    return check_points(TimeRange(end - timedelta(hours=1), end, step or timedelta(minutes=1),
                                  window or timedelta(minutes=5)))


def make_graphs(event_type: str, *, out_dir: str | Path, source: PrometheusSource | HistorySource | None = None,
                rng: TimeRange | None = None) -> tuple[list[Chart], list[Path]]:
    """Fetch the charts of ``event_type`` from one source and write the PNGs.  Returns ``(charts, paths)``.

    The source is ``source``, else the history in the type's default checkpoint (:func:`open_source` without
    options); the range is ``rng``, else :func:`graphs_range`'s default.  Other sources and ranges are made with
    those two functions, as ``event-etl graphs`` makes them from its options."""
    if source is None:
        source = open_source(event_type)
    if rng is None:
        rng = graphs_range(source, event_type)
    charts = source.charts(event_type, rng)
    where = source.url if isinstance(source, PrometheusSource) else source.path
    if not any(c.has_data for c in charts):
        known = source.event_types()
        if event_type not in known:
            raise UsageError(f"{where} has no metrics of event type {event_type!r}",
                             fix=f"event types there: {', '.join(known) or '(none)'}")
        raise UsageError(f"{where} has no metrics of {event_type} in {rng.describe()}",
                         fix="widen the range (--last 6h, --since ...), or give none to draw the whole history")
    paths = render(charts, out_dir, event_type=event_type, rng=rng,
                   source=f"Prometheus {where}" if isinstance(source, PrometheusSource)
                   else f"history {_short_path(where)}")
    return charts, paths


def _short_path(path: str, width: int = 70) -> str:
    """``path`` as a title shows it: relative to the working folder when it is inside it, its end when long."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    shown = rel if not rel.startswith("..") else path
    return shown if len(shown) <= width else "…" + shown[-(width - 1):]
