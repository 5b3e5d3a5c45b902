"""Reading ``py-spy record --native --format raw`` output: samples summed into categories of work.

A raw (collapsed) py-spy file has one line per distinct stack, ``root;...;leaf COUNT``, each
frame ``function (file:line)`` or, for native code without symbols, ``0xADDR (library.so)``.
A sample is put in the category of the frame **nearest its leaf** that a category
recognises: time in ``Py_DECREF`` under fastavro's ``_write.c`` is Avro encoding, time in
``libc`` under ``cramjam`` is snappy compression, time in the interpreter under
``payload.py`` is the Python side of validation.  So C extensions (orjson, fastavro,
cramjam, hashlib) count as what they do, not as their Python caller.  A stack inside an
import is start-up, whatever the module imported does.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["CATEGORIES", "WAITING", "IMPORTS", "py_spy", "read_raw", "categorize"]

_Test = Callable[[str], bool]


def _any(*needles: str) -> _Test:
    return lambda frame: any(n in frame for n in needles)


# In order of precedence for one frame; the frame nearest the leaf that matches any of them decides.
# py-spy also samples threads blocked in a read or a wait; those samples are "waiting", not work.
WAITING = "waiting (socket reads, py4j calls, locks, sleep)"
CATEGORIES: list[tuple[str, _Test]] = [
    (WAITING, _any("socket.py", "readinto", "readline", "select", "threading.py", "sleep", "read_int",
                   "_read_with_length", "awaitTermination", "clientserver.py", "java_gateway.py", "sock_recv",
                   "recv_into", "poll (")),
    ("garbage collector", _any("gc_collect", "gc_collect_main")),
    ("JSON parsing (orjson)", _any("orjson")),
    ("validation: fastavro validate", _any("_validation", "fastavro/validation")),
    ("Avro encoding (fastavro writer)", _any("fastavro/_write", "_write.c", "_write.cpython", "_logical_writers",
                                             "fastavro/write")),
    ("snappy compression (cramjam)", _any("cramjam")),
    ("sha256", _any("sha256", "hashlib", "libcrypto")),
    ("dedupe keys (xxhash)", _any("xxhash", "dedupe.py", "key_hash")),
    ("fast path: JSON parsing (Arrow)", _any("arrow::json", "pyarrow/_json", "read_json", "rapidjson")),
    ("fast path: columnar checks and Avro encoding (Arrow compute, numpy)",
     _any("fastpath.py", "arrow::compute", "pyarrow/compute", "_compute", "numpy")),
    ("Arrow buffers (take, slices) and, under Spark, the JVM <-> Python transfer",
     _any("pyspark/", "pyarrow", "libarrow", "arrow::", "serializers", "py4j")),
    ("validation: event_etl payload checks", _any("payload.py")),
    ("judging (rules)", _any("/rules/")),
    ("reading input lines", _any("sources/read.py", "_file_lines", "_file_chunks", "_chunk_lines")),
    # before the file system: filling the files of a split in memory (storage/rolling.py, moved out of
    # executor.py) is the executor loop, not storage I/O
    ("executor loop (executor.py own code)", _any("executor.py", "storage/rolling.py")),
    ("file system (storage, fsspec, os)", _any("/storage/", "fsspec", "checkpoint.py", "posixpath", "shutil")),
    ("event_etl driver (controller, ledger, markers)", _any("controller.py", "runner.py", "manifest.py", "lease.py",
                                                           "/metrics/", "progress.py")),
]

_LINE = re.compile(r"^(.*) (\d+)$")


def py_spy() -> str:
    """The ``py-spy`` of this virtualenv (or on PATH), or an error saying how to install it."""
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    found = shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy (it is in the `test` extra)")
    return found


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """``[(frames root..leaf, samples)]`` of a py-spy raw file."""
    out = []
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if m:
            out.append((m.group(1).split(";"), int(m.group(2))))
    return out


IMPORTS = "Python start-up (imports)"


def category_of(frames: list[str]) -> str:
    """The category of one stack: imports if it is inside one, else the frame nearest the leaf that a category knows."""
    if any("importlib._bootstrap" in f for f in frames):
        return IMPORTS
    for frame in reversed(frames):
        for name, test in CATEGORIES:
            if test(frame):
                return name
    return "other (interpreter, unattributed)"


def categorize(stacks: Iterable[tuple[list[str], int]]) -> Counter:
    """Samples per category."""
    out: Counter = Counter()
    for frames, n in stacks:
        out[category_of(frames)] += n
    return out
