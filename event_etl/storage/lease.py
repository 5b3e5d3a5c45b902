"""One writer per event type and sink, and per checkpoint.

Two locks, both taken before Spark starts:

- **The checkpoint lock**: an exclusive ``flock`` on ``<checkpoint>/etl/LOCK``.  The
  kernel releases it when the holder dies, however it dies, so a crashed job never
  blocks its restart.  The holder's description is written into the file.
- **The sink lease**: ``<sink>/<event_type>/_LEASE``, a small JSON object naming the
  holder (a random id, host, pid, checkpoint, when it started) and until when the lease
  is valid.  Every change of it is a compare-and-swap on the version that was read
  (:meth:`~event_etl.storage.Storage.write_if`: a generation match on GCS, a lock file on
  local disk), so two jobs can never both believe they took it.  The holder renews it
  every ``ttl / 4`` (the process's one scheduler, :mod:`event_etl.util.timers`, renews each
  type's lease a period after its last renewal began), and says so when a renewal comes
  late (:meth:`Lease.late_line`, through ``say``).  Another job takes it over only when it
  has expired (not renewed for ``ttl``, default 60 s, plus a safety ``margin`` for clocks that disagree),
  or when it was left by a job with the *same checkpoint on the same host*: holding the checkpoint lock
  proves that job is gone.  A job with the same checkpoint path on another host (a shared
  mount) is another job.

**Fencing.**  A job writes only while it is sure to hold the lease: until the expiry its
last successful renewal wrote, minus the ``margin``.  Another job can take over only after
that expiry plus the margin, so their writes never overlap.  The driver checks it (no I/O:
:meth:`Lease.guard`) before every batch, every marker, idle tick and drain; executor tasks
check it before every file they write (:class:`Fence`).  On local disk a task reads the lease
before every file (a read of a few hundred bytes); on an object store it trusts its last read
until that lease's expiry minus the margin.  A job that cannot renew (the sink is unreachable)
stops writing when its lease runs out, and stops.

A restart on the same host takes over its dead predecessor's lease at once, but tasks of the
dead job (executors on a cluster, Python workers orphaned when only the driver died) may still
trust that lease until its expiry.  On local disk they read it again before their next file
and stop; on an object store the new job waits until that expiry before it replays the batch
those tasks were writing (:meth:`Lease.wait_for_old_tasks`), so that no file it replays can be
written over by them.

Behind the lease, two more guards: file names carry the checkpoint's writer id, so two
jobs can never write the same file name, and a job never adds a file to an hour that is
already marked, nor marks an hour whose files it did not write.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from event_etl import faults
from event_etl.errors import LeaseHeldError, StorageError
from event_etl.storage import Storage
from event_etl.timeutil import format_duration, iso
from event_etl.util.timers import Timer, shared_timers

__all__ = ["Lease", "Fence", "DEFAULT_TTL_MS", "default_ttl_ms", "LEASE_NAME", "LATE_LINE_EVERY_MS"]

DEFAULT_TTL_MS = 60_000
LEASE_NAME = "_LEASE"
LATE_LINE_EVERY_MS = 600_000
"""At most one line a type in this long about its late renewals (the next one counts those it did not print)."""

log = logging.getLogger(__name__)


def default_ttl_ms() -> int:
    """``$EVENT_ETL_LEASE_TTL`` (a duration such as ``"60s"``), else 60 s."""
    from event_etl.settings import current_settings
    from event_etl.timeutil import parse_duration

    text = current_settings().lease_ttl
    return parse_duration(text) if text else DEFAULT_TTL_MS


def _seconds(ms: int | float) -> str:
    return f"{ms / 1000:.1f}s"


def _who(doc: dict[str, Any]) -> str:
    return (f"pid {doc.get('pid')} on {doc.get('host')} (checkpoint {doc.get('checkpoint')}, "
            f"running since {doc.get('started_at')})")


def _parse(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class Lease:
    """The locks of one running job.  ``acquire`` before Spark starts, ``release`` at the end."""

    storage: Storage
    event_type: str
    checkpoint_dir: Path
    clock: Callable[[], int]
    ttl_ms: int = DEFAULT_TTL_MS
    margin_ms: int | None = None
    # where its lines for people go (a late renewal's, :meth:`late_line`): the job passes its echo (on stderr); a
    # caller that gives none has them logged as warnings (Python's last resort prints those on stderr)
    say: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self.holder = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.rel = f"{self.event_type}/{LEASE_NAME}"
        if self.margin_ms is None:
            self.margin_ms = self.ttl_ms // 4
        self._lock_fh: TextIO | None = None
        self._stop = threading.Event()  # set: no more renewals
        self._timer: Timer | None = None  # its turn in the process's schedule (event_etl.util.timers)
        self.lost: str | None = None
        self.started_at = self.clock()
        self.valid_until = 0  # the last instant this job may write (its last renewal's expiry minus the margin)
        self.renewed_at = 0  # when its last successful renewal (or its taking) began, by ``clock``
        self.old_tasks_until = 0  # a dead predecessor's tasks may trust its lease until then (see the docstring)
        # more for people, written with every renewal (the Pub/Sub source: how far back a seek must go, which a
        # lost checkpoint can no longer tell); a failure leaves them out, never the renewal
        self.extra: Callable[[], dict[str, Any]] | None = None
        self._failed = 0  # renewals failed (the sink unreachable) since the last that succeeded
        self._late_said_at: int | None = None  # when the last line about a late renewal was printed
        self._late_unsaid = 0  # late renewals since then, not printed

    @property
    def _margin(self) -> int:
        """``margin_ms`` as ``__post_init__`` resolved it (the given margin, else a quarter of the TTL)."""
        assert self.margin_ms is not None  # __post_init__ resolved it
        return self.margin_ms

    def describe(self) -> dict[str, Any]:
        return {"holder": self.holder, "host": self.host, "pid": os.getpid(),
                "checkpoint": str(self.checkpoint_dir), "started_at": iso(self.started_at)}

    # -- checkpoint lock -------------------------------------------------------------------
    def _lock_checkpoint(self) -> None:
        path = Path(self.checkpoint_dir) / "etl" / "LOCK"
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held (with its lock) while the job runs
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            doc = _parse(fh.read().encode())
            fh.close()
            raise LeaseHeldError(
                f"checkpoint {self.checkpoint_dir} is in use by another job: {_who(doc)}",
                fix="stop that job first (SIGTERM; `event-etl drain TYPE` to mark its open hours too), or give "
                    "this run its own --checkpoint",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(self.describe()))
        fh.flush()
        self._lock_fh = fh

    # -- sink lease ------------------------------------------------------------------------
    def _doc(self, now: int) -> bytes:
        extra: dict[str, Any] = {}
        if self.extra is not None:
            try:
                extra = dict(self.extra())
            except Exception:  # noqa: BLE001 - only for people: the lease is renewed all the same
                extra = {}
        return json.dumps({**extra, **self.describe(), "renewed_at": iso(now), "expires_at_ms": now + self.ttl_ms,
                           "expires_at": iso(now + self.ttl_ms)}, indent=1).encode()

    def _takeable(self, doc: dict[str, Any], now: int) -> bool:
        if not doc or doc.get("holder") == self.holder:
            return True
        if int(doc.get("expires_at_ms", 0)) + self._margin < now:
            return True  # expired: its holder died or is cut off, and stopped writing a margin ago
        # We hold this checkpoint's lock, so a lease left by a job on this same checkpoint *on this
        # host* is a dead job's (the kernel released its lock): a restart after a crash takes over at
        # once.  A lease of release 0.1.0 names no host: it was written on a host that shares this path.
        same_host = doc.get("host", self.host) == self.host
        return doc.get("checkpoint") == str(self.checkpoint_dir) and same_host

    def _take_sink_lease(self) -> None:
        for _ in range(5):
            now = self.clock()
            current = self.storage.read_versioned(self.rel)
            doc = _parse(current[0]) if current is not None else {}
            if current is not None and not self._takeable(doc, now):
                expires = int(doc.get("expires_at_ms", 0))
                when = (f"its lease is valid for {format_duration(expires - now)} more" if expires > now else
                        f"its lease ran out {format_duration(now - expires)} ago and may be taken over in "
                        f"{format_duration(expires + self._margin - now)} (a margin for clocks that disagree)")
                raise LeaseHeldError(
                    f"{self.storage.display(self.rel)}: {self.event_type} is already being written to this sink by "
                    f"{_who(doc)}; {when}",
                    fix="stop that job first (SIGTERM; `event-etl drain TYPE` to mark its open hours too); a job "
                        f"that died loses its lease after {format_duration(self.ttl_ms + self._margin)}",
                )
            if self.storage.write_if(self.rel, self._doc(now), None if current is None else current[1]):
                self.valid_until = now + self.ttl_ms - self._margin
                self.renewed_at = now
                expires = int(doc.get("expires_at_ms", 0))
                if doc.get("holder") not in (None, self.holder) and expires > now:  # a dead job's, taken over early
                    self.old_tasks_until = expires
                return
        raise LeaseHeldError(f"{self.storage.display(self.rel)} keeps changing: another job is taking it",
                             fix="run only one job per event type and sink")

    def renew(self) -> None:
        """Renew the sink lease if this job still holds it; raise if another job took it."""
        if self.lost:
            raise LeaseHeldError(self.lost, fix="another job took over this event type and sink; this one stops")
        now = self.clock()
        current = self.storage.read_versioned(self.rel)
        doc = _parse(current[0]) if current is not None else {}
        if current is None or doc.get("holder") != self.holder:
            self.lost = (f"the lease {self.storage.display(self.rel)} is now held by {_who(doc)}" if doc
                         else f"the lease {self.storage.display(self.rel)} was removed")
            raise LeaseHeldError(self.lost, fix="another job took over this event type and sink; this one stops")
        faults.point("lease_renew", f"{self.event_type} {self.holder}")  # read and still ours, not yet written again
        if self.storage.write_if(self.rel, self._doc(now), current[1]):
            self.valid_until = now + self.ttl_ms - self._margin
            self.renewed_at = now
            return
        self.renew()  # changed between read and write: read again (and find out who took it)

    check = renew  # the name release 0.1.0 used

    def guard(self) -> None:
        """Raise unless this job may still write (no I/O: the renewals keep the lease fresh)."""
        if self.lost:
            raise LeaseHeldError(self.lost, fix="another job took over this event type and sink; this one stops")
        now = self.clock()
        if now >= self.valid_until:
            raise LeaseHeldError(
                f"the lease {self.storage.display(self.rel)} could not be renewed in time (valid until "
                f"{iso(self.valid_until + self._margin)}); this job stops writing before another may take over",
                fix="check that the sink is reachable; a restart on the same checkpoint loses nothing",
            )

    def fence(self) -> dict[str, Any]:
        """What executor tasks check before they write (see :class:`Fence`)."""
        return {"rel": self.rel, "holder": self.holder, "margin_ms": self.margin_ms}

    @property
    def period_ms(self) -> int:
        """How often the lease is renewed: a quarter of its TTL."""
        return self.ttl_ms // 4

    def _renew_turn(self) -> bool:
        """One renewal, in its turn of the process's schedule; False ends the renewals (stopped, or lost).  A late one
        is said (:meth:`late_line`)."""
        if self._stop.is_set():
            return False
        last = self.renewed_at
        began = self.clock()
        try:
            self.renew()
        except LeaseHeldError:
            return False
        except (StorageError, OSError):  # a failed renewal is retried at the next turn; the lease lasts ttl
            self._failed += 1
            return not self._stop.is_set()
        line = self.late_line(began - last, self.clock() - began)
        self._failed = 0
        if line is not None:
            try:
                if self.say is not None:
                    self.say(line)
                else:
                    log.warning("%s", line)
            except Exception:  # noqa: BLE001 - only for people: the renewals go on all the same
                pass
        return not self._stop.is_set()

    def late_line(self, age_ms: int, took_ms: int) -> str | None:
        """The line for a renewal that began ``age_ms`` after the last successful one (due a period after it) and took
        ``took_ms``, if it came more than half the margin late; ``None`` if it was on time, or if a line was printed
        less than :data:`LATE_LINE_EVERY_MS` ago (counted into the next: one line a type, not one a renewal).

        A lease ages by a period between renewals when the renewals keep their time, and is lost (the type stops
        writing) when it ages past its TTL less the margin: a renewal late by half the margin is a warning well
        before that (at the default margin, a quarter of the TTL: at 1.5 periods of age, lost at 3)."""
        late = age_ms - self.period_ms
        if late <= self._margin / 2:
            return None
        now = self.clock()
        if self._late_said_at is not None and now - self._late_said_at < LATE_LINE_EVERY_MS:
            self._late_unsaid += 1
            return None
        from event_etl.settings import ENV_LEASE_TTL

        unsaid = (f" ({self._late_unsaid} more late renewal{'s' if self._late_unsaid != 1 else ''} of it in the "
                  f"{format_duration(now - self._late_said_at)} since the last such line)"
                  if self._late_said_at is not None and self._late_unsaid else "")
        cause = (f"{self._failed} renewal{'s' if self._failed != 1 else ''} failed in between (is the sink reachable?)"
                 if self._failed else "the sink answers slowly, or this process's renewals of its types wait on each "
                 "other")
        self._late_said_at, self._late_unsaid = now, 0
        return (f"[{self.event_type}] warning: its lease {self.storage.display(self.rel)} was renewed {_seconds(late)} "
                f"late: {_seconds(age_ms)} after its last renewal, where one is due every "
                f"{format_duration(self.period_ms)} (this one took {_seconds(took_ms)}){unsaid}; past "
                f"{format_duration(self.ttl_ms - self._margin)} the lease is lost and the type stops writing. "
                f"{cause[0].upper()}{cause[1:]}: a faster sink, or a longer lease ({ENV_LEASE_TTL}, now "
                f"{format_duration(self.ttl_ms)}; renewed every quarter of it), leaves more room")

    def stop_renewing(self, timeout: float = 5.0) -> None:
        """No more renewals (a renewal under way ends first, within ``timeout``); the lease stays as it is."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(timeout)

    def acquire(self) -> Lease:
        self._lock_checkpoint()
        try:
            self._take_sink_lease()
        except BaseException:
            self._unlock()
            raise
        self._sweep_lease_temporaries()
        # renewed every ttl / 4 by the process's one scheduler (a thousand types: no thread each), each lease's
        # first renewal at its own point of the period, so that a fleet's renewals do not all come at once
        self._timer = shared_timers().every(self.period_ms / 1000, self._renew_turn, name=f"lease {self.rel}")
        return self

    def _sweep_lease_temporaries(self) -> None:
        """Remove what earlier holders' killed renewals left next to the lease (``._LEASE.<id>.tmp``: a write is a
        temporary file, then a rename).  The job start's sweep of the sink keeps the lease's folder itself (a running
        job's renewals write there); this runs once the lease is this job's, before its own renewals start.  Only
        local disk has such files (an object store writes each object in one request)."""
        if not self.storage.local:
            return
        from event_etl.storage.atomic import fsync_dir
        from event_etl.storage.temporaries import is_temporary

        folder = os.path.dirname(self.storage.path(self.rel))
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return
        gone = []
        for name in names:
            if is_temporary(name) and name.startswith(f".{LEASE_NAME}."):
                try:
                    os.unlink(os.path.join(folder, name))
                    gone.append(name)
                except FileNotFoundError:
                    continue
        if gone:
            fsync_dir(folder)

    def _unlock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    def wait_for_old_tasks(self, say: Callable[[str], None] | None = None,
                           sleep: Callable[[float], None] | None = None) -> float:
        """On an object store, after taking over a dead job's lease before it ran out: wait until it has, so that
        no task of that job can still write a file of the batch this job is about to replay.  Returns the seconds
        waited (0 on local disk, where tasks read the lease before every file)."""
        import time

        wait_ms = self.old_tasks_until - self.clock()
        if self.storage.local or wait_ms <= 0:
            return 0.0
        if say is not None:
            say(f"[{self.event_type}] waiting {format_duration(wait_ms)} for the tasks of the job that held this type "
                "before (it died) to stop writing: its lease runs out then")
        (sleep or time.sleep)(wait_ms / 1000)
        return wait_ms / 1000

    def fence_off(self, reason: str) -> None:
        """From now on this job writes nothing more: :meth:`guard` refuses (a step still running meets it at its next
        write).  The lease and the lock stay held until :meth:`release` or :meth:`abandon`."""
        self.lost = self.lost or reason

    def abandon(self) -> None:
        """Stop renewing, but keep the lease and the checkpoint lock: the process is about to end with a step still
        running, and the kernel releases the lock with it (a restart on this host then takes the lease over)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()

    def release(self) -> None:
        self.stop_renewing()
        try:
            current = self.storage.read_versioned(self.rel)
            if current is not None and _parse(current[0]).get("holder") == self.holder:
                self.storage.delete(self.rel)
        finally:
            self._unlock()


_FENCES: dict[tuple[str, str, str], Fence] = {}


class Fence:
    """An executor's check that the job it writes for still holds its lease.

    It reads the lease (one GET) and trusts it until the expiry written there minus the
    margin; then it reads it again.  So a task writes nothing after its job lost the lease,
    and nothing in the margin before another job may take it over.
    """

    def __init__(self, spec: dict[str, Any], storage: Storage, clock: Callable[[], int] | None = None) -> None:
        from event_etl.timeutil import now_millis

        self.rel, self.holder, self.margin_ms = spec["rel"], spec["holder"], int(spec["margin_ms"])
        self.storage = storage
        self.clock = clock or now_millis
        self.valid_until = 0

    @classmethod
    def of(cls, spec: dict[str, Any] | None, storage: Storage) -> Fence | None:
        """The fence of a batch's ``spec`` (``None``: no lease, as in tests), one per process and lease holder."""
        if not spec:
            return None
        key = (storage.url, spec["rel"], spec["holder"])
        fence = _FENCES.get(key)
        if fence is None:
            fence = _FENCES[key] = cls(spec, storage)
        return fence

    def check(self) -> None:
        now = self.clock()
        if now < self.valid_until and not self.storage.local:  # local disk: read before every file, it costs little
            return
        try:
            doc = _parse(self.storage.read(self.rel))
        except FileNotFoundError:
            doc = {}
        if doc.get("holder") != self.holder:
            raise LeaseHeldError(
                f"this job no longer holds {self.storage.display(self.rel)}"
                + (f": {_who(doc)} does" if doc else ""),
                fix="another job took over this event type and sink; this one stops",
            )
        self.valid_until = int(doc.get("expires_at_ms", 0)) - self.margin_ms
        if now >= self.valid_until:
            raise LeaseHeldError(
                f"the lease {self.storage.display(self.rel)} runs out at {doc.get('expires_at')}: this task may "
                "not write any more",
                fix="the job could not renew its lease (is the sink reachable?); a restart loses nothing",
            )
