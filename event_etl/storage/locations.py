"""Where things are: the one place that tells a URL from a local path.

A location is a URL (``gs://bucket/prefix``: anything with ``://`` but ``file://``) or a local
path (``./data``, ``/mnt/shared/data``, ``file:///data``).  A local path is made absolute,
since executors and a submitted driver may run in another folder; a URL stays as it is.
"""

from __future__ import annotations

import os

__all__ = ["is_remote", "local_path", "resolve_sink", "default_checkpoint"]


def is_remote(location: str) -> bool:
    """Whether ``location`` is a URL of a remote store (``gs://...``), not a local path (``file://`` is local)."""
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> str:
    """The absolute path of a local ``location`` (``file://`` stripped)."""
    return os.path.abspath(location[len("file://"):] if location.startswith("file://") else location)


def resolve_sink(sink: str) -> str:
    """Local sinks become absolute paths (executors may run elsewhere); URLs stay as they are."""
    if is_remote(sink):
        return sink.rstrip("/")
    return local_path(sink)


def default_checkpoint(event_type: str) -> str:
    """``./checkpoints/<event_type>``: predictable, next to the default sink."""
    return os.path.abspath(os.path.join("checkpoints", event_type))
