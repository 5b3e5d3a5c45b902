"""Airflow: a sensor that waits for an hour's ``_COMPLETE`` marker, deferrable where Airflow supports it.

Airflow is not a dependency of event_etl: this module imports it only when
:class:`HourCompleteSensor` or :class:`HourCompleteTrigger` is first used, so the rest of
event_etl (and this module's logic) works without it.  In a DAG::

    from event_etl.consumer.airflow import HourCompleteSensor

    wait = HourCompleteSensor(task_id="wait_for_hour", sink="gs://my-events/prod", event_type="page_view",
                              hour="{{ data_interval_start }}", deferrable=True, poke_interval=60, timeout=6 * 3600)

What a poke answers (:func:`poke`, the same rule as :func:`event_etl.consumer.poke_hour`):

- the hour has its marker: done; the sensor returns the manifest's summary (XCom);
- not yet (open, not started): poke again after ``poke_interval``;
- the sink cannot be read, the hour lies before the job's first hour, or nothing at all is at
  ``<sink>/<event_type>/`` (a wrong sink): the task **fails** (Airflow's ``retries`` apply),
  never "not yet" forever.

``deferrable=True`` (Airflow 2.2+ with a triggerer running) hands the waiting to
:class:`HourCompleteTrigger`, which polls in the triggerer's event loop (the blocking poll runs
in a thread) and frees the worker slot; ``mode="reschedule"`` is the other way to free it.

Without this module, Google's own ``GCSObjectExistenceSensor`` on the marker's object does the
waiting as well (docs/consumers.md), but it takes a wrong bucket or a damaged marker for "not
yet": it has no notion of a wrong sink, a job's first hour or a manifest.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from event_etl.consumer.hours import hour_text
from event_etl.consumer.status import HourState, hour_status, require_complete
from event_etl.errors import EventEtlError
from event_etl.timeutil import iso

# HourCompleteSensor and HourCompleteTrigger are made on first use (module __getattr__), when Airflow is importable
__all__ = ["HourCompleteSensor", "HourCompleteTrigger", "PokeResult", "marker_object", "poke", "watch"]  # noqa: F822


@dataclass(frozen=True)
class PokeResult:
    """One poke: ``done`` and, when done, the summary a sensor returns (JSON-able, for XCom)."""

    done: bool
    state: str
    summary: dict[str, Any] | None = None


def poke(sink: str, event_type: str, hour: Any) -> PokeResult:
    """One look at the hour.  Raises (an :class:`~event_etl.errors.EventEtlError`) for every answer that is
    not "complete" or "not yet": could not check (4), no data at all (6), an hour that is never marked (2)."""
    status = hour_status(sink, event_type, hour)
    if status.state is HourState.NEVER:
        require_complete(status)  # raises HourNeverCompleteError
    if not status.is_complete:
        return PokeResult(False, str(status.state))
    m = status.manifest
    assert m is not None  # a complete hour's status carries its manifest
    return PokeResult(True, str(status.state), {
        "event_type": m.event_type, "hour": hour_text(m.hour), "records": m.records, "late_records": m.late_records,
        "files": [f.name for f in m.files], "completed_at": iso(m.completed_at),
    })


async def watch(sink: str, event_type: str, hour: Any, *, poke_interval: float,
                sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                poke_fn: Callable[[str, str, Any], PokeResult] = poke,
                deadline: float | None = None, clock: Callable[[], float] = time.time) -> AsyncIterator[dict[str, Any]]:
    """What :class:`HourCompleteTrigger` yields: one event, ``{"status": "complete", ...}``,
    ``{"status": "error", "message": ..., "fix": ..., "exit_code": ...}`` or, once ``deadline`` (seconds since the
    epoch, on ``clock``) has passed, ``{"status": "timeout", ...}``.  Each poke runs in a thread.

    The trigger keeps the sensor's timeout itself: Airflow's triggerer enforces a deferral's timeout only where a
    scheduler watches it, and ``airflow dags test`` runs a trigger inline with no timeout at all."""
    while True:
        try:
            got = await asyncio.to_thread(poke_fn, sink, event_type, hour)
        except EventEtlError as err:
            yield {"status": "error", "message": err.message, "fix": err.fix, "exit_code": int(err.exit_code)}
            return
        if got.done:
            yield {"status": "complete", **(got.summary or {})}
            return
        left = None if deadline is None else deadline - clock()
        if left is not None and left <= 0:
            yield {"status": "timeout", "message": f"{event_type} {hour_text_of(hour)} was not complete "
                   f"({got.state}) when the sensor's timeout ran out",
                   "fix": "raise the sensor's timeout, or check that the job runs (event-etl status)"}
            return
        await sleep(poke_interval if left is None else max(0.0, min(poke_interval, left)))


def hour_text_of(hour: Any) -> str:
    """The hour as ``2026-11-21T13:00:00Z`` whatever form it was given in (a message must not fail on it)."""
    from event_etl.consumer.hours import hour_ms

    try:
        return hour_text(hour_ms(hour))
    except EventEtlError:
        return str(hour)


def marker_object(sink: str, event_type: str, hour: Any) -> tuple[str, str]:
    """``(bucket, object)`` of the hour's ``_COMPLETE`` marker in a ``gs://`` sink, for
    ``GCSObjectExistenceSensor(bucket=..., object=...)``."""
    from event_etl.consumer.hours import hour_ms
    from event_etl.consumer.sink import type_name
    from event_etl.errors import UsageError
    from event_etl.rules.buckets import MARKER_NAME, hour_dir

    if not sink.startswith("gs://"):
        raise UsageError(f"{sink} is not a gs:// sink", fix="GCSObjectExistenceSensor watches Cloud Storage only")
    bucket, _, prefix = sink[len("gs://"):].rstrip("/").partition("/")
    rel = f"{hour_dir(type_name(event_type), hour_ms(hour))}/{MARKER_NAME}"
    return bucket, f"{prefix}/{rel}" if prefix else rel


def _airflow_error(err: ImportError) -> ImportError:
    return ImportError(f"event_etl.consumer.airflow.HourCompleteSensor needs Apache Airflow, which is not installed "
                       f"({err}); "
                       "install event_etl into the Airflow workers' environment, not Airflow into event_etl's")


def _build() -> dict[str, type]:
    try:
        trigger = _trigger_class()
        sensor = _sensor_class(trigger)
    except ImportError as err:
        raise _airflow_error(err) from err
    return {"HourCompleteSensor": sensor, "HourCompleteTrigger": trigger}


# Airflow has no types where event_etl is type-checked (it is not installed there): its base classes are Any, hence
# the two `type: ignore[misc]` (subclassing Any) below.
def _trigger_class() -> type:
    from airflow.triggers.base import BaseTrigger, TriggerEvent

    class HourCompleteTrigger(BaseTrigger):  # type: ignore[misc]  # Airflow's class, Any here (see above)
        """Polls the hour's marker in the triggerer (see :func:`watch`)."""

        def __init__(self, sink: str, event_type: str, hour: str, poke_interval: float = 60.0,
                     deadline: float | None = None) -> None:
            super().__init__()
            self.sink, self.event_type, self.hour, self.poke_interval = sink, event_type, hour, float(poke_interval)
            self.deadline = deadline  # seconds since the epoch: the sensor's timeout, kept by the trigger itself

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return ("event_etl.consumer.airflow.HourCompleteTrigger",
                    {"sink": self.sink, "event_type": self.event_type, "hour": self.hour,
                     "poke_interval": self.poke_interval, "deadline": self.deadline})

        async def run(self) -> AsyncIterator[Any]:
            async for event in watch(self.sink, self.event_type, self.hour, poke_interval=self.poke_interval,
                                     deadline=self.deadline):
                yield TriggerEvent(event)

    return HourCompleteTrigger


