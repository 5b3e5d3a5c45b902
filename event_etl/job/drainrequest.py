"""Asking a running job to drain and stop: ``event-etl drain TYPE``.

A plain stop (Ctrl-C, SIGTERM, SIGHUP) marks no hour the watermark has not passed, so that the
next run continues it (:mod:`event_etl.job.stopping`).  A job stopped for good is drained
instead: ``run --drain-on-stop`` before it starts, or, while it runs, :data:`DRAIN_SIGNAL`
(SIGUSR1) sent to its process.  This module finds that process the way ``event-etl status``
and a second job find it: the checkpoint lock (``<checkpoint>/etl/LOCK``) is held by the
running job, which wrote its host and pid into it (:mod:`event_etl.storage.lease`).  A fleet
holds the lock of each of its types: asking one of them drains the whole fleet.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from event_etl.errors import EventEtlError
from event_etl.job.stopping import DRAIN_SIGNAL

__all__ = ["lock_holder", "ask_to_drain", "checkpoint_of"]


def lock_holder(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Who holds the checkpoint lock of ``checkpoint_dir`` (``host``, ``pid``, ``checkpoint``, ``started_at``), or
    None when no job holds it."""
    path = Path(checkpoint_dir) / "etl" / "LOCK"
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed below, after the probe
    except FileNotFoundError:
        return None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # taken only while no job holds it
        except BlockingIOError:
            pass
        else:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            return None
        try:
            doc = json.loads(fh.read() or "{}")
        except ValueError:
            doc = {}
    return doc if isinstance(doc, dict) else {}


def checkpoint_of(name: str, *, checkpoint: str | None, checkpoint_root: str) -> Path:
    """The checkpoint of type ``name``'s job: ``--checkpoint DIR`` as ``run TYPE`` was given it (or a fleet's
    ``--checkpoint ROOT``: then ``ROOT/<name>``), else ``<checkpoint_root>/<name>``."""
    if checkpoint is not None:
        own = Path(checkpoint)
        if not (own / "etl" / "LOCK").exists() and (own / name / "etl" / "LOCK").exists():
            return own / name  # a fleet's --checkpoint ROOT
        return own
    return Path(checkpoint_root) / name


def ask_to_drain(name: str, checkpoint_dir: Path) -> dict[str, Any]:
    """Send :data:`DRAIN_SIGNAL` to the job running on ``checkpoint_dir``; returns its lock's record.

    Raises :class:`EventEtlError` when no job holds that checkpoint, or it runs on another host."""
    holder = lock_holder(checkpoint_dir)
    if holder is None:
        stopped = (Path(checkpoint_dir) / "etl").is_dir()
        raise EventEtlError(
            f"no job of {name} runs on checkpoint {checkpoint_dir}"
            + (" (it is stopped)" if stopped else " (there is no checkpoint there)"),
            fix=(f"to close the hours of a stopped job, run it once with a drain: event-etl run {name} --once --drain "
                 "(the same --checkpoint, --sink and --source)") if stopped else
            "give the checkpoint the job runs on: --checkpoint DIR (as `run` was given it) or --checkpoint-root DIR")
    pid, host = holder.get("pid"), holder.get("host")
    if not isinstance(pid, int):
        raise EventEtlError(f"the lock of checkpoint {checkpoint_dir} names no process: {holder}",
                            fix="stop the job with Ctrl-C, then run it once with --once --drain")
    if host != socket.gethostname():
        raise EventEtlError(f"the job of {name} (pid {pid}) runs on host {host}, not here",
                            fix=f"run `event-etl drain {name}` on {host}, or send SIGUSR1 to pid {pid} there")
    try:
        os.kill(pid, DRAIN_SIGNAL)
    except ProcessLookupError:
        raise EventEtlError(f"the job of {name} (pid {pid}) has just ended",
                            fix=f"run it once with a drain: event-etl run {name} --once --drain") from None
    except PermissionError:
        raise EventEtlError(f"not allowed to signal the job of {name} (pid {pid}: another user's)",
                            fix=f"run this command as the job's user, or `sudo kill -USR1 {pid}`") from None
    return holder
