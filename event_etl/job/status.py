"""What ``event-etl status`` shows: each type's job, from its checkpoint and its lease in the sink."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.job.checkpoint import Checkpoint
from event_etl.storage import Storage
from event_etl.storage.lease import LEASE_NAME
from event_etl.storage.locations import resolve_sink
from event_etl.timeutil import format_duration, iso, now_millis

__all__ = ["job_status", "job_statuses", "read_status", "STATUS_FILE"]

STATUS_FILE = "status.json"
"""A fleet member's status (state, restarts, last error), in ``<checkpoint>/etl/``: written by
:mod:`event_etl.job.fleet`, read by :func:`read_status`."""


def read_status(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """The fleet status of the job of ``checkpoint_dir``, or None when it has none (not run in a fleet)."""
    p = Path(checkpoint_dir) / "etl" / STATUS_FILE
    return json.loads(p.read_text()) if p.exists() else None


def job_status(event_type: str, *, storage: Storage, checkpoint_dir: Path, now: int) -> dict[str, Any]:
    """State of one type's job: ``running`` (a valid lease), ``restarting``/``quarantined``/``failed`` (its fleet
    says so), ``stopped`` (a checkpoint, no lease) or ``never run``."""
    ck = Checkpoint(checkpoint_dir)
    state = ck.load_state() if (ck.etl / "state.json").exists() else None
    fleet = read_status(checkpoint_dir) or {}
    lease = None
    try:
        lease = json.loads(storage.read(f"{event_type}/{LEASE_NAME}"))
    except FileNotFoundError:
        pass
    except (ValueError, UnicodeDecodeError):
        lease = {}
    live = bool(lease) and int(lease.get("expires_at_ms", 0)) > now
    if live:
        st = fleet.get("state") if fleet.get("state") in ("restarting", "quarantined", "failed") else "running"
    elif state is None:
        st = "never run"
    else:
        st = "stopped"
    wm = state.watermark if state else None
    return {
        "event_type": event_type,
        "state": st,
        "watermark": iso(wm),
        # a generator's event clock runs ahead of the wall clock (the demo): a negative lag would read as nonsense
        "lag": None if wm is None else format_duration(now - wm) if now >= wm else "ahead",
        "last_marker": iso(state.marked_through) if state and state.marked_through is not None else None,
        "last_batch": state.last_batch_id if state else None,
        "restarts": fleet.get("restarts") if fleet else None,
        "last_error": fleet.get("last_error") if live else None,
        "holder": {k: lease.get(k) for k in ("host", "pid", "checkpoint", "started_at")} if live else None,
        "policies": _policies(ck, state),
    }


def _policies(ck: Checkpoint, state: Any) -> dict[str, dict[str, Any]]:
    """Each commit policy's progress (event_etl.job.policies): through which hour it is done, how many marked
    hours wait for it, its failures and last error."""
    from event_etl.job.policies import pending_hours

    out = {}
    for name, rec in ck.policy_records().items():
        done = rec.get("done_through")
        out[name] = {
            "kind": rec.get("kind"),
            "done_through": iso(done) if done is not None else None,
            "pending": pending_hours(rec, state.first_hour, state.marked_through) if state is not None else 0,
            "failures": int(rec.get("failures", 0)),
            "last_error": rec.get("last_error"),
            "last_error_at": rec.get("last_error_at"),
        }
    return out


def job_statuses(event_types: list[str], *, sink: str, checkpoint_root: str,
                 clock: Callable[[], int] = now_millis) -> list[dict[str, Any]]:
    storage = Storage(resolve_sink(sink))
    now = clock()
    return [job_status(name, storage=storage, checkpoint_dir=Path(checkpoint_root) / name, now=now)
            for name in event_types]
