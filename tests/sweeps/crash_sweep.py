"""A crash sweep that reaches every window: the process is killed before *each* file-system call of a scenario.

The fault campaign (integration/campaigns/campaign.py) kills a real job at a handful of named fault points.
This sweep drives the real executor and controller (:class:`tests.lib.harness.LocalPipeline`, no Spark)
through a small scenario (:data:`STEPS`: eight steps, ~600 calls on local disk) and kills it just
before every call event_etl makes there (:class:`FsTap`): ``os.replace``, ``rename``, ``link``,
``unlink``, ``rmdir``, ``mkdir``, ``fsync``, ``shutil.rmtree`` (and the calls inside it), and an
``open`` that writes.  The call raises :class:`Killed` (a ``BaseException``: no ``except Exception``
of the code under test catches it), and so does every later file-system call of that process (a
dead process runs no ``finally`` that touches the disk).  Then, as after a real kill: a new
controller on the same checkpoint (:meth:`LocalPipeline.restart`), the killed step again (Spark
replays a batch it has not committed, and a kill inside a step always comes before Spark's commit;
a tick or a drain is simply run again), and the rest of the scenario.  A *double kill* kills again
during that restart and replay (at call ``j`` of it).  After every batch step there is one more
kill point, ``before Spark's commit``: the step returned, Spark had not recorded it, the batch is
replayed.

Runs are *forked* (:meth:`FsTap.fork_kill`): one clean run of the scenario (the trunk) forks, just
before each call to kill at, a child that dies there.  The child first copies the run's folder
(sink, checkpoint, input) and goes on in its copy, so the trunk's files, and the folder
descriptors of an ``rmtree`` in flight, stay as they were; the trunk waits for the child's report
and makes the call.  A child forks again, in its restart and replay, for double kills.  So a run
costs only what comes after its kill.  :meth:`Sweep.single` and :meth:`Sweep.double` kill directly
(one run from scratch, no fork), to reproduce a case.

Each kill is labelled with its *window*: the last :func:`event_etl.faults.point` reached before it
(``restart`` while a restarted controller starts: its sweep of temporaries, its marker adoption),
the function of event_etl that makes the call (after the phase it runs in: ``rolling/merge_hour``,
``marker/merge_hour`` for a final merge, ``adopt/save_state``, ``first batch/_store_once``...),
the kind of call and a short pattern of its path (``replace sink:click/dt=*/hour=*/part-*``,
``link sink:click/dt=*/hour=*/_COMPLETE``, ``unlink ckpt:etl/ledger/*/*.json``).

After every run, against the clean run (:func:`check_run`): no record lost and none duplicated (by
id, over every ``part-`` and ``late-`` file), each record where the clean run put it (its hour,
``late-`` or not), the dead letters equal (reason and payload), every hour the clean run marked is
marked, every ``_COMPLETE`` lists exactly its folder's ``.avro`` files
(:func:`~tests.lib.harness.check_manifest_matches_folder`), a marker once seen (after each step and
each kill) never changes and neither do its folder's files, no restart and no step after a kill
raises, and no temporary file (``.*.tmp``) is left in the sink or the checkpoint.

The executor runs its record path (:data:`FAST_PATH`); work folders live on ``/dev/shm`` when it
is there (tmpfs: ``fsync`` is cheap; it is still called).

``.venv/bin/python -m tests.sweeps.crash_sweep`` kills before every call, before every commit, and again
at every call of the restart and replay of a sample of those kills (the first kill of each window
and every 7th: :func:`double_kill_sample`), and prints a table per window; ``--all`` kills again
after every kill (hours); ``--quick`` is :func:`every_window`, and ``--quick --replay-only`` what
``tests/test_crash_sweep.py`` runs; ``--repro K [J]`` (``--repro c<step> [J]`` for a kill before
a commit) runs one case directly and shows its failures in full.
"""

from __future__ import annotations

import argparse
import builtins
import gc
import io
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import event_etl
from event_etl import faults
from event_etl.job.checkpoint import Checkpoint
from event_etl.rules.buckets import MARKER_NAME, parse_data_file_name, parse_hour_dir
from event_etl.rules.watermark import SourceActivity
from event_etl.storage import Storage
from event_etl.storage.temporaries import is_temporary
from event_etl.task.executor import process_split
from tests.lib.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    click,
    hour,
    make_event_type,
    read_avro,
    read_deadletter,
    read_sink,
    t,
)

__all__ = ["Killed", "FsTap", "STEPS", "SETTINGS", "ALL", "Call", "Run", "Sweep", "run_scenario", "check_run",
           "every_window", "equivalent_kill", "double_kill_sample", "table", "FAILURE_KINDS", "main"]

EVENT_ETL_DIR = os.path.dirname(os.path.abspath(event_etl.__file__)) + os.sep

SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m",
            "max_events_per_file": 3}
"""The event type (``dedupe_window`` is the default, 10 minutes); 3 records a file, so that small files merge."""


class Killed(BaseException):
    """The process died here."""


# -- the scenario ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[LocalPipeline], Any]
    commits: bool = False
    """A batch: Spark commits it after the step returns (a kill point ``before Spark's commit`` follows it)."""


def _batch(batch_id: int, at: str, lines: list[bytes], shards: int, *, not_before: int = 0) -> Callable:
    """A micro-batch arriving at ``at`` (or ``not_before`` ms after the clock, if that is later: after a tick step
    whose replay ran longer); replayed with the same id and input (LocalPipeline keeps the first arrival)."""

    def run(p: LocalPipeline):
        if batch_id not in p.arrivals:
            p.clock.now = max(t(at), p.clock.now + not_before)
        return p.batch(lines, batch_id=batch_id, shards=shards)

    return run


