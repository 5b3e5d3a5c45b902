"""A live ``event-etl run`` as a child process: its output lines with the wall time they arrived, and a clean stop.

Used by the live benchmarks (latency, memory).  The job prints a line per micro-batch
(``[type] batch N: in X ... watermark W ... Ys``); :class:`LiveJob` keeps every line with the
``time.time()`` it was read, so a benchmark can tell when a batch ended, and can wait for a
line with a deadline instead of sleeping and hoping.  ``stop()`` sends SIGTERM, which makes
the job stop at the next batch boundary and *drain* (mark every hour holding data).

Every child of a benchmark (a job, the baseline) is started by :func:`start_child`: in a
session of its own, so that Ctrl-C in the terminal reaches the benchmark only, which then
stops its child with exactly one signal (a second one would make event-etl stop at once,
see event_etl/job/stopping.py); and, on Linux, with SIGTERM as its parent-death signal, so a
benchmark that dies without cleaning up (SIGKILL, SIGTERM to it alone) still leaves its job
a SIGTERM to drain on.  :func:`run_main` turns a benchmark's own Ctrl-C into one line and
exit code 130 once its ``finally`` blocks have stopped what it started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from re import Pattern

__all__ = ["LiveJob", "event_etl_command", "BATCH_LINE", "start_child", "stop_child", "kill_tree", "run_main"]

BATCH_LINE = re.compile(r"\] batch (\d+)(?: \(replay\))?: in ([\d,]+) ")


def event_etl_command(event_type: str, *, source: str, sink: Path, checkpoint: Path, master: str,
                      trigger_interval: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The ``event-etl run`` command line of a live job (no ``--once``)."""
    return [str(Path(sys.executable).with_name("event-etl")), "run", event_type, "--source", source,
            "--sink", str(sink), "--checkpoint", str(checkpoint), "--master", master,
            "--trigger-interval", trigger_interval, "--drain-on-stop", *extra]  # SIGTERM: stop and drain


def _term_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_child(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """A benchmark's child process: a session of its own, SIGTERM when the benchmark dies (see the module)."""
    return subprocess.Popen(cmd, start_new_session=True,
                            preexec_fn=_term_with_parent if sys.platform.startswith("linux") else None, **popen_kwargs)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (a job's JVM runs in a session of its own)."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def stop_child(proc: subprocess.Popen, *, timeout: float = 180.0) -> int:
    """One SIGTERM (event-etl: stop at the batch boundary and drain), then wait;
    SIGKILL the tree after ``timeout`` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        return proc.wait()


def run_main(main) -> None:
    """Run a benchmark's ``main``; Ctrl-C ends it with one line and exit code 130 (its children were stopped)."""
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: the benchmark stopped what it had started", file=sys.stderr)
        raise SystemExit(130) from None


class LiveJob:
    """A running job; ``lines`` is ``[(wall_time, text)]`` of everything it printed so far."""

    def __init__(self, cmd: list[str], *, log: Path | None = None) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
        self.proc = start_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._log = open(log, "w") if log else None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            now = time.time()
            if self._log:
                self._log.write(f"{now:.3f} {line}")
                self._log.flush()
            with self._cond:
                self.lines.append((now, line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, pattern: Pattern[str] | str, *, timeout: float) -> tuple[float, str]:
        """The first line matching ``pattern``, waiting up to ``timeout`` s; fails if the job ends or time runs out."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for t, line in self.lines[seen:]:
                    if rx.search(line):
                        return t, line
                seen = len(self.lines)
                if not self.running() and not self._reader.is_alive():
                    raise SystemExit(f"the job ended (exit code {self.proc.returncode}) before printing "
                                     f"{rx.pattern!r}:\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit(f"no line matching {rx.pattern!r} within {timeout:.0f} s:\n{self.tail()}")
                self._cond.wait(min(left, 1.0))

    def events_in(self) -> int:
        """Events the job has read so far: the sum of ``in X`` over its batch lines."""
        with self._cond:
            return sum(int(m.group(2).replace(",", "")) for _, line in self.lines
                       if (m := BATCH_LINE.search(line)))

    def wait_events(self, n: int, *, timeout: float) -> bool:
        """Wait until the job has read ``n`` events; ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        while self.events_in() < n:
            if time.monotonic() > deadline or not self.running():
                return False
            time.sleep(0.2)
        return True

    def stop(self, *, timeout: float = 180.0) -> int:
        """SIGTERM (stop at a batch boundary and drain), then wait; SIGKILL the job's tree after ``timeout`` s."""
        stop_child(self.proc, timeout=timeout)
        self._reader.join(timeout=10)
        if self._log:
            self._log.close()
        return self.proc.returncode

    def _kill_tree(self) -> None:
        """SIGKILL the job and everything it started."""
        kill_tree(self.proc.pid)
        self.proc.wait()

    def tail(self, n: int = 30) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines[-n:])
