"""Reading ``py-spy record --native --format raw`` output: samples summed into categories of work.

A raw (collapsed) py-spy file has one line per distinct stack, ``root;...;leaf COUNT``, each
frame ``function (file:line)`` or, for native code without symbols, ``0xADDR (library.so)``.
A sample is put in the category of the frame **nearest its leaf** that a category
recognises: time in ``Py_DECREF`` under fastavro's ``_write.c`` is Avro encoding, time in
``libc`` under ``cramjam`` is snappy compression, time in the interpreter under
``payload.py`` is the Python side of validation.  So C extensions (orjson, fastavro,
cramjam, hashlib) count as what they do, not as their Python caller.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable

__all__ = ["CATEGORIES", "read_raw", "categorize", "by_process"]

_Test = Callable[[str], bool]


def _any(*needles: str) -> _Test:
    return lambda frame: any(n in frame for n in needles)


# In order of precedence for one frame; the frame nearest the leaf that matches any of them decides.
CATEGORIES: list[tuple[str, _Test]] = [
    ("garbage collector", _any("gc_collect", "gc_collect_main")),
    ("JSON parsing (orjson)", _any("orjson")),
    ("validation: fastavro validate", _any("_validation", "fastavro/validation")),
    ("Avro encoding (fastavro writer)", _any("fastavro/_write", "_write.c", "_write.cpython", "_logical_writers",
                                             "fastavro/write")),
    ("snappy compression (cramjam)", _any("cramjam")),
    ("sha256", _any("sha256", "hashlib", "libcrypto")),
    ("dedupe keys (xxhash, numpy rows)", _any("xxhash", "dedupe.py", "numpy")),
    ("JVM <-> Python transfer (pyspark worker, Arrow)", _any("pyspark/", "pyarrow", "serializers", "py4j")),
    ("validation: event_etl payload checks", _any("payload.py")),
    ("judging (rules)", _any("/rules/")),
    ("reading input lines", _any("_file_lines", "iter_payloads")),
    ("file system (storage, fsspec, os)", _any("storage.py", "fsspec", "checkpoint.py", "posixpath", "shutil")),
    ("event_etl driver (controller, ledger, markers)", _any("driver.py", "runner.py", "manifest.py", "lease.py",
                                                           "metrics.py", "progress.py")),
    ("executor loop (executor.py own code)", _any("executor.py")),
]

_LINE = re.compile(r"^(.*) (\d+)$")


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """``[(frames root..leaf, samples)]`` of a py-spy raw file."""
    out = []
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if m:
            out.append((m.group(1).split(";"), int(m.group(2))))
    return out


def category_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, test in CATEGORIES:
            if test(frame):
                return name
    return "other (interpreter, start-up, unattributed)"


def categorize(stacks: Iterable[tuple[list[str], int]]) -> Counter:
    """Samples per category."""
    out: Counter = Counter()
    for frames, n in stacks:
        out[category_of(frames)] += n
    return out


def by_process(stacks: Iterable[tuple[list[str], int]]) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks grouped by process, for ``py-spy --subprocesses`` files (whose root frame names the process)."""
    out: dict[str, list[tuple[list[str], int]]] = {}
    for frames, n in stacks:
        root = frames[0] if frames and frames[0].startswith("process ") else "process"
        out.setdefault(root, []).append((frames, n))
    return out