def _quiet_until_marked(through: int, start: str, every_ms: int = 5 * 60_000, most: int = 40) -> Callable:
    """The source stays quiet: the job ticks every ``every_ms`` until the idle advance has marked ``through``.
    Run again after a kill, it goes on ticking from where the clock stood (the restarted job is quiet since it
    started): the same hours are marked, a little later."""

    def run(p: LocalPipeline):
        p.clock.now = max(p.clock.now, t(start))
        for _ in range(most):
            st = p.controller.state
            if st.marked_through is not None and st.marked_through >= through:
                return
            p.clock.now += every_ms
            p.controller.tick()
        raise AssertionError(f"the idle ticks did not mark {through} in {most} ticks")

    return run


def _drain(p: LocalPipeline):
    return p.controller.drain()


FIRST = [click("old", "2026-11-19T10:00"), click("a", "13:10"), click("old2", "2026-11-19T10:05"),
         click("b", "13:20"), click("c", "13:25"), click("d", "13:26"), b"{not json"]
"""A job's first batch, in 3 splits: the two events of 2026-11-19 are too late against the batch's own reference
(13:24), so the splits holding them are written again (their first run wrote them into hour 10 of 2026-11-19)."""

STEPS: tuple[Step, ...] = (
    Step("b0 first batch", _batch(0, "13:30", FIRST, 3), commits=True),
    # producer retries of c and d (the type's dedupe, by id), alone in the last split: its file is emptied;
    # the watermark moves 12 minutes, and hour 13 closes within two such batches: its small files merge
    Step("b1 retries", _batch(1, "13:40", [click("e1", "13:31"), click("e2", "13:33"), click("e3", "13:35"),
                                           click("e4", "13:38"), click("c", "13:25"), click("d", "13:26")], 3),
         commits=True),
    # g1-g4 are timely (hour 13 was open when the batch began), a small file each: hour 13 holds more files than
    # its bound when the watermark passes 14:00, so they are merged before its marker (a final merge); the event
    # clock leaves the dedupe window of batches 0 and 1 (their keys are evicted)
    Step("b2 marks 13", _batch(2, "14:05", [click("f1", "14:01"), click("g1", "13:50"), click("f2", "14:02"),
                                            click("g2", "13:52"), click("f3", "14:03"), click("g3", "13:55"),
                                            click("f4", "14:04"), click("g4", "13:57")], 4), commits=True),
    # late events of hour 13 (into hour 14's late- files), a retry of f2, an event from the future
    Step("b3 late", _batch(3, "14:20", [click("h1", "14:10"), click("L1", "13:45"), click("h2", "14:12"),
                                        click("f2", "14:02"), click("L2", "13:55"), click("h3", "14:15"),
                                        click("fut", "15:00")], 2), commits=True),
    # more late and timely records: hour 14's small part- and late- files merge while it is open
    Step("b4 merges", _batch(4, "14:30", [click("h4", "14:20"), click("L3", "13:05"), click("h5", "14:22"),
                                          click("L4", "13:15"), click("h6", "14:25"), click("L5", "13:58"),
                                          click("h7", "14:28")], 2), commits=True),
    # quiet: idle ticks every 5 minutes advance the watermark with the clock until hour 14 is marked
    Step("idle ticks", _quiet_until_marked(hour("14"), "14:30")),
    # late events of the marked hours 13 and 14 (into hour 15's late- files), and a retry of h7 (late too: the
    # late- file it alone was written to is emptied and removed)
    Step("b6 late again", _batch(6, "15:40", [click("i1", "15:32"), click("L6", "14:40"), click("L7", "13:30"),
                                              click("i2", "15:35"), click("h7", "14:28"), click("i3", "15:38")], 2,
                                 not_before=5 * 60_000), commits=True),
    Step("drain", _drain),
)


FAST_PATH = False
"""Whether the executor's tasks may take their columnar fast path (:mod:`event_etl.task.fastpath`).  The sweep
runs the record path (``process_split(fast=False)``): the fast path writes the same files through the same calls
(``tests/test_fastpath.py`` compares them), and its Arrow set-up (~5 ms a split) would double every run's time."""


def make_pipeline(root: Path, et, *, fast: bool | None = None) -> LocalPipeline:
    p = LocalPipeline(root, et, FakeClock(t("13:30")))
    if not (FAST_PATH if fast is None else fast):
        def task_runner(splits):
            def run_tasks(ctx, shards):
                return [process_split(sp, ctx, p.storage, fast=False) for sp in splits
                        if shards is None or sp.shard in shards]

            return run_tasks

        p.task_runner = task_runner
    _reporting(p)
    return p


def _reporting(p: LocalPipeline) -> None:
    """A source that reports, at every look, that it is quiet (no backlog, no outage): idle ticks may advance."""
    p.controller.idle.source_activity = lambda: SourceActivity(updated_at=p.clock.now)


def restart(p: LocalPipeline) -> None:
    p.restart()
    _reporting(p)


# -- the file-system calls ------------------------------------------------------------------------------------------
ALL = "all"
"""Fork a killed branch before every call (``fork_at``)."""

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_HELPERS = (os.path.join(EVENT_ETL_DIR, "storage", "sink.py"), os.path.join(EVENT_ETL_DIR, "storage", "atomic.py"))
_PASS_THROUGH = ("_each_file",)  # helpers that name no window: their caller does


def _from_event_etl() -> bool:
    f = sys._getframe(3)
    while f is not None:
        if f.f_code.co_filename.startswith(EVENT_ETL_DIR):
            return True
        f = f.f_back
    return False


def _site() -> str:
    """The innermost function of event_etl that makes the call (storage helpers left out: their caller says more),
    after the phase it runs in when that is another: ``marker/merge_hour`` (a final merge, on a marker's path),
    ``rolling/merge_hour``, ``adopt/save_state``..."""
    f = sys._getframe(3)
    inner = None
    while f is not None:
        code = f.f_code
        if code.co_filename.startswith(EVENT_ETL_DIR):
            if inner is None and code.co_filename not in _HELPERS and code.co_name not in _PASS_THROUGH \
                    and not code.co_name.startswith("<"):
                inner = code.co_name
            phase = _PHASES.get(code.co_name) or _suspended_phase(f)
            if phase is not None and inner is not None:
                return inner if code.co_name == inner else f"{phase}/{inner}"
        f = f.f_back
    return inner or "?"


