"""The command line's one language: durations, the sink option, and what to say when an extra is missing.

- :data:`DURATION` is the type of every duration option (``--timeout``, ``--poll-interval``,
  ``--trigger-interval``, ``--step``, ``--window``, ``--last``, ``publish --duration``...):
  ``90s``, ``5m``, ``2h``, ``1h30m``, ``250ms``, or a bare number of seconds, as ``sleep``
  and ``timeout`` take it (``90``, ``0.5``).  It gives a :class:`Duration`, which is a float
  of seconds whose ``str()`` is a duration text the rest of event_etl parses (``90000ms``).
- :func:`sink_option`: ``--sink``, default ``$EVENT_ETL_SINK``, else ``./data``.
- :data:`EXTRAS` and :func:`missing_extra`: a command that needs an optional dependency
  (``pip install 'event_etl[job]'``...) that is not installed says which extra to install.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from event_etl.errors import UsageError
from event_etl.settings import ENV_SINK
from event_etl.timeutil import parse_duration

__all__ = ["DURATION", "Duration", "DurationType", "EXTRAS", "MissingExtraError", "missing_extra", "require_extra",
           "sink_option", "ENV_SINK"]

_F = TypeVar("_F", bound=Callable[..., Any])



class Duration(float):
    """A duration in seconds (a float).  ``str()`` is the text it was given as (``"2s"``, ``"90"``), so it
    passes through a command line unchanged; :attr:`text` is one :func:`~event_etl.timeutil.parse_duration`
    reads (``"2000ms"``).  Equal to a number of seconds, and to a text of the same duration."""

    given: str | None

    def __new__(cls, seconds: float, given: str | None = None) -> Duration:
        obj = super().__new__(cls, seconds)
        obj.given = given
        return obj

    def __str__(self) -> str:
        return self.given if self.given is not None else self.text

    def __repr__(self) -> str:
        return f"Duration({float(self)!r}, {str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = to_duration(other)
            except ValueError:
                return False
        return float(self) == other

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = float.__hash__

    @property
    def millis(self) -> int:
        return int(round(float(self) * 1000))

    @property
    def text(self) -> str:
        """The duration as text the rest of event_etl parses: ``"2000ms"``."""
        return f"{self.millis}ms"


def to_duration(value: Any) -> Duration:
    """``value`` (``"90s"``, ``"1h30m"``, ``"90"``, ``90``, ``0.5``) as a :class:`Duration`; ``ValueError`` if none."""
    if isinstance(value, Duration):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    given = None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        given = str(value).strip()
        text = str(value).strip()
        try:
            seconds = float(text)  # a bare number: seconds, as sleep(1) and timeout(1) take it
        except ValueError:
            try:
                seconds = parse_duration(text) / 1000
            except ValueError as err:
                raise ValueError(f"{text!r} is not a duration: write a number of seconds or a number and a unit "
                                 "(ms, s, m, h, d), e.g. 90, 90s, 5m, 2h or 1h30m") from err
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a duration of 0 or more")
    return Duration(seconds, given)


if TYPE_CHECKING:
    _DurationParam = click.ParamType[Duration, Any]
else:  # click's ParamType is generic only in recent releases (setup.cfg takes click 8.1 on)
    _DurationParam = click.ParamType


class DurationType(_DurationParam):
    """Every duration option: ``90s``, ``5m``, ``2h``, ``1h30m``, ``250ms``, or a bare number of seconds."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Duration:
        try:
            return to_duration(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


DURATION = DurationType()


def sink_option(fn: _F) -> _F:
    """``--sink``: where the hourly buckets are.  Default ``$EVENT_ETL_SINK``, else ``./data``."""
    return click.option(
        "--sink",
        envvar=ENV_SINK,
        default="./data",
        show_default=True,
        help="Where the hourly buckets are: a local folder or gs://bucket/prefix. Default: $EVENT_ETL_SINK, "
        "else ./data.",
    )(fn)


# extra -> (what it brings, the modules whose absence means it is missing)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "job": ("the streaming job: PySpark, the Pub/Sub client, OpenTelemetry's Prometheus exporter",
            ("pyspark", "numpy", "pandas", "xxhash", "google.cloud.pubsub_v1", "google.cloud.pubsub",
             "opentelemetry.sdk", "opentelemetry.exporter.prometheus", "prometheus_client")),
    "arrow": ("`read_table`: an hour as an Arrow table (pyarrow)", ("pyarrow",)),
    "graphs": ("`event-etl graphs`: matplotlib", ("matplotlib",)),
    "otlp": ("pushing metrics over OTLP (--otlp-endpoint)", ("opentelemetry.exporter.otlp",)),
}


class MissingExtraError(UsageError):
    """A command needs an optional dependency that is not installed; ``extra`` is the extra that brings it."""

    def __init__(self, module: str, extra: str, what: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(f"{what} needs the Python package {module.split('.')[0]!r}, which is not installed "
                         f"(it comes with the [{extra}] extra)",
                         fix=f"pip install 'event_etl[{extra}]'")


def extra_of(module: str) -> str | None:
    """The extra that brings ``module`` (a dotted name), or ``None`` if no extra does."""
    best = None
    for extra, (_, modules) in EXTRAS.items():
        for m in modules:
            if (module == m or module.startswith(m + ".") or m.startswith(module + ".")) and (
                    best is None or len(m) > len(best[1])):
                best = (extra, m)
    return None if best is None else best[0]


def missing_extra(err: ModuleNotFoundError, what: str = "this command") -> MissingExtraError | None:
    """The :class:`MissingExtraError` for an import that failed, if an extra brings the missing module."""
    name = err.name or ""
    extra = extra_of(name)
    return None if extra is None else MissingExtraError(name, extra, what)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_extra(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` unless the modules of ``extra`` that ``what`` needs are installed."""
    for module in modules or _REQUIRED[extra]:
        if not _installed(module):
            raise MissingExtraError(module, extra, what)


# what a command of each extra imports for sure (the other modules of EXTRAS are recognised in errors)
_REQUIRED = {
    "job": ("pyspark", "numpy", "xxhash", "opentelemetry.sdk"),
    "graphs": ("matplotlib",),
    "otlp": ("opentelemetry.exporter.otlp",),
}
