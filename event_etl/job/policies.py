"""Commit policies: what runs once an hour is complete (a Pub/Sub message, an OpenLineage run event), as Flink's
partition commit runs its ``PartitionCommitPolicy`` chain.

*When* an hour is complete is the marker's business (:mod:`event_etl.job.markers`); *what happens then* is the
type's ``[[commit_policy]]`` chain (``etl.toml``, :data:`event_etl.eventtypes.POLICY_KINDS`), run by one
:class:`PolicyChain` per job, on a thread of its own:

- **after the marker, never before**: the chain is fed by the controller's ``marker`` events, which come once the
  marker is written *and* the state that records it is saved; it reads the marker back from the sink (the
  contract: what a policy announces is the marker's bytes and their sha256), so nothing is announced that a
  consumer could not find;
- **off the batch path**: a batch only wakes the thread; a slow topic never delays the next batch;
- **at least once**: each policy's record in the checkpoint (``etl/policies/<name>.json``) says through which
  hour it is done, saved after each hour it finishes; every marked hour after it is pending (markers are written
  oldest first, so the pending hours are ``done_through + 1h .. marked_through``).  A restart, a kill or a stop
  cut short resumes from the record: an hour can be done twice, never skipped.  So each policy is idempotent
  (the same message or run event again, with the same identity);
- **in order**: hours oldest first; within an hour the policies in the order ``etl.toml`` lists them, a
  later one only once the earlier ones are done for that hour (a consumer told by the second may rely on the
  first);
- **failures never change an hour**: a policy's error is retried with a doubling backoff (1 s up to 5 min),
  counted (``event_etl_policy_failures_total``), written to its record (``event-etl status`` shows it) and
  logged; the hour, its files and its marker stay as they are, and the job goes on.

A policy first seen by a job that has marked hours already starts after them (its record is created at the
job's start with ``done_through`` = the last marked hour); a new job's policies do every hour.  A stop gives the
pending hours a short, bounded time (:data:`STOP_GRACE_S`); what is left waits for the next start.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from event_etl import faults
from event_etl.job.context import TypeContext
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import HOUR_MS, iso
from event_etl.util.retry import exponential_backoff

__all__ = ["CompleteHour", "Policy", "PolicyChain", "RECORD_FORMAT", "STOP_GRACE_S",
           "BACKOFF_FIRST_S", "BACKOFF_CAP_S", "pending_hours"]

log = logging.getLogger(__name__)

RECORD_FORMAT = 1
"""The format of a policy's record (``etl/policies/<name>.json``)."""
STOP_GRACE_S = 10.0
"""How long a stopping job lets its commit policies finish the pending hours (the rest waits for the next start)."""
BACKOFF_FIRST_S = 1.0
BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class CompleteHour:
    """A complete hour, as a policy is handed it: the marker's bytes as stored, and what they say."""

    event_type: str
    hour: int
    marker: bytes
    marker_uri: str
    folder_uri: str
    manifest: Manifest

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.marker).hexdigest()

    @property
    def attributes(self) -> dict[str, str]:
        """The attributes of a notification: who, which hour, how many records, where, and the marker's digest."""
        return {"event_type": self.event_type, "hour": iso(self.hour), "records": str(self.manifest.records),
                "late_records": str(self.manifest.late_records), "marker": self.marker_uri, "sha256": self.sha256}


class Policy(Protocol):
    """One commit policy: ``run`` does its work for a complete hour, idempotently, and raises if it could not."""

    name: str
    kind: str

    def run(self, hour: CompleteHour) -> None: ...

    def close(self) -> None: ...