def _suspended_phase(frame) -> str | None:
    """The phase a batch's phases are suspended in while their engine runs the tasks they asked for: a frame of
    :func:`event_etl.job.phases.drive` holds the batch's generator, whose innermost ``yield from`` names it."""
    if frame.f_code.co_name != "drive" or not frame.f_code.co_filename.endswith(os.path.join("job", "phases.py")):
        return None
    gen, phase = frame.f_locals.get("phases"), None
    while gen is not None and hasattr(gen, "gi_code"):
        phase = _PHASES.get(gen.gi_code.co_name, phase)
        gen = gen.gi_yieldfrom
    return phase


_PHASES = {"_adopt_markers": "adopt", "_write_marker": "marker", "rolling_merges": "rolling",
           "settle_first_batch": "first batch", "drop_duplicates": "duplicates"}
"""Functions that name the phase of the calls made under them."""


def _fd_path(fd: int) -> str:
    """The path of an open file descriptor (Linux); ``?`` where that cannot be told."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


class FsTap:
    """Wraps the calls event_etl makes on local disk, counts them, and kills the process before one of them.

    Counted (only when called from event_etl's code: the test's own files do not count): ``os.replace``,
    ``os.rename``, ``os.link``, ``os.unlink``, ``os.remove``, ``os.rmdir``, ``os.mkdir``, ``os.makedirs``,
    ``os.fsync``, ``shutil.rmtree`` (and the unlinks and rmdirs inside it: a kill may land midway), ``open``
    (``builtins.open`` and ``io.open``, which ``Path.open``, ``write_bytes`` and ``write_text`` use) with a mode
    that writes, and ``os.open`` with flags that write (``Path.touch``).  ``faults.point`` is wrapped too: the
    last point reached names the window of a call.

    A kill is either *direct* (``kill_at``: this process raises :class:`Killed` before that call, and before
    every later call until the caller clears :attr:`dead`) or *forked* (``fork_at``: before each such call the
    run's folder is copied aside and the process forks; the child is killed there and goes on as after a
    kill, the parent waits for it, puts the folder back and makes the call)."""

    def __init__(self) -> None:
        self.calls = 0
        self.kill_at: int | None = None
        self.fork_at: set[int] | str | None = None
        self.dead = False
        self.off = 0  # >0: the tap's own work (snapshots), not counted
        self.point = "start"
        self.step = ""
        self.log: list[tuple[str, str, int]] | None = None  # (step, label, clock) of every call, when asked
        self.clock: Callable[[], int] | None = None
        self.points: list[str] = []
        self.points_seen: list[str] = []  # the points the last run reached, in order
        self.killed: str | None = None  # the label of the call the process died before
        self.roots: list[tuple[str, str]] = []
        self.root: Path | None = None  # the run's folder (a forked branch works in a copy)
        self.relocate: Callable[[Path], None] | None = None  # moves the run to another folder
        self.depth = 0  # forks above this process
        self.forked: tuple[int, str] | None = None  # in a child just forked: (call, label) it was killed before
        self.branches: list[Run] = []  # what the children forked from this process reported
        self.child_pipe: int | None = None  # in a child: where it reports
        self.copy: Path | None = None  # in a child: its copy of the run's folder (removed when it reports)
        self.lost_child: Callable[[int, str, int], Run] | None = None
        self.on_report: Callable[[list[Run]], None] | None = None  # told what each child reported
        self._saved: list[tuple[Any, str, Any]] = []
        self._inside = 0  # inside a counted call that makes others (rmtree, makedirs)

    def arm(self, kill_at: int | None = None, fork_at: set[int] | str | None = None) -> None:
        """Count from 0 again; die before call ``kill_at``, or fork a killed child before the calls ``fork_at``."""
        self.calls, self.kill_at, self.fork_at, self.dead, self.killed = 0, kill_at, fork_at, False, None

    def label(self, kind: str, path: str) -> str:
        return f"{self.point} | {_site()}: {kind} {self.pattern(path)}"

    def pattern(self, path: Any) -> str:
        path = _fd_path(path) if isinstance(path, int) else os.fspath(path)
        for root, name in self.roots:
            if path == root or path.startswith(root + os.sep):
                path = f"{name}:{os.path.relpath(path, root)}"
                break
        else:
            path = os.path.basename(path)
        return path_pattern(path)

    def _call(self, kind: str, path: Any, *, count_inside: bool = False) -> None:
        if self.off or (self._inside and not count_inside) or not _from_event_etl():
            return
        if self.dead:
            raise Killed(f"dead: {kind} {path}")
        k = self.calls
        self.calls += 1
        label = None
        if self.log is not None:
            label = self.label(kind, path)
            self.log.append((self.step, label, self.clock() if self.clock else 0))
        if k == self.kill_at:
            self.killed = label or self.label(kind, path)
            self.off += 1
            try:  # as a forked branch does (so that a direct kill reproduces one: a folder's listing order is its own)
                self.relocate(self._copy_of_root())
            finally:
                self.off -= 1
            self.dead = True
            raise Killed(f"killed before call {k}: {self.killed}")
        if self.fork_at is None:
            return
        if callable(self.fork_at):
            label = label or self.label(kind, path)
            if self.fork_at(k, label):
                self.fork_kill(k, label)
        elif self.fork_at == ALL or k in self.fork_at:
            self.fork_kill(k, label or self.label(kind, path))

    def fork_kill(self, k: int, label: str) -> None:
        """Fork; the child dies here (raises :class:`Killed`) in a copy of the run's folder, the parent waits for
        its report and goes on, its folder untouched (an ``rmtree`` in flight keeps its folder descriptors)."""
        assert self.root is not None and self.relocate is not None
        r, w = os.pipe()
        gc.freeze()  # the child's collections leave the parent's objects (and their pages) alone
        pid = os.fork()
        if pid == 0:
            os.close(r)
            signal.alarm(300)  # a branch that hangs is reported as a lost child, not waited for forever
            self.child_pipe, self.branches, self.depth, self.copy = w, [], self.depth + 1, None
            self.off += 1
            try:
                self.copy = self._copy_of_root()
                self.relocate(self.copy)  # every later write of the branch goes to its copy
            except BaseException as err:  # noqa: BLE001 - whatever failed, never go on in the parent's folder
                assert self.lost_child is not None
                lost = self.lost_child(k, label, -1)
                lost.fail("restart failed", f"the branch could not copy the run's folder: {_error(err)}")
                self.report([lost])
            finally:
                self.off -= 1
            self.forked, self.fork_at = (k, label), None
            self.dead, self.killed = True, label
            raise Killed(f"killed before call {k}: {label}")
        gc.unfreeze()
        os.close(w)
        chunks = []
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if self.depth:
            signal.alarm(300)  # a branch waited for its own branch: its time to hang starts again
        try:
            runs = pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - the child died without reporting
            assert self.lost_child is not None
            runs = [self.lost_child(k, label, status)]
        self.branches.extend(runs)
        if self.on_report is not None:
            self.on_report(runs)

    def _copy_of_root(self) -> Path:
        """A copy of the run's folder, beside it, where the run goes on after its kill."""
        assert self.root is not None
        copy = self.root.with_name(f"{self.root.name}.c")
        shutil.copytree(self.root, copy, symlinks=True)
        return copy

    def report(self, runs: list[Run]) -> None:
        """In a forked child: remove its folder, send ``runs`` to the parent and end the process here."""
        try:
            self.off += 1
            if self.copy is not None:  # its own copy of the run's folder, nothing else
                shutil.rmtree(self.copy, ignore_errors=True)
            data = pickle.dumps(runs)
            view = memoryview(data)
            while view:
                view = view[os.write(self.child_pipe, view):]
        finally:
            os._exit(0)

    # -- installing -----------------------------------------------------------------------------------------
    def install(self) -> None:
        tap = self

        def simple(kind: str, real: Callable, path_arg: int = 0) -> Callable:
            def wrapper(*args, **kwargs):
                target = args[path_arg] if len(args) > path_arg else kwargs.get("dst" if path_arg else "path", "?")
                dir_fd = kwargs.get("dst_dir_fd" if path_arg else "dir_fd")
                if dir_fd is not None:
                    target = os.path.join(_fd_path(dir_fd), os.fspath(target))
                tap._call(kind, target, count_inside=kind in ("unlink", "rmdir"))
                return real(*args, **kwargs)

            return wrapper

        def fsync(fd):
            tap._call("fsync", fd if isinstance(fd, int) else fd.fileno())
            return real_fsync(fd)

        def nested(kind: str, real: Callable) -> Callable:
            def wrapper(path, *args, **kwargs):
                tap._call(kind, path)
                tap._inside += 1
                try:
                    return real(path, *args, **kwargs)
                finally:
                    tap._inside -= 1

            return wrapper

        def opener(real: Callable) -> Callable:
            def wrapper(file, mode="r", *args, **kwargs):
                if isinstance(mode, str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode) \
                        and not isinstance(file, int):
                    tap._call(f"open({mode})", file)
                return real(file, mode, *args, **kwargs)

            return wrapper

        def os_open(path, flags, *args, **kwargs):
            if flags & _WRITE_FLAGS:
                tap._call("os.open(w)", path)
            return real_os_open(path, flags, *args, **kwargs)

        def point(name: str, detail: str = "") -> None:
            tap.point = name
            tap.points.append(name)
            return real_point(name, detail)

        real_fsync, real_os_open, real_point = os.fsync, os.open, faults.point
        patches = [
            (os, "replace", simple("replace", os.replace, 1)), (os, "rename", simple("rename", os.rename, 1)),
            (os, "link", simple("link", os.link, 1)), (os, "unlink", simple("unlink", os.unlink)),
            (os, "remove", simple("unlink", os.remove)), (os, "rmdir", simple("rmdir", os.rmdir)),
            (os, "mkdir", simple("mkdir", os.mkdir)), (os, "makedirs", nested("makedirs", os.makedirs)),
            (os, "fsync", fsync), (os, "open", os_open), (shutil, "rmtree", nested("rmtree", shutil.rmtree)),
            (builtins, "open", opener(builtins.open)), (io, "open", opener(io.open)), (faults, "point", point),
        ]
        for obj, name, new in patches:
            self._saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, new)

    def uninstall(self) -> None:
        while self._saved:
            obj, name, old = self._saved.pop()
            setattr(obj, name, old)


