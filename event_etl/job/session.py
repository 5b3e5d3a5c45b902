"""Starting Spark for event_etl: the Python of the workers, quiet logs, loopback only, a JVM of its own.

The JVM is started in a session of its own (``start_new_session``), so a signal meant for
the job's process group -- Ctrl-C in a terminal, ``kill -- -PGID``, ``timeout``, a closing
terminal -- reaches the Python driver only, which stops the job as :mod:`event_etl.job.stopping`
says, while the JVM keeps running until the driver has finished with it.  It also starts
with SIGINT, SIGTERM and SIGHUP ignored (HotSpot then installs no shutdown handler for
them), so a SIGTERM sent to every process of a systemd unit (``KillMode=control-group``)
does not end it either, nor PySpark's workers of a local job (:mod:`event_etl.job.sparkdaemon`).
The JVM still ends with the driver however the driver ends: it
reads the pipe PySpark gives it as stdin and exits on end of file (a SIGKILL or an OOM kill
of the driver closes the pipe).  The Python workers are the JVM's children, in its session.

The SparkContext is created outside the main thread, so PySpark installs no SIGINT handler
of its own (it would raise KeyboardInterrupt in the middle of a py4j call).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from event_etl.errors import EventEtlError, UsageError
from event_etl.job.stopping import on_exit_now
from event_etl.settings import current_settings
from event_etl.util.thirdparty import detach_accumulator_server

__all__ = ["check_java", "get_session", "stop_session", "parse_conf", "DEFAULT_MASTER"]

DEFAULT_MASTER = "local[*]"

_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "false",
    # Our tasks write their own files and return small reports; keep driver memory modest.
    "spark.driver.memory": "1g",
    # A task's result carries its dedupe keys (~29 B an event: ~7 MB for a split of 250,000 events).  Above
    # 1 MiB (Spark's default) a result is stored in the executor's block manager and fetched by the driver
    # through its block transfer service, a network round trip even in a local job: ~0.3 s of JVM CPU in a
    # batch of 3 M events, on the cores the Python workers need.  Sent with the task's status instead (Spark
    # caps it at spark.rpc.message.maxSize, 128 MiB).
    "spark.task.maxDirectResultSize": "64m",
}


LOCAL_JIT = "-XX:TieredStopAtLevel=1"
"""JVM option of a local job's driver: compile with C1 only.  The JVM of a local job schedules tasks and
moves their reports while the Python workers do the work on the same cores; HotSpot's optimizing
compiler (C2) spent ~6 s of CPU there in the first seconds of a 3 M-event run, taken from the workers
(JVM start 15 % and the batch 15 % faster without it, bench/RESULTS.md).  ``--conf
spark.driver.extraJavaOptions=...`` replaces it (and the log settings) with the user's own."""

LOCAL_GC = "-XX:+UseSerialGC"
"""JVM option of a local job's driver: the serial collector.  That JVM's heap is small (1 GiB) and its
garbage short-lived (task results); G1's parallel and concurrent threads take CPU from the Python
workers on the same cores: the JVM used 0.63-0.71 s of CPU during a batch of 3 M events with G1, 0.51-0.53 s
with this, and the batch was ~4 % faster, the whole run ~0.3 s shorter (medians of 4-5 alternating runs).
It is the collector HotSpot itself picks on a small machine.  Replaced, as :data:`LOCAL_JIT`, by the user's
own ``spark.driver.extraJavaOptions``."""


def parse_conf(pairs: Iterable[str]) -> dict[str, str]:
    """Spark settings given as ``KEY=VALUE`` texts (``--conf``), as a dict; a text without ``=`` is a usage error."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise UsageError(f"--conf {p!r} is not key=value", fix="write --conf spark.executor.memory=2g")
        k, _, v = p.partition("=")
        out[k.strip()] = v.strip()
    return out


def check_java() -> str:
    """Path of the ``java`` Spark will use, or an error that says how to install Java 17."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise EventEtlError(
            "Java was not found; Spark needs Java 17 (or 21)"
            + (f" (JAVA_HOME={home} has no bin/java)" if home else ""),
            fix="install it, e.g. 'sudo apt-get install openjdk-17-jre-headless' (Debian/Ubuntu), "
            "'brew install openjdk@17' (macOS), then open a new shell or set JAVA_HOME",
        )
    return java


