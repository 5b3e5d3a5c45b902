"""What the figures were measured on: CPU, cores, memory, OS, Python, Spark, Java, the code's version.

Benchmark figures mean little without the machine, so every results section starts with
this description.  Everything is read locally (``/proc``, ``java -version``, ``git
rev-parse``); nothing is changed.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import psutil

__all__ = ["describe", "load_average", "ROOT"]

ROOT = Path(__file__).resolve().parent.parent


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))}, kernel {platform.release()}"
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}"


def _java_version() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else "java"
    try:
        r = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    lines = (r.stderr or r.stdout).splitlines()
    return lines[0].strip() if lines else "unknown"


def _git_version() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "event_etl"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{head}{' + uncommitted changes in event_etl/' if dirty else ''}" if head else "unknown"


def load_average() -> float:
    """The 1-minute load average: other work on the machine makes every figure noisier."""
    return os.getloadavg()[0]


def describe() -> dict[str, str]:
    """The machine and software the figures were measured on, as label -> text."""
    import pyspark

    from event_etl import __version__

    mem = psutil.virtual_memory().total
    return {
        "CPU": f"{_cpu_model()}, {os.cpu_count()} logical cores",
        "memory": f"{mem / 2**30:.1f} GiB",
        "OS": _os_name(),
        "Python": platform.python_version(),
        "Spark": f"PySpark {pyspark.__version__}",
        "Java": _java_version(),
        "event_etl": f"{__version__} (git {_git_version()})",
    }