_PATTERNS = [
    (re.compile(r"dt=\d{4}-\d\d-\d\d"), "dt=*"),
    (re.compile(r"hour=\d\d"), "hour=*"),
    (re.compile(r"(part|late)-\d{10}-(?:w[0-9a-f]{6}-)?b\d{10}-s9\d{3}-\d{4}\.avro"), r"\1-merged-*"),
    (re.compile(r"(part|late)-\d{10}-(?:w[0-9a-f]{6}-)?b\d{10}-s\d{4}-\d{4}\.avro"), r"\1-*"),
    (re.compile(r"dl-(?:w[0-9a-f]{6}-)?b\d{10}-s\d{4}\.avro"), "dl-*"),
    (re.compile(r"\.[0-9a-f]{8,12}\.tmp$"), ".*.tmp"),
    (re.compile(r"ledger/-?\d+"), "ledger/*"),
    (re.compile(r"\d{4,}"), "*"),
]


def path_pattern(path: str) -> str:
    """``sink:click/dt=2026-11-21/hour=13/.part-2026112113-b0000000001-s0000-0000.avro.1a2b3c4d5e6f.tmp`` ->
    ``sink:click/dt=*/hour=*/.part-*.*.tmp``."""
    for rx, repl in _PATTERNS:
        path = rx.sub(repl, path)
    return path


# -- runs ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    k: int
    step: int
    label: str
    clock: int = 0

    @property
    def fsync(self) -> bool:
        return ": fsync " in self.label


