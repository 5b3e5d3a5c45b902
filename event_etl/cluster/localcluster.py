"""A Spark standalone cluster on this machine: one master and N workers, all on 127.0.0.1.

For trying ``event-etl submit`` without a cluster (``bin/spark-cluster start``, whose commands
are :mod:`event_etl.cli.spark_cluster`) and for the integration tests.  It runs the daemons of the pip ``pyspark``
distribution
(``spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker``, with
SPARK_HOME the pyspark package).  Everything binds to 127.0.0.1; the master's REST
submission server is off; each worker has its own work folder.  The state (ports, pids)
and the logs live in one folder, so ``stop`` and ``status`` find the cluster again.

The daemons get a clean environment: the submitting shell's event_etl, emulator and
PySpark variables are left out, as on a real cluster, so whatever a job needs must reach
it through ``event-etl submit`` (which passes it on as ``spark.executorEnv.*``).

Each daemon leads a process group of its own (``stop`` sends it SIGTERM).
:meth:`LocalCluster.kill_worker` kills a worker with every process under it at once, its
executors and their Python processes (PySpark's daemon leads a group of its own): what a
crashed machine looks like to Spark.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.errors import EventEtlError, UsageError

__all__ = ["LocalCluster", "spark_home", "DEFAULT_DIR"]

DEFAULT_DIR = ".spark-cluster"
STATE_FILE = "cluster.json"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_DROPPED_ENV_PREFIXES = ("EVENT_ETL_", "PYSPARK_", "SPARK_")
_DROPPED_ENV = {"PYTHONPATH", "STORAGE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}


def spark_home() -> Path:
    """The pip pyspark package: a complete Spark distribution (bin/spark-class, jars/)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise EventEtlError(
            f"pyspark at {home} has no bin/spark-class", fix="reinstall pyspark: pip install --force-reinstall pyspark"
        )
    return home


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port(wanted: int, what: str) -> int:
    """``wanted``, checked free on 127.0.0.1; 0: any free port."""
    if wanted == 0:
        return _free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", wanted))
        except OSError as err:
            raise UsageError(f"port {wanted} ({what}) on 127.0.0.1 is in use: {err.strerror}",
                             fix="stop what holds it (another cluster: bin/spark-cluster stop), or choose other ports "
                                 "(--port 7078 --webui-port 8081; 0 picks free ones)") from err
    return wanted


