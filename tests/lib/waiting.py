"""How a test waits: :func:`wait_until`, a predicate polled until it holds, failing with what it waited for, why it
gave up (a process that exited, the end of a log) and the last value it saw.  It is the one way a test waits for
something."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "the condition", *,
               proc: subprocess.Popen | None = None, log: Path | None = None, poll: float = 0.05) -> T:
    """``predicate()``'s first truthy value, asked every ``poll`` seconds for at most ``timeout`` seconds.

    Fails (``AssertionError``) on time out, or at once when ``proc`` has exited (a job that died is not waited on
    for minutes); the message names ``what`` and ends with ``proc``'s output or the last 3,000 characters of
    ``log``, whichever the test gave."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job exited ({proc.returncode}) before {what}{_tail(proc, log)}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r}){_tail(proc, log)}")
        time.sleep(poll)


def _tail(proc: subprocess.Popen | None, log: Path | None) -> str:
    if log is not None and log.exists():
        return ":\n" + log.read_text(errors="replace")[-3000:]
    if proc is not None and proc.stdout is not None and proc.poll() is not None:
        out = proc.stdout.read()
        return ":\n" + (out.decode(errors="replace") if isinstance(out, bytes) else out)[-3000:]
    return ""
