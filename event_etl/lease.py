"""One writer per event type and sink, and per checkpoint.

Two locks, both taken before Spark starts:

- **The checkpoint lock**: an exclusive ``flock`` on ``<checkpoint>/etl/LOCK``.  The
  kernel releases it when the holder dies, however it dies, so a crashed job never
  blocks its restart.  The holder's description is written into the file.
- **The sink lease**: ``<sink>/<event_type>/_LEASE``, a small JSON object naming the
  holder (host, pid, checkpoint, when it started) and until when the lease is valid.
  The running job renews it every ``ttl / 4``; a job that finds a valid lease held by
  someone else refuses at once, naming the holder.  A lease not renewed for ``ttl``
  (default 60 s) has expired: its holder is dead or cut off, and the next job takes it
  over.  A lease left by a job with the *same* checkpoint is taken over at once: holding
  the checkpoint lock proves that job is gone.  The job checks that it still holds the lease before every micro-batch and
  stops if it lost it.

Behind the lease, two more guards: file names carry the checkpoint's writer id, so two
jobs can never write the same file name, and a job never adds a file to an hour that is
already marked, nor marks an hour whose files it did not write.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from event_etl.errors import LeaseHeldError
from event_etl.storage import Storage
from event_etl.timeutil import format_duration, iso

__all__ = ["Lease", "DEFAULT_TTL_MS", "default_ttl_ms"]

DEFAULT_TTL_MS = 60_000


def default_ttl_ms() -> int:
    """``$EVENT_ETL_LEASE_TTL`` (a duration such as ``"60s"``), else 60 s."""
    from event_etl.timeutil import parse_duration

    text = os.environ.get("EVENT_ETL_LEASE_TTL")
    return parse_duration(text) if text else DEFAULT_TTL_MS


@dataclass
class Lease:
    """The locks of one running job.  ``acquire`` before Spark starts, ``release`` at the end."""

    storage: Storage
    event_type: str
    checkpoint_dir: Path
    clock: Callable[[], int]
    ttl_ms: int = DEFAULT_TTL_MS

    def __post_init__(self) -> None:
        self.holder = uuid.uuid4().hex
        self.rel = f"{self.event_type}/_LEASE"
        self._lock_fh = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None
        self.started_at = self.clock()

    def describe(self) -> dict[str, Any]:
        return {"holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(),
                "checkpoint": str(self.checkpoint_dir), "started_at": iso(self.started_at)}

    @staticmethod
    def _who(doc: dict[str, Any]) -> str:
        return (f"pid {doc.get('pid')} on {doc.get('host')} (checkpoint {doc.get('checkpoint')}, "
                f"running since {doc.get('started_at')})")

    # -- checkpoint lock -------------------------------------------------------------------
    def _lock_checkpoint(self) -> None:
        path = Path(self.checkpoint_dir) / "etl" / "LOCK"
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            try:
                doc = json.loads(fh.read() or "{}")
            except json.JSONDecodeError:
                doc = {}
            fh.close()
            raise LeaseHeldError(
                f"checkpoint {self.checkpoint_dir} is in use by another job: {self._who(doc)}",
                fix="stop that job first (SIGTERM drains it), or give this run its own --checkpoint",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(self.describe()))
        fh.flush()
        self._lock_fh = fh

    # -- sink lease ------------------------------------------------------------------------
    def _doc(self) -> bytes:
        now = self.clock()
        return json.dumps({**self.describe(), "renewed_at": iso(now), "expires_at_ms": now + self.ttl_ms,
                           "expires_at": iso(now + self.ttl_ms)}, indent=1).encode()

    def _read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.storage.read(self.rel))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            return {}

    def _take_sink_lease(self) -> None:
        if self.storage.create_only(self.rel, self._doc()):
            return
        doc = self._read() or {}
        now = self.clock()
        expires = int(doc.get("expires_at_ms", 0))
        # We hold this checkpoint's lock, so a lease left by a job on this same checkpoint is a
        # dead job's (the kernel released its lock): a restart after a crash takes over at once.
        same_checkpoint = doc.get("checkpoint") == str(self.checkpoint_dir)
        if doc.get("holder") != self.holder and expires > now and not same_checkpoint:
            raise LeaseHeldError(
                f"{self.storage.display(self.rel)}: {self.event_type} is already being written to this sink by "
                f"{self._who(doc)}; its lease is valid for {format_duration(expires - now)} more",
                fix="stop that job first (SIGTERM drains it); a job that died loses its lease after "
                    f"{format_duration(self.ttl_ms)}",
            )
        # expired (its holder died): take it over
        self.storage.write_atomic(self.rel, self._doc())

    def check(self) -> None:
        """Renew the sink lease if this job still holds it; raise if another job took it."""
        if self.lost:
            raise LeaseHeldError(self.lost, fix="another job took over this event type and sink; this one stops")
        doc = self._read() or {}
        if doc.get("holder") not in (None, self.holder):
            self.lost = f"the lease {self.storage.display(self.rel)} is now held by {self._who(doc)}"
            raise LeaseHeldError(self.lost, fix="another job took over this event type and sink; this one stops")
        self.storage.write_atomic(self.rel, self._doc())

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_ms / 4000):
            try:
                self.check()
            except LeaseHeldError:
                return
            except Exception:  # noqa: BLE001 - a failed renewal is retried; the lease lasts ttl
                continue

    def acquire(self) -> "Lease":
        self._lock_checkpoint()
        try:
            self._take_sink_lease()
        except BaseException:
            self._unlock()
            raise
        self._thread = threading.Thread(target=self._renew_loop, name="event-etl-lease", daemon=True)
        self._thread.start()
        return self

    def _unlock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            doc = self._read()
            if doc and doc.get("holder") == self.holder:
                self.storage.delete(self.rel)
        finally:
            self._unlock()
