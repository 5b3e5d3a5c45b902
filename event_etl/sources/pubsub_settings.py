"""How a Pub/Sub fetcher pulls: its ``EVENT_ETL_PUBSUB_*`` settings, and whether its spool outlives the machine.

:class:`FetchSettings` is read once where the job starts (:meth:`FetchSettings.from_env`, each
field from ``EVENT_ETL_PUBSUB_<FIELD>``, docs/environment.md) and handed to the fetcher
(:mod:`event_etl.sources.pubsub_fetch`), its streams and, as a plain dict, the fetch partitions
on executors (:mod:`event_etl.sources.pubsub_partitions`).  ``ack`` says when a message is
acknowledged (``spooled``: once durable in the spool; ``committed``: once its batch is saved);
:func:`spool_warning` is the line a job prints at start when ``spooled`` acknowledgements would
leave the only copy of a message on a disk that does not outlive the machine or the container.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from event_etl.errors import UsageError
from event_etl.settings import current_settings

__all__ = ["FetchSettings", "ACK_MODES", "EMULATOR_STREAMS", "VOLATILE_FILESYSTEMS", "filesystem_type",
           "spool_warning"]

ACK_MODES = ("spooled", "committed")
"""When messages are acknowledged (``EVENT_ETL_PUBSUB_ACK``): once durable in the spool, or once their batch is
saved.  :mod:`event_etl.sources.pubsub_fetch` says what each promises."""
EMULATOR_STREAMS = 1
"""Pull streams by default against the emulator (see :meth:`FetchSettings.from_env`); 4 against the service."""


@dataclass
class FetchSettings:
    """How a fetcher pulls (``EVENT_ETL_PUBSUB_*`` settings, see :meth:`from_env`)."""

    streams: int = 4
    max_held_messages: int = 200_000
    max_held_bytes: int = 256 << 20
    segment_messages: int = 5_000
    segment_age: float = 0.5
    ack_deadline: int = 60
    outage_timeout: float = 120.0
    pull_timeout: float = 10.0
    once_quiet: float = 3.0
    fetch_partitions: int = 0
    """0: pull in the driver (threads beside the query).  N: pull in N tasks on the cluster's executors
    (:mod:`event_etl.sources.pubsub_partitions`), each with ``streams`` streams; they take N cores."""
    fleet_max_held_messages: int = 1_000_000
    """A fleet's bound on what all its Pub/Sub types hold pulled and not yet saved, shared fairly among those that
    hold any (:class:`~event_etl.sources.pubsub_pool.PullerPool`); each type's own bound holds too."""
    fleet_max_held_bytes: int = 1 << 30
    pullers: int = 8
    """A fleet's shared pullers (:mod:`event_etl.sources.pubsub_pool`): threads that pull every Pub/Sub type of the
    application in turns (a single type's job runs its streams as threads of its own)."""
    ack: str = "spooled"
    """When messages are acknowledged: ``spooled`` (once durable in the spool) or ``committed`` (once their batch is
    saved); :mod:`event_etl.sources.pubsub_fetch` says what each promises."""

    @property
    def spooled(self) -> bool:
        return self.ack == "spooled"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *, emulator: bool = False,
                 **overrides: Any) -> FetchSettings:
        """The ``EVENT_ETL_PUBSUB_*`` settings of ``env`` (default: those in force, :func:`current_settings`).
        ``emulator``: the job pulls from Google's Pub/Sub emulator (``PUBSUB_EMULATOR_HOST``), where the streams
        default to 1: its pulls slow down in proportion to the backlog as soon as anything is leased, so a second
        stream, whose pull always finds the first one's messages leased, cuts the rate instead of doubling it (to
        ~1,100 msg/s against 17,500 at 20,000 msg/s published, bench/RESULTS.md)."""
        env = dict(current_settings().pubsub if env is None else env)
        s = cls()
        if emulator:
            s.streams = EMULATOR_STREAMS
        for name, conv in (("streams", int), ("max_held_messages", int), ("max_held_bytes", int),
                           ("segment_messages", int), ("segment_age", float), ("ack_deadline", int),
                           ("outage_timeout", float), ("pull_timeout", float), ("once_quiet", float),
                           ("fetch_partitions", int), ("pullers", int), ("fleet_max_held_messages", int),
                           ("fleet_max_held_bytes", int), ("ack", _ack_mode)):
            key = f"EVENT_ETL_PUBSUB_{name.upper()}"
            if name == "outage_timeout":
                key = "EVENT_ETL_PUBSUB_OUTAGE_SECONDS"
            if key in env:
                setattr(s, name, conv(env[key]))
        for k, v in overrides.items():
            setattr(s, k, v)
        return s


def _ack_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ACK_MODES:
        raise UsageError(f"EVENT_ETL_PUBSUB_ACK={text!r} is not a way to acknowledge",
                         fix="set it to 'spooled' (the default: once durable in the spool) or 'committed' (once the "
                             "batch is saved); docs/production.md says what each promises and costs")
    return mode


_VOLATILE = {
    "tmpfs": "on tmpfs, which a restart of this machine empties",
    "ramfs": "on ramfs, which a restart of this machine empties",
    "overlay": ("on an overlay file system (a container's writable layer, a pod's ephemeral disk), which is lost "
                "with the container when it is replaced or rescheduled"),
}
VOLATILE_FILESYSTEMS = frozenset(_VOLATILE)
"""File systems whose files do not outlive the machine or the container: the spool must not be on one."""


def filesystem_type(path: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> str | None:
    """The type of the file system ``path`` lies on (the longest mount point that holds it), or None if unknown."""
    real = os.path.realpath(path)
    best, kind = "", None
    try:
        with open(mounts, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, parts[2]
    except OSError:
        return None
    return kind


def spool_warning(name: str, spool_dir: str | os.PathLike[str], settings: FetchSettings,
                  mounts: str = "/proc/self/mounts") -> str | None:
    """The one-line warning for ``spooled`` acknowledgements over a checkpoint that does not outlive the machine
    (tmpfs, ramfs) or the container (an overlay: a container's writable layer), or None.  Each fetch partition
    checks its own host's mount too (:mod:`event_etl.sources.pubsub_partitions`)."""
    kind = filesystem_type(spool_dir, mounts)
    if not settings.spooled or kind not in _VOLATILE:
        return None
    return (f"[{name}] warning: the checkpoint is {_VOLATILE[kind]}, and with EVENT_ETL_PUBSUB_ACK=spooled an "
            "acknowledged message is only in its spool until its batch commits: losing the spool loses it; fix: put "
            "--checkpoint on durable storage (a persistent volume), or set EVENT_ETL_PUBSUB_ACK=committed")
