"""Many small event types in one application (issue 58 item 5): drain, quiet and stop, Pub/Sub and Kafka.

    .venv/bin/python bench/fleet_scale.py --types 50,300 --scenarios drain,quiet,bare
    .venv/bin/python bench/fleet_scale.py --types 50 --scenarios kafka
    .venv/bin/python bench/fleet_scale.py --types 300 --scenarios drain,quiet --vs /tmp/ref   # side by side
    .venv/bin/python bench/fleet_scale.py --types 1000 --scenarios drain --timeout 600
    .venv/bin/python bench/fleet_scale.py --types 300 --scenarios live      # waits for an hour boundary

For every ``N`` of ``--types``, a fresh folder of event types holds ``N`` copies of
``event_types/page_view`` named ``pv_0001`` .. ``pv_N`` (same schema and settings; each one's
``source`` is its own subscription or topic, its ``[pubsub]`` table names them), and one
``event-etl run --all --event-types DIR --master local[2]`` runs them as a fleet in one Spark
application.  Every run gets a fresh broker: Google's Pub/Sub emulator
(:class:`bench.pubsub.Emulator`) or noida-db's Kafka service (:func:`bench.kafka.start_broker`), started
on 127.0.0.1 and stopped after the run, so two runs never meet each other's topics.

Scenarios (``--scenarios``, comma-separated):

- **drain** (Pub/Sub): a topic and a subscription per type; ``--events`` (60) page views published to each,
  event time spread evenly over the last ``--event-hours`` (3) hours, so no event falls before
  ``max_backfill`` (30 d) and every type has a few hours to mark; then ``run --all --once --drain``.
  Figures: **wall** time from start to exit and the exit code, **up** (start to the first batch
  line: JVM, session, sources), **peak PSS** of the job's process tree (driver JVM, Python driver,
  Python workers; :func:`bench.procstats.sample_tree` every ``--sample-interval`` s), the **peak number
  of threads** of the Python driver (the ``event-etl`` process, not the JVM), **hours marked**
  (``_COMPLETE`` files) against the hours the events fall in, and **exactly once**: for every type
  the sum of ``records`` over its manifests equals what was published to it (else ``WRONG
  OUTPUT``).  A run that has not exited after ``--timeout`` s is reported as ``no exit after T s``
  with the hours marked by then, then stopped (SIGTERM, SIGKILL of its tree after ``--stop-timeout``).
- **quiet** (Pub/Sub): ``N`` live types whose subscriptions stay empty, ``run --all`` (no
  ``--once``).  Once every type's ``etl/status.json`` says ``running`` (and ``--quiet-settle`` s
  more), for ``--quiet-seconds`` (60): the driver's **CPU** (cores: CPU seconds of its own over the
  window / the window), the whole tree's and the emulator's, and the driver's threads.  Then one
  SIGTERM (a plain stop, no drain) and the **time to stop**: seconds to exit, exit code.
- **kafka**: the drain on noida-db: a topic per type (``--kafka-partitions``, 1), ``--events`` records
  each, ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS`` (and ``EVENT_ETL_KAFKA_PROPERTIES``: noida's fetch
  answers need a large ``receive.message.max.bytes``, see bench/kafka.py).  ``--kafka-types``
  (default: ``--types``) sets its sizes.
- **bare** (Pub/Sub): the baseline for drain, no Spark: the same messages (each topic has a second
  subscription) pulled and acknowledged by one plain google-cloud-pubsub client in this process,
  ``--bare-threads`` (4) threads taking subscriptions from a queue, each pulling one until it has
  all of its messages.  What the emulator gives a plain reader of ``N`` subscriptions: when it is
  close to the drain's time, the emulator bounds the figure, not the job.  Then one pull on each of
  ``--bare-threads`` of the drained subscriptions at once, with the 3-s deadline of the job's pulls under
  ``--once``: how long the emulator holds a pull that finds nothing (a drain must see every subscription empty).

- **live** (Pub/Sub): ``N`` types publishing live, the issue's "300 types at 10 events/s for 10 minutes".  The
  types' ``out_of_orderness`` is ``--live-ooo`` (5 s), the fleet runs ``run --all --trigger-interval
  --live-trigger`` (5s).  Hours are UTC hours and event time is the wall clock at publish, so an hour closes only
  when the clock passes one: the scenario waits (it says how long) so that publishing starts
  ``--live-boundary-at`` (300) s before the first UTC hour boundary that leaves ``--live-setup`` (150) s to
  set up, then starts the emulator, a topic and subscription per type, the fleet; once every type runs,
  ``--live-publishers`` (3) processes of ``--live-threads`` (6) threads (``bench/fleet_live.py``) publish
  ``--live-rate`` (10) events a second to each topic for ``--live-seconds`` (600), a request per topic every
  ``--live-tick`` (0.5) s, each event stamped with the wall clock when its request is made.  Figures: for every
  type, the **marker delay** of the hour that ends inside the window: the marker file's mtime minus the moment
  the first event stamped at or after hour end + out_of_orderness was sent (when the watermark can pass the
  hour), and minus hour end + out_of_orderness itself, p50/p99/max over the types against the goal (1 trigger +
  2 s); whether each marker holds what was published to its hour; the **watermark lag** (wall clock minus
  watermark at the types' status lines, every 30 s); the publisher's **achieved rate** and how far behind its
  schedule its requests went (did it keep up); **CPU** over the publishing of the driver, of the job's tree
  (reaped Python workers included) and of the emulator; a **memory series** every ``--live-series-every`` (10)
  s: PSS of the tree, the JVM and the Python driver, the driver's threads, the load; then, ``--live-tail``
  (20) s after the publishing, one SIGTERM and the time to stop.

**Threads**: where the driver's threads come from, at its peak.  ``/proc/PID/task/*/comm`` names every
thread the kernel knows: native threads (gRPC's ``event_engine``, ``grpc_global_tim``, librdkafka's
``rdk:...``, jemalloc's) name themselves, but Python 3.11's ``threading`` sets no OS name (3.14 does),
so every Python thread shows the process's name (``event-etl``).  Their Python names come from
``py-spy dump --nonblocking`` (``.venv/bin/py-spy``, if installed; up to ``--dumps`` per drain, at its
first batch line and at new peaks, 5 s apart, and one after quiet's window): grouped with their digits as ``N``
(``pubsub-pull-N``).

**Side by side** (``--vs PATH``): the same runs against another checkout, e.g. ``git worktree add
/tmp/ref <commit>``: ``PATH``'s ``.venv/bin/event-etl`` if it has one, else this venv's ``event-etl``
with ``PYTHONPATH=PATH`` (Python's path finder comes before the editable install's finder, and the
Spark workers inherit the variable); the script checks that ``event_etl`` is imported from ``PATH``.
``--rounds R`` alternates the trees (A B A B) and reports every run and the medians.  ``--main-tree PATH``
measures ``PATH`` (the same way) in place of this checkout's working tree: a worktree of main's last commit
is clean of work in progress that others have not committed yet.

Results: printed, the raw figures in ``fleet-scale.json`` in the work folder, and section ``fleet-scale``
of ``bench/RESULTS.md`` (``--section``; ``--no-write`` leaves it alone) with the machine, the load
average (1 min) at each run's start and its highest during the run (the machine's cores may be
shared), and the command.  No process is left behind: jobs stopped, brokers stopped as a group.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import ROOT, describe, load_average
from bench.procstats import sample_tree
from bench.results import machine_lines, markdown_table, publish

TEMPLATE = ROOT / "event_types" / "page_view"
PROJECT = "event-etl-bench"
HOUR_MS = 3_600_000
SCENARIOS = ("drain", "quiet", "kafka", "bare", "live")
PY_SPY = Path(sys.executable).with_name("py-spy")
BATCH_LINE = re.compile(r"\] batch (\d+)(?: \(replay\))?: in ([\d,]+) ")
ROUND_LINE = re.compile(r"^\[fleet\] \d+ rounds? with input took .*$", re.M)
PUBSUB_STATS = re.compile(r"\] Pub/Sub: pulled ([\d,]+), acknowledged ([\d,]+), ([\d,]+) requests \(.*?pull ([\d,]+)")
WATERMARK_LINE = re.compile(r"^\[([^\]]+)\] (?:batch \d+.*?|running:) watermark (\S+) lag ")
DUMP_THREAD = re.compile(r'^Thread (\d+) \(([^)]*)\): "(.*)"$', re.M)


class BenchError(SystemExit):
    """A run that cannot give figures: the message says why (the work folder is kept)."""


# ------------------------------------------------------------------------------------------ the trees


@dataclass
class Tree:
    """A checkout whose ``event-etl`` is measured: this one (``main``) or ``--vs``'s."""

    label: str
    path: Path
    commit: str
    exe: Path
    pythonpath: str | None = None  # set: this venv's event-etl with PYTHONPATH pointed at the checkout

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {**os.environ, "PYSPARK_PYTHON": str(self.exe.with_name("python")), "PYTHONUNBUFFERED": "1", **extra}
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.pythonpath, env.get("PYTHONPATH", "")) if p)
        return env


