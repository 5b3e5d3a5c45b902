"""One type of a run (a single type's job is a fleet of one): what the driver and the engine know of it.

A :class:`FleetMember` is made when the type is prepared (:class:`~event_etl.job.setup.Prepared`: checked and
leased, before Spark); once Spark is up the driver opens it (:func:`event_etl.job.setup.open_shared`): its
:class:`~event_etl.job.setup.Job` (controller, metrics, printer) and its :class:`~event_etl.job.lane.Lane` (its
source's session and offsets).  A fleet quarantines a member that fails and opens it again after a backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from event_etl.errors import EventEtlError
from event_etl.eventtypes import EventType
from event_etl.job.lane import Lane
from event_etl.job.setup import Job, Prepared
from event_etl.timeutil import iso

__all__ = ["FleetMember"]


@dataclass
class FleetMember:
    """One type of the fleet and what the supervisor knows of it."""

    event_type: EventType
    prepared: Prepared
    job: Job | None = None  # once opened
    state: str = "starting"
    lane: Lane | None = None  # the engine's hold on its source, once opened
    failures: int = 0
    restart_at: float | None = None
    last_error: str | None = None
    drain_error: str | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.event_type.name

    @property
    def opened(self) -> Job:
        """Its job, which a running or quarantined member has (an error before it was opened)."""
        if self.job is None:
            raise EventEtlError(f"[{self.name}] the type's job is not open", fix="report it: a bug of event_etl")
        return self.job

    @property
    def source(self) -> Lane:
        """Its lane, which an opened member has."""
        if self.lane is None:
            raise EventEtlError(f"[{self.name}] the type's source is not open", fix="report it: a bug of event_etl")
        return self.lane

    def status(self, clock: Callable[[], int]) -> dict[str, Any]:
        st = self.job.controller.state if self.job else None
        wm = st.watermark if st else None
        printer = self.job.printer if self.job else None
        now = printer.now() if printer is not None else clock()  # the generator's own clock for generate:
        return {
            "event_type": self.name,
            "state": self.state,
            "watermark": iso(wm),
            "lag_ms": None if wm is None or now is None else now - wm,
            "last_marker": iso(st.marked_through) if st and st.marked_through is not None else None,
            "last_batch": st.last_batch_id if st else None,
            "restarts": self.failures,
            "last_error": self.drain_error or self.last_error,
            "updated_at": iso(clock()),
        }
