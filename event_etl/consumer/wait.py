"""Waiting for hours to be complete: poll their markers until they appear, a deadline passes, or storage fails.

Three outcomes, never confused:

- **complete**: the manifests are returned (exit code 0 on the command line);
- **timeout**: no poll saw the hour complete before the deadline:
  :class:`~event_etl.consumer.errors.WaitTimeoutError` (exit code 3), with the last status;
- **could not check**: a poll could not read the sink:
  :class:`~event_etl.consumer.errors.CouldNotCheckError` (exit code 4) at once.  A wait
  does not paper over storage failures: whoever runs it (a scheduler) decides whether to
  retry.

An hour that lies before the job's first marked hour will never get a marker; waiting for
it fails at once with :class:`~event_etl.consumer.errors.HourNeverCompleteError`.

A poll reads the marker by name (one request); only while the hour has none, it also lists
the hour's folder and looks for the first marked hour.  The clock and the sleep are
arguments, so the loop can be tested without waiting.

:func:`poke_hour` is a single poll returning a bool: an Airflow ``PythonSensor``'s
``python_callable`` (see ``examples/airflow_dag.py``).

With ``subscription`` (a subscription of the topic a ``pubsub`` commit policy publishes to), the wait sleeps on
its messages instead: it looks at the marker as soon as a message about an awaited hour arrives, and every
``poll_interval`` anyway (:mod:`event_etl.consumer.notices`: a message is a hint, the marker is the contract).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from event_etl.consumer.errors import WaitTimeoutError
from event_etl.consumer.hours import HourLike, hour_ms, hour_range, hour_text
from event_etl.consumer.sink import EventTypeLike, SinkLike, open_sink, type_name
from event_etl.consumer.status import HourState, HourStatus, hour_status, require_complete
from event_etl.errors import UsageError
from event_etl.rules.manifest import Manifest
from event_etl.storage import Storage
from event_etl.timeutil import HOUR_MS, format_duration, to_datetime

__all__ = ["DEFAULT_POLL_INTERVAL", "poke_hour", "wait_for_hour", "wait_for_hours"]

DEFAULT_POLL_INTERVAL = 2.0
"""Seconds between polls: a GET per poll is cheap, and a consumer should start soon after the marker."""

Seconds = float | int | timedelta
T = TypeVar("T")


def _seconds(value: Seconds | None, what: str) -> float | None:
    if value is None:
        return None
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s < 0 or math.isnan(s):
        raise UsageError(f"{what} {value!r} is negative", fix=f"give {what} in seconds (or a timedelta), 0 or more")
    return s


def _poll(check: Callable[[], T | None], *, timeout: float | None, poll_interval: float,
         clock: Callable[[], float], sleep: Callable[[float], None]) -> T | None:
    """Call ``check`` until it returns something, or ``None`` once ``timeout`` seconds have passed.

    ``check`` runs at least once, and once more at the deadline.
    """
    deadline = None if timeout is None else clock() + timeout
    while True:
        got = check()
        if got is not None:
            return got
        now = clock()
        if deadline is not None and now >= deadline:
            return None
        sleep(poll_interval if deadline is None else min(poll_interval, deadline - now))


def wait_for_hours(
    sink: SinkLike,
    event_type: EventTypeLike,
    since: HourLike,
    until: HourLike,
    *,
    timeout: Seconds | None = None,
    poll_interval: Seconds = DEFAULT_POLL_INTERVAL,
    on_status: Callable[[HourStatus], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    subscription: str | None = None,
) -> list[Manifest]:
    """Wait until every hour in ``[since, until)`` is complete; their manifests, oldest first.

    ``timeout`` (seconds or a timedelta; ``None``: no limit, ``0``: look once) bounds the
    wait; ``on_status`` is called with the status of every hour looked at.  Raises
    :class:`WaitTimeoutError`, :class:`CouldNotCheckError` or :class:`HourNeverCompleteError`
    (see the module docstring).  ``subscription``: wake on its messages (see the module docstring).
    """
    storage, name, hours = open_sink(sink), type_name(event_type), hour_range(since, until)
    limit, interval = _seconds(timeout, "timeout"), _seconds(poll_interval, "poll_interval")
    if not interval:
        raise UsageError(f"poll_interval {poll_interval!r} must be more than 0", fix="poll every second or two")
    if subscription is not None:
        from event_etl.consumer.notices import HourMessages

        with HourMessages(subscription, name, hours) as messages:
            return _wait(storage, name, hours, limit=limit, interval=interval, on_status=on_status, clock=clock,
                         sleep=messages.sleeper(sleep))
    return _wait(storage, name, hours, limit=limit, interval=interval, on_status=on_status, clock=clock, sleep=sleep)


def _wait(storage: Storage, name: str, hours: list[int], *, limit: float | None, interval: float,
          on_status: Callable[[HourStatus], None] | None, clock: Callable[[], float],
          sleep: Callable[[float], None]) -> list[Manifest]:
    done: dict[int, Manifest] = {}
    last: list[HourStatus] = []

    def check() -> list[Manifest] | None:
        for h in hours:
            if h in done:
                continue
            status = hour_status(storage, name, to_datetime(h))
            if on_status is not None:
                on_status(status)
            if not status.is_complete:
                if status.state is HourState.NEVER:
                    require_complete(status)  # raises: no marker will ever come
                last[:] = [status]
                return None  # markers come in order: the later hours are not complete either
            assert status.manifest is not None  # a complete hour's status carries its manifest
            done[h] = status.manifest
        return [done[h] for h in hours]

    got = _poll(check, timeout=limit, poll_interval=interval, clock=clock, sleep=sleep)
    if got is None:
        assert limit is not None  # without a limit, _poll returns only what check() found
        status = last[0]
        raise WaitTimeoutError(
            f"{status.describe()}, still not complete after {format_duration(limit * 1000)}",
            event_type=name, hour=status.hour, timeout=limit, status=status,
            fix=f"wait longer (--timeout), or check that the job writing {name} runs and its watermark moves "
            f"(event-etl hours {name})",
        )
    return got


def wait_for_hour(
    sink: SinkLike,
    event_type: EventTypeLike,
    hour: HourLike,
    *,
    timeout: Seconds | None = None,
    poll_interval: Seconds = DEFAULT_POLL_INTERVAL,
    on_status: Callable[[HourStatus], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    subscription: str | None = None,
) -> Manifest:
    """Wait until ``hour`` is complete and return its manifest (see :func:`wait_for_hours`)."""
    h = hour_ms(hour)
    return wait_for_hours(sink, event_type, hour_text(h), hour_text(h + HOUR_MS), timeout=timeout,
                          poll_interval=poll_interval, on_status=on_status, clock=clock, sleep=sleep,
                          subscription=subscription)[0]


def poke_hour(sink: SinkLike, event_type: EventTypeLike, hour: HourLike) -> bool:
    """One poll: ``True`` if ``hour`` is complete, ``False`` if not yet.

    Made for Airflow's ``PythonSensor(python_callable=poke_hour, op_kwargs={...})``: a
    storage failure raises :class:`CouldNotCheckError` and an hour before the job's first
    hour raises :class:`HourNeverCompleteError`, so the sensor fails (and Airflow's retries
    apply) instead of poking "not yet" forever.
    """
    status = hour_status(sink, event_type, hour)
    if status.state is HourState.NEVER:
        require_complete(status)
    return status.is_complete
