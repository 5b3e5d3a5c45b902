"""Measuring a command: wall time, CPU seconds and peak memory of its whole process tree (JVM and Python workers)."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil


def run_measured(cmd: list[str], *, env=None, cwd=None, interval: float = 0.1) -> dict:
    """Run ``cmd``; sample the RSS of it and all its descendants.  Returns wall, cpu, peak_rss, output."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True)
    peak = 0
    cpu: dict[int, float] = {}
    out_lines: list[str] = []
    reader = threading.Thread(target=lambda: out_lines.extend(proc.stdout), daemon=True)
    reader.start()
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                ct = p.cpu_times()
                cpu[p.pid] = ct.user + ct.system + ct.children_user + ct.children_system
            except psutil.Error:
                pass
        peak = max(peak, rss)
        time.sleep(interval)
    reader.join()
    wall = time.monotonic() - t0
    return {"wall": wall, "cpu": sum(cpu.values()), "peak_rss": peak, "returncode": proc.returncode,
            "output": "".join(out_lines)}
