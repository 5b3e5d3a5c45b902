"""Measuring a command: wall time, CPU seconds and peak memory of its whole process tree (JVM and Python workers).

Memory is sampled every ``interval`` seconds over the process and all its descendants,
two ways:

- **RSS**, summed over the tree: what ``ps`` shows.  Pages shared between processes (the
  Python workers Spark forks from one daemon share most of theirs) count once per process,
  so the sum overstates the tree's footprint.
- **PSS** (proportional set size), summed: a page shared by ``n`` processes counts ``1/n``
  in each, so the sum is what the tree really holds in memory.  Where the kernel does not
  provide it, PSS is reported as 0.

CPU seconds (user + system) are two lower bounds, of which the larger is reported: the sum
over every process seen of its own CPU time at its last sample (a process born and gone
between two samples is missed, the last ``interval`` of each process too), and the CPU time
of the command's reaped descendants as the kernel accounts it when the command ends (what
``/usr/bin/time`` shows; it misses descendants whose parent never waited for them).
"""

from __future__ import annotations

import resource
import subprocess
import threading
import time
from collections.abc import Callable

import psutil

__all__ = ["TreeSample", "sample_tree", "run_measured"]


class TreeSample:
    """One look at a process tree: per process its pid, command line, RSS, PSS and CPU seconds."""

    __slots__ = ("at", "procs")

    def __init__(self, at: float, procs: list[dict]) -> None:
        self.at = at
        self.procs = procs

    @property
    def rss(self) -> int:
        return sum(p["rss"] for p in self.procs)

    @property
    def pss(self) -> int:
        return sum(p["pss"] for p in self.procs)


def _pss(p: psutil.Process) -> int:
    try:
        return int(getattr(p.memory_full_info(), "pss", 0) or 0)
    except (psutil.AccessDenied, NotImplementedError, OSError):
        return 0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sample_tree(root: psutil.Process, *, with_cmdline: bool = False, with_pss: bool = True) -> TreeSample | None:
    """Sample ``root`` and its descendants; ``None`` once the root is gone."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    out = []
    for p in procs:
        try:
            with p.oneshot():
                ct = p.cpu_times()  # its own time only: reaped children are counted where they were seen
                row = {"pid": p.pid, "rss": p.memory_info().rss, "cpu": ct.user + ct.system}
                if with_cmdline:
                    row["cmdline"] = " ".join(p.cmdline())
                    row["ppid"] = p.ppid()
            row["pss"] = _pss(p) if with_pss else 0
            out.append(row)
        except psutil.Error:
            pass
    return TreeSample(time.monotonic(), out)


def run_measured(cmd: list[str], *, env=None, cwd=None, interval: float = 0.1,
                 on_line: Callable[[float, str], None] | None = None, pss: bool = True) -> dict:
    """Run ``cmd`` to its end, sampling its process tree.

    Returns ``wall`` (s), ``cpu`` (s), ``peak_rss`` and ``peak_pss`` (bytes, of the tree's
    sum; ``peak_pss`` None without ``pss``), ``returncode`` and ``output`` (stdout and stderr
    interleaved).  ``on_line(t, line)`` is called for every output line with its monotonic time,
    as it arrives.

    PSS costs the sampler: the kernel walks every page of every process of the tree for it, ~17 ms
    a sample of a Spark job's tree on 2 cores, 1.3 s of CPU over a 9-s run, taken from the run
    measured (its batch ~10 % slower).  Runs that measure speed pass ``pss=False`` (RSS and CPU
    times are cheap to read); memory is then measured in runs of its own.
    """
    t0 = time.monotonic()
    before = _children_cpu()
    from bench.livejob import start_child, stop_child

    proc = start_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True)
    out_lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            out_lines.append(line)
            if on_line is not None:
                on_line(time.monotonic(), line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    root = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    cpu: dict[int, float] = {}
    try:
        while proc.poll() is None:
            s = sample_tree(root, with_pss=pss)
            if s is None:
                break
            peak_rss = max(peak_rss, s.rss)
            peak_pss = max(peak_pss, s.pss)
            for p in s.procs:
                cpu[p["pid"]] = max(cpu.get(p["pid"], 0.0), p["cpu"])
            time.sleep(interval)
    except BaseException:  # Ctrl-C (the child, in a session of its own, did not get it): stop it, then go
        stop_child(proc, timeout=60)
        raise
    proc.wait()
    reader.join()
    wall = time.monotonic() - t0
    return {"wall": wall, "cpu": max(sum(cpu.values()), _children_cpu() - before),
            "peak_rss": peak_rss, "peak_pss": peak_pss if pss else None,
            "returncode": proc.returncode, "output": "".join(out_lines)}