def _daemon_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _DROPPED_ENV and not k.startswith(_DROPPED_ENV_PREFIXES)}
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "512m",
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
    return env


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, grandchildren...), from ``ps``."""
    rows = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True).stdout.split("\n")
    children: dict[int, list[int]] = {}
    for row in rows:
        parts = row.split()
        if len(parts) == 2:
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _command_of(pid: int) -> str:
    r = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
    return r.stdout.strip()


class LocalCluster:
    """A master and workers on 127.0.0.1, their state in ``state_dir`` (see the module docstring)."""

    def __init__(self, state_dir: str | os.PathLike[str] = DEFAULT_DIR) -> None:
        self.dir = Path(state_dir).resolve()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}  # the daemons this object started (to reap them)
        path = self.dir / STATE_FILE
        self.state: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}

    # -- facts -----------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.state['port']}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.state['webui_port']}"

    def pid(self, name: str) -> int:
        """The pid (and process group) of ``master`` or ``worker-N``."""
        return int(self.state["pids"][name])

    def workers(self) -> list[str]:
        return sorted(n for n in self.state.get("pids", {}) if n.startswith("worker-"))

    def is_running(self, name: str) -> bool:
        try:
            pid = self.pid(name)
        except KeyError:
            return False
        proc = self._procs.get(pid)
        if proc is not None:
            return proc.poll() is None
        return "org.apache.spark.deploy." in _command_of(pid)  # alive, and not a reused pid

    def status(self, timeout: float = 5) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): ``aliveworkers``, ``workers``, ``activeapps``..."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=timeout) as resp:
            state: dict[str, Any] = json.loads(resp.read())
            return state

    # -- start -----------------------------------------------------------------------------
    def start(self, *, workers: int = 2, cores: int = 1, memory: str = "1g", port: int = 7077, webui_port: int = 8080,
              timeout: float = 120) -> LocalCluster:
        """Start the master, then the workers; return once every worker is registered with the master."""
        if self.state and self.is_running("master"):
            raise UsageError(f"a cluster from {self.dir} is already running ({self.master_url})",
                             fix=f"use it, or stop it first: bin/spark-cluster stop --dir {self.dir}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = {"port": _port(port, "master"), "webui_port": _port(webui_port, "master web UI"), "pids": {},
                      "workers": workers, "cores": cores, "memory": memory}
        try:
            self._spawn("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.state["port"]),
                                   "--webui-port", str(self.state["webui_port"])])
            alive = self._wait(lambda s: s.get("status") == "ALIVE", timeout, "the master to start", ["master"])
            self._adopt_port(alive)
            for i in range(1, workers + 1):
                self._start_worker(f"worker-{i}")
            self.wait_for_workers(workers, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _adopt_port(self, status: dict[str, Any]) -> None:
        """The master's port as it bound it: when another process took the free port chosen for it in the meantime,
        Spark binds the next one (``could not bind on port P. Attempting port P+1``), and the workers must be told
        that one, not the port asked for (they would never register)."""
        url = str(status.get("url", ""))
        port = url.rsplit(":", 1)[-1]
        if url.startswith("spark://") and port.isdigit() and int(port) != self.state["port"]:
            self.state["port"] = int(port)
            self._save()

    def _start_worker(self, name: str) -> None:
        work = self.dir / "work" / name
        work.mkdir(parents=True, exist_ok=True)
        self._spawn(name, [WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(self.state["cores"]), "--memory",
                           self.state["memory"], "--webui-port", str(_free_port()), "--work-dir", str(work),
                           self.master_url])

    def restart_worker(self, name: str, timeout: float = 120) -> None:
        """Start a worker that was killed again, and wait until the master counts every worker alive."""
        if self.is_running(name):
            raise UsageError(f"{name} is running", fix="kill it first, or leave it")
        self._start_worker(name)
        self.wait_for_workers(len(self.workers()), timeout)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - the daemon writes it; closed below or at stop
        try:
            proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=_daemon_env(),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                    start_new_session=True)
        finally:
            log.close()
        self._procs[proc.pid] = proc
        self.state["pids"][name] = proc.pid
        self._save()

    def _save(self) -> None:
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.dir / STATE_FILE)

    def _wait(self, ready: Callable[[dict[str, Any]], bool], timeout: float, what: str,
              names: list[str]) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name in names:
                if not self.is_running(name):
                    raise EventEtlError(f"the Spark {name} exited while waiting for {what}; its log ends with:\n"
                                        f"{self._tail(name)}", fix="see the log for the cause (Java 17? memory?)")
            try:
                state = last = self.status()
                if ready(state):
                    return state
            except (urllib.error.URLError, OSError, ValueError) as err:
                last = err
            time.sleep(0.3)
        raise EventEtlError(f"timed out after {timeout:.0f}s waiting for {what} (last answer: {last!r}); "
                            f"the master's log ends with:\n{self._tail('master')}",
                            fix=f"look at the logs in {self.dir}")

    def _tail(self, name: str, chars: int = 3000) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else "(no log)"

    def wait_for_workers(self, count: int, timeout: float = 120) -> dict[str, Any]:
        """Wait until exactly ``count`` workers are ALIVE in the master's view."""
        return self._wait(lambda s: s.get("aliveworkers") == count, timeout, f"{count} workers to register",
                          ["master", *self.workers()])

    # -- stop ------------------------------------------------------------------------------
    def processes(self, name: str) -> list[int]:
        """The pids of a daemon and of every process under it (a worker's executors and their Python processes)."""
        return [self.pid(name), *_descendants(self.pid(name))]

    def kill_worker(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a worker and every process under it at once: what a crashed machine looks like to Spark."""
        for pid in self.processes(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        proc = self._procs.get(self.pid(name))
        if proc is not None:
            proc.wait(timeout=30)

    def stop(self, timeout: float = 20) -> list[str]:
        """Stop the workers, then the master (SIGTERM, then SIGKILL); returns the names of those stopped."""
        stopped = []
        for name in [*self.workers(), "master"]:
            if self.is_running(name):
                self._terminate(self.pid(name), timeout)
                stopped.append(name)
        (self.dir / STATE_FILE).unlink(missing_ok=True)
        return stopped

    def _terminate(self, pid: int, timeout: float) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                proc = self._procs.get(pid)
                gone = proc.poll() is not None if proc is not None else not _command_of(pid)
                if gone:
                    return
                time.sleep(0.2)