def git_commit(path: Path) -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(path), *a], capture_output=True, text=True, timeout=30).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "event_etl")
    return head + (" + uncommitted changes in event_etl/" if dirty else "")


def make_tree(path: Path, label: str | None) -> Tree:
    path = path.resolve()
    if not (path / "event_etl" / "__init__.py").is_file():
        raise BenchError(f"{path}: not a checkout of event_etl (no event_etl/__init__.py)")
    commit = git_commit(path)
    own = path / ".venv" / "bin" / "event-etl"
    if path == ROOT:
        tree = Tree(label or "main", path, commit, Path(sys.executable).with_name("event-etl"))
    elif own.exists():
        tree = Tree(label or path.name, path, commit, own)
    else:
        tree = Tree(label or path.name, path, commit, Path(sys.executable).with_name("event-etl"), str(path))
    probe = subprocess.run([str(tree.exe.with_name("python")), "-c", "import event_etl; print(event_etl.__file__)"],
                           capture_output=True, text=True, env=tree.env({}), cwd=tempfile.gettempdir(), timeout=60)
    where = Path(probe.stdout.strip() or "?").resolve()
    if not where.is_relative_to(path):
        raise BenchError(f"{label or path}: event_etl is imported from {where}, not from {path}: {probe.stderr[-500:]}")
    return tree


# ------------------------------------------------------------------------------------------ the types


def type_names(n: int) -> list[str]:
    return [f"pv_{i:04d}" for i in range(1, n + 1)]


def make_types(types_dir: Path, sources: dict[str, str], pubsub: dict[str, tuple[str, str]],
               settings_over: dict[str, str] | None = None) -> None:
    """``types_dir/<name>/``: page_view's schema and settings, ``source`` and the ``[pubsub]`` table its own;
    ``settings_over``: other top-level settings of page_view's replaced (``out_of_orderness``: ``"5s"``)."""
    settings = (TEMPLATE / "etl.toml").read_text()
    schema = (TEMPLATE / "schema.avsc").read_bytes()
    for name, source in sources.items():
        d = types_dir / name
        d.mkdir(parents=True)
        (d / "schema.avsc").write_bytes(schema)
        topic, sub = pubsub[name]
        text = settings
        for key, value in (("source", source), ("topic", topic), ("subscription", sub),
                           ("description", "bench/fleet_scale.py: copy of page_view"),
                           *(settings_over or {}).items()):
            text, n = re.subn(rf"(?m)^{key}\s*=.*$", lambda _m, k=key, v=value: f"{k} = {json.dumps(v)}", text)
            if n != 1 and key in ("source", *(settings_over or {})):
                text = f"source = {json.dumps(source)}\n" + text
        (d / "etl.toml").write_text(text)


def event_times(n: int, hours: float, seed: int) -> list[int]:
    """``n`` event times spread evenly over the last ``hours`` hours (up to 1 s of jitter), oldest first."""
    import random

    rng = random.Random(seed)
    now = int(time.time() * 1000)
    span = int(hours * HOUR_MS)
    return [min(now - 60_000, now - span + i * span // max(1, n) + rng.randint(0, 1000)) for i in range(n)]


def hours_of(times: list[int]) -> int:
    return len({t // HOUR_MS for t in times})


def payloads(n: int, hours: float, seed: int) -> tuple[list[bytes], int]:
    """``n`` page views as JSON (each its own UUID) and the number of hours they fall in."""
    import random

    import orjson

    from bench.datagen import make_record

    rng = random.Random(seed * 31 + 7)
    times = event_times(n, hours, seed)
    return [orjson.dumps(make_record("page_view", i, t, rng)) for i, t in enumerate(times)], hours_of(times)


# ------------------------------------------------------------------------------------------ the brokers


def pubsub_setup(host: str, names: list[str], *, bare: bool, threads: int = 8) -> dict[str, tuple[str, str]]:
    """A topic and a subscription per type (and a ``-bare`` one with ``bare``) on the emulator at ``host``."""
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    from google.cloud import pubsub_v1

    pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    out = {n: (f"projects/{PROJECT}/topics/top-{n}", f"projects/{PROJECT}/subscriptions/sub-{n}") for n in names}

    def one(name: str) -> None:
        topic, s = out[name]
        pub.create_topic(name=topic)
        sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=60)
        if bare:
            sub.create_subscription(name=s + "-bare", topic=topic, ack_deadline_seconds=60)

    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, names))
    finally:
        sub.close()
    return out


def pubsub_publish(host: str, topics: list[str], data: list[bytes], threads: int = 8) -> float:
    """Every message of ``data`` to every topic (one publish request a topic); returns the seconds it took."""
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import PublishRequest, PubsubMessage

    api = pubsub_v1.PublisherClient().api
    t0 = time.monotonic()

    def one(topic: str) -> None:
        req = PublishRequest(topic=topic, messages=[PubsubMessage(data=d) for d in data])
        ids = api.publish(request=req, timeout=120).message_ids
        if len(ids) != len(data):
            raise BenchError(f"{topic}: {len(ids)} of {len(data)} messages published")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, topics))
    return time.monotonic() - t0


def kafka_setup(broker, names: list[str], partitions: int, data: list[bytes]) -> tuple[dict[str, str], float]:
    """A topic per type (``fs-<name>``), every record of ``data`` produced to each; returns the topics and the
    seconds producing took."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = {n: f"fs-{n}" for n in names}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    todo = list(topics.values())
    for i in range(0, len(todo), 100):
        futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1)
                                       for t in todo[i:i + 100]])
        for f in futures.values():
            f.result(60)
    prod = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1, "linger.ms": 5, "log_level": 3})
    t0 = time.monotonic()
    now = int(time.time() * 1000)
    for topic in todo:
        for i, d in enumerate(data):
            while True:
                try:
                    prod.produce(topic, value=d, partition=i % partitions, timestamp=now)
                    break
                except BufferError:
                    prod.poll(0.05)
        prod.poll(0)
    left = prod.flush(300)
    if left:
        raise BenchError(f"{left} records not delivered to noida-db")
    return topics, time.monotonic() - t0


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of a process and its descendants (0 once gone)."""
    if pid is None:
        return 0.0
    total = 0.0
    try:
        root = psutil.Process(pid)
        for p in (root, *root.children(recursive=True)):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def proc_cpu_reaped(pid: int | None) -> float:
    """:func:`proc_cpu` plus what the tree's processes' reaped children used (``children_user/_system``): the
    Python workers PySpark's daemon forks for a Spark job and reaps afterwards, which :func:`proc_cpu` misses."""
    if pid is None:
        return 0.0
    total = 0.0
    try:
        root = psutil.Process(pid)
        for p in (root, *root.children(recursive=True)):
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


# ------------------------------------------------------------------------------------------ threads


def group_name(name: str) -> str:
    """A thread's name with its numbers as ``N``: ``pubsub-pull-3`` -> ``pubsub-pull-N``."""
    return re.sub(r"\d+", "N", name)


def task_names(pid: int) -> dict[int, str]:
    """Every thread of ``pid`` and its kernel name (``/proc/PID/task/TID/comm``)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out[int(tid)] = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            pass
    return out


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` so far."""
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except psutil.Error:
        return {}


def cpu_by_group(before: dict[int, float], after: dict[int, float], comms: dict[int, str],
                 names: dict[int, str] | None, pid: int) -> dict[str, float]:
    """CPU seconds between two :func:`thread_cpu` readings, by thread group (as :func:`thread_groups`)."""
    out: Counter[str] = Counter()
    for tid, cpu in after.items():
        out[group_of(tid, comms.get(tid, "?"), names or {}, comms.get(pid))] += cpu - before.get(tid, 0.0)
    return {k: round(v, 2) for k, v in out.most_common() if v >= 0.005}


