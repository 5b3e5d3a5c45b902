"""How every long-running command of event_etl stops: one protocol, whatever sends the signal.

A terminal's Ctrl-C (SIGINT to the foreground process group), ``systemctl stop`` (SIGTERM to
every process of the unit), ``timeout`` and ``kill -- -PGID`` (the whole group), Kubernetes and
``docker stop`` (SIGTERM to the main process only) and a closing terminal (SIGHUP) all end up
here, and mean the same thing whichever processes they reach.  For a streaming job
(``event-etl run``, a fleet, a submitted driver):

=========  ===========================================  ======================================
signal     first time                                   again, while stopping
=========  ===========================================  ======================================
SIGINT     finish the batch in flight, save, stop; no   stop at once (exit 130)
           drain: no hour the watermark has not passed
           is marked (the next run continues it)
SIGTERM    as SIGINT; with ``run --drain-on-stop``      stop at once, drain cut short (143)
           also drain (every hour holding data marked)
SIGHUP     as SIGTERM                                   ignored (a closing terminal sends it
                                                        more than once)
SIGUSR1    finish the batch in flight, stop and drain   ignored (``event-etl drain TYPE``
           (a drain asked of a running job)             sends it)
=========  ===========================================  ======================================

A drain is decided when the job stops reading: a SIGUSR1 received by then makes the stop a
drain, whatever came first.

**One signal through two paths is one request.**  ``timeout -s INT`` signals the process and
then its group, a terminal and a supervisor may both pass a signal on: the same signal again
within :data:`SAME_SIGNAL_S` (0.5 s) of the one recorded is taken for that one, not for "Ctrl-C
twice".  A person who wants to stop at once presses Ctrl-C again after that.

Signal handlers only *record* the signal (:class:`StopSignals`): they never call into the
JVM (py4j) and never raise, so no Python call is ever torn apart in the middle.  The
command's main loop looks at the record between its steps and acts.  Steps that may take
long (waiting for a batch, a drain) run so that the main loop keeps looking
(:func:`wait_for`, :func:`run_watched`), so a second signal is honoured at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, Protocol, TypeVar

__all__ = [
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_OTHER_WRITER",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "STOP_SIGNALS",
    "DRAIN_SIGNAL",
    "SAME_SIGNAL_S",
    "StopSignals",
    "Interrupted",
    "Escalated",
    "cut_short_line",
    "signal_name",
    "exit_code_for",
    "wait_for",
    "run_watched",
    "say",
    "Echo",
    "at_once_line",
    "with_exit_code",
    "run_finished_line",
    "end_at_once",
    "on_exit_now",
    "StoppedAtOnce",
    "abandoned_steps",
    "LATE_STEP_WAIT_S",
]

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_OTHER_WRITER = 3
EXIT_INTERRUPTED = 128 + int(signal.SIGINT)  # 130: SIGINT twice
EXIT_TERMINATED = 128 + int(signal.SIGTERM)  # 143: SIGTERM twice

STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DRAIN_SIGNAL: int = signal.SIGUSR1
"""Asks a running job to drain and stop (``event-etl drain TYPE`` sends it to the pid in the job's checkpoint lock)."""
SAME_SIGNAL_S = 0.5
"""The same signal again within this many seconds of the one recorded is the same request (see the module docstring)."""

POLL_S = 0.1
"""How often a waiting main loop looks at the signals."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code_for(signum: int) -> int:
    """128 + the signal's number, as a shell reports a command ended by it."""
    return 128 + int(signum)


class Interrupted(Exception):
    """The command stopped at once, as a repeated signal asked: exit with ``exit_code``, print ``message``."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        self.exit_code = exit_code_for(signum)
        self.message = message
        super().__init__(message)


class StoppedAtOnce(Interrupted):
    """A repeated signal stopped the job where no step can be finished or undone (Spark starting, a lease waited
    for, a drain under way): the command line ends the process at once with ``exit_code`` and ``message``, without
    the cleanup a normal exit runs (:func:`end_at_once`; what was durable stays).  Library code raises it; the
    command line's error handler is the one place that ends the process."""


class StopSignals:
    """The signals a command has received, recorded by handlers that do nothing else.

    ``install()`` (main thread only; elsewhere it does nothing) sets the handlers and may be
    called again, e.g. after PySpark replaced one; ``restore()`` puts the previous ones back.
    ``request(signum)`` records a stop asked for by other means (a test's event, a deadline).

    A streaming job also listens for :data:`DRAIN_SIGNAL` (:meth:`accept_drain_requests`), and
    ``drain_on_stop`` (``run --drain-on-stop``) makes SIGTERM and SIGHUP drain as well.
    """

    def __init__(self, signals: Iterable[int] = STOP_SIGNALS, *, drain_on_stop: bool = False) -> None:
        self.signals = tuple(signals)
        self.drain_on_stop = drain_on_stop
        self.received: list[int] = []
        self._recorded_at: dict[int, float] = {}
        self._previous: dict[int, Any] = {}
        self.left_running: list[threading.Thread] = []  # steps a stop at once left going (see abandoned_steps)

    # -- handlers ------------------------------------------------------------------------------
    def _record(self, signum: int, _frame: Any) -> None:
        # nothing else: no py4j, no raise, no lock.  The same signal again within SAME_SIGNAL_S of the one recorded
        # came through another path (the process and its group): one request, not a second one
        now = time.monotonic()
        last = self._recorded_at.get(signum)
        if last is not None and now - last < SAME_SIGNAL_S:
            return
        self._recorded_at[signum] = now
        self.received.append(signum)

    def install(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            old = signal.signal(sig, self._record)
            if sig not in self._previous and old != self._record:
                self._previous[sig] = old
        return self

    def installed(self) -> bool:
        """Whether every handler is still this object's (PySpark replaces SIGINT's when a SparkContext starts)."""
        return all(signal.getsignal(sig) == self._record for sig in self.signals)

    def accept_drain_requests(self) -> StopSignals:
        """Listen for :data:`DRAIN_SIGNAL` too (a streaming job); its handler is set at once if this object's
        handlers are in (a caller that installed them before the job started, as a submitted driver does)."""
        if DRAIN_SIGNAL not in self.signals:
            in_place = bool(self._previous)  # installed (PySpark may have replaced SIGINT's since: still ours)
            self.signals = (*self.signals, DRAIN_SIGNAL)
            if in_place:
                self.install()
        return self

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._previous.items():
            if sig == DRAIN_SIGNAL and old in (None, signal.SIG_DFL):
                old = signal.SIG_IGN  # a drain asked of a job that is ending must not kill it (SIGUSR1's default)
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def request(self, signum: int = signal.SIGINT) -> None:
        self.received.append(signum)

    # -- what was asked ------------------------------------------------------------------------
    @property
    def requested(self) -> bool:
        return bool(self.received)

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    @property
    def drain(self) -> bool:
        """Whether the stop drains: a drain was asked for (:data:`DRAIN_SIGNAL`), or SIGTERM or SIGHUP stopped a job
        run with ``drain_on_stop``.  A plain stop (SIGINT; SIGTERM and SIGHUP without it) only stops."""
        if DRAIN_SIGNAL in self.received:
            return True
        return self.drain_on_stop and self.first in (signal.SIGTERM, signal.SIGHUP)

    @property
    def escalation(self) -> int | None:
        """The first SIGINT or SIGTERM after the first signal: stop at once.  (SIGHUP and SIGUSR1 never escalate.)"""
        for signum in self.received[1:]:
            if signum in (signal.SIGINT, signal.SIGTERM):
                return signum
        return None

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, returning early (True) when a new signal arrives."""
        seen = len(self.received)
        deadline = time.monotonic() + seconds
        while True:
            if len(self.received) != seen:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))


def wait_for(condition: Callable[[], bool], stops: StopSignals | None, *, timeout: float | None = None,
             poll: float = POLL_S) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` passes (False).

    Raises :class:`Escalated` when a repeated signal asks to stop at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if condition():
            return True
        if stops is not None and stops.escalation is not None:
            raise Escalated(stops.escalation)
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll)


class Escalated(Exception):
    """Raised by :func:`wait_for` and :func:`run_watched` in the main loop: a repeated signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal_name(signum))


def run_watched(fn: Callable[[], T], stops: StopSignals | None, *, name: str = "event_etl-step") -> T:
    """Run ``fn`` in a helper thread while the main loop keeps watching the signals.

    Returns ``fn``'s result or raises its exception; raises :class:`Escalated` (leaving
    ``fn`` running in its daemon thread) when a repeated signal asks to stop at once."""
    if stops is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            box["error"] = err

    th = threading.Thread(target=target, name=name, daemon=True)
    th.start()
    # joined, not polled: the caller goes on the moment fn returns (a poll's sleep would add up to POLL_S to every
    # step, and to every member's tick in a fleet); the signals are still looked at every POLL_S
    while True:
        th.join(POLL_S)
        if not th.is_alive():
            break
        if stops.escalation is not None:
            stops.left_running.append(th)  # fn goes on in its thread: see abandoned_steps
            raise Escalated(stops.escalation)
    if "error" in box:
        raise box["error"]
    return box.get("value")  # type: ignore[return-value]


LATE_STEP_WAIT_S = 5.0
"""How long a stop at once waits for a step it left running (a batch, a drain) to meet its next guarded write and
end, before it releases the job's locks."""


def abandoned_steps(stops: StopSignals | None) -> list[threading.Thread]:
    """Steps that :func:`run_watched` left running when ``stops`` asked to stop at once, still alive.  Until they end,
    the job must not release its lease and checkpoint lock: they may still write markers or state, and a restart
    that took the lock meanwhile would write beside them."""
    return [th for th in (stops.left_running if stops is not None else []) if th.is_alive()]


def at_once_line(who: str, signum: int, cut: list[tuple[str, int]], *, exit_code: bool = True) -> str:
    """What a stop at once says (``who``: the job's types, or ``fleet``): the batches ``cut`` short, ``(type,
    batch)``, are replayed on the next run; it ends with the exit code (``exit_code``)."""
    what = "Ctrl-C twice" if signum == signal.SIGINT else "SIGTERM twice"
    if cut:
        batches = ", ".join(f"{n} batch {b}" for n, b in cut)
        line = (f"[{who}] stopped at once ({what}), not drained: {batches} was cut short and is replayed when you "
                f"run the same command")
    else:
        line = f"[{who}] stopped at once ({what}), not drained; run the same command to continue"
    return with_exit_code(line, exit_code_for(signum)) if exit_code else line


def run_finished_line(who: str, stopped_by: str | None, drained: bool) -> str:
    """The last line of a run that ends by itself or as asked (``who``: the type, or ``fleet``), with its exit code:
    ``[who] run finished: exit 0 (how it ended)``.  ``stopped_by``: a signal's name, ``time limit``, or None (the
    end of its input)."""
    if stopped_by in (None, "end of input", "query end", "time limit"):
        how = stopped_by or "end of input"
    else:
        who_stopped = {"SIGINT": "Ctrl-C", signal_name(DRAIN_SIGNAL): "a drain request"}.get(stopped_by, stopped_by)
        how = f"stopped by {who_stopped}"
    if drained:
        how += ", drained: every hour holding data is complete"
    elif how.startswith("stopped by"):
        how += ", not drained: the open hours stay open for the next run"
    return f"[{who}] run finished: exit 0 ({how})"


def with_exit_code(line: str, code: int) -> str:
    """``line`` ending with the exit code the process ends with: the last line of a job says it."""
    tail = f" (exit {code})"
    return line if line.endswith(tail) else line + tail


class Echo(Protocol):
    """Where a job's lines for people go (:func:`say`, or what the command line passes in)."""

    def __call__(self, line: str, /, *, err: bool = False) -> None: ...


def say(line: str, /, *, err: bool = False) -> None:
    """Print a line; a terminal that is gone (SIGHUP) must not turn a clean stop into a traceback."""
    stream = sys.stderr if err else sys.stdout
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass


_AT_ONCE: list[Callable[[], None]] = []


def on_exit_now(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the process ends at once (:func:`end_at_once`), before its last line.

    :mod:`event_etl.job.session` registers the end of the JVM it started, with everything in
    its session (PySpark's daemon and workers): ended together by
    SIGKILL, none of them is left to print the broken connections of the others as tracebacks."""
    if fn not in _AT_ONCE:
        _AT_ONCE.append(fn)


def end_at_once(code: int, line: str) -> NoReturn:
    """Print ``line`` on stderr and end the process at once (no cleanup: what was durable stays).

    Called by the command line's error handler only (:func:`event_etl.cli.options.handles_errors`), for a
    :class:`StoppedAtOnce` a job raised: the one way a signal ends the process before its job finished."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    for fn in _AT_ONCE:
        try:
            fn()
        except Exception:  # noqa: BLE001 - ending at once must not fail
            pass
    say(with_exit_code(line, code), err=True)
    os._exit(code)


def cut_short_line(name: str, signum: int) -> str:
    what = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    return (f"[{name}] drain cut short ({what} again): the hours marked so far stay complete, the others are not; "
            f"run the same command to continue")
