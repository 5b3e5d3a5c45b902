"""The spool sweep (issue 47): the spool as a write-ahead log, broken at every step of its path, then restarted.

From a pull's acknowledgement until its batch commits, the spool is the only copy of its messages.
:mod:`tests.sweeps.spool_campaign` kills the fetcher before every call of that path with injected errors; this sweep
adds what the issue asks of a write-ahead log, on a *real* small disk where the disk can do it itself:

- **a full disk at every spool step, then space coming back.**  Every run's checkpoint is a tmpfs of 2 MiB
  (:mod:`tests.lib.disks`).  ``full``: the tmpfs is filled just before the call (its inodes too before a file is
  created), kept full until the fetcher reports it, then emptied; ``short``: filled but for one page, so that a
  frame's write is short, then ``ENOSPC``; ``full-lasting``: kept full past ``outage_timeout``, so that the job
  stops with the error (whose file cannot be written either), then space comes back and the job is restarted.
  What a tmpfs never does is injected: ``enospc`` (a short write then ``ENOSPC``, or ``ENOSPC`` on a sync or a
  rename, as ext4 and NFS can), ``eio`` (on a write, a sync, a rename, the run record), ``eio+errfile`` (a sync
  fails and so does the error file the job stops with), ``enospc+broken`` (a short write whose truncation back
  fails too: the segment is broken, its tail torn).
- **torn tails through the power-loss model.**  ``cut``: the power goes before the call
  (:class:`tests.lib.power_loss.Disk`, extended by :class:`SpoolDisk`: a rename not synced gives the file its old
  name back, a file created and not synced in its folder goes, and bytes written after a file's last
  ``fdatasync`` are *lost*, *zeros* (the size kept, the data not) or *half* kept; ``cut-mid``: half of a write
  reached the disk).
- **a second writer on the same segment** (:func:`run_second_writer`): a fetch partition (``fetch_partition``,
  attempt 0) is held at each call of its spool path while the driver goes on planning batches; then attempt 1 of
  the same task starts (Spark retries it, the first still running), which fences the open segment; then attempt
  0 goes on.
- **kills before and after each acknowledgement** (``kill``, ``kill-after``), a lost, failed or late answer to it
  (``ack-lost``, ``ack-fails``, ``ack-late``), and a kill before every other call (``kill``): every later call
  of the dead process's threads raises :class:`~tests.sweeps.crash_sweep.Killed`, so no ``finally`` of a dead process
  touches the disk or the service; a restart is a new :class:`~event_etl.sources.pubsub_fetch.Fetcher` and
  :class:`~event_etl.sources.pubsub.PubSubPlanner` on the same spool.
- **a stop with a stream dead between pull and acknowledgement**: ``dies`` (the stream's thread raises at a
  fault point between its pull and its acknowledgement, the job stops with the error and is started again) and
  ``hang`` (the stream is stuck in that call when the job is stopped: the stop gives up waiting, the process
  exits, the job is started again).
- **damage that is no torn tail**: ``rot`` (killed, and a bit of the first of two synced frames of the open
  segment flipped): the restart must refuse with :class:`~event_etl.sources.spool.SpoolDamaged` naming the
  segment; then the runbook (the segment moved aside, the subscription sought back to the oldest publish time
  the spool held) and a restart that loses nothing.

The fetcher pulls 120 messages of ~450 bytes from a fake of the real service
(:class:`tests.test_spool_wal.CappedService`: 20 a pull, leases of 1 s, ``DeadlineExceeded`` on an empty pull);
the consumer is the planner and the batches: ``latest_offset``, ``splits``, the messages read from the segments,
the batch saved, ``fetcher.ack(names)`` (what it answers says whether the batch's message keys wait for a
redelivery), Spark's commit (kept in memory: Spark's own logs are taken as durable) and ``commit``; a restart
commits the last committed batch's end again when no batch waits for its replay, as the shared engine does
(``Lane.open`` in ``event_etl/job/engine.py``), so that segments a power cut brought back after their batch
committed are deleted.  In the
real-full-disk windows the planner's log is on another disk: what a full checkpoint does to Spark's own logs is
not this sweep's.

A fault is addressed by its *window*, the function of event_etl that makes the call and the call
(``_spool_pull > append > _append: fdatasync segments/*.open``), and by the occurrence of that window in a clean
run, so that the timing of empty pulls does not shift it.  After every run, by message id
(:meth:`Outcome.ok`): ``lost`` (acknowledged to the service, never consumed), ``unexpected redeliveries`` (a
message consumed again after a batch that ``ack()`` reported all acknowledged), ``failed restarts`` (a start
after a fault that raised, but ``SpoolDamaged`` naming the segment for rot), ``premature`` (at a look where the
fetcher reported neither down nor settling and a backlog of 0, acknowledged messages not consumed: an hour could
have been marked before its events were read), ``missing`` (published, never consumed in the run's time).
``duplicated`` counts the redeliveries the dedupe was told to expect.  A run ends only once everything published
was consumed, the fetcher no longer settles and the service has nothing left to deliver (what was not
acknowledged came again).  Counted apart, not failures of the contract: ``torn looks`` (:data:`ROLL_RACE`,
:data:`LISTING_RACE`: a look that saw no backlog only while a segment was rolled or renamed),
``stuck backlog`` (:data:`STUCK_BACKLOG`: a backlog reported at the end that the spool does not hold), ``stop
hung`` (:data:`STOP_LOCK`).  The sweep found those four and :data:`EXECUTOR_BACKLOG`, all fixed since; each has a
test in ``tests/test_spool_sweep.py``, whose sample also checks that none of them comes back.

``.venv/bin/python -m tests.sweeps.spool_sweep`` runs every window at every occurrence and prints a table per window
(401 runs, ~8 minutes on 2 cores: a script, never in the suite); ``--sample`` runs what
``tests/test_spool_sweep.py`` runs (30 runs, ~30 s); ``--only FAULT`` one kind of fault; ``--repro
'FAULT@OCCURRENCE@WINDOW'`` one case, with its details.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import errno
import io
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.api_core import exceptions as gex

from event_etl import faults
from event_etl.errors import SourceError
from event_etl.sources import live, pubsub_run
from event_etl.sources.pubsub import PubSubPlanner
from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from event_etl.sources.pubsub_partitions import STOP, ExecutorFetcher, FetchJob, PartitionFetcher, fetch_partition
from event_etl.sources.pubsub_stream import PullStream
from event_etl.sources.spool.segment import _HEAD, MAGIC, SpoolDamaged, _parse, _scan, oldest_publish_ms, read_messages
from event_etl.storage.atomic import makedirs_durable
from tests.lib.disks import fill, free_bytes, small_disk
from tests.lib.harness import t
from tests.lib.power_loss import Change, Disk, PowerCut
from tests.lib.pubsub_service import CappedService
from tests.sweeps.crash_sweep import EVENT_ETL_DIR, Killed

__all__ = ["Case", "Outcome", "SpoolDisk", "Tap", "run_case", "run_second_writer", "clean_windows", "cases",
           "sample", "sweep", "table", "main"]

SUB = "projects/sweep/subscriptions/spool"
RUN = "5ee95ee9"  # the fetch partitions' run
MESSAGES = 120
PULL = 20  # messages a pull
PAYLOAD = 450  # bytes: a pull's frame (~9.8 KB) does not fit in one free page plus a segment's last one
LEASE = 1  # seconds: the subscription's ack deadline (a killed run's restart settles for it)
DISK_BYTES = 2 << 20
DISK_INODES = 256
RUN_SECONDS = 20.0  # a run's time after its last fault or restart, to consume everything published
SETTINGS = dict(streams=1, segment_messages=60, segment_age=0.3, ack_deadline=60, outage_timeout=3.0,
                pull_timeout=0.1, once_quiet=0.5)
LASTING_OUTAGE = 1.0  # ``full-lasting``: the job stops once the disk has been full this long
HOLD_BEFORE_STOP = 0.3  # ``hang``: batches go on this long with the stream stuck, then the job is stopped
STOP_WAIT = 0.3  # ... and its stop waits this long for the stuck stream
PAUSE_BEFORE_RETRY = 0.3  # second writer: attempt 0 held this long before attempt 1 starts

FAULTS = ("kill", "kill-after", "cut", "cut-lost", "cut-zeros", "cut-half", "cut-mid", "full", "short",
          "full-lasting", "enospc", "enospc+broken", "eio", "eio+errfile", "ack-fails", "ack-lost", "ack-late",
          "dies", "hang", "rot", "fence")
REAL_DISK = ("full", "short", "full-lasting")
"""Faults the real (tmpfs) disk makes itself; the others are injected or modelled."""
BY_KIND: dict[str, tuple[str, ...]] = {
    "pull": ("kill", "kill-after", "hang"),
    "acknowledge": ("kill", "kill-after", "ack-fails", "ack-lost", "ack-late", "hang"),
    "get_subscription": ("kill",),
    "point:pulled": ("dies", "rot"),
    "point:spooled": ("dies", "hang"),
    "point:spool_acked": ("dies",),
    "stat": ("dies", "hang"),
    "open": ("kill", "cut", "full", "enospc", "eio"),
    "write": ("kill", "cut-mid", "full", "short", "full-lasting", "enospc", "enospc+broken", "eio"),
    "fdatasync": ("kill", "cut-lost", "cut-zeros", "cut-half", "full", "enospc", "eio", "eio+errfile", "hang"),
    "fsync": ("kill", "cut", "full", "enospc", "eio"),
    "replace": ("kill", "cut", "full", "enospc", "eio"),
    "unlink": ("kill", "cut"),
}
"""The faults swept at each kind of call of the driver's fetcher."""
EXECUTOR_BACKLOG = ("ExecutorFetcher.held_totals counted the messages of closed segments only: with fetch partitions "
                    "and spooled acknowledgements, the messages a partition had acknowledged into its open segment "
                    "were no backlog to the driver, whose activity() said quiet (backlog 0, not down, not settling) "
                    "while they were unread.  Found by the second-writer windows ('premature' wherever attempt 0 was "
                    "held with an acknowledged frame in its open segment); it now counts open and fenced segments.")
