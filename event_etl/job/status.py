"""What ``event-etl status`` shows: each type's job, from its checkpoint and its lease in the sink."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.job.checkpoint import Checkpoint
from event_etl.sources.registry import spooled_in
from event_etl.storage import Storage
from event_etl.storage.lease import LEASE_NAME
from event_etl.storage.locations import resolve_sink
from event_etl.timeutil import format_duration, iso, now_millis

__all__ = ["job_status", "job_statuses", "read_status", "seek_time", "seek_fields_at", "backfill_deadletters",
           "STATUS_FILE"]

STATUS_FILE = "status.json"
"""A fleet member's status (state, restarts, last error), in ``<checkpoint>/etl/``: written by
:func:`event_etl.job.fleet.write_status`, read by :func:`read_status`."""


def read_status(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """The fleet status of the job of ``checkpoint_dir``, or None when it has none (not run in a fleet)."""
    p = Path(checkpoint_dir) / "etl" / STATUS_FILE
    return json.loads(p.read_text()) if p.exists() else None


def seek_time(oldest_open_hour: int | None, out_of_orderness: int | None, spool_oldest: int | None
              ) -> tuple[int, str] | None:
    """How far back (ms) a seek of a Pub/Sub subscription must go for Pub/Sub to deliver again everything a job has
    not committed (docs/runbook.md), and what decided it: the start of the oldest open hour minus
    ``out_of_orderness`` (an event of that hour may have been published that much before it), or the oldest
    publish time the spool holds (acknowledged messages published earlier: late events on their way to ``late-``
    files, a backlog delivered out of order), whichever is earlier.  None when neither is known."""
    options = []
    if oldest_open_hour is not None:
        if out_of_orderness is None:  # the type's settings could not be read: say so rather than guess
            options.append((oldest_open_hour, "the oldest open hour's start; out_of_orderness unknown here (no "
                            "--event-types): seek earlier by it"))
        else:
            options.append((oldest_open_hour - out_of_orderness, "the oldest open hour's start minus "
                            "out_of_orderness"))
    if spool_oldest is not None:
        options.append((spool_oldest, "the oldest message the spool holds"))
    return min(options) if options else None


def _oldest_open_hour(state: Any) -> int | None:
    from event_etl.timeutil import HOUR_MS

    if state is None:
        return None
    if state.marked_through is not None:
        return int(state.marked_through) + HOUR_MS
    return None if state.first_hour is None else int(state.first_hour)


def seek_fields_at(state: Any, out_of_orderness: int | None, spool_oldest: int | None) -> dict[str, Any]:
    """``seek_to`` (ISO UTC), ``seek_to_ms`` and ``seek_to_by`` for a Pub/Sub job whose spool's oldest publish time
    is ``spool_oldest`` (see :func:`seek_time`); empty when nothing is known."""
    found = seek_time(_oldest_open_hour(state), out_of_orderness, spool_oldest)
    if found is None:
        return {}
    return {"seek_to": iso(found[0]), "seek_to_ms": found[0], "seek_to_by": found[1]}


def backfill_deadletters(storage: Storage, event_type: str, state: Any, *, max_backfill: int | None = None,
                         settings_file: str | None = None) -> dict[str, Any] | None:
    """The events of ``event_type`` the dead letters hold as ``before_backfill`` (more than ``max_backfill`` before
    their arrival while the job had no watermark), when the job of ``state`` has no watermark yet: everything it
    read went to the dead letters, and nothing else tells why.  ``{"events", "waiting", "replayed", "oldest",
    "newest", "max_backfill", "line"}`` (``events``: every such dead letter, replayed or not, as before;
    ``replayed``: those a replay recorded in ``_deadletter/_replays/`` named; ``waiting``: the others; ``oldest``
    and ``newest``: of the waiting ones, or of all when none waits; ``max_backfill``: the type's setting now, when
    known; ``line``: what to do); None when there are none,
    or when the job has a watermark (then its run said so, batch by batch, and the dead letters are not read)."""
    if state is None or state.watermark is not None:
        return None
    from event_etl.consumer.replay import load_entries, replay_records
    from event_etl.job.progress import backfill_text
    from event_etl.rules.reasons import Reason

    letters = [e for e in load_entries(storage, event_type) if e.reason == Reason.BEFORE_BACKFILL.value]
    if not letters:
        return None
    sent = {k for rec in replay_records(storage, event_type) for k in rec.get("entries", [])}
    waiting = [e for e in letters if e.key not in sent]
    replayed = len(letters) - len(waiting)
    times = [e.event_time for e in (waiting or letters) if e.event_time is not None]
    oldest, newest = (min(times), max(times)) if times else (None, None)
    if waiting:
        line = backfill_text(event_type, len(waiting), oldest=oldest, newest=newest, settings_file=settings_file,
                             what="sit in the dead letters")
        if replayed:
            line += f" ({replayed:,} replayed)"
    else:
        line = (f"{len(letters):,} event{'s' if len(letters) != 1 else ''} dead-lettered as before_backfill, all "
                f"replayed (`event-etl deadletter {event_type}` shows the replays)")
    if max_backfill is not None:
        line += f" (max_backfill is {format_duration(max_backfill) if max_backfill else '0: no bound'} now)"
    return {"events": len(letters), "waiting": len(waiting), "replayed": replayed, "oldest": iso(oldest),
            "newest": iso(newest),
            "max_backfill": None if max_backfill is None else format_duration(max_backfill) if max_backfill else "0",
            "line": line}


def job_status(event_type: str, *, storage: Storage, checkpoint_dir: Path, now: int,
               out_of_orderness: int | None = None, max_backfill: int | None = None,
               settings_file: str | None = None) -> dict[str, Any]:
    """State of one type's job: ``running`` (a valid lease), ``restarting``/``quarantined``/``failed`` (its fleet
    says so), ``stopped`` (a checkpoint, no lease) or ``never run``.

    For a Pub/Sub job also ``seek_to``: how far back a seek of its subscription must go (:func:`seek_time`), from
    its checkpoint, or, when the checkpoint is gone, from what the job last wrote into its lease (``seek_to_from``
    says which).  ``before_backfill``: what :func:`backfill_deadletters` finds (None: nothing to say)."""
    ck = Checkpoint(checkpoint_dir)
    state = ck.load_state() if (ck.etl / "state.json").exists() else None
    fleet = read_status(checkpoint_dir) or {}
    lease: dict[str, Any] = {}  # none, or not readable: no job holds the type
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
    seek: dict[str, Any] = {}
    spooled = spooled_in(ck.etl / "source")  # read-only, through the source's face: None if it holds no spool
    if live and lease.get("seek_to"):  # the running job's own view, at most a renewal old
        seek = {k: lease.get(k) for k in ("seek_to", "seek_to_ms", "seek_to_by")}
        seek["seek_to_from"] = f"the running job, at {lease.get('renewed_at')}"
    elif spooled is not None:
        seek = seek_fields_at(state, out_of_orderness, spooled.oldest_ms)
        if seek:
            seek["seek_to_from"] = "the checkpoint"
    elif lease and lease.get("seek_to"):  # the checkpoint is gone: what the job last said
        seek = {k: lease.get(k) for k in ("seek_to", "seek_to_ms", "seek_to_by")}
        seek["seek_to_from"] = f"the job's lease, last renewed at {lease.get('renewed_at')} (no checkpoint here)"
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
        "source_down": lease.get("source_down") if live else None,
        "before_backfill": backfill_deadletters(storage, event_type, state, max_backfill=max_backfill,
                                                settings_file=settings_file),
        **seek,
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
                 clock: Callable[[], int] = now_millis, types_dir: str | Path | None = None) -> list[dict[str, Any]]:
    storage = Storage(resolve_sink(sink))
    now = clock()
    out = []
    types = {}
    for name in event_types:
        et = types[name] = _event_type(types_dir, name)
        out.append(job_status(name, storage=storage, checkpoint_dir=Path(checkpoint_root) / name, now=now,
                              out_of_orderness=None if et is None else int(et.out_of_orderness),
                              max_backfill=None if et is None else int(et.max_backfill),
                              settings_file=None if et is None else et.settings_file))
    buses = _buses(types, storage, now)
    for row in out:
        if row["event_type"] in buses:
            row["bus"] = buses[row["event_type"]]
    return out


def _buses(types: dict[str, Any], storage: Storage, now: int) -> dict[str, dict[str, Any]]:
    """Each bus type's bus (``bus``: its id; ``unclaimed``: the messages it kept that no type claimed, all runs so
    far; ``unclaimed_at``: where), by type name; types whose settings do not make a bus show none."""
    from event_etl.errors import EventEtlError
    from event_etl.rules.routing import UNCLAIMED_DIR, plan_buses
    from event_etl.sources.registry import job_source
    from event_etl.storage.deadletter import count_unclaimed

    try:
        known = [et for et in types.values() if et is not None]
        plans = plan_buses([(et.name, job_source(et, None, now=now).identity(), et.route) for et in known])
    except EventEtlError:
        return {}  # `check` says what is wrong with them
    out = {}
    for plan in plans:
        info = {"bus": plan.id, "unclaimed": count_unclaimed(storage, plan.id),
                "unclaimed_at": storage.display(f"{UNCLAIMED_DIR}/{plan.id}")}
        out.update(dict.fromkeys(plan.names, info))
    return out


def _event_type(types_dir: str | Path | None, name: str) -> Any:
    """The type (its settings), or None when they cannot be read here."""
    if types_dir is None:
        return None
    from event_etl.eventtypes import load_event_type

    try:
        return load_event_type(Path(types_dir) / name)
    except Exception:  # noqa: BLE001 - status shows what it can
        return None

