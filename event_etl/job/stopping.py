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

For Spark jobs, :class:`BatchGate` wraps the ``foreachBatch`` function: a stop waits until no
batch is in flight, closes the gate and only then stops the query through the API (Spark
logs a requested stop without an error).  A batch that Spark begins after the gate closed
never starts its work: it waits inside the JVM until the stop interrupts it, which Spark
recognises as a requested stop, and it is planned again by the next run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

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
    "BatchGate",
    "BatchInterrupted",
    "stop_at_boundary",
    "stop_at_once",
    "cut_short_line",
    "PENDING_REPLAY_TIMEOUT_S",
    "STOP_AT_ONCE_TIMEOUT_S",
    "signal_name",
    "exit_code_for",
    "wait_for",
    "run_watched",
    "say",
    "Echo",
    "at_once_line",
    "with_exit_code",
    "run_finished_line",
    "exit_now",
    "on_exit_now",
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
    """Run ``fn`` when the process ends at once (:func:`exit_now`), before its last line.

    :mod:`event_etl.job.session` registers the end of the JVM it started, with everything in
    its session (PySpark's daemon and workers, the source's Python process): ended together by
    SIGKILL, none of them is left to print the broken connections of the others as tracebacks."""
    if fn not in _AT_ONCE:
        _AT_ONCE.append(fn)


def exit_now(code: int, line: str) -> None:
    """Print ``line`` on stderr and end the process at once (no cleanup: what was durable stays)."""
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


SPARK_STOP_TEXT = "py4j.protocol.Py4JJavaError: An error occurred while calling {what}: java.lang.InterruptedException"
"""How an error of a ``foreachBatch`` function must read for Spark to take it for a requested stop.

When a stopped query's batch function fails, Spark (``StreamExecution.isInterruptionException``)
logs nothing if the Python error's text matches its ``PROXY_ERROR`` pattern: a py4j call
that met an ``InterruptedException``.  That pattern, ``...calling((.|\\r\\n|\\r|\\n)*)(...)``,
recurses once per character after the match's start, so a real traceback (the Java stack
trace of the interrupted call, chained Python errors) overflows the query thread's stack and
the JVM prints a ``StackOverflowError`` of a thousand lines.  So the error is re-raised
alone (``from None``) with this short text, which is what happened: a py4j call interrupted
by ``query.stop()``."""


class BatchInterrupted(Exception):
    """A batch cut short, or not begun, because its query was stopped (see :data:`SPARK_STOP_TEXT`)."""


class BatchGate:
    """The ``foreachBatch`` function of a query, wrapped so that a stop never cuts a batch in two.

    ``close_when_idle`` closes the gate once no batch is in flight; the query can then be
    stopped through the API without cancelling any batch's work.  A batch Spark begins after
    that never calls the wrapped function: it waits inside the JVM (in the query's own
    thread, where Python's calls run in PySpark's pinned-thread mode) until ``query.stop()``
    interrupts it.  Spark takes that interruption for the requested stop it is (no error is
    logged) and does not commit the batch: the next run plans it again.  A stop at once
    (``close_now``) cancels the batch in flight; its failure is reported to Spark the same way.
    """

    ABANDON_TIMEOUT_S = 300.0

    def __init__(self, fn: Callable[[Any, int], None]) -> None:
        self.fn = fn
        self._cond = threading.Condition()
        self.running: int | None = None
        self.closed = False
        self.abandoned: list[int] = []
        self.finished: list[int] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        with self._cond:
            closed = self.closed
            if not closed:
                self.running = batch_id
        if closed:
            self.abandoned.append(batch_id)
            self._wait_for_the_stop(df, batch_id)
            return
        try:
            self.fn(df, batch_id)
            self.finished.append(batch_id)
        except Exception:
            if self.closed:  # stopped at once: the batch's Spark jobs were cancelled; it replays on restart
                raise BatchInterrupted(f"batch {batch_id} was cut short by a stop ("
                                       + SPARK_STOP_TEXT.format(what=f"batch {batch_id}") + ")") from None
            raise
        finally:
            with self._cond:
                self.running = None
                self._cond.notify_all()

    def close_when_idle(self, timeout: float) -> bool:
        """Close the gate as soon as no batch is in flight; False if one still runs after ``timeout`` s."""
        with self._cond:
            if self.running is not None and timeout > 0:
                self._cond.wait(timeout)
            if self.running is None:
                self.closed = True
                return True
            return False

    def close_now(self) -> None:
        """Close the gate whatever runs (a stop at once: the batch in flight is cancelled and replays)."""
        with self._cond:
            self.closed = True

    @property
    def busy(self) -> bool:
        return self.running is not None

    def _wait_for_the_stop(self, df: Any, batch_id: int) -> None:
        """Block the query's thread, interruptibly, until ``query.stop()`` interrupts it; then raise."""
        from py4j.protocol import Py4JJavaError

        jvm = df.sparkSession._jvm
        deadline = time.monotonic() + self.ABANDON_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                jvm.java.lang.Thread.sleep(1000)  # InterruptedException when the query is stopped
        except Py4JJavaError:
            raise BatchInterrupted(f"batch {batch_id} was not begun: its query was stopped ("
                                   + SPARK_STOP_TEXT.format(what="java.lang.Thread.sleep") + ")") from None
        raise BatchInterrupted(f"batch {batch_id} was held back for a stop that did not come; it is replayed "
                               "on restart")


