"""Time in event_etl: UTC only, milliseconds since the Unix epoch inside, aware datetimes outside.

The rules (``event_etl.rules``) work on plain integers: event times, watermarks and
hour starts are *milliseconds since 1970-01-01T00:00:00Z*.  Integers are exact, cheap
to compare in the hot path of an executor, and cannot carry a wrong time zone.  Where
a time leaves the program (file names, manifests, the CLI) it becomes an ISO-8601
string with a ``Z`` or a timezone-aware ``datetime`` in UTC.

Durations in settings and on the command line are strings such as ``"90s"``, ``"5m"``,
``"24h"``, ``"1d"`` or compound ``"1h30m"``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import overload

__all__ = [
    "HOUR_MS",
    "MINUTE_MS",
    "SECOND_MS",
    "DAY_MS",
    "parse_duration",
    "format_duration",
    "to_datetime",
    "to_millis",
    "iso",
    "parse_hour",
    "hour_floor",
    "hour_end",
    "now_millis",
    "seconds_to_millis",
    "parse_rfc3339_millis",
]

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNITS = {"ms": 1, "s": SECOND_MS, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str) -> int:
    """Parse ``"90s"``, ``"5m"``, ``"24h"``, ``"1d"``, ``"1h30m"``, ``"250ms"`` or ``"0"`` into milliseconds.

    Raises ``ValueError`` with the accepted forms when the text is not a duration.
    """
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(
            f"expected a duration string such as \"90s\", \"5m\" or \"24h\", got {text!r}"
        )
    s = text.strip().lower().replace(" ", "")
    if s == "0":
        return 0
    pos = 0
    total = 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or pos != len(s):
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit (ms, s, m, h, d), "
            "for example \"90s\", \"5m\", \"24h\" or \"1h30m\""
        )
    return int(round(total))


def format_duration(ms: int | float) -> str:
    """Render milliseconds compactly for people: ``3h05m``, ``42s``, ``1d``, ``-1m30s``, ``850ms``."""
    sign = "-" if ms < 0 else ""
    ms = abs(int(ms))
    if ms < SECOND_MS:
        return f"{sign}{ms}ms"
    s = ms // SECOND_MS
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    units = [(d, "d"), (h, "h"), (m, "m"), (s, "s")]
    first = next(i for i, (v, _) in enumerate(units) if v)
    parts = [f"{units[first][0]}{units[first][1]}"]
    if first < 3 and units[first + 1][0]:
        parts.append(f"{units[first + 1][0]:02d}{units[first + 1][1]}")
    return sign + "".join(parts)


def to_datetime(ms: int) -> datetime:
    """Milliseconds since the epoch to an aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=ms)


def to_millis(dt: datetime) -> int:
    """An aware datetime to milliseconds since the epoch. Naive datetimes are refused."""
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"naive datetime {dt!r}: event_etl only accepts timezone-aware datetimes (UTC)")
    delta = dt - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


@overload
def iso(ms: int) -> str: ...
@overload
def iso(ms: None) -> None: ...
@overload
def iso(ms: int | None) -> str | None: ...
def iso(ms: int | None) -> str | None:
    """ISO-8601 UTC with a ``Z``: ``2026-11-21T13:00:00Z`` (milliseconds shown only when present)."""
    if ms is None:
        return None
    dt = to_datetime(ms)
    if ms % 1000:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


_HOUR_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2})(?::00(?::00(?:\.0+)?)?)?(Z|[+-]00:?00)?$"
)


def parse_hour(text: str) -> int:
    """Parse an hour given as ISO-8601 UTC: ``2026-11-21T13``, ``2026-11-21T13:00Z``, ``2026-11-21T13:00:00+00:00``.

    Returns the hour's start in milliseconds.  Minutes or seconds other than zero, or an offset
    other than UTC, are refused with a ``ValueError`` that shows the accepted forms.
    """
    m = _HOUR_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            f"{text!r} is not an hour: write it in UTC as YYYY-MM-DDTHH, e.g. 2026-11-21T13 or 2026-11-21T13:00Z"
        )
    y, mo, d, h = (int(g) for g in m.groups()[:4])
    try:
        dt = datetime(y, mo, d, h, tzinfo=UTC)
    except ValueError as err:
        raise ValueError(f"{text!r} is not a valid hour: {err}") from err
    return to_millis(dt)


def seconds_to_millis(value: int | float | str) -> int:
    """Epoch seconds (a number, or its text) to milliseconds, *floored*: 13:59:59.9996 stays in hour 13.

    Rounding would move an event into the next millisecond, and so, at an hour's last
    millisecond, into the next hour.  Floats are taken by their shortest decimal form
    (``1700000000.123`` is 1700000000123 ms, not ...122 as binary floating point would give).
    """
    from decimal import ROUND_FLOOR, Decimal, InvalidOperation

    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000
    try:
        d = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
    except InvalidOperation as err:
        raise ValueError(f"{value!r:.40} is not a number of seconds") from err
    if not d.is_finite():
        raise ValueError(f"{value!r:.40} is not a finite number of seconds")
    return int((d * 1000).to_integral_value(rounding=ROUND_FLOOR))


_RFC3339_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:?\d{2})?$")


def parse_rfc3339_millis(text: str) -> int:
    """An RFC 3339 / ISO-8601 time with a UTC offset to milliseconds (floored).

    Accepts what RFC 3339 allows and ``datetime.fromisoformat`` refuses: a lower-case ``t`` or
    ``z``, and a leap second (``23:59:60``), which is read as the last millisecond of its minute
    (POSIX time has no leap seconds; this keeps the event in its own minute and hour).  Other
    ISO-8601 forms that ``datetime.fromisoformat`` reads are accepted too.  A time without an
    offset is refused: its time zone is unknown.
    """
    m = _RFC3339_RE.match(text.strip())
    if m:
        day, hh, mm, ss, frac, off = m.groups()
        leap = ss == "60"
        if leap:
            ss, frac = "59", ".999"
        if off is None:
            raise ValueError(f"{text!r:.40} has no UTC offset: write it with Z or +00:00")
        off = "+00:00" if off in ("Z", "z") else off
        frac = (frac or "")[:7]  # datetime takes at most microseconds; further digits are floored away
        dt = datetime.fromisoformat(f"{day}T{hh}:{mm}:{ss}{frac[:7]}{off}")
        return to_millis(dt)
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        raise ValueError(f"{text!r:.40} has no UTC offset: write it with Z or +00:00")
    return to_millis(dt)


def hour_floor(ms: int) -> int:
    """Start of the UTC hour that holds ``ms``."""
    return ms - (ms % HOUR_MS)


def hour_end(hour_start: int) -> int:
    """End (exclusive) of the hour that starts at ``hour_start``."""
    return hour_start + HOUR_MS


def now_millis() -> int:
    """The wall clock, read only at the edges of the program (drivers, CLI), never inside rules."""
    return to_millis(datetime.now(UTC))