def get_session(master: str | None = None, conf: Mapping[str, str] | None = None,
                app_name: str = "event_etl") -> Any:
    """The process's SparkSession (created on first call)."""
    java = check_java()
    master = master or DEFAULT_MASTER
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Local workers must run this very interpreter, or they fail to connect back.  (On a
        # cluster this path may not exist on the executors: `event-etl submit` sets their Python.)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(_DEFAULTS)
    # Tasks allocate Arrow buffers chunk by chunk; the system allocator gives them back between
    # tasks (mimalloc, pyarrow's default, keeps them: ~100 MiB more per Python worker).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # local workers inherit the driver's environment
    settings["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] = os.environ["ARROW_DEFAULT_MEMORY_POOL"]
    log4j = _log4j()
    if log4j and master.startswith("local"):
        settings["spark.executor.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    driver_options = driver_java_options(master, java)
    if driver_options:
        settings["spark.driver.extraJavaOptions"] = " ".join(driver_options)
    if master.startswith("local"):
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        if log4j:  # event_etl installed as files (not a zip): its daemon entry can be run
            # the workers are this job's own processes: keep them alive through a SIGTERM meant for the job
            settings["spark.python.daemon.module"] = "event_etl.job.sparkdaemon"
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    launch = {"spark.master": master, "spark.app.name": app_name, **settings}
    _launch_own_jvm(launch)
    try:
        spark = _off_the_main_thread(lambda: _create(builder, launch, start_workers=master.startswith("local")))
    except Exception as err:
        raise _gateway_exited(err, master) from err
    spark.sparkContext.setLogLevel(current_settings().spark_log_level)
    return spark


def _log4j() -> str | None:
    """event_etl's log4j settings file; None when event_etl is imported from a zip (`submit`)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "log4j2.properties")
    return path if os.path.isfile(path) else None


def driver_java_options(master: str, java: str, *, archive: bool = True) -> list[str]:
    """The driver JVM's options: event_etl's log settings, :data:`LOCAL_JIT` and :data:`LOCAL_GC` for a local
    master and, with ``archive``, those mapping `event-etl warmup`'s class archive of Spark if it was built."""
    from event_etl.job.jvmarchive import jvm_options

    log4j = _log4j()
    options = [f"-Dlog4j2.configurationFile=file:{log4j}"] if log4j else []
    if master.startswith("local"):
        options += [LOCAL_JIT, LOCAL_GC]
    return options + (jvm_options(java) if archive else [])


def _launch_own_jvm(settings: Mapping[str, str]) -> None:
    """Start the JVM (spark-submit's ``pyspark-shell``, as PySpark would) in a session of its own.

    The settings go on its command line, as PySpark passes a session's conf at launch, so
    the driver's memory and JVM options take effect.  Nothing to do when a JVM is already
    there: this process's (a session stopped and created again) or the one that started
    this process (``event-etl submit``: spark-submit sets PYSPARK_GATEWAY_PORT).
    """
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return
        conf = SparkConf()  # no JVM yet: a plain dict, given to spark-submit as --conf
        for k, v in settings.items():
            conf.set(k, v)
        kwargs = _JvmPopenKwargs(start_new_session=True, preexec_fn=_ignore_stop_signals)
        quieted = _quiet_jvm_stderr()
        if quieted is not None:
            kwargs["stderr"] = quieted.stdin
        try:
            gateway = launch_gateway(conf, popen_kwargs=kwargs)  # type: ignore[no-untyped-call]  # pyspark's own
        finally:
            if quieted is not None and quieted.stdin is not None:
                quieted.stdin.close()  # the JVM and its children hold the pipe now; the filter ends with them
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
        on_exit_now(_kill_own_jvm)


JVM_NOISE = ("WARNING: Using incubator modules: jdk.incubator.vector",)
"""Lines the JVM prints on stderr at every start that tell a user of event_etl nothing (Spark 4's launcher adds the
incubating vector module to every JVM it starts, and the JVM announces it).  Spark's own "Setting default log level"
lines are kept out by log4j2.properties instead."""


def _quiet_jvm_stderr() -> subprocess.Popen[bytes] | None:
    """A filter between the JVM's stderr and this process's: every line passes but :data:`JVM_NOISE`.

    ``grep --line-buffered`` in a session of its own, deaf to the stop signals as the JVM is (systemd's
    ``KillMode=control-group`` sends SIGTERM to every process of the unit: the JVM must still be heard while it
    drains); it ends when the JVM and the processes it started have closed the pipe.  None (the JVM writes to
    stderr directly) where there is no grep or stderr is not a file descriptor."""
    grep = shutil.which("grep")
    try:
        err_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    if grep is None:
        return None
    args = [grep, "--line-buffered", "-v", "-x", "-F"]
    for line in JVM_NOISE:
        args += ["-e", line]
    try:
        return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=err_fd, stderr=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_ignore_stop_signals)
    except OSError:
        return None


def _kill_own_jvm() -> None:
    """A stop at once: SIGKILL the JVM this process started and its session (PySpark's daemon and
    workers), all at the same instant.  Left to notice the driver's
    end one by one, a worker in the middle of a handshake prints ``ConnectionResetError``."""
    from pyspark.core.context import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the JVM leads its own process group


def _ignore_stop_signals() -> None:  # pragma: no cover - runs in the child between fork and exec
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


class _JvmPopenKwargs(dict[str, Any]):
    """Popen arguments for PySpark's ``launch_gateway``, which replaces ``preexec_fn`` with its own
    (it ignores SIGINT in the JVM): whatever it sets, the child also ignores SIGTERM and SIGHUP."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "preexec_fn" and value is not None and value is not _ignore_stop_signals:
            theirs = value

            def value() -> None:  # pragma: no cover - runs in the child between fork and exec
                theirs()
                _ignore_stop_signals()

        super().__setitem__(key, value)


def _create(builder: Any, settings: Mapping[str, str], *, start_workers: bool) -> Any:
    """``builder.getOrCreate()``; with ``start_workers``, the Python workers are started while the session is built.

    A job's first Spark job would otherwise start them itself: PySpark's worker daemon and its first
    workers took ~0.7 s before the first task of a job's first batch could start (``bench/RESULTS.md``).
    The SparkContext comes first, with the settings the builder would give it; a small job on it then
    starts the workers in the background (:func:`_start_workers`) while the session, the controller
    and the source are set up (~1 s), and the builder finds that context."""
    if start_workers:
        from pyspark import SparkConf
        from pyspark.core.context import SparkContext

        sc = SparkContext.getOrCreate(SparkConf().setAll(list(settings.items())))
        _start_workers(sc)
    return builder.getOrCreate()


WORKERS_GROUP = "event_etl-start-workers"


def _start_workers(sc: Any) -> threading.Thread:
    """Run one trivial task per core in a background thread: Spark starts the Python worker daemon and
    forks a worker for each, which later tasks reuse (``spark.python.worker.reuse``).  Its failure is
    not reported: the job's own first task meets the same cause and reports it."""
    from event_etl.job.sparkdaemon import ready

    def run() -> None:
        try:
            sc.setJobGroup(WORKERS_GROUP, "event_etl: starting the Python workers", interruptOnCancel=True)
            n = max(1, int(sc.defaultParallelism))
            sc.parallelize(range(n), n).mapPartitions(ready).collect()
        except Exception:  # noqa: BLE001 - not reported: the job's own first task meets the same cause and says it
            pass

    th = threading.Thread(target=run, name="event_etl-start-workers", daemon=True)
    th.start()
    return th


def _gateway_exited(err: Exception, master: str) -> Exception:
    """Spark's JVM that exits as it starts (PySpark's ``JAVA_GATEWAY_EXITED``: a master it refuses, a JVM option,
    no memory) as an error with the fix, not an unexpected one to report; other errors as they are."""
    if "JAVA_GATEWAY_EXITED" not in str(err) and "Java gateway process exited" not in str(err):
        return err
    from event_etl.errors import UsageError

    return UsageError(f"Spark's JVM exited as it started (master {master!r}): its own lines above say why",
                      fix="check --master (local[*], spark://HOST:7077, yarn, k8s://...), JAVA_HOME (Java 17 or 21) "
                          "and the memory free, then run the same command again")


def _off_the_main_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a helper thread:
    PySpark installs its SIGINT handler only when a context starts on the main thread."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    th = threading.Thread(target=target, name="event_etl-spark-start", daemon=True)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def stop_session(spark: Any, *, timeout: float = 30.0) -> None:
    """Stop the session; when this process started the JVM, let it exit (stdin closed) and wait for it.

    Stopping in this order leaves nothing for the JVM to complain about after the driver is
    gone (no py4j connection refused, no half-stopped context in its shutdown hook)."""
    import subprocess

    from pyspark.core.context import SparkContext

    gateway: Any = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    sc = getattr(spark, "sparkContext", None)
    # PySpark's accumulator server reads the JVM's connection with a 1-s poll, and stopping it waits for
    # that poll to time out (~1 s of every job's stop, paid by no JVM-only job); once the JVM has exited,
    # the connection's end wakes it at once.  Stopped below, then; the end of that connection is expected.
    accumulators = detach_accumulator_server(sc) if proc is not None else None
    if accumulators is not None:
        accumulators.handle_error = lambda *_: None
    spark.stop()
    if proc is None:  # a JVM we did not start (event-etl submit): it outlives us by design
        return
    try:
        gateway.shutdown()  # py4j's sockets and callback server, before the JVM goes
    except Exception:  # noqa: BLE001 - the JVM ends below either way
        pass
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # end of file: Spark's PythonGatewayServer exits
        proc.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait(timeout=timeout)
    if accumulators is not None:  # its serving loop notices within 0.5 s: not waited for
        threading.Thread(target=accumulators.shutdown, name="event_etl-accumulators-stop", daemon=True).start()
    with SparkContext._lock:
        SparkContext._gateway = None
        SparkContext._jvm = None