PENDING_REPLAY_TIMEOUT_S = 300.0
"""How long a stop that drains waits for Spark to replay a batch a crash left unfinished."""
STOP_AT_ONCE_TIMEOUT_S = 15.0
"""How long a stop at once waits for Spark to cancel the batch in flight before the process just exits."""


def stop_at_boundary(running: list[tuple[Any, Any]], stops: StopSignals | None, *, drain: bool) -> None:
    """Stop queries between two batches: the batch in flight finishes, a batch not begun is left for the next run.

    For each query: (when it will drain) wait until Spark has replayed a batch a crash left
    unfinished; wait until no batch is in flight and close its gate; then stop it through
    the API, which Spark logs as a requested stop.  Raises :class:`Escalated` on a second signal."""
    running = [(job, q) for job, q in running if q is not None]
    if drain:
        for job, q in running:
            if job.controller.pending_batch is not None:
                wait_for(_replayed_or_ended(job.controller, q), stops, timeout=PENDING_REPLAY_TIMEOUT_S)
    closers = [_boundary(job, q) for job, q in running if job.gate is not None]
    wait_for(lambda: all([close() for close in closers]), stops)  # every gate at once (a list: no short cut)
    for job, _q in running:
        job.controller.request_stop()  # no batch runs: does not wait
    for _job, q in running:
        run_watched(q.stop, stops, name="event_etl-stop")


def _replayed_or_ended(controller: Any, query: Any) -> Callable[[], bool]:
    return lambda: controller.pending_batch is None or not query.isActive


def _boundary(job: Any, query: Any) -> Callable[[], bool]:
    """A check that closes the job's gate at the query's next batch boundary (True once closed).

    The batch in flight finishes, and Spark commits it (it writes its commit log after the
    batch function returned, then reports progress): a stop in between would make the next
    run replay a batch that is done.  When no batch is in flight but Spark is already
    planning one (its trigger is active), that one batch is let in and processed too (a
    drain includes it).  Otherwise the gate closes while Spark waits for its next trigger,
    and ``query.stop()`` interrupts that wait.  Should Spark begin a batch in the instant
    between, that batch is left for the next run (:class:`~event_etl.job.stopping.BatchGate`).
    The waits are bounded (a couple of trigger intervals; ten seconds for a commit)."""
    gate = job.gate
    done_before = len(gate.finished) + len(gate.abandoned)
    current = gate.busy
    patience_s = max(2.0, 2 * job.prepared.trigger_ms / 1000.0)
    patience = time.monotonic() + patience_s
    committed_by: dict[int, float] = {}

    def reported_batch() -> int:
        try:
            return int((query.lastProgress or {}).get("batchId", -1))
        except Exception:  # noqa: BLE001 - the query ended meanwhile: nothing more will come
            return 1 << 62

    def planning() -> bool:
        try:
            return bool((query.status or {}).get("isTriggerActive"))
        except Exception:  # noqa: BLE001 - as above
            return False

    def close() -> bool:
        if gate.closed:
            return True
        if gate.busy:
            return False
        if gate.finished:  # the last batch done: wait (a while) for Spark to commit it
            last = gate.finished[-1]
            deadline = committed_by.setdefault(last, time.monotonic() + max(10.0, patience_s))
            if reported_batch() < last and time.monotonic() < deadline:
                return False
        one_ran = current or len(gate.finished) + len(gate.abandoned) > done_before
        if not one_ran and time.monotonic() < patience and planning():
            return False
        return bool(gate.close_when_idle(0))

    return close


def stop_at_once(running: list[tuple[Any, Any]], stops: StopSignals, signum: int) -> None:
    """A second signal: stop the queries now, cancelling the batch in flight (Spark replays it on restart).

    Spark's ``stop()`` cancels the query's Spark jobs once and interrupts its thread; a batch
    that submits a job a moment later would run to its end, so the jobs are cancelled again
    until the stop returns.  Raises :class:`Interrupted` with a line saying which batch, if any,
    was cut short; ends the process at once if Spark does not stop in time or yet another
    signal comes."""
    from pyspark import SparkContext

    running = [(job, q) for job, q in running if q is not None]
    in_flight = [(job, job.gate.running) for job, _ in running if job.gate is not None and job.gate.running is not None]
    for job, _ in running:
        if job.gate is not None:
            job.gate.close_now()
    seen = len(stops.received)

    def stop_all() -> None:
        for _, q in running:
            q.stop()

    th = threading.Thread(target=stop_all, name="event_etl-stop-now", daemon=True)
    th.start()
    deadline = time.monotonic() + STOP_AT_ONCE_TIMEOUT_S
    sc: Any = SparkContext._active_spark_context
    while th.is_alive() and len(stops.received) == seen and time.monotonic() < deadline:
        for _, q in running:
            try:
                sc.cancelJobGroup(str(q.runId))
            except Exception:  # noqa: BLE001 - the stop goes on regardless
                pass
        th.join(0.25)
    cut = [(job.prepared.event_type.name, b) for job, b in in_flight if b not in job.gate.finished]
    who = ", ".join(job.prepared.event_type.name for job, _ in running) or "job"
    if th.is_alive():
        exit_now(128 + signum, at_once_line(who, signum, cut, exit_code=False)
                 + f" ({signal_name(signum)}: Spark did not stop in time; the process ended)")
    raise Interrupted(signum, at_once_line(who, signum, cut))


def cut_short_line(name: str, signum: int) -> str:
    what = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    return (f"[{name}] drain cut short ({what} again): the hours marked so far stay complete, the others are not; "
            f"run the same command to continue")