"""A bug found by this sweep (fixed in event_etl meanwhile; tests/test_spool_sweep.py keeps it fixed)."""
LISTING_RACE = ("ExecutorFetcher.held_totals (as fixed for EXECUTOR_BACKLOG) lists the spool three times: *.seg, then "
                "*.open, then *.fenced; a segment renamed between two of them (a partition's close: .open -> .seg; "
                "a retried attempt's finish: .open -> .fenced -> .seg) is missed, or counted twice: a look during a "
                "close can see a backlog of 0 with its acknowledged messages unread.  The sweep counts such looks "
                "apart (torn looks: the look taken again at once sees the backlog).  Fixed: one listing, each segment "
                "counted once by its run, stream and number whatever its name, looked at again if it moved on.")
"""A bug found by this sweep in the fix of EXECUTOR_BACKLOG (fixed meanwhile; tests/test_spool_sweep.py keeps it
fixed)."""
STOP_LOCK = ("Fetcher.stop(timeout) took the fetcher's lock to wake the waiting streams before it waited for its "
             "threads, and a stream stuck in a segment's close holds it (_roll runs close(): the rename and the "
             "folder sync, under the lock): a stop while the spool's disk hangs in a close did not return until the "
             "close did.  Fixed: the stop waits for the lock at most its timeout.")
"""A bug found by this sweep (fixed meanwhile; tests/test_spool_sweep.py keeps it fixed)."""
STUCK_BACKLOG = ("Fetcher._count_leftovers counts the segments of earlier runs once, at the start (again only while "
                 "the spool is over its bound), and only ack() of such a segment takes it off: a segment a batch had "
                 "read and Spark had committed, left in the spool by a kill before the source's commit deleted it or "
                 "brought back by a power cut that undid that delete, is never offered again, so never acknowledged: "
                 "once commit() deletes it, the fetcher still reports its messages as backlog for the whole run, and "
                 "the idle rule (rules/watermark.py quiet_since: backlog > 0 is never quiet) marks no hour of a quiet "
                 "subscription until the job is restarted.  The sweep's 'stuck backlog' (power cuts in the stop, after "
                 "the batches' deletes).  Fixed: while it counts any, activity() counts them again.")
"""A bug found by this sweep (fixed meanwhile; tests/test_spool_sweep.py keeps it fixed)."""
ROLL_RACE = ("Fetcher._roll took a stream's open segment (s.open = None) before it closed it and held its name; "
             "Fetcher.held_totals, read by activity() without the lock, counted neither meanwhile: a look during a "
             "roll saw a backlog of 0 with the segment's acknowledged messages unread.  The sweep counts such looks "
             "apart (torn looks) and judges 'premature' on the same look taken under the fetcher's lock; _roll now "
             "keeps the segment open until it is held.")
"""A bug found by this sweep (fixed in event_etl meanwhile; tests/test_spool_sweep.py keeps it fixed)."""
PARTITION_KINDS = ("pull", "point:pulled", "open", "write", "fdatasync", "fsync", "stat", "point:spooled",
                   "acknowledge", "point:spool_acked", "replace")
"""The calls of a fetch partition's spool path where attempt 0 is held for the second writer."""


# -- the service --------------------------------------------------------------------------------------------------
class Service(CappedService):
    """The fake of the real service (:data:`PULL` messages a pull, leases of :data:`LEASE` s), and a seek."""

    def __init__(self) -> None:
        super().__init__(cap=PULL)
        self.subscription_deadline = LEASE
        self.deadline_s = float(LEASE)
        self.messages: dict[str, tuple[bytes, int]] = {}

    def publish_all(self, n: int) -> set[str]:
        for i in range(n):
            data, pub = (b"%06d" % i).ljust(PAYLOAD, b"p"), t("13:00") + i * 1000
            self.messages[self.publish(data, pub)] = (data, pub)
        return set(self.messages)

    def acked_now(self) -> set[str]:
        with self.lock:
            return set(self.acked)

    def seek(self, ms: int) -> int:
        """Seek the subscription back to ``ms``: every message published since is delivered again."""
        with self.lock:
            back = {m for m, (_d, pub) in self.messages.items() if pub >= ms}
            for ack, (mid, *_rest) in list(self.leased.items()):
                if mid in back:
                    del self.leased[ack]
            queued = {m for m, _d, _p in self.queue}
            self.queue[:0] = [(m, *self.messages[m]) for m in sorted(back - queued, key=int)]
            return len(back)


