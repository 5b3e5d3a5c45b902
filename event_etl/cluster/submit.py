"""``event-etl submit``: the job of ``event-etl run``, on a Spark cluster, through spark-submit.

What is shipped where:

- **The bundle** (:mod:`event_etl.cluster.bundle`): event_etl and the event types in one zip, built
  (or reused: it is named by content hash) in ``.event_etl-submit/`` and given to
  spark-submit with ``--py-files``.  Spark copies it to the driver and to every executor and
  puts it on their Python path; the nodes need Python and event_etl's dependencies, not
  event_etl.
- **The driver entry**: a three-line script next to the bundle that runs
  :func:`event_etl.cli.submitted.main` with the job's options, those of ``run``, local paths
  made absolute (in cluster mode the driver runs elsewhere, in another folder).
- **The executors' Python** (``spark.pyspark.python``): ``--python PATH``; or the packed
  environment of ``--python-env`` (venv-pack / conda-pack, shipped with ``--archives``);
  or, when the master runs on this machine, this very interpreter; otherwise the cluster's
  default.  Spark also starts that Python *on the driver* for the source's planner, so in
  client mode the path must exist here too.
- **Settings**: every ``--conf`` goes to spark-submit (so driver JVM settings take effect)
  and to the driver (so the job's defaults do not override it).  event_etl's environment
  (``EVENT_ETL_*``, the emulator hosts) is passed on to the executors as
  ``spark.executorEnv.*``, as ``run`` passes it to its local executors.

In client mode (the default, and the only one Spark standalone offers Python) the driver
runs here, as a child of spark-submit's JVM, in a session of its own: a signal meant for
``event-etl submit`` (to its process or its whole group: Ctrl-C, ``kill -- -PGID``,
Kubernetes, systemd) is passed on to the driver, one for one, and the driver stops as
``run`` does (:mod:`event_etl.job.stopping`): SIGINT, SIGTERM and SIGHUP at a batch boundary (SIGTERM and
SIGHUP drain with ``--drain-on-stop``), SIGUSR1 (``event-etl drain``) drains and stops, a second SIGINT or
SIGTERM stops at once.  A signal that comes before the driver has
started is held until it has.  Yet another SIGINT or SIGTERM after that kills spark-submit
and the driver.  The job's exit code is the command's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from event_etl.errors import EventEtlError, UsageError
from event_etl.settings import ENV_DRIVER_PIDFILE, LOCAL_ONLY

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType

__all__ = [
    "SubmitOptions",
    "DEFAULT_BUNDLE_DIR",
    "ENV_ALIAS",
    "ENV_DRIVER_PIDFILE",
    "ENTRY_SCRIPT",
    "submit_job",
    "check_submit_options",
    "check_python_here",
    "is_this_machine",
    "absolute_job_paths",
    "driver_args",
    "forwarded_env",
    "submit_conf",
    "submit_command",
    "spark_submit_path",
    "write_entry_script",
]

DEFAULT_BUNDLE_DIR = ".event_etl-submit"
ENV_ALIAS = "environment"
"""Where a ``--python-env`` archive is unpacked in the containers: ``./environment/bin/python``."""

ENTRY_SCRIPT_NAME = "event_etl_driver.py"
"""Where the driver writes its pid, so that ``event-etl submit`` can pass Ctrl-C and SIGTERM on to it."""

ENTRY_SCRIPT = '''"""Driver entry of `event-etl submit` (generated): event_etl comes from the bundle on --py-files."""
from event_etl.cli.submitted import main

main()
'''
"""spark-submit runs a Python file, not a module: this is the file (see :func:`write_entry_script`)."""

_FORWARDED = ("STORAGE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass(frozen=True)
class SubmitOptions:
    """How to submit a job; the job's own options are those of ``run``."""

    master: str
    deploy_mode: str = "client"
    python: str | None = None
    python_env: str | None = None
    spark_submit: str | None = None
    bundle_dir: str = DEFAULT_BUNDLE_DIR


