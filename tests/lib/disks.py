"""Real small file systems for the tests of what a full disk does: a tmpfs of a few pages, mounted for one test.

A tmpfs that runs out of room behaves as any full disk does: a write that does not fit writes what fits and
returns the count (a short write), the next one fails with ``ENOSPC``.  Mounting needs root (or CAP_SYS_ADMIN),
which CI has; elsewhere the test fails with the reason, it does not skip.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["small_disk", "fill", "free_bytes"]


@contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``path`` for the ``with`` block."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                           capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.fail("`mount` was not found: these tests fill a real (tmpfs) disk; install util-linux's mount")
    if r.returncode:
        pytest.fail(f"could not mount a {size}-byte tmpfs at {path}: {r.stderr.strip() or r.returncode}; these tests "
                    "fill a real disk: run them as root (CI does), or in a container with CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int = 0, name: str = "ballast") -> Path:
    """Fill the file system of ``path`` with a file ``name``, leaving about ``leave`` bytes free (page-rounded)."""
    ballast = path / name
    chunk = b"\xee" * 4096
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    if leave:
        size = ballast.stat().st_size
        os.truncate(ballast, max(0, size - leave))
    return ballast