class TappedClient:
    """The service as the fetcher's threads see it: each call goes through the :class:`Tap`."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.svc, name)
        if name not in ("pull", "acknowledge", "modify_ack_deadline", "get_subscription"):
            return real

        def call(**kw):
            act = TAP.before(name, "")
            return real(**kw) if act is None else act(lambda *_a, **_k: real(**kw), (), {})

        return call


# -- the power-loss model, for the spool --------------------------------------------------------------------------
class SpoolDisk(Disk):
    """:class:`tests.test_power_loss.Disk`, and what the spool needs more of it: a file created by ``os.open`` is a
    folder change (gone after a cut until its folder is synced), a rename not synced gives the file back its old
    name (a journalling file system's rename is atomic: the old name or the new one), and the bytes written after
    a file's last ``fdatasync`` are torn by the cut (:meth:`tear`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        super().__init__(monkeypatch, root)
        self.more = {name: getattr(os, name) for name in ("open", "write", "fdatasync")}
        self.fds: dict[int, tuple[int, int]] = {}
        self.synced: dict[tuple[int, int], int] = {}  # a file's bytes made durable by its last fdatasync
        monkeypatch.setattr(os, "open", self._os_open)
        monkeypatch.setattr(os, "write", self._os_write)
        monkeypatch.setattr(os, "fdatasync", self._os_fdatasync)

    def _put(self, name: str, src, dst, **kw) -> Any:
        s = self._where(src, kw.get("src_dir_fd"))
        if name == "link" or not self._tracked(s):
            return super()._put(name, src, dst, **kw)
        old = self._content(s)
        out = super()._put(name, src, dst, **kw)
        self.journal.insert(len(self.journal) - 1, Change("del", s, os.path.dirname(s), old))
        return out

    def _fsync(self, fd):
        """A folder's sync clears its journal (:class:`Disk`), after the real call, which the tap sees (a file's
        sync: the real call only)."""
        n = fd if isinstance(fd, int) else fd.fileno()
        self.real["fsync"](fd)  # through the tap: a kill or a cut before it leaves the folder's changes unsynced
        if stat.S_ISDIR(os.fstat(n).st_mode):
            return super()._fsync(fd)
        return None

    def _os_open(self, path, flags, mode=0o777, *, dir_fd=None):
        real = self.more["open"]
        p = self._where(path, dir_fd)
        if not self._tracked(p) or not flags & (os.O_WRONLY | os.O_RDWR):
            return real(path, flags, mode, dir_fd=dir_fd)
        new = not os.path.lexists(p)
        if new:
            self._tick("put")
        fd = real(path, flags, mode, dir_fd=dir_fd)
        if new:
            self.journal.append(Change("put", p, os.path.dirname(p)))
        st = os.fstat(fd)
        self.fds[fd] = (st.st_dev, st.st_ino)
        self.synced.setdefault((st.st_dev, st.st_ino), 0 if new else st.st_size)
        return fd

    def _os_write(self, fd, data):
        if self.dead:
            raise PowerCut("the power is off")
        return self.more["write"](fd, data)

    def _os_fdatasync(self, fd):
        if self.dead:
            raise PowerCut("the power is off")
        self.more["fdatasync"](fd)
        ino = self.fds.get(fd)
        if ino is not None:
            self.synced[ino] = os.fstat(fd).st_size

    def tear(self, mode: str) -> list[str]:
        """What the cut does to bytes written after a file's last ``fdatasync``: ``lost``, ``zeros`` (its size kept,
        its data not), ``half`` (half of them kept), ``kept`` (all: the cut came between a write and its sync, and
        the disk had written them).  Returns the files torn."""
        torn = []
        by_ino = {}
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                by_ino[(st.st_dev, st.st_ino)] = (p, st.st_size)
        for ino, synced in self.synced.items():
            if ino not in by_ino:
                continue
            path, size = by_ino[ino]
            if size <= synced or mode == "kept":
                continue
            torn.append(f"{os.path.basename(path)}: {size - synced} bytes after its sync {mode}")
            with open(path, "r+b") as fh:
                if mode == "zeros":
                    fh.seek(synced)
                    fh.write(bytes(size - synced))
                else:
                    fh.truncate(synced + ((size - synced) // 2 if mode == "half" else 0))
        return torn


# -- the tap ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    fault: str  # one of FAULTS, or "" for a clean run
    window: str = ""  # the call's window (see the module docstring)
    nth: int = 0  # its occurrence in a clean run (1-based)

    def __str__(self) -> str:
        return f"{self.fault}@{self.nth}@{self.window}" if self.fault else "clean"

    @classmethod
    def parse(cls, text: str) -> Case:
        fault, nth, window = text.split("@", 2)
        return cls(fault, window, int(nth))

    @property
    def kind(self) -> str:
        """The kind of call of its window (``write``, ``acknowledge``, ``point:spooled``...)."""
        return _kind_of(self.window)


def _kind_of(window: str) -> str:
    return window.split(": ", 1)[1].split(" ", 1)[0] if ": " in window else ""


_SKIP = {"PullStream.run", "write_json_atomic", "_write_all", "Fetcher.start", "Fetcher.__init__",
         # the fetcher's parts that pass a call on to the spool or the run record, named by the call they pass on
         "FetchRun.begin", "FetchRun.end", "Spool.open_segment", "Spool.write_segment", "Spool.recover",
         "Spool.mark_acked", "Spool.write_status", "Spool.leave_error", "Spool.mark_drained",
         "Acknowledger.hand_back"}
_NAMES = re.compile(r"[0-9a-f]{8}-\d{2,}-\d{8,}(?:-n\d+)?")


def _short(qualname: str) -> str:
    cls, _, name = qualname.rpartition(".")
    if name == "__init__":
        return f"{cls}()"
    return name if cls in ("Fetcher", "PartitionFetcher", "PullStream", "OpenSegment") else qualname


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


class Tap:
    """Counts the calls of the fetchers' spool path and breaks the one a :class:`Case` names (see the module
    docstring).  A call is the fetcher's when a frame of a method of a :class:`Fetcher` or of one of its pull
    streams (:class:`PullStream`) is on its stack: its *generation* (0: the first process, 1 and on: restarts; a
    fetch partition's attempt) is ``_sweep_gen`` or, for a fetch partition, its attempt.  Calls of a dead
    generation raise :class:`Killed`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.local = threading.local()
        self.saved: list[tuple[Any, str, Any]] = []
        self.last_calls: list[str] = []
        self.arm(None, None)

    def arm(self, case: Case | None, root: Path | None, disk: SpoolDisk | None = None,
            kinds: tuple[str, ...] | None = None) -> None:
        if getattr(self, "case", None) is not None:
            self.last_calls = list(self.calls)  # the windows of the run that ends (a clean run's: the sweep's)
        self.case, self.root, self.disk = case, root, disk
        self.kinds = kinds  # the kinds of call that count (None: all)
        self.dead: set[int] = set()
        self.seen: Counter = Counter()
        self.calls: list[str] = []  # generation 0's windows, in order
        self.fired: str | None = None
        self.fired_at = 0.0
        self.errors: list[tuple[str, int]] = []  # errors the next calls of those kinds meet, in order
        self.errfile = False  # the error file fails too (eio+errfile)
        self.hung = threading.Event()
        self.release = threading.Event()
        self.gens_seen: set[int] = set()
        self.ballast: list[Path] = []
        self.on_death: Callable[[int], None] | None = None

    # -- which call, whose --------------------------------------------------------------------------------------
    def _where(self) -> tuple[int | None, list[str]]:
        f = sys._getframe(2)
        gen, chain = None, []
        while f is not None:
            code = f.f_code
            if code.co_filename.startswith(EVENT_ETL_DIR):
                chain.append(code.co_qualname)
                if gen is None:
                    me = f.f_locals.get("self")
                    if isinstance(me, PullStream):  # a stream's thread: its fetcher's generation
                        me = me.fetcher
                    if isinstance(me, Fetcher):
                        gen = getattr(me, "_sweep_gen", None)
                        if gen is None and isinstance(me, PartitionFetcher):
                            gen = getattr(me, "attempt", None)
            f = f.f_back
        return gen, chain[::-1]

    def window(self, kind: str, target: Any, chain: list[str]) -> str:
        names = [_short(q) for q in chain if q not in _SKIP and not q.startswith("<")]
        if len(names) > 1 and names[0] == "_pull_loop":
            names = names[1:]
        site = " > ".join(names[:1] + names[-2:] if len(names) > 3 else names) or "?"
        return f"{site}: {kind}{' ' + self.pattern(target) if target != '' else ''}"

    def pattern(self, target: Any) -> str:
        path = _fd_path(target) if isinstance(target, int) else os.fsdecode(os.fspath(target))
        root = os.path.realpath(self.root) if self.root else None
        if root and (path == root or path.startswith(root + os.sep)):
            path = os.path.relpath(path, os.path.join(root, "spool"))
            path = "spool/" if path == "." else path + ("/" if os.path.isdir(os.path.join(root, "spool", path))
                                                          else "")
        else:
            path = os.path.basename(path)
        path = _NAMES.sub("*", path)
        return re.sub(r"\.[0-9a-f]{8}\.tmp$", ".*.tmp", re.sub(r"\d{12}\.json", "*.json", path))

    # -- the decision -------------------------------------------------------------------------------------------
    def before(self, kind: str, target: Any, *, data: Any = None) -> Callable | None:
        """Called before each tapped call: raises if its process is dead, returns the fault to make (a function
        of the real call) or None."""
        if self.case is None or getattr(self.local, "busy", False):
            return None
        gen, chain = self._where()
        if gen is None:
            return None
        if gen in self.dead:
            raise Killed(f"generation {gen} is dead")
        self.gens_seen.add(gen)
        if gen != 0 or (self.kinds is not None and kind not in self.kinds):
            return None
        with self.lock:
            label = self.window(kind, target, chain)
            if self.errfile and self.fired and "error.json" in label:
                return _raise(errno.EIO)
            if self.errors and self.errors[0][0] == kind:
                return _raise(self.errors.pop(0)[1])
            if self.fired is not None:
                return None
            self.seen[label] += 1
            self.calls.append(label)
            case = self.case
            if case.fault == "" or label != case.window or self.seen[label] != case.nth:
                return None
            if case.fault in ("cut", "cut-lost", "cut-zeros", "cut-half", "cut-mid") and self.disk is None:
                return None
            self.fired, self.fired_at = f"{case.fault} at {label} #{self.seen[label]}", time.monotonic()
            return self._fault(case.fault, kind, gen, data)

    def _fault(self, fault: str, kind: str, gen: int, data: Any) -> Callable:
        def die(reason: str) -> None:
            self.dead.add(gen)
            if self.disk is not None and fault.startswith("cut"):
                self.disk.dead = True  # every tracked call of anyone raises PowerCut until the harness cuts
            raise Killed(reason)

        if fault in ("kill", "rot") or (fault.startswith("cut") and fault != "cut-mid"):
            return lambda real, a, k: die(f"{fault} before {kind}")
        if fault == "cut-mid":
            def half(real, a, k):
                if data is not None and len(data) > 1:
                    real(a[0], bytes(data[:len(data) // 2]))
                die("power cut in the middle of a write")
            return half
        if fault == "kill-after":
            def after(real, a, k):
                try:
                    real(*a, **k)
                finally:  # answered or failed (an empty pull runs out), the process dies as it returns
                    die(f"killed after {kind}")
            return after
        if fault in ("full", "short", "full-lasting"):
            def full(real, a, k):
                self.fill(leave=4096 if fault == "short" else 0, inodes=kind == "open")
                return real(*a, **k)
            return full
        if fault in ("enospc", "enospc+broken", "eio", "eio+errfile"):
            code = errno.EIO if fault.startswith("eio") else errno.ENOSPC
            self.errfile = fault == "eio+errfile"
            if kind == "write" and code == errno.ENOSPC:
                def short(real, a, k):  # a short write, and the rest of it finds no room (nor, broken, its undoing)
                    self.errors = [("write", errno.ENOSPC)] + ([("ftruncate", errno.EIO)] if "broken" in fault else [])
                    return real(a[0], bytes(data[:max(1, len(data) // 2)]))
                return short
            return _raise(code)
        if fault == "ack-fails":
            return _raise_exc(gex.ServiceUnavailable("the connection was reset"))
        if fault == "ack-lost":
            def lost(real, a, k):
                real(*a, **k)
                raise gex.DeadlineExceeded("the answer was lost")
            return lost
        if fault == "ack-late":
            def late(real, a, k):
                time.sleep(LEASE + 0.2)
                return real(*a, **k)
            return late
        if fault == "dies":
            return _raise_exc(RuntimeError("the stream died here (injected)"))
        if fault in ("hang", "fence"):
            def hang(real, a, k):
                self.hung.set()
                self.release.wait(30)
                if gen in self.dead:
                    raise Killed("the process ended while this call was stuck")
                return real(*a, **k)
            return hang
        raise AssertionError(fault)

    def fill(self, *, leave: int = 0, inodes: bool = False) -> None:
        """Fill the run's disk (its blocks, and its inodes if asked), leaving about ``leave`` bytes."""
        assert self.root is not None
        self.local.busy = True
        try:
            self.ballast.append(fill(self.root, leave=leave, name=f"ballast-{len(self.ballast)}"))
            if inodes:
                for i in range(10 * DISK_INODES):
                    p = self.root / f"ballast-inode-{len(self.ballast)}-{i}"
                    try:
                        os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))
                    except OSError as err:
                        if err.errno != errno.ENOSPC:
                            raise
                        break
                    self.ballast.append(p)
        finally:
            self.local.busy = False

    def space_back(self) -> None:
        while self.ballast:
            self.ballast.pop().unlink(missing_ok=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The tap on ``os``, ``open`` and :func:`event_etl.faults.point`, for the ``with`` block only."""
        tap = self

        def wrap(kind: str, real: Callable, target_of: Callable, *, data_of: Callable | None = None,
                 when: Callable | None = None) -> Callable:
            def call(*a, **k):
                if tap.case is None or (when is not None and not when(a, k)):
                    return real(*a, **k)
                act = tap.before(kind, target_of(a, k), data=data_of(a, k) if data_of else None)
                return real(*a, **k) if act is None else act(real, a, k)

            return call

        def writes(a, k) -> bool:
            flags = a[1] if len(a) > 1 else k.get("flags", 0)
            return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))

        def writes_mode(a, k) -> bool:
            mode = a[1] if len(a) > 1 else k.get("mode", "r")
            return isinstance(mode, str) and any(c in mode for c in "wax+") and not isinstance(a[0], int)

        def owned(a, k) -> bool:
            return sys._getframe(2).f_code.co_name == "owned"

        def point(real: Callable) -> Callable:
            def call(name: str, detail: str = "") -> None:
                if tap.case is not None:
                    act = tap.before(f"point:{name}", "")
                    if act is not None:
                        return act(lambda *_a, **_k: real(name, detail), (), {})
                return real(name, detail)

            return call

        first = lambda a, k: a[0] if a else k.get("path", k.get("fd", ""))  # noqa: E731
        second = lambda a, k: a[1] if len(a) > 1 else k.get("dst", "")  # noqa: E731
        patches = [
            (os, "open", wrap("open", os.open, first, when=writes)),
            (os, "write", wrap("write", os.write, first, data_of=lambda a, k: a[1])),
            (os, "fdatasync", wrap("fdatasync", os.fdatasync, first)),
            (os, "fsync", wrap("fsync", os.fsync, lambda a, k: a[0] if isinstance(a[0], int) else a[0].fileno())),
            (os, "ftruncate", wrap("ftruncate", os.ftruncate, first)),
            (os, "replace", wrap("replace", os.replace, second)),
            (os, "unlink", wrap("unlink", os.unlink, first)),
            (os, "stat", wrap("stat", os.stat, first, when=owned)),
            (builtins, "open", wrap("open", builtins.open, first, when=writes_mode)),
            (io, "open", wrap("open", io.open, first, when=writes_mode)),
            (faults, "point", point(faults.point)),
        ]
        hook = threading.excepthook

        def quiet(args) -> None:  # a dead process's threads end with Killed or PowerCut: the death, no error
            if not issubclass(args.exc_type, (Killed, PowerCut)):
                hook(args)

        threading.excepthook = quiet
        for obj, name, new in patches:
            self.saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, new)
        try:
            yield
        finally:
            while self.saved:
                obj, name, old = self.saved.pop()
                setattr(obj, name, old)
            threading.excepthook = hook


def _raise(code: int) -> Callable:
    def fail(real, a, k):
        raise OSError(code, os.strerror(code))
    return fail


def _raise_exc(err: BaseException) -> Callable:
    def fail(real, a, k):
        raise err
    return fail


TAP = Tap()


# -- a run --------------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    reached: bool = False
    real_disk: bool = False
    restarts: int = 0
    lost: int = 0
    duplicated: int = 0  # redeliveries of batches the fetcher said were not all acknowledged (waited for)
    unexpected: int = 0  # redeliveries of batches the fetcher said were all acknowledged
    failed_restart: str | None = None
    premature: int = 0
    missing: int = 0
    stuck_backlog: int = 0  # a backlog the fetcher reports at the end that the spool does not hold
    torn_looks: int = 0  # looks that saw no backlog only because a segment was being rolled (ROLL_RACE)
    saw_down: bool = False  # a look found the fetcher down (a full disk, an error): never taken for quiet
    stop_hung: bool = False  # a stop did not return: a stream stuck under the fetcher's lock (STOP_LOCK)
    stopped: bool = False  # the job stopped with its source's error (and was started again)
    refused: str | None = None  # SpoolDamaged, as expected for rot
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.failed_restart or self.premature or self.missing)

    def __str__(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("lost", "unexpected", "premature", "missing", "duplicated",
                                                      "restarts", "stuck_backlog") if getattr(self, k)]
        if self.failed_restart:
            parts.append(f"failed restart: {self.failed_restart}")
        return f"{self.case}: {', '.join(parts) or 'ok'}" + "".join(f"\n    {n}" for n in self.notes[:12])


@dataclass
class Batches:
    """What the batches saved (by batch id: a replay replaces its first attempt), and Spark's offsets."""

    committed: dict[str, Any] | None = None
    planned: tuple[int, dict[str, Any]] | None = None
    next_id: int = 0
    saved: dict[int, list[str]] = field(default_factory=dict)
    flagged: set[int] = field(default_factory=set)  # ack() said: not all acknowledged (redeliveries expected)

    def consumed(self) -> set[str]:
        return {m for ids in list(self.saved.values()) for m in ids}

    def flag_all(self) -> None:
        self.flagged.update(self.saved)

    def redeliveries(self) -> tuple[int, int, list[str]]:
        """(waited for, unexpected, examples): a message consumed again after a batch that was not flagged."""
        seen: dict[str, list[int]] = defaultdict(list)
        for bid in sorted(self.saved):
            for m in self.saved[bid]:
                seen[m].append(bid)
        expected = unexpected = 0
        examples = []
        for m, bids in seen.items():
            if len(bids) < 2:
                continue
            if all(b in self.flagged for b in bids[:-1]):
                expected += 1
            else:
                unexpected += 1
                examples.append(f"message {m} in batches {bids} (flagged: {sorted(self.flagged & set(bids))})")
        return expected, unexpected, examples


class Run:
    """One case of the driver's fetcher (see the module docstring)."""

    def __init__(self, case: Case, work: Path, disk: Path, messages: int, seconds: float = RUN_SECONDS) -> None:
        self.case, self.work, self.disk = case, work, disk
        self.seconds = seconds
        self.spool = disk / "spool"
        self.segdir = self.spool / "segments"  # made by the fetcher, as in a job (the planner syncs it)
        makedirs_durable(self.spool)  # the checkpoint's source folder (Checkpoint.source_dir)
        if case.fault in REAL_DISK:
            elsewhere = work / "log"
            elsewhere.mkdir()
            (self.spool / "log").symlink_to(elsewhere)
        self.svc = Service()
        self.published = self.svc.publish_all(messages)
        self.out = Outcome(case, real_disk=case.fault in REAL_DISK)
        self.b = Batches()
        self.gen = 0
        self.f: Fetcher | None = None
        self.planner: PubSubPlanner | None = None
        self.rotted: Path | None = None
        self.full_seen_down = 0.0
        self.hang_stopped = False

    # -- the process ----------------------------------------------------------------------------------------------
    def start(self) -> bool:
        """Start generation :attr:`gen` (a fetcher, then a planner, on the spool).  False if it could not and
        should be started again; raises :class:`_Stop` if it could not and that is a finding."""
        settings = dict(SETTINGS)
        if self.case.fault == "full-lasting" and self.gen == 0:
            settings["outage_timeout"] = LASTING_OUTAGE
        try:
            f = Fetcher(SUB, self.spool, settings=FetchSettings(**settings),
                        client_factory=lambda: TappedClient(self.svc))
            f._sweep_gen = self.gen  # type: ignore[attr-defined]
            self.f = f
            f.start()
            self.planner = PubSubPlanner(SUB, str(self.spool), max_messages=10_000, clock=lambda: t("14:00"))
            if self.b.committed is not None and self.b.planned is None:
                self.planner.commit(self.b.committed)  # as the shared engine does on a restart (job/engine.py)
            return True
        except (Killed, PowerCut):
            return True  # died while it started: the loop buries it and starts it again
        except SpoolDamaged as err:
            if self.rotted is not None and self.rotted.stem in str(err):
                self.out.refused = str(err).split(":")[0]
                self.out.notes.append(f"refused, as it must: {self.out.refused}")
                self.runbook()
                return False
            self.out.failed_restart = f"SpoolDamaged: {err}"
        except Exception as err:  # noqa: BLE001 - a start that fails: expected only as the fault's own effect
            if self.gen == 0 and TAP.fired is not None:
                self.out.notes.append(f"generation 0 did not start: {type(err).__name__}: {err}")
                TAP.space_back()
                return False
            self.out.failed_restart = f"{type(err).__name__}: {err}"
        raise _Stop

    def dead(self) -> bool:
        return self.gen in TAP.dead

    def bury(self) -> None:
        """The process died: its threads are abandoned (stop flags set, no cleanup), its disk as it left it (after
        a power cut: as the cut leaves it)."""
        f = self.f
        if f is not None:
            TAP.release.set()  # a call stuck in a dead process raises now (and leaves the fetcher's lock)
            f._stop.set()
            f._no_more_pulls.set()
            if f.lock.acquire(timeout=3.0):
                f.room.notify_all()
                f.wake.notify_all()
                f.lock.release()
            live.unregister(f.dir, f)
            for th in f._threads:
                th.join(3.0)
        if TAP.disk is not None and TAP.disk.dead:
            mode = {"cut-lost": "lost", "cut-zeros": "zeros", "cut-half": "half"}.get(self.case.fault, "kept")
            self.out.notes.extend(TAP.disk.tear(mode))
            undone = TAP.disk.power_cut()
            self.out.notes.extend(f"power cut undid: {c.op} {os.path.relpath(c.path, self.disk)}" for c in undone)
        if self.case.fault == "rot" and self.rotted is None:
            self.rot()

    def rot(self) -> None:
        """Flip a bit of the first frame of an open segment of two whole frames or more: damage, no torn tail."""
        for p in sorted(self.segdir.glob("*.open")):
            data = bytearray(p.read_bytes())
            if _scan(bytes(data)).frames >= 2:
                data[len(MAGIC) + _HEAD.size + 40] ^= 0x10
                p.write_bytes(bytes(data))
                self.rotted = p
                self.out.notes.append(f"rotted frame 1 of {p.name}")
                return
        self.out.notes.append("rot: no open segment of two frames at the kill")

    def runbook(self) -> None:
        """docs/runbook.md, 'A damaged spool segment': move it aside, seek back to the oldest publish time the spool
        held, start again; the dedupe window drops what was already written (here: every batch so far waits)."""
        seek = oldest_publish_ms(self.segdir)
        aside = self.work / "aside"
        aside.mkdir(exist_ok=True)
        for p in self.segdir.glob("*.fenced"):
            shutil.move(str(p), aside / p.name)
        n = self.svc.seek(seek if seek is not None else 0)
        self.b.flag_all()
        self.out.notes.append(f"runbook: segment moved aside, sought back to {seek}: {n} messages again")

    def restart(self) -> None:
        while True:
            self.gen += 1
            self.out.restarts += 1
            if self.gen > 8:
                self.out.failed_restart = "started 8 times and still not running"
                raise _Stop
            if self.start():
                return

    # -- the batches ----------------------------------------------------------------------------------------------
    def look(self) -> None:
        """What the controller sees before a batch: no hour may be markable while acknowledged messages are unread."""
        f = self.f
        if f is None or self.dead() or f.error is not None:
            return
        acked = self.svc.acked_now()
        a = f.activity()
        if a.retrying or a.settling or a.backlog:
            if a.retrying:
                self.out.saw_down = True
                if TAP.ballast:
                    self.full_seen_down = self.full_seen_down or time.monotonic()
            return
        early = acked - self.b.consumed()
        if early:
            if f.lock.acquire(timeout=0.5):  # the same look, with no segment half rolled (see ROLL_RACE)
                try:
                    again = f.activity()
                finally:
                    f.lock.release()
            else:  # a stream stuck under the lock, in a roll
                again = SimpleNamespace(retrying=False, settling=False, backlog=-1)
            if again.retrying or again.settling or again.backlog:
                self.out.torn_looks += 1
                if self.out.torn_looks == 1:
                    self.out.notes.append(f"a look during a roll saw no backlog with {len(early)} acknowledged "
                                          f"messages unread (ROLL_RACE); under the lock: {again.backlog}")
                return
        if early and len(early) > self.out.premature:
            self.out.premature = len(early)
            self.out.notes.append(f"premature: {len(early)} acknowledged, unread, while the fetcher said quiet "
                                  f"(e.g. {sorted(early, key=int)[:5]}); spool: {_listing(self.segdir)}")

    def batch(self, ack: Callable[[list[str]], bool]) -> None:
        """One micro-batch, or the replay of the one planned and not committed."""
        if self.planner is None:
            return
        b = self.b
        try:
            start = b.committed or self.planner.initial_offset()
            if b.planned is None:
                end = self.planner.latest_offset(start, None)
                if end == start:
                    return
                b.planned = (b.next_id, end)
                b.next_id += 1
            bid, end = b.planned
            names, ids = [], []
            for split in self.planner.splits(start, end):
                for path, lo, hi, _ in split.ranges():
                    names.append(os.path.basename(path))
                    ids.extend(m for _, m, _, _, _ in read_messages(path, lo, hi))
            b.saved[bid] = ids  # the batch's files, markers and state are saved
            if not ack(names):
                b.flagged.add(bid)
            b.committed, b.planned = end, None  # Spark's commit
            self.planner.commit(end)
        except (Killed, PowerCut):
            return  # the process died meanwhile
        except SourceError:
            if self.f is not None and self.f.error is not None:
                return  # the job stops with its source's error
            raise

    def done(self) -> bool:
        """Everything published was consumed, the fetcher no longer settles, and the service has nothing left to
        deliver (every message acknowledged: what was not, was delivered again and consumed)."""
        if not self.b.consumed() >= self.published or (self.f is not None and self.f.settling()):
            return False
        with self.svc.lock:
            return not self.svc.queue and not self.svc.leased

    def why_not_done(self) -> str:
        with self.svc.lock:
            queued, leased = len(self.svc.queue), len(self.svc.leased)
        return (f"ran out of time: {len(self.published - self.b.consumed())} messages not consumed, the service "
                f"holds {queued} queued and {leased} leased, settling: {self.f is not None and self.f.settling()}; "
                f"spool: {_listing(self.segdir)}")

    # -- the loop -------------------------------------------------------------------------------------------------
    def go(self) -> Outcome:
        try:
            if not self.start():
                self.restart()
            for _ in range(4):
                self.loop()
                before = TAP.fired
                if self.wind_down():
                    if before is not None or TAP.fired is None:
                        break
                    # the fault came in the last stop (its record not written): the next start, once space came
                    # back, must not trip on it
                    TAP.space_back()
                    TAP.dead.add(self.gen)
                self.bury()  # died in its stop
                self.restart()
        except _Stop:
            pass
        self.check()
        return self.out

    def loop(self) -> None:
        """Batches until everything published was consumed; a process that dies is buried and started again, a job
        that stops with its source's error is started again (once space came back)."""
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            if self.dead():
                self.bury()
                self.restart()
                deadline = time.monotonic() + self.seconds
                continue
            f = self.f
            assert f is not None
            if f.error is not None:
                self.out.stopped = True
                self.out.notes.append(f"the job stopped: {f.error.message}")
                with contextlib.suppress(Killed, PowerCut):
                    f.stop(timeout=2.0)  # the process ends with the error; its fetcher stops as it exits
                TAP.space_back()
                TAP.dead.add(self.gen)
                self.bury()
                self.restart()
                deadline = time.monotonic() + self.seconds
                continue
            self.hold_the_disk()
            if self.case.fault == "hang" and TAP.hung.is_set() and not self.hang_stopped \
                    and time.monotonic() - TAP.fired_at > HOLD_BEFORE_STOP:
                self.hang_stopped = True
                if not _within(partial(f.stop, timeout=STOP_WAIT), STOP_WAIT + 2.0):  # SIGTERM: gives up waiting
                    self.out.stop_hung = True
                    self.out.notes.append("the stop itself hung: the stuck stream holds the fetcher's lock")
                self.out.notes.append(f"stopped with the stream stuck: run.json {_run_record(self.spool)}")
                TAP.dead.add(self.gen)  # and the process exits
                continue
            self.look()
            self.batch(f.ack)
            stuck = self.case.fault == "hang" and TAP.hung.is_set() and not self.hang_stopped
            if self.done() and not TAP.ballast and not stuck:
                return
            time.sleep(0.02)
        self.out.notes.append(self.why_not_done())

    def hold_the_disk(self) -> None:
        """A real full disk: kept full (the batches delete segments) until the fetcher reports it (``full``,
        ``short``) or the job stops (``full-lasting``), then emptied."""
        if not TAP.ballast:
            return
        since = time.monotonic() - TAP.fired_at
        lasting = self.case.fault == "full-lasting"
        reported = self.full_seen_down and time.monotonic() - self.full_seen_down > 0.2
        if (not lasting and (reported or since > 1.5)) or since > 10.0:
            TAP.space_back()
            return
        if free_bytes(self.disk) > 0:
            with contextlib.suppress(OSError):
                TAP.fill()

    def wind_down(self) -> bool:
        """The end: batches until the fetcher reports no backlog (at most 1.5 s; what it reports then and the spool
        does not hold is a *stuck backlog*), then a stop.  False if the process died in its stop."""
        f = self.f
        if f is None or self.dead() or f.error is not None:
            return not self.dead()
        end = time.monotonic() + 1.5
        while f.activity().backlog and time.monotonic() < end and not self.dead():
            self.look()
            self.batch(f.ack)
            time.sleep(0.05)
        if not self.dead():
            held = len(_spool_ids(self.segdir) - self.b.consumed())
            backlog = f.activity().backlog
            if backlog > held:
                self.out.stuck_backlog = max(self.out.stuck_backlog, backlog - held)
                self.out.notes.append(f"the fetcher reports a backlog of {backlog} when the spool holds {held} "
                                      f"unread: {_listing(self.segdir)}")
        with contextlib.suppress(Killed, PowerCut):
            f.stop(timeout=2.0)
        return not self.dead()

    def check(self) -> None:
        TAP.release.set()
        consumed = self.b.consumed()
        acked = self.svc.acked_now()
        self.out.lost = len(acked - consumed)
        self.out.missing = len(self.published - consumed)
        if self.out.lost:
            self.out.notes.append(f"lost: {sorted(acked - consumed, key=int)[:10]}; spool: {_listing(self.segdir)}")
        self.out.duplicated, self.out.unexpected, examples = self.b.redeliveries()
        self.out.notes.extend(examples[:3])
        self.out.reached = (TAP.fired is not None or self.case.fault == "") and not (
            self.case.fault == "rot" and self.rotted is None)


def _within(call: Callable[[], Any], seconds: float) -> bool:
    """Run ``call`` in a thread of its own; whether it returned within ``seconds`` (if not, it is left running: it
    dies with its generation)."""

    def body() -> None:
        with contextlib.suppress(Killed, PowerCut):
            call()

    th = threading.Thread(target=body, name="stopping", daemon=True)
    th.start()
    th.join(seconds)
    return not th.is_alive()


def _listing(d: Path) -> list[str]:
    try:
        return sorted(p.name for p in d.iterdir())
    except FileNotFoundError:
        return []


def _run_record(spool: Path) -> str:
    try:
        doc = json.loads((spool / "run.json").read_text())
    except (OSError, ValueError) as err:
        return f"unreadable ({err})"
    return f"clean={doc.get('clean')} leased_until={doc.get('leased_until')}"


class _Stop(Exception):
    """A run cannot go on (a restart failed)."""


def _spool_ids(segdir: Path) -> set[str]:
    """The message ids of every whole frame the spool holds (closed, open and fenced segments)."""
    out: set[str] = set()
    for p in (segdir.iterdir() if segdir.is_dir() else ()):
        try:
            if p.suffix == ".seg":
                out.update(m for _, m, _, _, _ in read_messages(p))
            elif p.suffix in (".open", ".fenced"):
                data = p.read_bytes()
                good, pos = _scan(data).good, len(MAGIC)
                while pos < good:
                    n = _HEAD.unpack_from(data, pos)[0]
                    out.update(rm.message.message_id for rm in
                               _parse(data[pos + _HEAD.size:pos + _HEAD.size + n]).received_messages)
                    pos += _HEAD.size + n
        except (FileNotFoundError, SpoolDamaged):
            continue
    return out


@contextlib.contextmanager
def _run_disk(work: Path) -> Iterator[Path]:
    with small_disk(work / "disk", DISK_BYTES) as disk:
        subprocess_remount(disk)
        yield disk


def subprocess_remount(disk: Path) -> None:
    """Limit the tmpfs's inodes too (``full`` before a file is created fills them)."""
    import subprocess

    subprocess.run(["mount", "-o", f"remount,nr_inodes={DISK_INODES}", str(disk)], capture_output=True,
                   timeout=30, check=True)


def run_case(case: Case, work: Path, *, messages: int = MESSAGES, seconds: float = RUN_SECONDS) -> Outcome:
    """One case, from scratch, in ``work`` (on a tmpfs mounted there for it); ``seconds``: how long it may take to
    consume everything after its last fault or restart."""
    if case.fault == "fence":
        return run_second_writer(case, work, messages=messages)
    work.mkdir(parents=True, exist_ok=True)
    with _run_disk(work) as disk:
        mp = pytest.MonkeyPatch()
        try:
            pdisk = SpoolDisk(mp, disk) if case.fault.startswith("cut") else None
            run = Run(case, work, disk, messages, seconds)
            TAP.arm(case, disk, pdisk)
            try:
                return run.go()
            finally:
                TAP.release.set()
                TAP.dead.add(run.gen)
                f = run.f
                if f is not None:
                    f._stop.set()
                    live.unregister(f.dir, f)
                    for th in f._threads:
                        th.join(3.0)
                TAP.arm(None, None)
        finally:
            mp.undo()


# -- a second writer: a retried fetch partition, the first attempt still running ----------------------------------
def _fake_spark() -> SimpleNamespace:
    return SimpleNamespace(conf=SimpleNamespace(get=lambda k, d=None: d),
                           sparkContext=SimpleNamespace(defaultParallelism=8))


PART_SETTINGS = dict(SETTINGS, segment_age=30.0, ack="spooled")
"""A fetch partition's settings: segments closed when full (the age loop stays out of the way of the windows)."""


def run_second_writer(case: Case, work: Path, *, messages: int = MESSAGES) -> Outcome:
    """Attempt 0 of fetch partition 0 is held at the call ``case`` names while the driver plans batches; attempt 1
    of the same task starts (and fences attempt 0's open segment); attempt 0 goes on.  The driver acknowledges
    through :meth:`ExecutorFetcher.ack` and reports through :meth:`ExecutorFetcher.activity`."""
    work.mkdir(parents=True, exist_ok=True)
    with _run_disk(work) as disk:
        run = Run(case, work, disk, messages)
        spool = run.spool
        run.segdir.mkdir()  # the driver's ExecutorFetcher makes it before the fetch job starts
        ex = ExecutorFetcher(SUB, spool, spark=_fake_spark(),
                             settings=FetchSettings(**PART_SETTINGS, fetch_partitions=1))
        ex.run = RUN
        run.planner = PubSubPlanner(SUB, str(spool), max_messages=10_000, clock=lambda: t("14:00"))
        TAP.arm(case, disk, None, kinds=PARTITION_KINDS)
        results: dict[int, Any] = {}

        def attempt(n: int) -> None:
            try:
                job = FetchJob(SUB, str(spool), 1, dict(PART_SETTINGS), RUN, lease_seconds=LEASE)
                results[n] = fetch_partition(job, 0, n, client_factory=lambda: TappedClient(run.svc),
                                             report_every=0.05)
            except BaseException as err:  # noqa: BLE001 - reported
                results[n] = err

        threads = {0: threading.Thread(target=attempt, args=(0,), name="fetch-task-0", daemon=True)}
        threads[0].start()
        try:
            deadline = time.monotonic() + RUN_SECONDS
            while time.monotonic() < deadline:
                if TAP.hung.is_set() and 1 not in threads and time.monotonic() - TAP.fired_at > PAUSE_BEFORE_RETRY:
                    threads[1] = threading.Thread(target=attempt, args=(1,), name="fetch-task-1", daemon=True)
                    threads[1].start()  # Spark retries the task: attempt 1 fences attempt 0's open segment
                    _wait(lambda: 1 in TAP.gens_seen or 1 in results, 10.0)  # it fenced, and it pulls
                    TAP.release.set()  # attempt 0 goes on
                _look_partitions(run, ex)
                run.batch(ex.ack)
                with run.svc.lock:
                    quiet = not run.svc.queue and not run.svc.leased  # all acknowledged: a stop closes the rest
                if quiet and (not TAP.hung.is_set() or TAP.release.is_set()):
                    break
                time.sleep(0.02)
            else:
                run.out.notes.append(run.why_not_done())
            (run.segdir / STOP).write_text("stop\n")
            TAP.release.set()
            for th in threads.values():
                th.join(10.0)
            for _ in range(3):
                run.batch(ex.ack)
            for n, r in sorted(results.items()):
                if isinstance(r, BaseException):
                    run.out.failed_restart = f"attempt {n}: {type(r).__name__}: {r}"
                elif r.get("fenced"):
                    run.out.notes.append(f"attempt {n} was fenced: it stopped pulling")
            run.out.restarts = len(threads) - 1
            run.check()
        finally:
            TAP.release.set()
            (run.segdir / STOP).touch()
            for th in threads.values():
                th.join(5.0)
            ex._release_cores()
            TAP.arm(None, None)
        return run.out


def _look_partitions(run: Run, ex: ExecutorFetcher) -> None:
    acked = run.svc.acked_now()
    a = ex.activity()
    if a.retrying or a.settling or a.backlog:
        return
    early = acked - run.b.consumed()
    if early:
        again = ex.activity()  # taken again at once: a look torn by a rename sees the backlog now (LISTING_RACE)
        if again.retrying or again.settling or again.backlog:
            run.out.torn_looks += 1
            if run.out.torn_looks == 1:
                run.out.notes.append(f"a look during a rename saw no backlog with {len(early)} acknowledged messages "
                                     f"unread (LISTING_RACE); again at once: {again.backlog}")
            return
    if early and len(early) > run.out.premature:
        run.out.premature = len(early)
        run.out.notes.append(f"premature: {len(early)} acknowledged, unread, while the driver said quiet (backlog 0, "
                             f"not down, not settling); spool: {sorted(os.listdir(run.segdir))}")


def _wait(cond: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


# -- the sweep ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def sweeping() -> Iterator[None]:
    """The tap installed, short settling (a killed run's 1-s leases and 0.2 s), the fetcher's log lines quiet."""
    margin = pubsub_run.SETTLE_MARGIN_SECONDS
    logger = logging.getLogger("event_etl")
    level = logger.level
    pubsub_run.SETTLE_MARGIN_SECONDS = 0.2
    logger.setLevel(logging.CRITICAL)
    try:
        with TAP.installed():
            yield
    finally:
        pubsub_run.SETTLE_MARGIN_SECONDS = margin
        logger.setLevel(level)


def clean_windows(work: Path, *, messages: int = MESSAGES, partition: bool = False) -> tuple[list[str], Outcome]:
    """The windows of a clean run, in order, and its outcome (which must be clean too)."""
    case = Case("")
    out = run_second_writer(case, work, messages=messages) if partition else run_case(case, work, messages=messages)
    return list(TAP.last_calls), out


def cases(calls: list[str], *, partition_calls: list[str] | None = None, messages: int = MESSAGES) -> list[Case]:
    """Every case of a clean run's windows: each fault its kind of call meets (:data:`BY_KIND`), at every
    occurrence; pulls and looks at the subscription only while it still held messages (an empty subscription's
    are as many as its timing makes them); rot where the open segment holds two frames; and the second writer at
    every call of a fetch partition's spool path (not its status reports, as many as their timing makes them)."""
    pulls = -(-messages // PULL)
    per_segment = SETTINGS["segment_messages"] // PULL
    out: list[Case] = []
    seen: Counter = Counter()
    for w in calls:
        seen[w] += 1
        kind = _kind_of(w)
        if kind in ("pull", "point:pulled") and seen[w] > pulls + 1:
            continue
        if kind == "get_subscription" and seen[w] > 2:
            continue
        for fault in BY_KIND.get(kind, ()):
            if fault == "rot" and (seen[w] - 1) % per_segment < 2:
                continue
            out.append(Case(fault, w, seen[w]))
    seen.clear()
    for w in partition_calls or []:
        seen[w] += 1
        if "status/" in w or (_kind_of(w) in ("pull", "point:pulled") and seen[w] > pulls):
            continue
        out.append(Case("fence", w, seen[w]))
    return out


SAMPLE: tuple[tuple[str, str, int], ...] = (
    # the run's start and stop
    ("kill", "begin_run > RunRecord.begin > write_text_atomic: replace", 1),
    ("full", "begin_run > RunRecord.begin > write_text_atomic: open", 1),
    ("kill", "stop > RunRecord.end > write_text_atomic: replace", 1),
    ("cut", "stop > RunRecord.end > write_text_atomic: replace", 1),  # undoes the batches' deletes: STUCK_BACKLOG
    # the second pull: a frame appended to an open segment that holds an acknowledged one, and its acknowledgement
    ("kill", "append > _append: fdatasync", 2),
    ("cut-mid", "append > _append: write", 2),
    ("cut-lost", "append > _append: fdatasync", 2),
    ("cut-zeros", "append > _append: fdatasync", 2),
    ("cut-half", "append > _append: fdatasync", 2),
    ("short", "append > _append: write", 2),
    ("full-lasting", "append > _append: write", 2),
    ("enospc", "append > _append: fdatasync", 2),
    ("enospc+broken", "append > _append: write", 2),
    ("eio+errfile", "append > _append: fdatasync", 2),
    ("dies", "append > owned: stat", 4),
    ("dies", "point:spooled", 2),
    ("hang", "append > _append: fdatasync", 2),
    ("kill", "acknowledge", 2),
    ("kill-after", "acknowledge", 2),
    ("ack-lost", "acknowledge", 2),
    ("ack-late", "acknowledge", 2),
    ("hang", "acknowledge", 2),
    ("rot", "point:pulled", 3),
    # the first segment's close, and the second one's first line
    ("cut", "_roll > close: replace", 1),
    ("enospc", "_roll > close: replace", 1),
    ("full", "OpenSegment(): open", 2),
    # a second writer: attempt 0 held with an acknowledged frame in its open segment, in a frame's write, before
    # its acknowledgement, and in its segment's close
    ("fence", "append > _append: write", 2),
    ("fence", "acknowledge", 2),
    ("fence", "_roll > close: replace", 1),
)
"""What ``tests/test_spool_sweep.py`` runs: (fault, a part of its window, the window's occurrence)."""


def sample(all_cases: list[Case]) -> list[Case]:
    """The cases :data:`SAMPLE` names (each must be one of ``all_cases``: a window renamed fails the test)."""
    out = []
    for fault, part, nth in SAMPLE:
        match = [c for c in all_cases if c.fault == fault and part in c.window and c.nth == nth]
        if not match:
            raise LookupError(f"no case {fault}@{nth}@...{part}... in the clean run's windows")
        out.append(match[0])
    return out


def sweep(*, quick: bool = False, only: str | None = None, workroot: Path | None = None,
          messages: int = MESSAGES, progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """The clean runs, then every case (``quick``: :func:`sample`); the clean runs' outcomes come first."""
    root = Path(workroot or tempfile.mkdtemp(prefix="spool-sweep-"))
    with sweeping():
        calls, clean = clean_windows(root / "clean", messages=messages)
        pcalls, pclean = clean_windows(root / "clean-partition", messages=messages, partition=True)
        todo = cases(calls, partition_calls=pcalls, messages=messages)
        if only:
            todo = [c for c in todo if c.fault == only]
        if quick:
            todo = sample(todo)
        outcomes = [clean, pclean]
        for i, case in enumerate(todo):
            work = root / f"case-{i:04d}"
            o = run_case(case, work, messages=messages)
            outcomes.append(o)
            shutil.rmtree(work, ignore_errors=True)
            if progress is not None:
                progress(o)
    return outcomes


COLUMNS = ("runs", "real disk", "restarts", "lost", "duplicated (waited for)", "unexpected redeliveries",
           "failed restarts", "premature", "missing", "not reached", "torn looks", "stuck backlog", "stop hung")
"""The last three are not failures of the contract: looks that saw no backlog only in a roll (ROLL_RACE), a
backlog reported at the end that the spool does not hold, stops that did not return (STOP_LOCK)."""


def _row(os_: list[Outcome]) -> list[int]:
    reached = [o for o in os_ if o.reached]
    return [len(reached), sum(o.real_disk for o in reached), sum(o.restarts for o in reached),
            sum(o.lost for o in os_), sum(o.duplicated for o in os_), sum(o.unexpected for o in os_),
            sum(1 for o in os_ if o.failed_restart), sum(o.premature for o in os_), sum(o.missing for o in os_),
            sum(1 for o in os_ if not o.reached), sum(1 for o in os_ if o.torn_looks),
            sum(o.stuck_backlog for o in os_), sum(o.stop_hung for o in os_)]


def table(outcomes: list[Outcome], *, by: str = "window") -> str:
    """Figures per window (``by="fault"``: per fault)."""
    rows: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        c = o.case
        key = "clean" if not c.fault else (f"{c.fault} @ {c.window}" if by == "window" else c.fault)
        rows[key].append(o)
    lines = ["| window | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for key, os_ in sorted(rows.items(), key=lambda kv: (kv[0] != "clean", kv[0])):
        lines.append(f"| {key} | " + " | ".join(str(v) for v in _row(os_)) + " |")
    lines.append("| **all** | " + " | ".join(f"**{v}**" for v in _row(outcomes)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sample", action="store_true", help="only what tests/test_spool_sweep.py runs")
    ap.add_argument("--only", choices=FAULTS, help="only this fault")
    ap.add_argument("--repro", help="one case, FAULT@OCCURRENCE@WINDOW as the table and the findings print it")
    ap.add_argument("--by-fault", action="store_true", help="a row per fault instead of per window")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    started = time.monotonic()
    if args.repro:
        with sweeping(), tempfile.TemporaryDirectory(prefix="spool-sweep-") as d:
            o = run_case(Case.parse(args.repro), Path(d))
        print(o)
        return 0 if o.ok else 1

    def progress(o: Outcome) -> None:
        if not o.ok:
            print(f"  finding: {o}", flush=True)

    outcomes = sweep(quick=args.sample, only=args.only, progress=progress)
    print(table(outcomes, by="fault" if args.by_fault else "window"))
    bad = [o for o in outcomes if not o.ok]
    print(f"{len(outcomes)} runs ({sum(o.reached for o in outcomes)} reached their window, "
          f"{sum(o.real_disk for o in outcomes if o.reached)} on a real full disk) in "
          f"{time.monotonic() - started:.0f} s; {len(bad)} with a finding")
    for o in bad[:30]:
        print(f"  {o}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