def _sensor_class(trigger: type) -> type:
    try:  # Airflow 3
        from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout
    except ImportError:  # Airflow 2
        from airflow.exceptions import AirflowException, AirflowSensorTimeout
    try:  # Airflow 3
        from airflow.sdk.bases.sensor import BaseSensorOperator
    except ImportError:  # Airflow 2
        from airflow.sensors.base import BaseSensorOperator

    class HourCompleteSensor(BaseSensorOperator):  # type: ignore[misc]  # Airflow's class, Any here (see above)
        """Waits until ``hour`` of ``event_type`` in ``sink`` is complete; returns the manifest's summary."""

        template_fields = ("sink", "event_type", "hour")

        def __init__(self, *, sink: str, event_type: str, hour: str = "{{ data_interval_start }}",
                     deferrable: bool = False, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.sink, self.event_type, self.hour, self.deferrable = sink, event_type, hour, deferrable
            self._summary: dict[str, Any] | None = None

        def poke(self, context: Any) -> bool:
            try:
                got = poke(self.sink, self.event_type, self.hour)
            except EventEtlError as err:
                raise AirflowException(f"{err.message} (fix: {err.fix})") from err
            self._summary = got.summary
            return got.done

        def execute(self, context: Any) -> Any:
            if not self.deferrable:
                super().execute(context)
                return self._summary
            if self.poke(context):
                return self._summary
            # the sensor's timeout goes with the deferral (without it the trigger polled on for ever): the trigger
            # keeps it itself, and Airflow's deferral timeout backs it up where a scheduler runs
            seconds = float(self.timeout) if self.timeout is not None else None
            deadline = None if seconds is None else time.time() + seconds
            self.defer(trigger=trigger(self.sink, self.event_type, str(self.hour), self.poke_interval, deadline),
                       method_name="execute_complete",
                       timeout=None if seconds is None else timedelta(seconds=seconds + 60))

        def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
            got = event or {}
            status = got.get("status")
            if status == "timeout":  # as a sensor's own timeout: fails the task, no retries
                raise AirflowSensorTimeout(f"{got.get('message')} (fix: {got.get('fix')})")
            if status != "complete":
                raise AirflowException(f"{got.get('message')} (fix: {got.get('fix')})")
            return {k: v for k, v in got.items() if k != "status"}

    return HourCompleteSensor


_built: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """``HourCompleteSensor`` and ``HourCompleteTrigger`` are made (importing Airflow) when first asked for."""
    if name in ("HourCompleteSensor", "HourCompleteTrigger"):
        if not _built:
            _built.update(_build())
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