def pending_hours(record: dict[str, Any], first_hour: int | None, marked_through: int | None) -> int:
    """How many marked hours a policy's record has not done."""
    if first_hour is None or marked_through is None:
        return 0
    done = record.get("done_through")
    start = first_hour if done is None else max(first_hour, int(done) + HOUR_MS)
    return max(0, (marked_through - start) // HOUR_MS + 1)


class PolicyChain:
    """Runs a job's commit policies for every hour it marks (see the module docstring).

    ``ctx`` is the job's :class:`~event_etl.job.context.TypeContext` (the type, the sink the markers are read back
    from, the checkpoint that keeps the records, the clock); ``marked()`` returns ``(first_hour, marked_through)`` of
    the job's *saved* state; ``listeners`` get ``("policy_done", (name, hour))`` and
    ``("policy_failed", (name, hour, error))`` (the metrics)."""

    def __init__(self, policies: list[Policy], ctx: TypeContext, *,
                 marked: Callable[[], tuple[int | None, int | None]],
                 listeners: list[Callable[[str, Any], None]] | None = None,
                 backoff_first: float | None = None, backoff_cap: float | None = None) -> None:
        self.policies = policies
        self.event_type = ctx.event_type.name
        self.storage = ctx.storage
        self.ckpt = ctx.checkpoint
        self.marked = marked
        self.clock = ctx.clock
        self.listeners = list(listeners or [])
        self.backoff_first = BACKOFF_FIRST_S if backoff_first is None else backoff_first
        self.backoff_cap = BACKOFF_CAP_S if backoff_cap is None else backoff_cap
        self._wake = threading.Event()
        self._stop_at: float | None = None
        self._thread: threading.Thread | None = None
        self._failing = False  # the last attempt failed (a stop then waits for nothing)
        self.records: dict[str, dict[str, Any]] = {}
        _, marked_through = marked()
        for p in policies:
            rec = self.ckpt.load_policy_record(p.name)
            if rec is None:  # first seen: the hours marked before it are not its business
                rec = {"format": RECORD_FORMAT, "policy": p.name, "kind": p.kind, "done_through": marked_through,
                       "failures": 0, "last_error": None, "last_error_at": None, "created_at": iso(self.clock())}
                self.ckpt.save_policy_record(p.name, rec)
            self.records[p.name] = rec

    # -- feeding and stopping ------------------------------------------------------------------
    def on_event(self, kind: str, _payload: Any) -> None:
        """Controller listener: a saved marker (or adopted ones) wakes the thread; nothing else is done here."""
        if kind in ("marker", "adopted"):
            self._wake.set()

    def start(self) -> PolicyChain:
        self._thread = threading.Thread(target=self._loop, name=f"event_etl-policies-{self.event_type}", daemon=True)
        self._thread.start()
        self._wake.set()  # what a killed run left pending
        return self

    def stop(self, grace: float = STOP_GRACE_S) -> dict[str, int]:
        """Let the pending hours run for at most ``grace`` seconds (none while a policy keeps failing), then stop.
        Returns the hours left, by policy."""
        if self._failing:  # a policy in a failure streak would not make it now: a fleet's stop must not wait on it
            grace = 0.0
        self._stop_at = time.monotonic() + grace
        self._wake.set()
        if self._thread is not None:
            self._thread.join(grace + 1.0)
        for p in self.policies:
            try:
                p.close()
            except Exception:  # closing a client must not hide how the job ended
                log.exception("event_etl: could not close commit policy %s", p.name)
        left = {name: n for name, n in self.pending().items() if n}
        if left:
            log.warning("[%s] commit policies stopped with hours pending (%s); the next start does them",
                        self.event_type, ", ".join(f"{k}: {v}" for k, v in left.items()))
        return left

    def pending(self) -> dict[str, int]:
        """Marked hours each policy has not done yet."""
        first, through = self.marked()
        return {p.name: pending_hours(self.records[p.name], first, through) for p in self.policies}

    def idle(self) -> bool:
        return not any(self.pending().values())

    # -- the thread ----------------------------------------------------------------------------
    def _stopping(self) -> bool:
        return self._stop_at is not None

    def _out_of_time(self) -> bool:
        return self._stop_at is not None and time.monotonic() >= self._stop_at

    def _next_hour(self) -> int | None:
        first, through = self.marked()
        if first is None or through is None:
            return None
        starts = []
        for p in self.policies:
            done = self.records[p.name].get("done_through")
            starts.append(first if done is None else max(first, int(done) + HOUR_MS))
        hour = min(starts, default=None)
        return hour if hour is not None and hour <= through else None

    def _loop(self) -> None:
        while not self._out_of_time():
            hour = self._next_hour()
            if hour is None:
                if self._stopping():
                    return
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            if not self._run_hour(hour):
                return

    def _run_hour(self, hour: int) -> bool:
        """Every policy that has not done ``hour`` yet, in order, each until it succeeds.  False: out of time."""
        complete: CompleteHour | None = None
        for p in self.policies:
            rec = self.records[p.name]
            done = rec.get("done_through")
            if done is not None and int(done) >= hour:
                continue
            attempt = 0
            while True:
                try:
                    if complete is None:
                        complete = self._read(hour)
                    faults.point("before_policy", f"{p.name} {hour}")
                    p.run(complete)
                    finished = {**rec, "done_through": hour, "done_at": iso(self.clock())}
                    self.ckpt.save_policy_record(p.name, finished)  # not saved: run again (at least once)
                    rec.update(finished)
                    self._failing = False
                    break
                except Exception as err:  # noqa: BLE001 - any failure is retried; the hour stays as it is
                    attempt += 1
                    self._failing = True
                    self._failed(p, hour, err, attempt)
                    wait = exponential_backoff(attempt, first=self.backoff_first, cap=self.backoff_cap)
                    if self._stop_at is not None:
                        wait = min(wait, self._stop_at - time.monotonic())
                    if wait <= 0 or self._sleep(wait):
                        return False
            faults.point("policy_done", f"{p.name} {hour}")
            self._emit("policy_done", (p.name, hour))
        return True

    def _sleep(self, seconds: float) -> bool:
        """Wait out a backoff; True if the stop's time ran out meanwhile."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._out_of_time():
                return True
            time.sleep(min(left, 0.2))
        return self._out_of_time()

    def _read(self, hour: int) -> CompleteHour:
        """The hour's marker as stored (a marked hour has one; its absence is an error, retried and reported)."""
        folder = hour_dir(self.event_type, hour)
        rel = f"{folder}/{MARKER_NAME}"
        try:
            data = self.storage.read(rel)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{self.storage.display(rel)} is missing although the job marked the hour: "
                                    "restore it (or the hour) to let the commit policies go on") from err
        return CompleteHour(self.event_type, hour, data, self.storage.display(rel), self.storage.display(folder),
                            Manifest.from_bytes(data))

    def _failed(self, p: Policy, hour: int, err: Exception, attempt: int) -> None:
        rec = self.records[p.name]
        text = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        rec.update(failures=int(rec.get("failures", 0)) + 1, last_error=f"{iso(hour)}: {text}",
                   last_error_at=iso(self.clock()))
        try:
            self.ckpt.save_policy_record(p.name, rec)
        except OSError:
            log.exception("event_etl: could not record the failure of commit policy %s", p.name)
        if attempt in (1, 10) or attempt % 100 == 0:
            log.warning("[%s] commit policy %s failed for hour %s (attempt %d, retried): %s", self.event_type,
                        p.name, iso(hour), attempt, text)
        self._emit("policy_failed", (p.name, hour, err))

    def _emit(self, kind: str, payload: Any) -> None:
        for fn in self.listeners:
            try:
                fn(kind, payload)
            except Exception:  # a listener (metrics) never stops the chain
                log.exception("event_etl: a listener failed on %s", kind)