@dataclass
class Run:
    """What one run of the scenario did and left.  ``first``: the call (of the whole scenario) the process died
    before, None for a kill before Spark's commit; ``second``: the call of the restart and replay it died before
    again; ``killed_step``: the step killed (and replayed)."""

    first: int | None = None
    second: int | None = None
    first_label: str | None = None
    second_label: str | None = None
    killed_step: int | None = None
    replay_calls: int = 0  # calls of the restart and the replay after the first kill (where a second one lands)
    failures: dict[str, list[str]] = field(default_factory=dict)
    sink: dict[str, Any] = field(default_factory=dict)
    log: list[tuple[str, str, int]] | None = None  # (step, label, clock) of every call, when asked

    def fail(self, kind: str, detail: str) -> None:
        self.failures.setdefault(kind, []).append(detail)

    @property
    def double(self) -> bool:
        return self.second_label is not None

    @property
    def window(self) -> str | None:
        """The window of the last kill."""
        return self.second_label or self.first_label

    def describe(self) -> str:
        step = "?" if self.killed_step is None else f"{self.killed_step} ({STEPS[self.killed_step].name})"
        where = "after it, before Spark's commit" if self.first is None else f"before call {self.first}"
        out = f"killed in step {step} {where}: {self.first_label}"
        if self.double:
            out += f"; again before call {self.second} of its restart and replay: {self.second_label}"
        return out


FAILURE_KINDS = ("lost", "duplicated", "misplaced", "deadletter", "unmarked", "marker changed", "hour changed",
                 "manifest mismatch", "restart failed", "temporaries left", "not killed")
"""What :func:`check_run` and the run itself can find wrong, in the order the table shows them."""


def _observe(p: LocalPipeline) -> dict[str, Any]:
    """Records (id -> sorted (hour, late) places), dead letters, marked hours."""
    places: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    marked = []
    for h, hc in read_sink(p.sink, p.et.name).items():
        for name, data in hc.files.items():
            late = parse_data_file_name(name).late
            for rec in read_avro(data):
                places[str(rec["id"])].append((h, late))
        if hc.marker is not None:
            marked.append(h)
    deadletters = Counter((r["reason"], bytes(r["payload"])) for r in read_deadletter(p.sink, p.et.name))
    return {"places": {k: sorted(v) for k, v in places.items()}, "deadletters": deadletters, "marked": sorted(marked)}


def _marked_folders(p: LocalPipeline) -> dict[int, tuple[bytes, dict[str, bytes]]]:
    """Every marked hour: its marker's bytes, and its folder's other files with their bytes (not the temporaries a
    kill left: the next start removes them, and none may be left at the end, see :func:`run_scenario`)."""
    out = {}
    base = p.sink / p.et.name
    for marker in base.glob(f"dt=*/hour=*/{MARKER_NAME}"):
        folder = marker.parent
        _, h = parse_hour_dir(f"{p.et.name}/{folder.parent.name}/{folder.name}")
        out[h] = (marker.read_bytes(), {f.name: f.read_bytes() for f in folder.iterdir()
                                        if f.name != MARKER_NAME and not is_temporary(f.name)})
    return out


