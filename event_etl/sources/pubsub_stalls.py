"""Why a Pub/Sub fetcher cannot pull right now, since when, how long to wait, and when to give up.

Two things hold pulling up without being the subscription's quiet: an **outage** (the service
does not answer: transient errors, a pull that ran out while the service is unreachable) and a
**full disk** (the spool's disk has no room for a pull, which was handed back).  Either one is
waited out with a backoff by its age (:func:`waited_since`: the tries come about 0.5, 1, 2, 4
and 8 s into it, then every 10 s, however many streams try meanwhile) and ends the job once it
has lasted ``outage_timeout`` seconds.  Meanwhile the fetcher is *down* (:meth:`Stalls.down`):
the watermark does not follow the clock and the idle rule marks no hour.

:class:`Stalls` is the bookkeeping only, on the monotonic clock the caller passes in; the
fetcher (:class:`event_etl.sources.pubsub_fetch.Fetcher`) logs, sleeps and fails the job.
"""

from __future__ import annotations

__all__ = ["Stalls", "waited_since", "WAIT_FIRST", "WAIT_CAP"]

WAIT_FIRST, WAIT_CAP = 0.5, 10.0
"""Seconds: the shortest and the longest wait before a stream tries again in an outage or on a full disk."""


def waited_since(since: float, now: float) -> float:
    """How long to wait before trying again when trying has failed since ``since`` (monotonic): as long as it has
    failed so far, at least :data:`WAIT_FIRST` and at most :data:`WAIT_CAP`.  Each wait doubles the failure's age,
    so the tries come about 0.5, 1, 2, 4 and 8 s into it, then every 10 s: a backoff by the time the outage (or the
    full disk) has lasted, the same however many streams try meanwhile."""
    return min(WAIT_CAP, max(WAIT_FIRST, now - since))


class Stalls:
    """The outage and the full disk of one fetcher (see the module docstring); times are monotonic seconds."""

    def __init__(self, outage_timeout: float) -> None:
        self.outage_timeout = outage_timeout
        self.outage_since: float | None = None  # the service has not answered since then
        self.disk_full_since: float | None = None  # the spool's disk has had no room for a pull since then
        self.disk_error: str | None = None  # what the full disk answered

    def outage(self, now: float) -> float | None:
        """The service did not answer at ``now``: the wait before the next try, or None once the outage has lasted
        longer than ``outage_timeout`` (the job stops)."""
        if self.outage_since is None:
            self.outage_since = now
        if now - self.outage_since > self.outage_timeout:
            return None
        return waited_since(self.outage_since, now)

    def answered(self) -> None:
        """The service answered: no outage (any stream's pull that succeeds ends it)."""
        self.outage_since = None

    def disk_full(self, now: float, error: str) -> tuple[bool, bool]:
        """The spool's disk had no room at ``now`` (``error``: what it answered): ``(whether this begins a full
        disk, whether it has lasted longer than outage_timeout)``."""
        first = self.disk_full_since is None
        if self.disk_full_since is None:
            self.disk_full_since = now
        self.disk_error = error
        return first, now - self.disk_full_since > self.outage_timeout

    def room_again(self) -> bool:
        """An append or a close found room on the spool's disk; whether the disk was full until then."""
        was_full = self.disk_full_since is not None
        self.disk_full_since, self.disk_error = None, None
        return was_full

    def disk_full_wait(self, now: float) -> float:
        """How long a stream waits before it tries a pull again on a full disk (:func:`waited_since`)."""
        since = self.disk_full_since
        return waited_since(since, now) if since is not None else WAIT_FIRST

    def down(self, now: float) -> str | None:
        """Why pulling is held up at ``now``, for people (None: it is not): a full disk first, then an outage."""
        if self.disk_full_since is not None:
            return (f"the spool's disk is full ({self.disk_error}) for {now - self.disk_full_since:.0f}s: "
                    "pulling waits for room")
        if self.outage_since is not None:
            return f"Pub/Sub unreachable for {now - self.outage_since:.0f}s: retrying"
        return None
