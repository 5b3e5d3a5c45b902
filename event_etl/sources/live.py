"""The Pub/Sub fetchers running in this process, by their spool folder.

A fetcher's error is known in memory first: a full disk may keep it from leaving the error file
the planner and the job read (``error.json`` in the spool), and a stream's death must never be
taken for a quiet subscription.  So whoever asks for a spool's error (:func:`event_etl.sources.pubsub.read_error`)
asks the fetcher of that spool running in this process first, then the file (left by a fetcher
in another process: a fetch partition on an executor).
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

from event_etl.errors import SourceError

__all__ = ["register", "unregister", "live_error"]


class _HasError(Protocol):
    """A fetcher, as this registry sees it: the error that stopped it, if any."""

    @property
    def error(self) -> SourceError | None: ...


_LIVE: dict[str, _HasError] = {}
_LOCK = threading.Lock()


def _key(spool_dir: str | os.PathLike[str]) -> str:
    return os.path.realpath(spool_dir)


def register(spool_dir: str | os.PathLike[str], fetcher: _HasError) -> None:
    """``fetcher`` (with an ``error`` attribute) pulls into ``spool_dir`` in this process from now on."""
    with _LOCK:
        _LIVE[_key(spool_dir)] = fetcher


def unregister(spool_dir: str | os.PathLike[str], fetcher: _HasError) -> None:
    """``fetcher`` has stopped (a later one of the same spool stays registered)."""
    with _LOCK:
        if _LIVE.get(_key(spool_dir)) is fetcher:
            del _LIVE[_key(spool_dir)]


def live_error(spool_dir: str | os.PathLike[str]) -> SourceError | None:
    """The error (a :class:`~event_etl.errors.SourceError`) of the fetcher of ``spool_dir`` running in this process,
    or None."""
    with _LOCK:
        f = _LIVE.get(_key(spool_dir))
    return None if f is None else f.error