class _Watch:
    """Every marker's bytes and its folder's files when first seen; a later look that differs is a failure."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.seen: dict[int, tuple[bytes, dict[str, bytes]]] = {}

    def look(self, p: LocalPipeline, when: str) -> None:
        now = _marked_folders(p)
        for h, (data, files) in now.items():
            first = self.seen.setdefault(h, (data, files))
            if first[0] != data:
                self.run.fail("marker changed", f"{_hour_text(h)} {when}")
            if first[1] != files:
                before, after = set(first[1]), set(files)
                what = f"-{sorted(before - after)} +{sorted(after - before)}" if before != after else "other bytes"
                self.run.fail("hour changed", f"{_hour_text(h)} {when}: {what}")
        for h in self.seen:
            if h not in now:
                self.run.fail("marker changed", f"{_hour_text(h)} {when}: gone")


def _hour_text(h: int) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(h / 1000, tz=UTC).strftime("%Y-%m-%dT%H")


def _temporaries(*roots: Path) -> list[str]:
    return sorted(str(f) for r in roots if r.is_dir() for f in r.rglob(".*.tmp"))


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}\n" + "".join(traceback.format_exception(err)[-8:])


class _Workdir:
    """Fresh folders for runs: on /dev/shm when it is there."""

    def __init__(self, base: str | None = None) -> None:
        if base is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            base = "/dev/shm"
        self.root = Path(tempfile.mkdtemp(prefix="crash-sweep-", dir=base))
        self.n = 0
        self.et = make_event_type(self.root / "types", **SETTINGS)

    def fresh(self) -> Path:
        self.n += 1
        d = self.root / f"run-{self.n}"
        d.mkdir()
        return d

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


Forks = "set[int] | str | Callable[[int, str], bool] | None"
"""Where to fork killed branches: a set of calls, :data:`ALL`, or ``pred(call, label)``; None: nowhere."""


def run_scenario(tap: FsTap, work: _Workdir, *, first: int | None = None, second: int | None = None,
                 commit_kill: int | None = None, fork_first: Forks = None,
                 fork_second: Callable[[Run], Forks] | None = None, fork_commits: tuple[int, ...] = (),
                 log: bool = False) -> list[Run]:
    """The scenario from scratch, with kills; returns its run (and, forking, every branch's after it).

    Direct kills: before call ``first`` (counted over the whole scenario), then before call ``second`` of the
    restart and the replay of the killed step (counted from the restart); ``commit_kill``: the step after which
    the process dies before Spark's commit.  Forked kills: a branch killed before each call ``fork_first``, one
    killed before Spark's commit after each step of ``fork_commits``, and in each branch's restart and replay a
    branch killed again before each call ``fork_second(branch)``.  The runs are not yet compared with a clean
    run (:func:`check_run`)."""
    run = Run(first=first, second=second)
    root = work.fresh()
    tap.point, tap.points, tap.log, tap.step, tap.branches, tap.depth = "start", [], [] if log else None, "0", [], 0
    tap.arm()
    p = make_pipeline(root, work.et)

    def relocate(to: Path) -> None:
        """The run goes on in the folder ``to`` (a forked branch, in its copy of the folder)."""
        tap.root = p.tmp = to
        p.sink, p.inputs = to / "sink", to / "inputs"
        p.storage = Storage(str(p.sink))
        p.ckpt = Checkpoint(to / "ckpt")
        tap.roots = [(str(p.sink), "sink"), (str(p.ckpt.root), "ckpt"), (str(to), "root")]

    relocate(root)
    tap.relocate, tap.clock = relocate, p.clock
    assert tap.calls == 0, "a new pipeline touches nothing before its first batch"
    tap.arm(kill_at=first, fork_at=fork_first)
    watch = _Watch(run)
    replaying = False  # counting the calls of a restart and its replay (where a second kill lands)

    def lost_child(k: int, label: str, status: int) -> Run:
        lost = Run(first=k, first_label=label, killed_step=int(tap.step)) if not replaying else \
            Run(first=run.first, first_label=run.first_label, killed_step=run.killed_step, second=k, second_label=label)
        lost.fail("restart failed", f"the branch died without reporting (wait status {status})")
        return lost

    tap.lost_child = lost_child

    def killed(i: int, where: str) -> None:
        """The process died (in step ``i`` or its restart): what was killed, and what may kill it next."""
        nonlocal run, replaying
        tap.dead = False
        if tap.forked is not None:  # this process is the branch just forked off: a run of its own
            k, label = tap.forked
            tap.forked = None
            if run.killed_step is None:
                run = watch.run = Run(first=k, first_label=label, killed_step=i)
                replaying = True
                tap.arm(fork_at=fork_second(run) if fork_second else None)
            else:
                run = watch.run = Run(first=run.first, first_label=run.first_label, killed_step=run.killed_step,
                                      second=k, second_label=label)
                replaying = False
                tap.arm()
        elif run.killed_step is None:
            run.killed_step, run.first_label, replaying = i, tap.killed, True
            tap.arm(kill_at=second)
        else:
            run.second_label, replaying = tap.killed, False
            tap.arm()
        watch.look(p, where)

    def recover(i: int) -> bool:
        """A new controller on the same checkpoint, as after a process restart (a second kill may land in it)."""
        while True:
            tap.point = "restart"
            try:
                restart(p)
                return True
            except Killed:
                killed(i, f"after the second kill, in the restart after step {i}")
            except Exception as err:  # noqa: BLE001 - the finding
                run.fail("restart failed", f"restart after the kill in step {i}: {_error(err)}")
                return False

    def finish() -> list[Run]:
        runs = [run]
        if tap.child_pipe is None:
            runs += tap.branches
        else:  # a branch: report (with its own branches) and end here
            tap.report(runs + tap.branches)
        return runs

    i = 0
    try:
        while i < len(STEPS):
            tap.step = str(i)
            try:
                STEPS[i].run(p)
            except Killed:
                killed(i, f"after the kill in step {i}")
                if not recover(i):
                    return finish()
                continue  # Spark replays the batch; a tick or a drain runs again
            if replaying:
                run.replay_calls, replaying = tap.calls, False
                tap.arm()
            elif run.killed_step is None and (i == commit_kill or i in fork_commits):
                # the step returned; the process dies before Spark commits the batch
                label = f"{tap.point} | before Spark's commit"
                try:
                    if i == commit_kill:
                        tap.off += 1
                        try:
                            tap.relocate(tap._copy_of_root())  # as a forked branch does
                        finally:
                            tap.off -= 1
                        raise Killed(label)
                    tap.fork_kill(-1, label)
                except Killed:
                    if tap.forked is not None:
                        tap.forked = None
                        run = watch.run = Run(killed_step=i)
                        tap.arm(fork_at=fork_second(run) if fork_second else None)
                    else:
                        tap.arm(kill_at=second)
                    run.killed_step, run.first_label, replaying = i, label, True
                    watch.look(p, f"after step {i}, killed before Spark's commit")
                    if not recover(i):
                        return finish()
                    continue
            watch.look(p, f"after step {i}")
            i += 1
        if first is not None and run.killed_step is None:
            run.fail("not killed", f"call {first} was never reached")
        if second is not None and run.second_label is None:
            run.fail("not killed", f"replay call {second} was never reached")
        watch.look(p, "at the end")
        run.sink = _observe(p)
        left = _temporaries(p.sink, p.ckpt.root)
        if left:
            run.fail("temporaries left", ", ".join(os.path.relpath(f, p.tmp) for f in left))
        for h in run.sink["marked"]:
            try:
                check_manifest_matches_folder(p.sink, p.et.name, h)
            except AssertionError as err:
                run.fail("manifest mismatch", f"{_hour_text(h)}: {err}")
    except Exception as err:  # noqa: BLE001 - a step after a kill failed: the finding
        run.fail("restart failed", f"step {i} ({STEPS[i].name if i < len(STEPS) else '-'}): {_error(err)}")
    except BaseException as err:
        if tap.child_pipe is None:
            raise
        run.fail("restart failed", f"the branch ended with {_error(err)}")
    finally:
        run_log = tap.log
        tap.arm()
        tap.log = None
        tap.points_seen = tap.points
    run.log = run_log
    return finish()


def check_run(run: Run, ref: Run) -> Run:
    """Compare a run that ended with the clean run (records by id, places, dead letters, marked hours)."""
    if not run.sink:
        return run
    want, got = ref.sink["places"], run.sink["places"]
    lost = sorted(set(want) - set(got))
    if lost:
        run.fail("lost", ", ".join(lost))
    dup = sorted(i for i, pl in got.items() if len(pl) > 1)
    if dup:
        run.fail("duplicated", ", ".join(f"{i} x{len(got[i])} ({_places(got[i])})" for i in dup))
    extra = sorted(set(got) - set(want))
    if extra:
        run.fail("misplaced", "not in the clean run: " + ", ".join(extra))
    moved = [i for i in sorted(set(want) & set(got)) if len(got[i]) == 1 and got[i] != want[i]]
    if moved:
        run.fail("misplaced", ", ".join(f"{i}: {_places(got[i])} instead of {_places(want[i])}" for i in moved))
    if run.sink["deadletters"] != ref.sink["deadletters"]:
        a, b = ref.sink["deadletters"], run.sink["deadletters"]
        run.fail("deadletter", f"missing {dict(a - b)}, extra {dict(b - a)}")
    unmarked = sorted(set(ref.sink["marked"]) - set(run.sink["marked"]))
    if unmarked:
        run.fail("unmarked", ", ".join(map(_hour_text, unmarked)))
    return run


def _places(pl: list[tuple[int, bool]]) -> str:
    return ", ".join(f"{_hour_text(h)}{' late' if late else ''}" for h, late in pl)


# -- the sweep ------------------------------------------------------------------------------------------------------
class Sweep:
    """The tap installed, a work folder, and the clean run of the scenario (the reference, with every call)."""

    def __init__(self, base: str | None = None) -> None:
        self.tap = FsTap()
        self.work = _Workdir(base)
        self.tap.install()
        try:
            (ref,) = run_scenario(self.tap, self.work, log=True)
            if ref.failures:
                raise AssertionError(f"the clean run of the scenario fails its own checks: {ref.failures}")
            twice = {i: pl for i, pl in ref.sink["places"].items() if len(pl) != 1}
            if twice:
                raise AssertionError(f"the clean run of the scenario holds records more than once: {twice}")
            self.ref = ref
            self.points = list(self.tap.points_seen)
            self.calls = [Call(k, int(step), label, clock) for k, (step, label, clock) in enumerate(ref.log or [])]
        except BaseException:
            self.close()
            raise
        self.commit_steps = tuple(i for i, s in enumerate(STEPS) if s.commits)

    def windows(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = {}
        for c in self.calls:
            out.setdefault(c.label, []).append(c)
        return out

    def branch(self, fork_first: Forks, fork_second: Callable[[Run], Forks] | None = None,
               fork_commits: tuple[int, ...] = (), on_report: Callable[[list[Run]], None] | None = None) -> list[Run]:
        """Forked kills (see :func:`run_scenario`), each branch compared with the clean run."""
        self.tap.on_report = on_report
        try:
            trunk, *branches = run_scenario(self.tap, self.work, fork_first=fork_first, fork_second=fork_second,
                                            fork_commits=fork_commits)
        finally:
            self.tap.on_report = None
        if trunk.failures:
            raise AssertionError(f"the trunk of the branches failed: {trunk.failures}")
        return [check_run(b, self.ref) for b in branches]

    def single(self, k: int) -> Run:
        """A direct kill before call ``k`` (to reproduce one)."""
        (run,) = run_scenario(self.tap, self.work, first=k)
        return check_run(run, self.ref)

    def double(self, k: int, j: int) -> Run:
        (run,) = run_scenario(self.tap, self.work, first=k, second=j)
        return check_run(run, self.ref)

    def before_commit(self, step: int, j: int | None = None) -> Run:
        (run,) = run_scenario(self.tap, self.work, commit_kill=step, second=j)
        return check_run(run, self.ref)

    def close(self) -> None:
        self.tap.uninstall()
        self.work.close()

    def __enter__(self) -> Sweep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def equivalent_kill(calls: list[Call], k: int) -> int:
    """The call whose kill leaves what a kill before call ``k`` leaves: ``k`` itself, or for an ``fsync`` the next
    call of the same step on the same clock (a process kill cannot tell whether a file or folder was synced: that is
    a power cut's question, tests/test_power_loss.py's; nothing else touches the disk in between)."""
    while calls[k].fsync and k + 1 < len(calls) and (calls[k + 1].step, calls[k + 1].clock) == \
            (calls[k].step, calls[k].clock):
        k += 1
    return k


def every_window(sw: Sweep, *, replay_only: bool = False, fsync_equivalent: bool = False,
                 on_report: Callable[[list[Run]], None] | None = None) -> list[Run]:
    """The quick sweep: every window killed once (at its last call: the shortest branch), a kill before Spark's
    commit after every batch, and in their restarts and replays every window killed again once (the first time
    a branch reaches it; the branches run in call order, each knowing what the ones before it covered).
    ``replay_only``: only the windows no single kill reaches (a restart's, a replay's own) are killed again.
    ``fsync_equivalent``: a window of an ``fsync`` is killed at its :func:`equivalent_kill` (a third fewer runs)."""
    last = {c.label: c.k for c in sw.calls}
    firsts = {equivalent_kill(sw.calls, k) for k in last.values()} if fsync_equivalent else set(last.values())
    covered: set[str] = set(last) if replay_only else set()

    def again(run: Run) -> Forks:
        def new_window(j: int, label: str) -> bool:
            if label in covered:
                return False
            covered.add(label)  # in this branch (the next ones learn it from its report)
            return True

        return new_window

    def reported(runs: list[Run]) -> None:
        covered.update(r.second_label for r in runs if r.double)
        if on_report is not None:
            on_report(runs)

    return sw.branch(firsts, again, sw.commit_steps, reported)


def double_kill_sample(calls: list[Call], every: int = 7) -> set[int]:
    """First kills to kill again during their replay: the first call of each window, and every ``every``-th call."""
    firsts: dict[str, int] = {}
    for c in calls:
        firsts.setdefault(c.label, c.k)
    return set(firsts.values()) | {c.k for c in calls if c.k % every == 0}


# -- script mode ------------------------------------------------------------------------------------------------------
SHORT = {"lost": "lost", "duplicated": "dup", "misplaced": "place", "deadletter": "dl", "unmarked": "unmk",
         "marker changed": "mchg", "hour changed": "hchg", "manifest mismatch": "mfst", "restart failed": "rstrt",
         "temporaries left": "tmp", "not killed": "nokil"}


def table(runs: list[Run]) -> str:
    """Per window (of the last kill): kills, double kills, and failures of each kind."""
    rows: dict[str, dict[str, Any]] = {}
    for run in runs:
        row = rows.setdefault(run.window or "?", {"steps": set(), "kills": 0, "double": 0,
                                                  **dict.fromkeys(FAILURE_KINDS, 0)})
        row["double" if run.double else "kills"] += 1
        if run.killed_step is not None:
            row["steps"].add(run.killed_step)
        for kind in run.failures:
            row[kind] += 1
    legend = ("steps: the steps killed; kills: runs killed there once; dbl: runs killed there again, in the restart "
              "and replay after a kill; then runs that failed, by kind: lost, dup(licated), place (misplaced), dl "
              "(dead letters differ), unmk (hour left unmarked), mchg (marker changed), hchg (a marked hour's files "
              "changed), mfst (manifest does not match its folder), rstrt (a restart or a later step raised), tmp "
              "(temporaries left), nokil (the kill point was never reached)")
    width = max([len(w) for w in rows] + [6])
    head = f"{'window':<{width}}  {'steps':<11} {'kills':>5} {'dbl':>5} " + " ".join(f"{SHORT[k]:>5}"
                                                                                    for k in FAILURE_KINDS)
    lines = [textwrap.fill(legend, len(head)), "", head, "-" * len(head)]
    for w in sorted(rows, key=lambda w: (min(rows[w]["steps"] or {99}), w)):
        r = rows[w]
        steps = ",".join(map(str, sorted(r["steps"])))
        lines.append(f"{w:<{width}}  {steps:<11} {r['kills']:>5} {r['double']:>5} "
                     + " ".join(f"{r[k] or '.':>5}" for k in FAILURE_KINDS))
    lines.append("-" * len(head))
    lines.append(f"{'total':<{width}}  {'':<11} {sum(r['kills'] for r in rows.values()):>5} "
                 f"{sum(r['double'] for r in rows.values()):>5} "
                 + " ".join(f"{sum(r[k] for r in rows.values()) or '.':>5}" for k in FAILURE_KINDS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sweeps.crash_sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="kill again at every call of the replay of every kill")
    ap.add_argument("--every", type=int, default=7, help="without --all: kill again during the replay of every "
                                                         "Nth kill and of the first kill of each window (default 7)")
    ap.add_argument("--no-double", action="store_true", help="single kills only")
    ap.add_argument("--quick", action="store_true", help="every window once, and every window of a replay once "
                                                         "(see every_window)")
    ap.add_argument("--replay-only", action="store_true", help="with --quick: kill again only in the windows of a "
                                                               "replay that no single kill reaches, and an fsync's "
                                                               "window at its equivalent kill (what "
                                                               "tests/test_crash_sweep.py runs)")
    ap.add_argument("--failures", type=int, default=30, help="show at most this many failed runs in full")
    ap.add_argument("--repro", nargs="+", metavar=("K", "J"),
                    help="one direct run: killed before call K (c<step>: before the commit of a step), and before "
                         "call J of its restart and replay; its failures in full")
    args = ap.parse_args(argv)
    started = time.monotonic()
    with Sweep() as sw:
        n = len(sw.calls)
        print(f"clean run: {n} file-system calls, {len(sw.windows())} windows, fault points reached: "
              f"{dict(Counter(sw.points))}", flush=True)
        if args.repro:
            j = int(args.repro[1]) if len(args.repro) > 1 else None
            if args.repro[0].startswith("c"):
                run = sw.before_commit(int(args.repro[0][1:]), j)
            else:
                run = sw.single(int(args.repro[0])) if j is None else sw.double(int(args.repro[0]), j)
            print(run.describe())
            for kind, details in run.failures.items():
                for d in details:
                    print(f"  {kind}: {d}")
            return 1 if run.failures else 0
        done = {"runs": 0, "failed": 0, "shown": 0.0}

        def progress(runs: list[Run]) -> None:
            """Failures as they come, and every 30 s how far the sweep is."""
            done["runs"] += len(runs)
            for run in runs:
                if run.failures:
                    done["failed"] += 1
                    print(f"FAILED: {run.describe()}: {sorted(run.failures)}", flush=True)
            if time.monotonic() - done["shown"] > 30:
                done["shown"] = time.monotonic()
                print(f"  ... {done['runs']} runs, {done['failed']} failed, {done['shown'] - started:.0f} s "
                      f"(first kill at call {runs[0].first} of {n})", flush=True)

        if args.quick:
            runs = every_window(sw, replay_only=args.replay_only, fsync_equivalent=args.replay_only, on_report=progress)
            again = None
        elif args.no_double:
            again = None
        elif args.all:
            def again(run: Run) -> Forks:
                return ALL
        else:
            sample = double_kill_sample(sw.calls, args.every)

            def again(run: Run) -> Forks:
                return ALL if run.first is None or run.first in sample else None
        if not args.quick:
            runs = sw.branch(ALL, again, sw.commit_steps, progress)
        elapsed = time.monotonic() - started
    singles = [r for r in runs if not r.double]
    doubles = [r for r in runs if r.double]
    failed = [r for r in runs if r.failures]
    print(f"{len(runs)} crash runs ({len(singles)} single kills, {len(doubles)} double kills after "
          f"{len({(r.first, r.killed_step) for r in doubles})} of them) in {elapsed:.1f} s; windows: "
          f"{len({r.first_label for r in singles})} of single kills, {len({r.second_label for r in doubles})} of "
          f"double kills, {len({r.window for r in runs})} in all; {len(failed)} runs failed\n")
    print(table(runs))
    for run in failed[:args.failures]:
        print(f"\nFAILED: {run.describe()}")
        for kind, details in run.failures.items():
            for d in details:
                print(f"  {kind}: {d}")
    if len(failed) > args.failures:
        print(f"\n... and {len(failed) - args.failures} more")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