def parse_dump(text: str) -> dict[int, str]:
    """``py-spy dump``'s threads: native thread id -> Python name."""
    return {int(m.group(1)): m.group(3) for m in DUMP_THREAD.finditer(text)}


def py_spy_dump(pid: int) -> dict[int, str] | None:
    """The Python names of ``pid``'s threads (``py-spy dump --nonblocking``), or None without py-spy."""
    if not PY_SPY.exists():
        return None
    try:
        r = subprocess.run([str(PY_SPY), "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                           text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = parse_dump(r.stdout)
    return names or None


def group_of(tid: int, comm: str, names: dict[int, str], own: str | None) -> str:
    """A thread's group: ``py: NAME`` by its Python name (from py-spy), ``native: NAME`` by its kernel name, or
    ``unnamed`` when it carries the process's own name (``own``) and no dump named it (a Python thread started after
    the dump, or a native one that does not name itself)."""
    if tid in names:
        return "py: " + group_name(names[tid])
    if comm == own:
        return "unnamed"
    return f"native: {group_name(comm)}"


def thread_groups(comms: dict[int, str], names: dict[int, str] | None, pid: int | None = None) -> dict[str, int]:
    """Threads by group (:func:`group_of`); ``comms[pid]`` is the process's own name."""
    own = comms.get(pid) if pid is not None else None
    groups = Counter(group_of(tid, comm, names or {}, own) for tid, comm in comms.items())
    return dict(groups.most_common())


# ------------------------------------------------------------------------------------------ watching a job


@dataclass
class Watch:
    """What the sampler saw of a running job."""

    peak_pss: int = 0
    peak_rss: int = 0
    peak_threads: int = 0
    threads_at_peak: dict[int, str] = field(default_factory=dict)  # tid -> comm, at the peak
    names: dict[int, str] | None = None  # tid -> Python name, from every dump
    names_threads: int = 0  # the most threads the driver had at a dump
    dumps: int = 0
    samples: int = 0
    load_max: float = 0.0
    thread_series: list[tuple[float, int]] = field(default_factory=list)


class Job:
    """An ``event-etl run`` child: its output to ``log`` (with the time of every line), its tree sampled."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, *, interval: float, dumps: int) -> None:
        from bench.livejob import start_child

        self.t0 = time.monotonic()
        self.proc = start_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=log.parent)
        self.lines: list[tuple[float, str]] = []
        self.first_batch: float | None = None
        self.watch = Watch()
        self.interval = interval
        self.dumps_left = dumps
        self._dumped_at_batch = False
        self.frozen = False  # set: the series goes on, the peak and the names stay as they are
        self._log = open(log, "w")
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self._threads = threading.Thread(target=self._sample_threads, daemon=True)
        self._threads.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stdout:
            t = time.monotonic() - self.t0
            self._log.write(f"{t:9.3f} {line}")
            self.lines.append((t, line.rstrip("\n")))
            if self.first_batch is None and BATCH_LINE.search(line):
                self.first_batch = t
        self._log.flush()

    def _sample(self) -> None:
        root = psutil.Process(self.pid)
        while not self._stop.is_set():
            s = sample_tree(root)
            if s is None:
                break
            w = self.watch
            w.samples += 1
            w.peak_pss = max(w.peak_pss, s.pss)
            w.peak_rss = max(w.peak_rss, s.rss)
            w.load_max = max(w.load_max, load_average())
            try:
                for p in root.children(recursive=True):
                    self._procs.setdefault(p.pid, p)
            except psutil.Error:
                pass
            self._stop.wait(self.interval)

    def _sample_threads(self) -> None:
        """The driver's threads every 0.2 s; their kernel names whenever there are more than the last names
        cover (at most twice a second); a py-spy dump at the first batch line and whenever they are 25 % (and 10)
        more than the last dump named (after the first 3 s, 5 s apart), at most ``dumps``."""
        last_names = last_dump = 0.0
        while not self._stop.is_set() and self.proc.poll() is None:
            try:
                n = psutil.Process(self.pid).num_threads()
            except psutil.Error:
                break
            now = time.monotonic()
            w = self.watch
            if not w.thread_series or w.thread_series[-1][1] != n:
                w.thread_series.append((round(now - self.t0, 2), n))
            if self.frozen:
                self._stop.wait(0.2)
                continue
            w.peak_threads = max(w.peak_threads, n)
            if n > len(w.threads_at_peak) and now - last_names >= 0.5:
                comms = task_names(self.pid)
                if len(comms) > len(w.threads_at_peak):
                    w.threads_at_peak = comms
                last_names = now
            at_batch = self.first_batch is not None and not self._dumped_at_batch  # every source started
            if self.dumps_left > 0 and (at_batch or (now - self.t0 >= 3.0 and now - last_dump >= 5.0
                                                     and n >= max(w.names_threads * 1.25, w.names_threads + 10))):
                self._dumped_at_batch = self._dumped_at_batch or at_batch
                self.dump()
                last_dump = time.monotonic()
                self.dumps_left -= 1
            self._stop.wait(0.2)

    def dump(self) -> None:
        """Python names of the driver's threads now (py-spy), added to those of earlier dumps (a thread id names
        one thread while it lives)."""
        comms = task_names(self.pid)
        names = py_spy_dump(self.pid)
        w = self.watch
        w.dumps += 1
        if names is not None:
            w.names = {**(w.names or {}), **names}
            w.names_threads = max(w.names_threads, len(comms))
            if len(comms) >= len(w.threads_at_peak):
                w.threads_at_peak = comms

    def driver_cpu(self) -> float:
        try:
            t = psutil.Process(self.pid).cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def end(self) -> list[dict]:
        """Stop sampling; SIGKILL whatever of the job's tree is still alive (by pid, as the sampler saw it)."""
        self._stop.set()
        for th in (self._sampler, self._threads):
            th.join(timeout=30)
        left = []
        if self.proc.poll() is None:
            from bench.livejob import kill_tree

            kill_tree(self.pid)
            self.proc.wait()
        for p in self._procs.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append({"pid": p.pid, "cmdline": " ".join(p.cmdline())[:160]})
                    p.kill()
            except psutil.Error:
                pass
        self._reader.join(timeout=30)
        self._log.close()
        return left

    def stop(self, timeout: float) -> tuple[int | None, float]:
        """One SIGTERM; returns the exit code (None: no exit within ``timeout``) and the seconds it took."""
        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.wait(timeout)
        return rc, time.monotonic() - t

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


def count_sink(sink: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    """Per type: (records over its manifests, hours marked)."""
    out = {}
    for name in names:
        records = hours = 0
        for marker in sink.glob(f"{name}/dt=*/hour=*/_COMPLETE"):
            try:
                records += int(json.loads(marker.read_text())["records"])
            except (OSError, ValueError, KeyError):
                continue
            hours += 1
        out[name] = (records, hours)
    return out


def pubsub_requests(output: str) -> dict[str, int]:
    """Pulls and requests over every type, from the lines the job prints at its end."""
    pulls = requests = types = 0
    for m in PUBSUB_STATS.finditer(output):
        requests += int(m.group(3).replace(",", ""))
        pulls += int(m.group(4).replace(",", ""))
        types += 1
    return {"types": types, "requests": requests, "pulls": pulls}


def thread_fields(w: Watch, pid: int) -> dict:
    return {"peak_threads": w.peak_threads, "thread_groups": thread_groups(w.threads_at_peak, w.names, pid),
            "names_from_dump": w.names is not None, "dumps": w.dumps, "threads_named": len(w.threads_at_peak),
            "thread_series": w.thread_series}


# ------------------------------------------------------------------------------------------ scenarios


@dataclass
class Run:
    """One run's setting: which tree, how many types, where."""

    kind: str  # drain | quiet | kafka
    n: int
    tree: Tree
    work: Path
    round: int = 1


def job_command(tree: Tree, types_dir: Path, sink: Path, ckpt: Path, args, *extra: str) -> list[str]:
    return [str(tree.exe), "run", "--all", "--event-types", str(types_dir), "--sink", str(sink), "--checkpoint",
            str(ckpt), "--master", args.master, *args.job_arg, *extra]


def scenario_drain(run: Run, args, expected_bare: dict | None) -> dict:
    """Pub/Sub (``drain``) or Kafka (``kafka``): publish, then ``run --all --once --drain``; see the docstring."""
    names = type_names(run.n)
    data, hours_each = payloads(args.events, args.event_hours, args.seed)
    res: dict = {"scenario": run.kind, "types": run.n, "tree": run.tree.label, "commit": run.tree.commit,
                 "round": run.round, "events_per_type": len(data), "hours_expected": hours_each * run.n}
    broker_cpu0 = 0.0
    if run.kind == "kafka":
        from bench.kafka import start_broker, wait_idle, write_properties

        broker = start_broker(run.work, "noida")
        stopper = broker.stop
        try:
            topics, secs = kafka_setup(broker, names, args.kafka_partitions, data)
            sources = {n: f"kafka:{topics[n]}" for n in names}
            pubsub = {n: (f"projects/{PROJECT}/topics/unused-{n}", f"projects/{PROJECT}/subscriptions/unused-{n}")
                      for n in names}
            res["setup"] = {"produce_seconds": secs, "broker_idle": wait_idle(broker, timeout=300)}
            env = {"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}
            props = write_properties(run.work, "noida")
            if props is not None:
                env["EVENT_ETL_KAFKA_PROPERTIES"] = str(props)
            broker_pid = broker.proc.pid
        except BaseException:
            stopper()
            raise
    else:
        from bench.pubsub import Emulator

        emu = Emulator(run.work).start()
        stopper = emu.stop
        try:
            t0 = time.monotonic()
            pubsub = pubsub_setup(emu.host, names, bare=expected_bare is not None)
            created = time.monotonic() - t0
            secs = pubsub_publish(emu.host, [pubsub[n][0] for n in names], data)
            sources = {n: f"pubsub:{pubsub[n][1]}" for n in names}
            res["setup"] = {"create_seconds": created, "publish_seconds": secs}
            env = {"PUBSUB_EMULATOR_HOST": emu.host}
            broker_pid = emu.proc.pid
            if expected_bare is not None:
                expected_bare.update(bare_baseline(emu.host, [pubsub[n][1] + "-bare" for n in names], len(data),
                                                   args.bare_threads, broker_pid))
        except BaseException:
            stopper()
            raise
    try:
        types_dir, sink, ckpt = run.work / "types", run.work / "sink", run.work / "ckpt"
        make_types(types_dir, sources, pubsub)
        cmd = job_command(run.tree, types_dir, sink, ckpt, args, "--once", "--drain")
        res["load_start"] = load_average()
        print(f"  {run.tree.label}: {run.kind} of {run.n} types ({len(data)} events each) ...", flush=True)
        b0 = proc_cpu(broker_pid)
        job = Job(cmd, run.tree.env(env), run.work / "job.log", interval=args.sample_interval, dumps=args.dumps)
        try:
            rc = job.wait(args.timeout)
            wall = job.elapsed()
            at_timeout = count_sink(sink, names) if rc is None else None
            stop_rc = stop_s = None
            if rc is None:
                stop_rc, stop_s = job.stop(args.stop_timeout)
        finally:
            left = job.end()
        broker_cpu0 = proc_cpu(broker_pid) - b0
    finally:
        stopper()
    counts = at_timeout or count_sink(sink, names)
    records = sum(r for r, _ in counts.values())
    wrong = [f"{n}: {counts[n][0]} of {len(data)}" for n in names if counts[n][0] != len(data)]
    out = job.output()
    res.update({
        "cmd": cmd, "exit": rc, "wall": wall, "timed_out": rc is None, "stop_exit": stop_rc, "stop_seconds": stop_s,
        "up": job.first_batch, "peak_pss": job.watch.peak_pss, "peak_rss": job.watch.peak_rss,
        "hours_marked": sum(h for _, h in counts.values()), "records": records, "published": len(data) * run.n,
        "exactly_once": rc == 0 and not wrong, "wrong_types": wrong[:20], "wrong_count": len(wrong),
        "batches": len([1 for _, line in job.lines if BATCH_LINE.search(line)]), "load_max": job.watch.load_max,
        "broker_cpu": broker_cpu0, "leftovers": left, "requests": pubsub_requests(out) if run.kind == "drain" else None,
        "rounds_line": (m.group(0)[len("[fleet] "):] if (m := ROUND_LINE.search(out)) else None),
        **thread_fields(job.watch, job.pid)})
    if rc not in (None, 0):
        res["tail"] = "\n".join(line for _, line in job.lines[-30:])
    shutil.rmtree(run.work / "types", ignore_errors=True)
    if not args.keep:
        for d in ("sink", "ckpt"):
            shutil.rmtree(run.work / d, ignore_errors=True)
    return res


def wait_running(ckpt: Path, names: list[str], job: Job, timeout: float) -> float | None:
    """Seconds from the job's start until every type's ``etl/status.json`` says ``running``; None if not in time."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while time.monotonic() < deadline and job.proc.poll() is None:
        for name in list(pending):
            try:
                if json.loads((ckpt / name / "etl" / "status.json").read_text()).get("state") == "running":
                    pending.discard(name)
            except (OSError, ValueError):
                pass
        if not pending:
            return job.elapsed()
        time.sleep(0.5)
    return None


def scenario_quiet(run: Run, args) -> dict:
    """``run --all`` over ``n`` empty subscriptions: CPU and threads over a window, then the time to stop."""
    from bench.pubsub import Emulator

    names = type_names(run.n)
    res: dict = {"scenario": "quiet", "types": run.n, "tree": run.tree.label, "commit": run.tree.commit,
                 "round": run.round, "window": args.quiet_seconds}
    emu = Emulator(run.work).start()
    try:
        pubsub = pubsub_setup(emu.host, names, bare=False)
        types_dir, sink, ckpt = run.work / "types", run.work / "sink", run.work / "ckpt"
        make_types(types_dir, {n: f"pubsub:{pubsub[n][1]}" for n in names}, pubsub)
        cmd = job_command(run.tree, types_dir, sink, ckpt, args)
        res["load_start"] = load_average()
        print(f"  {run.tree.label}: quiet with {run.n} types ...", flush=True)
        job = Job(cmd, run.tree.env({"PUBSUB_EMULATOR_HOST": emu.host}), run.work / "job.log",
                  interval=args.sample_interval, dumps=0)
        try:
            up = wait_running(ckpt, names, job, args.timeout)
            res.update({"cmd": cmd, "up": up})
            if up is None:
                res["error"] = (f"the job exited with {job.proc.returncode}" if job.proc.poll() is not None else
                                f"not every type running after {args.timeout:.0f} s")
            else:
                time.sleep(args.quiet_settle)
                w = job.watch
                w.peak_threads, w.thread_series, w.threads_at_peak = 0, [], {}  # the window's, not the start-up's
                th0 = thread_cpu(job.pid)
                m0 = machine_cpu()
                d0, t0, e0, c0 = job.driver_cpu(), proc_cpu(job.pid), proc_cpu(emu.proc.pid), time.monotonic()
                time.sleep(args.quiet_seconds)
                d1, t1, e1, c1 = job.driver_cpu(), proc_cpu(job.pid), proc_cpu(emu.proc.pid), time.monotonic()
                m1 = machine_cpu()
                res["machine_busy_cores"] = (m1[0] - m0[0]) / (c1 - c0)
                res["cpu_pressure"] = (m1[2] - m0[2]) / (c1 - c0) if m0[2] is not None and m1[2] is not None else None
                th1 = thread_cpu(job.pid)
                secs = c1 - c0
                res.update({"driver_cores": (d1 - d0) / secs, "tree_cores": (t1 - t0) / secs,
                            "emulator_cores": (e1 - e0) / secs, "window_threads_max": w.peak_threads,
                            "window_threads_min": min((n for _, n in w.thread_series), default=None)})
                job.frozen = True  # the window's threads and names, not the stop's
                if args.dumps:
                    job.dump()
                comms = task_names(job.pid) or job.watch.threads_at_peak
                res["cpu_by_thread_group"] = cpu_by_group(th0, th1, comms, job.watch.names, job.pid)
                if len(comms) >= len(job.watch.threads_at_peak):
                    job.watch.threads_at_peak = comms
                signalled = job.elapsed()
                rc, secs = job.stop(args.stop_timeout)
                res.update({"stop_exit": rc, "stop_seconds": secs if rc is not None else None,
                            "stop_timed_out": rc is None,
                            "stop_threads_max": max((n for t, n in job.watch.thread_series if t >= signalled),
                                                    default=None)})
        finally:
            left = job.end()
    finally:
        emu.stop()
    out = job.output()
    res.update({"peak_pss": job.watch.peak_pss, "load_max": job.watch.load_max, "leftovers": left,
                "requests": pubsub_requests(out), "lifetime": job.elapsed(), **thread_fields(job.watch, job.pid)})
    if res.get("stop_exit") not in (0, None) or "error" in res:
        res["tail"] = "\n".join(line for _, line in job.lines[-30:])
    if not args.keep:
        for d in ("types", "sink", "ckpt"):
            shutil.rmtree(run.work / d, ignore_errors=True)
    return res


def live_start(args) -> float:
    """When the live publishing starts (epoch seconds): with ``--live-boundary-at S``, S seconds before the first
    UTC hour boundary that leaves ``--live-setup`` seconds to set up first (emulator, topics, the fleet's start),
    so that a boundary falls S seconds into the window; with 0, as soon as the fleet runs."""
    now = time.time()
    if args.live_boundary_at <= 0:
        return 0.0
    b = (int(now) // 3600 + 1) * 3600
    while b - args.live_boundary_at < now + args.live_setup:
        b += 3600
    return float(b - args.live_boundary_at)


def machine_cpu() -> tuple[float, float, float | None]:
    """The machine's busy and total CPU seconds so far (/proc/stat, every core), and the seconds during which some
    runnable task waited for a CPU (/proc/pressure/cpu ``some``; None without PSI)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    try:
        text = Path("/proc/pressure/cpu").read_text()
        some = int(re.search(r"^some .*total=(\d+)", text, re.M).group(1)) / 1e6
    except (OSError, AttributeError):
        some = None
    return (sum(v) - idle) / tick, sum(v) / tick, some


def watermark_lags(lines: list[tuple[float, str]], wall0: float, since: float, until: float) -> list[float]:
    """The wall clock minus the watermark at every line that says a type's watermark (its batch lines, as its round
    ends, and its status lines) between ``since`` and ``until`` (epoch seconds; ``wall0``: the wall clock at the
    lines' t = 0)."""
    from bench.fleet_live import _iso_s

    out = []
    for t, line in lines:
        if (m := WATERMARK_LINE.match(line)) and (w := _iso_s(m.group(2))) is not None and since <= wall0 + t <= until:
            out.append(wall0 + t - w)
    return out


def tree_row(root: psutil.Process) -> dict | None:
    """The job's tree now: PSS of the whole, of the Python driver and of the JVM; the driver's threads."""
    s = sample_tree(root)
    if s is None:
        return None
    jvm = 0
    for p in s.procs:
        if p["pid"] != root.pid:
            try:
                if psutil.Process(p["pid"]).name() == "java":
                    jvm += p["pss"]
            except psutil.Error:
                pass
    driver = next((p for p in s.procs if p["pid"] == root.pid), None)
    try:
        threads = root.num_threads()
    except psutil.Error:
        threads = None
    return {"pss": s.pss, "driver_pss": driver["pss"] if driver else 0, "jvm_pss": jvm, "threads": threads,
            "procs": len(s.procs)}


def scenario_live(run: Run, args) -> dict:
    """``n`` live types, each published ``--live-rate`` events a second for ``--live-seconds``: marker delays past
    an hour boundary, watermark lag, a memory series, CPU; see the docstring."""
    from bench.fleet_live import marker_delays, merge_publishers, spread
    from bench.pubsub import Emulator

    names = type_names(run.n)
    ooo_ms = int(args.live_ooo * 1000)
    res: dict = {"scenario": "live", "types": run.n, "tree": run.tree.label, "commit": run.tree.commit,
                 "round": run.round, "rate": args.live_rate, "seconds": args.live_seconds, "ooo": args.live_ooo,
                 "trigger": args.live_trigger, "tick": args.live_tick, "publishers": args.live_publishers}
    start = live_start(args)
    if start:
        wait = start - args.live_setup - time.time()
        print(f"  live: publishing starts at {time.strftime('%H:%M:%S', time.gmtime(start))} UTC (an hour boundary "
              f"{args.live_boundary_at:.0f} s into the {args.live_seconds:.0f} s); setting up in {max(0, wait):.0f} s",
              flush=True)
        if wait > 0:
            time.sleep(wait)
    emu = Emulator(run.work).start()
    procs: list[subprocess.Popen] = []
    try:
        pubsub = pubsub_setup(emu.host, names, bare=False)
        types_dir, sink, ckpt = run.work / "types", run.work / "sink", run.work / "ckpt"
        make_types(types_dir, {n: f"pubsub:{pubsub[n][1]}" for n in names}, pubsub,
                   {"out_of_orderness": f"{args.live_ooo:g}s"})
        cmd = job_command(run.tree, types_dir, sink, ckpt, args, "--trigger-interval", args.live_trigger)
        res["load_start"] = load_average()
        print(f"  {run.tree.label}: live with {run.n} types ...", flush=True)
        job = Job(cmd, run.tree.env({"PUBSUB_EMULATOR_HOST": emu.host}), run.work / "job.log",
                  interval=args.sample_interval, dumps=0)
        wall0 = time.time() - job.elapsed()  # the wall clock at the job's t = 0 (its lines' times)
        series: list[dict] = []
        try:
            up = wait_running(ckpt, names, job, args.timeout)
            res.update({"cmd": cmd, "up": up})
            if up is None:
                res["error"] = (f"the job exited with {job.proc.returncode}" if job.proc.poll() is not None else
                                f"not every type running after {args.timeout:.0f} s")
                raise BenchError(res["error"])
            t_pub = max(start, time.time() + 3.0)
            res["boundary_at"] = ((int(t_pub) // 3600 + 1) * 3600 - t_pub)
            shares = [names[i::args.live_publishers] for i in range(args.live_publishers)]
            outs = []
            for i, share in enumerate(shares):
                f = run.work / f"topics-{i}.txt"
                f.write_text("".join(f"{n} {pubsub[n][0]}\n" for n in share))
                out = run.work / f"publisher-{i}.json"
                outs.append(out)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.fleet_live", "publish", "--host", emu.host, "--topics", str(f),
                     "--start", f"{t_pub:.3f}", "--seconds", str(args.live_seconds), "--rate", str(args.live_rate),
                     "--tick", str(args.live_tick), "--threads", str(args.live_threads), "--ooo-ms", str(ooo_ms),
                     "--seed", str(args.seed + i), "--out", str(out)],
                    cwd=ROOT, stdout=open(run.work / f"publisher-{i}.log", "w"), stderr=subprocess.STDOUT))
            time.sleep(max(0.0, t_pub - time.time()))
            root = psutil.Process(job.pid)
            d0, t0c, e0, p0, c0 = (job.driver_cpu(), proc_cpu_reaped(job.pid), proc_cpu(emu.proc.pid),
                                   sum(proc_cpu(p.pid) for p in procs), time.monotonic())
            m0 = machine_cpu()
            next_sample = c0
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if now >= next_sample:
                    row = tree_row(root)
                    if row is not None:
                        series.append({"t": round(now - c0, 1), **row, "load": load_average(),
                                       "driver_cpu": job.driver_cpu() - d0, "tree_cpu": proc_cpu_reaped(job.pid) - t0c})
                    next_sample += args.live_series_every
                if job.proc.poll() is not None:
                    raise BenchError(f"the job exited with {job.proc.returncode} while publishing")
                time.sleep(0.5)
            pub_cpu = sum(proc_cpu(p.pid) for p in procs) - p0  # 0 once reaped: taken from their own figures
            d1, t1c, e1, c1 = job.driver_cpu(), proc_cpu_reaped(job.pid), proc_cpu(emu.proc.pid), time.monotonic()
            secs = c1 - c0
            m1 = machine_cpu()
            res["machine_busy_cores"] = (m1[0] - m0[0]) / secs
            res["cpu_pressure"] = (m1[2] - m0[2]) / secs if m0[2] is not None and m1[2] is not None else None
            res.update({"window": secs, "driver_cores": (d1 - d0) / secs, "tree_cores": (t1c - t0c) / secs,
                        "emulator_cores": (e1 - e0) / secs, "publisher_cpu_seen": pub_cpu})
            parts = []
            for out in outs:
                try:
                    parts.append(json.loads(out.read_text()))
                except (OSError, ValueError) as e:
                    raise BenchError(f"{out}: no figures from a publisher ({e}): see its log") from e
            pub = merge_publishers(parts)
            res["publisher"] = {k: v for k, v in pub.items() if k != "types"}
            res["publisher"]["cores"] = pub["cpu"] / secs
            time.sleep(args.live_tail)  # the last rounds' markers
            row = tree_row(root)
            if row is not None:
                series.append({"t": round(time.monotonic() - c0, 1), **row, "load": load_average()})
            res["load_max"] = job.watch.load_max
            rc, stop_s = job.stop(args.stop_timeout)
            res.update({"stop_exit": rc, "stop_seconds": stop_s if rc is not None else None})
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            left = job.end()
    finally:
        emu.stop()
    md = marker_delays(sink, names, pub, ooo_ms)
    out_text = job.output()
    res["lag"] = spread(watermark_lags(job.lines, wall0, t_pub + 30, t_pub + args.live_seconds))
    res["wall0"], res["t_pub"] = wall0, t_pub
    res.update({"markers": {k: v for k, v in md.items() if k != "rows"},
                "series": series, "peak_pss": job.watch.peak_pss, "leftovers": left,
                "rounds_line": (m.group(0)[len("[fleet] "):] if (m := ROUND_LINE.search(out_text)) else None),
                "batches": len([1 for _, line in job.lines if BATCH_LINE.search(line)]),
                "peak_threads": job.watch.peak_threads})
    (run.work / "markers.json").write_text(json.dumps(md["rows"], default=str))
    if res.get("stop_exit") not in (0, None):
        res["tail"] = "\n".join(line for _, line in job.lines[-30:])
    if not args.keep:
        for d in ("types", "sink", "ckpt"):
            shutil.rmtree(run.work / d, ignore_errors=True)
    return res


def bare_baseline(host: str, subscriptions: list[str], expected: int, threads: int, emulator_pid: int) -> dict:
    """Pull and acknowledge every message of ``subscriptions`` (``expected`` each) with one plain client from
    ``threads`` threads; wall time from the first pull to the last acknowledgement."""
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import PullResponse

    client = pubsub_v1.SubscriberClient()
    todo: queue.Queue[str] = queue.Queue()
    for s in subscriptions:
        todo.put(s)
    lock = threading.Lock()
    stats = {"pulls": 0, "acks": 0, "received": 0, "distinct": 0, "short": []}

    def worker() -> None:
        while True:
            try:
                s = todo.get_nowait()
            except queue.Empty:
                return
            ids: set[str] = set()
            pulls = acks = got = empty = 0
            while len(ids) < expected and empty < 20:
                resp = PullResponse.pb(client.pull(subscription=s, max_messages=1000, timeout=30))
                pulls += 1
                if not resp.received_messages:
                    empty += 1
                    continue
                got += len(resp.received_messages)
                ids.update(m.message.message_id for m in resp.received_messages)
                client.acknowledge(subscription=s, ack_ids=[m.ack_id for m in resp.received_messages], timeout=60)
                acks += 1
            with lock:
                stats["pulls"] += pulls
                stats["acks"] += acks
                stats["received"] += got
                stats["distinct"] += len(ids)
                if len(ids) != expected:
                    stats["short"].append(f"{s}: {len(ids)}")

    print(f"  bare client: {len(subscriptions)} subscriptions, {threads} threads ...", flush=True)
    e0, c0 = proc_cpu(emulator_pid), psutil.Process().cpu_times()
    t0 = time.monotonic()
    try:
        pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    finally:
        client.close()
    secs = time.monotonic() - t0
    c1 = psutil.Process().cpu_times()
    empty = empty_pulls(subscriptions[:threads], EMPTY_PULL_DEADLINE)
    return {"subscriptions": len(subscriptions), "threads": threads, "seconds": secs, "empty_pull": empty,
            "messages": stats["distinct"], "expected": expected * len(subscriptions),
            "rate": stats["distinct"] / secs if secs else None, "pulls": stats["pulls"], "acks": stats["acks"],
            "redelivered": stats["received"] - stats["distinct"], "short": stats["short"][:20],
            "client_cpu": (c1.user + c1.system) - (c0.user + c0.system), "emulator_cpu": proc_cpu(emulator_pid) - e0}


EMPTY_PULL_DEADLINE = 3.0
"""The deadline of the job's pulls under ``--once`` (``pull_timeout`` cut to ``once_quiet``, 3 s by default)."""


def empty_pulls(subscriptions: list[str], deadline: float) -> list[float]:
    """Seconds one pull takes on each of ``subscriptions``, now empty, all at once (a thread each), with
    ``deadline``: how long the emulator holds a pull that finds nothing (a deadline that runs out counts in full)."""
    from google.api_core import exceptions as ex
    from google.cloud import pubsub_v1

    client = pubsub_v1.SubscriberClient()
    out: list[float] = []

    def one(s: str) -> None:
        t = time.monotonic()
        try:
            client.pull(subscription=s, max_messages=1000, timeout=deadline, retry=None)
        except ex.DeadlineExceeded:
            pass
        out.append(round(time.monotonic() - t, 2))

    try:
        with ThreadPoolExecutor(max(1, len(subscriptions))) as pool:
            list(pool.map(one, subscriptions))
    finally:
        client.close()
    return sorted(out)


# ------------------------------------------------------------------------------------------ the report


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f} s"


def _mib(x: int | None) -> str:
    return "-" if not x else f"{x / 2**20:,.0f} MiB"


def _exit(r: dict) -> str:
    if r.get("timed_out"):
        return f"no exit after {r['wall']:.0f} s"
    return "-" if r.get("exit") is None else str(r["exit"])


def drain_row(r: dict) -> list:
    once = "yes" if r["exactly_once"] else (f"no ({r['wrong_count']} types off)" if r["wrong_count"] else "no")
    return [r["tree"], r["types"], _exit(r), _s(r["wall"]), _s(r["up"]), r["batches"], _mib(r["peak_pss"]),
            r["peak_threads"], f"{r['hours_marked']:,} / {r['hours_expected']:,}",
            f"{r['records']:,} / {r['published']:,}", once, f"{r['broker_cpu']:.1f} s",
            f"{r['load_start']:.2f} / {r['load_max']:.2f}"]


DRAIN_HEAD = ["tree", "types", "exit", "wall", "first batch line", "batches", "peak PSS", "driver threads",
              "hours marked / expected", "records / published", "exactly once", "broker CPU", "load start / max"]
QUIET_HEAD = ["tree", "types", "up (all running)", "driver cores", "tree cores", "emulator cores", "driver threads",
              "pulls/s (all types)", "stop exit", "time to stop", "peak PSS", "load start / max"]


def quiet_row(r: dict) -> list:
    if r.get("up") is None:
        return [r["tree"], r["types"], r.get("error", "-"), *["-"] * 9]
    stop = f"no exit after {r['stop_seconds'] or 0:.0f} s" if r.get("stop_timed_out") else _s(r.get("stop_seconds"))
    pulls = r["requests"]["pulls"] / r["lifetime"] if r.get("lifetime") else None
    return [r["tree"], r["types"], _s(r["up"]), f"{r['driver_cores']:.2f}", f"{r['tree_cores']:.2f}",
            f"{r['emulator_cores']:.2f}", r["window_threads_max"], "-" if pulls is None else f"{pulls:,.1f}",
            "-" if r.get("stop_exit") is None else r["stop_exit"], stop, _mib(r["peak_pss"]),
            f"{r['load_start']:.2f} / {r['load_max']:.2f}"]


BARE_HEAD = ["types", "threads", "wall", "messages", "msg/s", "pulls", "client CPU", "emulator CPU",
             f"an empty pull ({EMPTY_PULL_DEADLINE:g} s deadline)"]


def bare_row(n: int, b: dict) -> list:
    return [n, b["threads"], f"{b['seconds']:.2f} s", f"{b['messages']:,} / {b['expected']:,}", f"{b['rate']:,.0f}",
            f"{b['pulls']:,}", f"{b['client_cpu']:.1f} s", f"{b['emulator_cpu']:.1f} s",
            ", ".join(f"{x:.1f}" for x in b.get("empty_pull") or []) + " s"]


LIVE_HEAD = ["delay of the hour's marker, from", "markers", "p50", "p99", "max", "goal (p99)"]


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def live_text(r: dict) -> list[str]:
    """The live scenario's figures: marker delays against the goal, watermark lag, the publisher, CPU, memory."""
    m, pub = r["markers"], r["publisher"]
    trig = r["trigger"]
    goal_s = float(trig[:-1]) if trig.endswith("s") else float(trig)
    goal = f"<= {goal_s + 2:g} s (1 trigger of {trig} + 2 s)"
    rows = []
    for key, what in (("from_event", "the first event past hour end + out_of_orderness (publish time)"),
                      ("from_nominal", "hour end + out_of_orderness (wall clock)"),
                      ("completed_at_from_nominal", "(its manifest's completed_at, from hour end + out_of_orderness)")):
        d = m[key]
        rows.append([what, d["n"], _secs(d["p50"]), _secs(d["p99"]), _secs(d["max"]), goal])
    lag = r["lag"]
    series = r["series"]
    top = max(series, key=lambda x: x["pss"]) if series else None
    out = [f"**Pub/Sub live: {r['types']} types at {r['rate']} events/s each for {r['seconds']:g} s** "
           f"(`run --all --trigger-interval {trig}`, out_of_orderness {r['ooo']:g} s; an hour boundary "
           f"{r.get('boundary_at', 0):.0f} s into the publishing)", "",
           markdown_table(LIVE_HEAD, rows), "",
           f"- markers missing (a boundary crossed, no marker): {m['missing_count']}; markers whose records differ "
           f"from what was published to their hour: {m['wrong_count']}; late records in them: {m['late_records']}",
           f"- watermark lag (wall clock - watermark at every line that gives a type's watermark: its batch lines, as "
           f"each round ends, and status lines; from 30 s into the publishing to its end): p50 "
           f"{_secs(lag['p50'])}, p99 {_secs(lag['p99'])}, max {_secs(lag['max'])} over {lag['n']} readings "
           f"(out_of_orderness {r['ooo']:g} s included)",
           f"- publisher: {pub['processes']} processes x {pub['threads'] // max(1, pub['processes'])} threads, "
           f"{pub['sent']:,} of {pub['planned']:,} events planned, {pub['rate']:,.0f} events/s "
           f"({pub['rate_per_type']:.2f} per type) over {pub['span']:.1f} s; requests sent behind schedule: p50 "
           f"{pub['behind_p50'] * 1000:.0f} ms, p99 {pub['behind_p99'] * 1000:.0f} ms, max "
           f"{pub['behind_max'] * 1000:.0f} ms ({pub['behind_over_tick']:,} of {pub['requests']:,} more than a "
           f"tick late); errors {pub['errors']}; its CPU {pub['cores']:.2f} cores",
           f"- CPU over the publishing ({r['window']:.0f} s): driver (Python) {r['driver_cores']:.2f} cores, the "
           f"job's whole tree (driver, JVM, Python workers, reaped ones included) {r['tree_cores']:.2f}, the "
           f"emulator {r['emulator_cores']:.2f}, the publishers {pub['cores']:.2f}; the machine's "
           f"{os.cpu_count()} cores were busy {r.get('machine_busy_cores', 0):.2f} cores on average (the rest: other "
           f"engineers' work), and a runnable task waited for a CPU {100 * (r.get('cpu_pressure') or 0):.0f} % of the "
           f"time (/proc/pressure/cpu, some)",
           f"- {r['batches']} batch lines; {r.get('rounds_line') or 'no round line'}",
           f"- stop: SIGTERM -> exit {r.get('stop_exit')} in {_s(r.get('stop_seconds'))}; peak PSS "
           f"{_mib(r['peak_pss'])}" + (f" (at t={top['t']:.0f} s in the series)" if top else "")
           + f"; load {r['load_start']:.2f} at the start, {r.get('load_max', 0):.2f} at most", "",
           "Memory series (every ~10 s of the publishing: t s, PSS of the job's tree MiB, of which the JVM and the "
           "Python driver, the driver's threads, its CPU over the step (cores, `c`), the load):", ""]
    def cores(i: int, key: str) -> str:
        a, b = series[i - 1] if i else None, series[i]
        if a is None or key not in b or key not in a or b["t"] <= a["t"]:
            return ""
        return f" {(b[key] - a[key]) / (b['t'] - a['t']):.2f}c"

    out.append("`" + "; ".join(f"{x['t']:.0f}: {x['pss'] / 2**20:.0f} (jvm {x['jvm_pss'] / 2**20:.0f}, py "
                               f"{x['driver_pss'] / 2**20:.0f}) {x['threads']}t{cores(i, 'driver_cpu')} "
                               f"{x['load']:.1f}" for i, x in enumerate(series)) + "`")
    out.append("")
    return out


def groups_text(r: dict, top: int = 8) -> str:
    g = r.get("thread_groups") or {}
    shown = ", ".join(f"{k} {v}" for k, v in list(g.items())[:top])
    rest = sum(list(g.values())[top:])
    return shown + (f", others {rest}" if rest else "")


def tables(results: list[dict], bare: dict[int, dict]) -> str:
    parts = []
    for kind, title in (("drain", "Pub/Sub drain (`run --all --once --drain`)"),
                        ("kafka", "Kafka drain on noida-db (`run --all --once --drain`)")):
        mine = [r for r in results if r["scenario"] == kind]
        if mine:
            parts += [f"**{title}**", "", markdown_table(DRAIN_HEAD, [drain_row(r) for r in mine]), ""]
            parts += [f"- {r['tree']}, {r['types']} types: {r['rounds_line']}" for r in mine if r.get("rounds_line")]
            parts.append("")
    for r in (r for r in results if r["scenario"] == "live"):
        parts += live_text(r)
    rows = [quiet_row(r) for r in results if r["scenario"] == "quiet"]
    if rows:
        parts += ["**Pub/Sub quiet, then SIGTERM (`run --all`, empty subscriptions)**", "",
                  markdown_table(QUIET_HEAD, rows), ""]
        parts += [f"- {r['tree']}, {r['types']} types: over the window the machine's {os.cpu_count()} cores were busy "
                  f"{r['machine_busy_cores']:.2f} cores on average, and a runnable task waited for a CPU "
                  f"{100 * (r.get('cpu_pressure') or 0):.0f} % of the time (/proc/pressure/cpu, some)"
                  for r in results if r["scenario"] == "quiet" and "machine_busy_cores" in r]
        parts.append("")
    if bare:
        parts += ["**Bare client baseline** (the drain's messages, one google-cloud-pubsub client, no Spark)", "",
                  markdown_table(BARE_HEAD, [bare_row(n, b) for n, b in sorted(bare.items())]), ""]
    named = [r for r in results if r.get("thread_groups")]
    if named:
        parts += ["**The driver's threads at their peak, by group** (`py:` Python names from py-spy, `native:` "
                  "kernel names):", ""]
        for r in named:
            peak = r["window_threads_max"] if r["scenario"] == "quiet" else r["peak_threads"]
            parts.append(f"- {r['tree']}, {r['scenario']}, {r['types']} types: {peak} threads: {groups_text(r)}")
        parts.append("")
    cpu = [r for r in results if r.get("cpu_by_thread_group")]
    if cpu:
        parts += ["**Quiet: the driver's CPU over the window, by thread group** (CPU seconds):", ""]
        for r in cpu:
            top = list(r["cpu_by_thread_group"].items())[:8]
            parts.append(f"- {r['tree']}, {r['types']} types, {r['window']:g} s: "
                         + ", ".join(f"{k} {v:.1f}" for k, v in top))
        parts.append("")
    return "\n".join(parts)


def medians(results: list[dict]) -> list[str]:
    """With several rounds: the median wall (drain, kafka) and time to stop (quiet) per tree and size."""
    keyed: dict[tuple[str, int, str], list[float]] = {}
    for r in results:
        v = r.get("wall") if r["scenario"] != "quiet" else r.get("stop_seconds")
        if v is not None and not r.get("timed_out"):
            keyed.setdefault((r["scenario"], r["types"], r["tree"]), []).append(v)
    out = []
    for (kind, n, tree), xs in sorted(keyed.items()):
        if len(xs) > 1:
            xs.sort()
            out.append(f"- {kind}, {n} types, {tree}: median {'wall' if kind != 'quiet' else 'time to stop'} "
                       f"{xs[len(xs) // 2]:.1f} s over {len(xs)} runs")
    return out


def report(results: list[dict], bare: dict[int, dict], args, machine: dict, command: str, trees: list[Tree],
           load: float) -> str:
    label = f", {args.label}" if args.label else ""
    ran = "; ".join(f"{t.label} at git {t.commit}" + ("" if t.path == ROOT else f" ({t.path})") for t in trees)
    version = machine.get("event_etl", "").split(" (git")[0]
    machine = {**machine, "event_etl": f"{version}: {ran}"}  # what ran, not this working tree
    head = [f"## Many small event types in one application (bench/fleet_scale.py{label})", "",
            machine_lines(machine, command, load)]
    head += ["", f"N copies of `page_view` (`pv_0001` ..) run as one fleet, `event-etl run --all --master "
             f"{args.master}`; a fresh emulator or broker per run. *drain*: {args.events} events per type published "
             f"before the job starts, event time over the last {args.event_hours:g} h, `--once --drain`; *wall*: "
             "start to exit (JVM included); *first batch line*: start to the first batch's line (printed as its "
             "round ends); *hours marked*: `_COMPLETE` files; "
             "*exactly once*: every type's manifests hold exactly what was published to it. *quiet*: empty "
             f"subscriptions, CPU over {args.quiet_seconds:g} s once every type's status says running (+ "
             f"{args.quiet_settle:g} s), then one SIGTERM (a plain stop). *driver*: the Python `event-etl` process "
             "(not the JVM); *tree*: the job's whole process tree; PSS summed over it. *load*: the 1-minute load "
             "average at the run's start and its highest during the run (the cores may be shared).", ""]
    body = tables(results, bare)
    med = medians(results)
    return "\n".join(head) + "\n" + body + ("\n" + "\n".join(med) + "\n" if med else "")


# ------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="50,300,1000", help="fleet sizes, comma-separated (default 50,300,1000)")
    ap.add_argument("--kafka-types", default=None, help="fleet sizes of the kafka scenario (default: --types)")
    ap.add_argument("--scenarios", default="drain,quiet,kafka,bare",
                    help=f"comma-separated, of {', '.join(SCENARIOS)} (bare: with drain's first run of each size)")
    ap.add_argument("--events", type=int, default=60, help="events per type (drain, kafka; default 60)")
    ap.add_argument("--event-hours", type=float, default=3.0, help="event time spread over the last H hours")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="give up on a drain (and on quiet's start-up) after this many seconds (default 900)")
    ap.add_argument("--stop-timeout", type=float, default=300.0,
                    help="seconds a job may take to exit after SIGTERM before its tree is killed (default 300)")
    ap.add_argument("--quiet-seconds", type=float, default=60.0, help="quiet's measuring window (default 60)")
    ap.add_argument("--quiet-settle", type=float, default=10.0,
                    help="seconds between every type running and quiet's window (default 10)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--job-arg", action="append", default=[], help="one more argument for event-etl run (repeat)")
    ap.add_argument("--kafka-partitions", type=int, default=1, help="partitions per topic (default 1)")
    ap.add_argument("--bare-threads", type=int, default=4, help="threads of the bare client (default 4)")
    ap.add_argument("--main-tree", type=Path, default=None,
                    help="measure this checkout as the first tree instead of this one's working tree (e.g. a "
                         "worktree of main's last commit, clean of work in progress)")
    ap.add_argument("--vs", type=Path, default=None, help="another checkout to run side by side (see the docstring)")
    ap.add_argument("--label-main", default=None, help="this checkout's label (default main)")
    ap.add_argument("--label-vs", default=None, help="--vs's label (default its folder's name)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per tree and size, alternating trees (default 1)")
    ap.add_argument("--sample-interval", type=float, default=1.0, help="process-tree samples (PSS), s (default 1)")
    ap.add_argument("--dumps", type=int, default=12,
                    help="py-spy dumps of the driver per drain (at new thread peaks), 0: none, and none after quiet")
    ap.add_argument("--live-rate", type=int, default=10, help="live: events a second per type (default 10)")
    ap.add_argument("--live-seconds", type=float, default=600.0, help="live: seconds of publishing (default 600)")
    ap.add_argument("--live-tick", type=float, default=0.5,
                    help="live: a publish request per topic every this many seconds (default 0.5: 5 events each)")
    ap.add_argument("--live-publishers", type=int, default=3, help="live: publisher processes (default 3)")
    ap.add_argument("--live-threads", type=int, default=6, help="live: threads per publisher process (default 6)")
    ap.add_argument("--live-ooo", type=float, default=5.0, help="live: the types' out_of_orderness, s (default 5)")
    ap.add_argument("--live-trigger", default="5s", help="live: the fleet's --trigger-interval (default 5s)")
    ap.add_argument("--live-boundary-at", type=float, default=300.0,
                    help="live: wait so that a UTC hour boundary falls this many seconds into the publishing "
                         "(default 300; 0: start at once, markers only if a boundary happens to fall inside)")
    ap.add_argument("--live-setup", type=float, default=150.0,
                    help="live: seconds set aside to set up before the publishing starts (default 150)")
    ap.add_argument("--live-series-every", type=float, default=10.0, help="live: the memory series' step, s")
    ap.add_argument("--live-tail", type=float, default=20.0,
                    help="live: seconds the fleet runs on after the publishing, before its SIGTERM (default 20)")
    ap.add_argument("--seed", type=int, default=58)
    ap.add_argument("--workdir", type=Path, default=None, help="work folder (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep sinks and checkpoints")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--section", default="fleet-scale", help="section of RESULTS.md (default fleet-scale)")
    ap.add_argument("--label", default="", help="appended to the section's title")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in args.scenarios if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenarios {bad}: choose from {', '.join(SCENARIOS)}")
    try:
        args.types = [int(x) for x in args.types.split(",") if x.strip()]
        args.kafka_types = ([int(x) for x in args.kafka_types.split(",") if x.strip()] if args.kafka_types
                            else args.types)
    except ValueError:
        ap.error("--types and --kafka-types take whole numbers, comma-separated")
    if "bare" in args.scenarios and "drain" not in args.scenarios:
        ap.error("bare reads the drain's messages: give --scenarios drain,bare")
    if min(args.types + args.kafka_types, default=1) < 1 or args.events < 1 or args.rounds < 1:
        ap.error("--types, --events and --rounds must be positive")
    return args


def plan(args, trees: list[Tree]) -> list[tuple[str, int, int, Tree]]:
    """(scenario, types, round, tree) in the order they run: by scenario and size, trees alternating per round."""
    out = []
    for kind in ("live", "drain", "quiet", "kafka"):
        if kind not in args.scenarios:
            continue
        for n in args.kafka_types if kind == "kafka" else args.types:
            for r in range(1, args.rounds + 1):
                out += [(kind, n, r, t) for t in trees]
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/fleet_scale.py",
                        *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    trees = [make_tree(args.main_tree or ROOT, args.label_main or "main")]
    if args.vs is not None:
        trees.append(make_tree(args.vs, args.label_vs))
        if trees[1].label == trees[0].label:
            raise BenchError("--vs: give the two trees different labels (--label-main, --label-vs)")
    created = args.workdir is None
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-fleet-scale-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    machine, load = describe(), load_average()
    print(f"work folder {work}; load average {load:.2f} on {os.cpu_count()} cores; trees: "
          + "; ".join(f"{t.label} = {t.path} at {t.commit}" for t in trees), flush=True)
    results: list[dict] = []
    bare: dict[int, dict] = {}
    ok = False
    try:
        for i, (kind, n, rnd, tree) in enumerate(plan(args, trees), 1):
            run = Run(kind, n, tree, work / f"{i:02d}-{kind}-{n}-{tree.label}", rnd)
            run.work.mkdir(parents=True, exist_ok=True)
            if kind == "quiet":
                res = scenario_quiet(run, args)
            elif kind == "live":
                res = scenario_live(run, args)
            else:
                want_bare = kind == "drain" and "bare" in args.scenarios and n not in bare and rnd == 1
                slot: dict | None = {} if want_bare else None
                res = scenario_drain(run, args, slot)
                if slot:
                    bare[n] = slot
            results.append(res)
            (work / "fleet-scale.json").write_text(json.dumps({"results": results, "bare": bare}, indent=2,
                                                              default=str))
            brief = (f"driver {res.get('driver_cores', 0):.2f} cores, stop {_s(res.get('stop_seconds'))}"
                     if kind in ("quiet", "live") else f"exit {_exit(res)}, wall {_s(res.get('wall'))}")
            print(f"    {brief}, driver threads {res.get('peak_threads')}", flush=True)
        text = tables(results, bare)
        print()
        print(text)
        for line in medians(results):
            print(line)
        if not args.no_write:
            publish(args.section, report(results, bare, args, machine, command, trees, load), args.results)
        ok = True
    finally:
        print(f"raw figures: {work / 'fleet-scale.json'}")
        if ok and created and not args.keep:
            for d in work.iterdir():
                if d.is_dir():
                    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