def check_submit_options(opts: SubmitOptions) -> None:
    """Refuse the combinations Spark would refuse later, or that cannot work, with the fix."""
    if opts.deploy_mode == "cluster" and opts.master.startswith("spark://"):
        raise UsageError("Spark standalone runs Python drivers in client mode only",
                         fix="drop --deploy-mode cluster: the driver then runs on this machine")
    if opts.deploy_mode == "cluster" and opts.master.startswith("local"):
        raise UsageError(
            f"--master {opts.master} has no cluster to run the driver on", fix="drop --deploy-mode cluster"
        )
    if opts.python_env:
        if not opts.python_env.endswith(_ARCHIVE_SUFFIXES):
            raise UsageError(f"--python-env {opts.python_env} is not an archive",
                             fix="pack the environment with venv-pack or conda-pack (a .tar.gz)")
        if opts.deploy_mode != "cluster":
            raise UsageError(
                "--python-env needs --deploy-mode cluster: in client mode Spark starts the executors' Python on this "
                "machine too (for the source), where the packed environment is not unpacked",
                fix="add --deploy-mode cluster (YARN, Kubernetes), or install the dependencies on every node and pass "
                    "--python PATH",
            )


def is_this_machine(master: str) -> bool:
    """Whether every process of ``master`` runs on this machine: ``local[...]``, or a master on a loopback address."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [hp.rsplit(":", 1)[0] for hp in master[len("spark://"):].split(",")]  # several masters: HA
    return all(h in _LOOPBACK or h.startswith("127.") for h in hosts)


def absolute_job_paths(event_type: str | None, job: Mapping[str, Any]) -> dict[str, Any]:
    """The job's options with every local path absolute, the default checkpoint spelled out (``event_type``
    None: a fleet's, the folder of every type's checkpoint).

    The driver may run in another folder (client mode: spark-submit's) or on another node
    (cluster mode); an absolute path means the same folder there, on a shared mount.
    """
    from event_etl.sources.registry import source_folder
    from event_etl.storage.locations import default_checkpoint, is_remote, local_path, resolve_sink

    out = dict(job)
    folder = source_folder(out["source"]) if out.get("source") else None
    if folder is not None:  # a folder source; an unknown scheme is left for the driver's error
        out["source"] = "dir:" + local_path(folder)
    out["sink"] = resolve_sink(out.get("sink") or "./data")
    checkpoint = out.get("checkpoint") or (default_checkpoint(event_type) if event_type is not None
                                           else os.path.dirname(default_checkpoint("x")))
    out["checkpoint"] = checkpoint if is_remote(checkpoint) else local_path(checkpoint)
    if out.get("metrics_history"):
        out["metrics_history"] = local_path(out["metrics_history"])
    return out


def driver_args(event_type: str | Sequence[str], job: Mapping[str, Any], params: Sequence[Any]) -> list[str]:
    """The command line of the driver (:func:`event_etl.cli.submitted.main`) for these job options.

    ``event_type`` is a type's name, or the names of a fleet's types (``["--all"]`` for every type).
    Built from the driver command's own click options (``params``), so every option of ``run``
    passes through as it was parsed; values equal to the default are left out.
    """
    import click

    args = [event_type] if isinstance(event_type, str) else list(event_type)
    for p in params:
        if not isinstance(p, click.Option) or p.name not in job:
            continue
        value, flag = job[p.name], p.opts[0]
        if p.is_flag:
            args += [flag] if value else []
        elif p.multiple:
            for v in value or ():
                args += [flag, str(v)]
        elif value is not None and value != p.default:
            args += [flag, str(value)]
    return args


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that configure event_etl and that the executors need too."""
    return {k: v for k, v in sorted(env.items())
            if (k.startswith("EVENT_ETL_") and k not in LOCAL_ONLY) or k in _FORWARDED}


def _log4j_file() -> Path | None:
    path = Path(__file__).resolve().parents[1] / "log4j2.properties"
    return path if path.is_file() else None


def submit_conf(opts: SubmitOptions, conf_pairs: Iterable[str], *, env: Mapping[str, str],
                executable: str) -> dict[str, str]:
    """The Spark settings of the submission: event_etl's defaults for a cluster, then the user's ``--conf`` on top."""
    out: dict[str, str] = {}
    python = opts.python or (f"./{ENV_ALIAS}/bin/python" if opts.python_env else None) or (
        executable if is_this_machine(opts.master) else None)
    if python:
        out["spark.pyspark.python"] = python
    if opts.deploy_mode == "client":
        out["spark.pyspark.driver.python"] = executable  # the driver runs here, in this Python
        log4j = _log4j_file()
        if log4j is not None:  # only spark-submit can configure the driver's JVM: it is started before the job
            out["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
        if is_this_machine(opts.master):
            out["spark.driver.host"] = out["spark.driver.bindAddress"] = "127.0.0.1"
    driver_env_prefix = _driver_env_prefix(opts)
    for k, v in forwarded_env(env).items():
        out[f"spark.executorEnv.{k}"] = v
        if driver_env_prefix:
            out[f"{driver_env_prefix}{k}"] = v
    from event_etl.job.session import parse_conf

    out.update(parse_conf(conf_pairs))
    return out


def _driver_env_prefix(opts: SubmitOptions) -> str | None:
    """How to set the driver's environment in cluster mode (in client mode it inherits this process's)."""
    if opts.deploy_mode != "cluster":
        return None
    if opts.master.startswith("yarn"):
        return "spark.yarn.appMasterEnv."
    if opts.master.startswith("k8s://"):
        return "spark.kubernetes.driverEnv."
    return None


def check_python_here(opts: SubmitOptions, conf: Mapping[str, str]) -> None:
    """In client mode Spark starts the executors' Python on this machine too (the source's planner):
    it must exist here."""
    python = conf.get("spark.pyspark.python")
    if opts.deploy_mode != "client" or not python:
        return
    found = os.access(python, os.X_OK) if os.sep in python else shutil.which(python) is not None
    if not found:
        raise UsageError(
            f"the executors' Python {python} is not on this machine, and in client mode Spark runs it here too "
            "(for the source)",
            fix="install the same Python, with event_etl's dependencies, at that path here too; or submit with "
                "--deploy-mode cluster (YARN, Kubernetes)",
        )


def spark_submit_path() -> str:
    """``bin/spark-submit`` of the installed pyspark: the Spark this job was written and tested against."""
    import pyspark

    path = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "bin", "spark-submit")
    if not os.path.isfile(path):
        raise EventEtlError(
            f"pyspark has no spark-submit at {path}",
            fix="reinstall pyspark (pip install --force-reinstall pyspark), or pass --spark-submit PATH",
        )
    return path


def submit_command(opts: SubmitOptions, *, spark_submit: str, bundle: Path, entry: Path, conf: Mapping[str, str],
                   driver: list[str], app_name: str) -> list[str]:
    """The spark-submit command line (pure: every input is an argument)."""
    cmd = [spark_submit, "--master", opts.master, "--deploy-mode", opts.deploy_mode, "--name", app_name,
           "--py-files", str(bundle)]
    if opts.python_env:
        cmd += ["--archives", f"{os.path.abspath(opts.python_env)}#{ENV_ALIAS}"]
    for k in sorted(conf):
        cmd += ["--conf", f"{k}={conf[k]}"]
    return cmd + [str(entry), *driver]


def write_entry_script(bundle_dir: str | os.PathLike[str]) -> Path:
    """The driver entry script in ``bundle_dir`` (written when missing or different)."""
    path = Path(bundle_dir).resolve() / ENTRY_SCRIPT_NAME
    if not path.is_file() or path.read_text(encoding="utf-8") != ENTRY_SCRIPT:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(ENTRY_SCRIPT, encoding="utf-8")
        os.replace(tmp, path)
    return path


def submit_job(event_type: EventType | None, event_types_dir: str | os.PathLike[str], job: Mapping[str, Any],
               opts: SubmitOptions, *, driver_params: Sequence[Any], dry_run: bool = False,
               echo: Callable[[str], None] = print, fleet: Sequence[str] | None = None) -> int:
    """Bundle the code and types, build the spark-submit command, run it (or only print it).  Returns the exit code.

    ``event_type`` is the job's type; for a fleet it is None and ``fleet`` the driver's arguments
    (the types' names, or ``["--all"]``).  ``driver_params`` are the click parameters of the driver
    command (:func:`event_etl.cli.submitted.main`), which :func:`driver_args` turns ``job`` into a
    command line with."""
    from event_etl.cluster.bundle import build_bundle

    check_submit_options(opts)
    bundle, built = build_bundle(event_types_dir, opts.bundle_dir)
    entry = write_entry_script(opts.bundle_dir)
    name = event_type.name if event_type is not None else None
    job = absolute_job_paths(name, job)
    conf = submit_conf(opts, job.get("conf") or (), env=os.environ, executable=sys.executable)
    check_python_here(opts, conf)
    cmd = submit_command(opts, spark_submit=opts.spark_submit or spark_submit_path(), bundle=bundle.resolve(),
                         entry=entry, conf=conf, driver=driver_args(name or list(fleet or ()), job, driver_params),
                         app_name=f"event_etl:{name}" if name else
                         "event_etl fleet (all types)" if list(fleet or ()) == ["--all"] else
                         f"event_etl fleet ({len(fleet or ())} types)")
    echo(f"event_etl: bundle {bundle} ({'built' if built else 'unchanged, reused'})")
    echo(shlex.join(cmd))
    if dry_run:
        return 0
    pidfile = entry.parent / f"driver-{os.getpid()}.pid"
    env = dict(os.environ)
    env[ENV_DRIVER_PIDFILE] = str(pidfile)
    if is_this_machine(opts.master):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return run_spark_submit(cmd, env=env, pidfile=pidfile, driver_here=opts.deploy_mode == "client")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: spark-submit gets SIGTERM when this process dies, however it dies (the job runs *here*,
    in client mode)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


DRIVER_START_TIMEOUT_S = 300.0
"""How long a signal is held for a driver that has not started (written its pid) yet."""


def run_spark_submit(cmd: list[str], *, env: Mapping[str, str], pidfile: Path, driver_here: bool = True) -> int:
    """Run spark-submit in a session of its own and pass each stop signal on to the driver.  Returns its exit code.

    Handlers only record the signals (:class:`~event_etl.job.stopping.StopSignals`); this loop
    forwards them, one for one, to the driver whose pid is in ``pidfile`` -- held until the
    driver has written it, when ``driver_here`` (client mode).  Without a driver here (cluster
    mode) a signal goes to spark-submit's process group.  A second SIGINT or SIGTERM before
    the driver started, or a third once it runs, kills spark-submit's session with SIGKILL."""
    from event_etl.job.stopping import DRAIN_SIGNAL, POLL_S, StopSignals

    try:
        proc = subprocess.Popen(cmd, env=dict(env), start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    except OSError as err:
        raise EventEtlError(f"cannot start {cmd[0]}: {err}",
                            fix="pass --spark-submit PATH, or reinstall pyspark") from err
    stops = StopSignals()
    stops.install()
    stops.accept_drain_requests()  # SIGUSR1 (`event-etl drain`) to submit reaches the driver, never ends submit
    forwarded = 0
    held_since: float | None = None
    try:
        while True:
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            urgent = [s for s in stops.received if s in (signal.SIGINT, signal.SIGTERM)]
            driver = _read_pid(pidfile)
            try:
                if len(urgent) >= (3 if driver is not None else 2):
                    os.killpg(proc.pid, signal.SIGKILL)  # asked once too often: nothing graceful is left to do
                    continue
                if forwarded < len(stops.received):  # one per step: two pending signals of a kind would merge
                    signum = stops.received[forwarded]
                    if signum == DRAIN_SIGNAL and driver is None and not driver_here:
                        forwarded += 1  # a driver on the cluster: spark-submit would die of it; drain it there
                        print("event-etl submit: a drain request cannot reach a driver on the cluster; run "
                              "`event-etl drain TYPE` where the driver runs", file=sys.stderr)
                    elif driver is not None:
                        os.kill(driver, signum)  # the driver stops as `run` does
                        forwarded += 1
                    elif not driver_here:
                        os.killpg(proc.pid, signum)  # the driver runs on the cluster: stop spark-submit
                        forwarded += 1
                    else:  # held until the driver has started
                        held_since = held_since or time.monotonic()
                        if time.monotonic() - held_since > DRIVER_START_TIMEOUT_S:
                            os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                forwarded = len(stops.received)  # gone meanwhile: its exit code tells
    finally:
        stops.restore()
        pidfile.unlink(missing_ok=True)
