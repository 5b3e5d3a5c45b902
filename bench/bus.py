"""A bus of event types against the same records on sources of their own (issue 59 item 7): a backlog and a live feed.

    .venv/bin/python bench/bus.py --scenarios backlog --records 1000000 --rounds 2
    .venv/bin/python bench/bus.py --scenarios live --live-rate 10000 --live-seconds 600   # waits for an hour boundary
    .venv/bin/python bench/bus.py --scenarios backlog,live --records 20000 --live-rate 1000 --live-seconds 60 \
        --live-boundary-at 0 --no-write          # a smoke run (a few minutes)

``--types`` (10) copies of ``event_types/page_view`` named ``pv_01`` .. ``pv_10`` (same schema and settings, only
``source`` and the routing rule changed), run together as the issue's fleet command ``event-etl run pv_01 ... pv_10
--event-types DIR --checkpoint-root CK --sink SINK --master local[2]``.  Record ``i`` is a page view of ~225 B
(:func:`bench.datagen.make_record`, its own UUID) belonging to type ``i % types``, and carries a Kafka header
``type = pv_XX`` naming it (``route_attribute = "type"``; ``route_value`` is left to its default, the type's name).

Scenarios (``--scenarios``, comma-separated):

- **backlog**: ``--records`` records produced, before any reader starts, three times over to three noida-db brokers
  (:class:`tests.lib.servers.NoidaKafka`, one a layout, so that no broker holds more than the ``--records`` it
  serves: noida keeps records in memory and saves its whole state as one JSON file after every change, consumer
  offset commits included, ~8 s of CPU per save at 1,000,000 records), the same bytes and headers in each:

  1. **bus**: one topic (``--partitions``, 4) read by the ``--types`` types, each routing by the header;
  2. **own topics**: a topic per type (``--partitions`` each), each read by its type alone (no routing rule);
  3. **one type**: one topic (``--partitions``) read by a single type ``pv_all`` (no routing rule): the same total
     volume, one type's work.

  Each is drained with ``--once --drain`` (a fresh checkpoint root and sink), measured as a whole process (JVM start
  included): wall time, records/s (records / wall), CPU seconds of the job's process tree (reaped Python workers
  included), peak PSS of the tree, of the Python driver (the ``event-etl`` process) and of the JVM (sampled every
  ``--sample-interval`` s; a PSS sample costs the sampler ~17 ms of CPU, the same for the three), the broker's
  CPU while the job ran.  ``--rounds`` alternates the three (bus, own, one, bus, ...) and takes medians.  Before
  every job the script waits until the broker's CPU stands still for 2 s and the machine is quiet (no
  ``fleet_live``/``fleet_scale`` benchmark running, the 1-minute load average under ``--max-load``, up to
  ``--quiet-timeout`` s; the load at each job's start is reported beside its figures).  Correctness, cheaply: for
  every type, the sum of ``records`` over its ``_COMPLETE`` manifests equals what was produced for it (``pv_all``:
  everything), and the bus kept no unclaimed message; else ``WRONG OUTPUT`` stops the benchmark.  Goals: the bus's
  records/s >= 0.8x own topics' and >= 0.8x one type's.

- **live**: the bus of ``--types`` types on one topic of a ``--live-broker`` (tansu by default: noida's state
  saves, ~40 s of CPU each at 5,000,000 records, rule it out for millions of live records), the types'
  ``out_of_orderness`` ``--live-ooo`` (5 s), the fleet run with ``--trigger-interval --live-trigger`` (5 s) and
  ``--drain-on-stop``.  Event time is the wall clock when a record is produced, so an hour closes only when the
  clock passes one: with ``--live-boundary-at S`` (300) the scenario waits so that a UTC hour boundary falls S
  seconds into the feed (it says how long; 0: start at once and report the watermark lag only).  ``--prime``
  records start the job; once its first batch line shows, ``--live-producers`` processes produce ``--live-rate``
  records/s in all (what is due every 50 ms) for ``--live-seconds``.  Figures:

  - **all saved**: from the broker's acknowledgement of the last record to the batch line that brings the job's
    count to everything produced (goal <= 15 s);
  - **marker delay** of every type's hour that ends inside the feed: its ``_COMPLETE``'s mtime minus the moment
    the broker acknowledged the type's first record stamped at or after hour end + out_of_orderness (when the
    type's watermark can pass the hour), and minus hour end + out_of_orderness itself (wall clock); p50/p99/max
    over the types against 1 trigger + 2 s; each marker's records against what was produced to its hour
    (:func:`bench.fleet_live.marker_delays`);
  - **watermark lag**: wall clock minus watermark at the types' status lines (every 30 s) during the feed;
  - the producers' **achieved rate**; **CPU** over the feed of the job's tree, the broker and the producers; a
    **memory series** every ``--live-series-every`` (10) s: PSS of the tree, the JVM, the Python driver, the
    driver's threads, records read so far, the load;
  - then a **bare consumer** (confluent-kafka, no Spark, :func:`bench.kafka.bare_loop`) reads the whole topic
    from offset 0: what the broker gives one plain reader on this machine, to tell a carrier bound from the job's.

  After ``--live-tail`` s the job gets one SIGTERM (it drains); every type's manifests must hold what was produced
  to it.

Sections of ``bench/RESULTS.md``: ``bus-backlog`` and ``bus-live`` (``-LABEL`` with ``--label``); raw figures in
``<workdir>/bus-<scenario>.json``.  No process is left behind: jobs are stopped (SIGTERM, then SIGKILL of their
tree), producers joined or terminated, brokers stopped.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_live import marker_delays, spread
from bench.livejob import BATCH_LINE, run_main
from bench.machine import describe, load_average
from bench.results import machine_lines, markdown_table, publish

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "event_types" / "page_view"
HOUR_MS = 3_600_000
TICK_S = 0.05
HEADER = "type"
STATUS_LINE = re.compile(r"^\[([^\]]+)\] running: watermark (\S+) lag ")
LAYOUTS = ("bus", "own", "one")
LAYOUT_TEXT = {"bus": "bus: 1 topic, {t} types routed by a header",
               "own": "own topics: {t} topics, a type each",
               "one": "one type: 1 topic, 1 type"}


class BenchError(SystemExit):
    """A run that cannot give figures: the message says why (the work folder is kept)."""


def type_names(n: int) -> list[str]:
    return [f"pv_{i:02d}" for i in range(1, n + 1)]


def make_types(folder: Path, sources: dict[str, str], *, route: bool, ooo: str | None = None) -> None:
    """``folder/<name>/``: page_view's schema and settings, ``source`` its own, with ``route_attribute`` (a Kafka
    header) when ``route``; ``ooo``: its ``out_of_orderness`` replaced."""
    settings = (TEMPLATE / "etl.toml").read_text()
    schema = (TEMPLATE / "schema.avsc").read_bytes()
    shutil.rmtree(folder, ignore_errors=True)
    for name, source in sources.items():
        d = folder / name
        d.mkdir(parents=True)
        (d / "schema.avsc").write_bytes(schema)
        top = f"source = {json.dumps(source)}" + (f'\nroute_attribute = "{HEADER}"' if route else "")
        text, n = re.subn(r"(?m)^source\s*=.*$", lambda _m, top=top: top, settings)
        if n != 1:
            raise BenchError(f"{TEMPLATE / 'etl.toml'}: no top-level source line to replace")
        text = re.sub(r"(?m)^description\s*=.*$", 'description = "bench/bus.py: copy of page_view"', text)
        if ooo is not None:
            text = re.sub(r"(?m)^out_of_orderness\s*=.*$", f'out_of_orderness = "{ooo}"', text)
        (d / "etl.toml").write_text(text)


# ------------------------------------------------------------------------------------------ quiet machine


def others_running() -> list[str]:
    """Other fleet benchmarks at work: a ``fleet_live`` publisher, or a ``fleet_scale`` with processes of its own (an
    emulator, a job); one that only sleeps until its hour boundary takes no CPU and is not counted."""
    r = subprocess.run(["pgrep", "-af", "fleet_live|fleet_scale"], capture_output=True, text=True)
    busy = []
    for line in r.stdout.splitlines():
        pid = int(line.split()[0]) if line.strip() else os.getpid()
        if pid == os.getpid():
            continue
        try:
            p = psutil.Process(pid)
            if "fleet_live" in line or any(c.name() != "sleep" for c in p.children(recursive=True)):
                busy.append(line)
        except psutil.Error:
            continue
    return busy


def wait_quiet(max_load: float, timeout: float) -> dict:
    """Until no other fleet benchmark runs and the 1-minute load is under ``max_load`` (at most ``timeout`` s)."""
    t0 = time.monotonic()
    said = 0.0
    while True:
        others, load = others_running(), load_average()
        if not others and load < max_load:
            break
        waited = time.monotonic() - t0
        if waited >= timeout:
            print(f"  still not quiet after {waited:.0f} s (load {load:.2f}, others: {len(others)}): going on",
                  flush=True)
            break
        if waited - said >= 60 or said == 0:
            print(f"  waiting for a quiet machine: load {load:.2f}, {len(others)} other benchmark process(es)",
                  flush=True)
            said = waited or 1e-9
        time.sleep(5)
    return {"waited": time.monotonic() - t0, "load": load_average(), "others": len(others_running())}


# ------------------------------------------------------------------------------------------ producing


@dataclass
class Dest:
    bootstrap: str
    layout: str  # bus | own | one
    partitions: int


def topic_of(layout: str, name: str) -> str:
    return {"bus": "bus", "own": f"own-{name}", "one": "one"}[layout]


@dataclass
class BacklogPlan:
    dests: list[Dest]
    names: list[str]
    worker: int
    workers: int
    count: int
    seed: int


def backlog_worker(plan: BacklogPlan) -> dict:
    """This worker's share of the records (``i = worker, worker + workers, ...``), each produced to every destination
    with the same bytes and header; returns the count per type."""
    import random

    import orjson

    from bench.datagen import make_record
    from bench.kafka import _producer

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prods = [_producer(d.bootstrap) for d in plan.dests]
    rng = random.Random(plan.seed * 1_000_003 + plan.worker)
    t = len(plan.names)
    per_type = dict.fromkeys(plan.names, 0)
    errors: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    for sent, i in enumerate(range(plan.worker, plan.count, plan.workers), 1):
        name = plan.names[i % t]
        now = time.time()
        value = orjson.dumps(make_record("page_view", i, int(now * 1000) - rng.randint(0, 1000), rng))
        headers = [(HEADER, name.encode())]
        for d, prod in zip(plan.dests, prods):
            part = ((i // t) if d.layout == "own" else i) % d.partitions
            while True:
                try:
                    prod.produce(topic_of(d.layout, name), value=value, partition=part, headers=headers,
                                 timestamp=int(now * 1000), on_delivery=delivered)
                    break
                except BufferError:
                    prod.poll(0.05)
        per_type[name] += 1
        if sent % 1000 == 0:
            for prod in prods:
                prod.poll(0)
    left = sum(prod.flush(300) for prod in prods)
    if left or errors:
        raise RuntimeError(f"backlog producer {plan.worker}: {left} not delivered, {len(errors)} failed "
                           f"({errors[:1]})")
    return {"per_type": per_type}


@dataclass
class LivePlan:
    bootstrap: str
    topic: str
    partitions: int
    names: list[str]
    worker: int
    workers: int
    first: int
    count: int
    rate: float | None  # records/s over all workers; None: as fast as possible
    start_at: float
    ooo_ms: int
    boundaries: list[int] = field(default_factory=list)
    single: bool = False  # every record produced alone (a batch of one: tansu's high watermark is then exact)


def live_worker(plan: LivePlan) -> dict:
    """Records ``first + worker, ... step workers``, event time the wall clock when each is produced, paced at
    ``rate / workers``; per type: records acknowledged per hour of event time, and for every hour boundary ``H``
    the broker's acknowledgement time of its first record stamped at or after ``H + ooo``."""
    import random

    import orjson

    from bench.datagen import make_record
    from bench.kafka import _producer

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prod = _producer(plan.bootstrap, single=plan.single)
    rng = random.Random(plan.first * 7 + plan.worker)
    t = len(plan.names)
    stats = {n: {"sent": 0, "by_hour": {}, "crossed": {}} for n in plan.names}
    state = {"errors": 0, "first_error": None}
    behind: list[float] = []

    def delivered(err, msg) -> None:
        if err is not None:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(err)
            return
        acked = time.time()
        k, et = msg.key().split(b",")
        st = stats[plan.names[int(k)]]
        et = int(et)
        st["sent"] += 1
        hk = str(et // HOUR_MS * HOUR_MS)
        st["by_hour"][hk] = st["by_hour"].get(hk, 0) + 1
        for h in plan.boundaries:
            if et >= h + plan.ooo_ms and str(h) not in st["crossed"]:
                st["crossed"][str(h)] = {"event_ms": et, "sent": acked}

    while time.time() < plan.start_at:
        time.sleep(min(0.01, plan.start_at - time.time()))
    t0 = max(time.time(), plan.start_at)
    indexes = range(plan.first + plan.worker, plan.first + plan.count, plan.workers)
    mine = len(indexes)
    per_s = None if plan.rate is None else plan.rate / plan.workers
    sent = 0
    while sent < mine:
        now = time.time()
        due = mine if per_s is None else min(mine, int((now - t0) * per_s) + 1)
        if per_s is not None:
            behind.append(max(0.0, now - (t0 + sent / per_s)))
        while sent < due:
            i = indexes[sent]
            made = time.time()
            et = int(made * 1000)
            value = orjson.dumps(make_record("page_view", i, et, rng))
            while True:
                try:
                    prod.produce(plan.topic, value=value, key=f"{i % t},{et}".encode(),
                                 partition=i % plan.partitions, headers=[(HEADER, plan.names[i % t].encode())],
                                 timestamp=et, on_delivery=delivered)
                    break
                except BufferError:
                    prod.poll(0.05)
            sent += 1
            if plan.single and prod.flush(30):
                raise RuntimeError(f"record {i} was not delivered")
            if sent % 1000 == 0:
                prod.poll(0)
        prod.poll(0)
        if per_s is not None and sent < mine:
            time.sleep(max(0.0, TICK_S - (time.time() - now)))
    t_sent = time.time()
    left = prod.flush(120)
    if left or state["errors"]:
        raise RuntimeError(f"live producer {plan.worker}: {left} not delivered, {state['errors']} failed "
                           f"({state['first_error']})")
    cpu = os.times()
    return {"types": stats, "t0": t0, "t_sent": t_sent, "t1": time.time(), "produced": sent,
            "behind": spread(behind), "cpu": cpu.user + cpu.system}


def merge_live(parts: list[dict]) -> dict:
    types: dict[str, dict] = {}
    for p in parts:
        for name, st in p["types"].items():
            into = types.setdefault(name, {"sent": 0, "by_hour": {}, "crossed": {}})
            into["sent"] += st["sent"]
            for h, n in st["by_hour"].items():
                into["by_hour"][h] = into["by_hour"].get(h, 0) + n
            for h, c in st["crossed"].items():
                if h not in into["crossed"] or c["sent"] < into["crossed"][h]["sent"]:
                    into["crossed"][h] = c
    t0, t1 = min(p["t0"] for p in parts), max(p["t1"] for p in parts)
    produced = sum(p["produced"] for p in parts)
    return {"types": types, "produced": produced, "t0": t0, "t1": t1, "span": t1 - t0,
            "rate": produced / (t1 - t0) if t1 > t0 else None, "cpu": sum(p["cpu"] for p in parts),
            "behind_p99": max((p["behind"]["p99"] or 0.0) for p in parts),
            "behind_max": max((p["behind"]["max"] or 0.0) for p in parts)}


def run_pool(fn, plans: list, timeout: float | None = None) -> list[dict]:
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(len(plans))
    try:
        return pool.map_async(fn, plans).get(timeout)
    finally:
        pool.terminate()
        pool.join()


# ------------------------------------------------------------------------------------------ measuring a job


class Measured:
    """An ``event-etl`` child: its output lines (monotonic time, text), its tree sampled (peak PSS of the tree, of
    the Python driver and of the JVM; CPU per process), until it exits."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, *, interval: float) -> None:
        from bench.livejob import start_child

        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.cpu0 = self._children_cpu()
        self.proc = start_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[tuple[float, str]] = []
        self.interval = interval
        self.peak = {"tree": 0, "driver": 0, "jvm": 0, "rss": 0}
        self.cpu: dict[int, float] = {}
        self.load_max = 0.0
        self.series: list[dict] = []
        self.first_batch: float | None = None
        self._log = open(log, "w")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    @staticmethod
    def _children_cpu() -> float:
        import resource

        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stdout:
            t = time.monotonic() - self.t0
            self._log.write(f"{t:9.3f} {line}")
            with self._lock:
                self.lines.append((t, line.rstrip("\n")))
            if self.first_batch is None and BATCH_LINE.search(line):
                self.first_batch = t
        self._log.flush()

    def sample(self) -> dict | None:
        from bench.procstats import sample_tree

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return None
        s = sample_tree(root)
        if s is None:
            return None
        jvm = driver = 0
        for p in s.procs:
            self.cpu[p["pid"]] = max(self.cpu.get(p["pid"], 0.0), p["cpu"])
            if p["pid"] == root.pid:
                driver = p["pss"]
                continue
            try:
                if psutil.Process(p["pid"]).name() == "java":
                    jvm += p["pss"]
            except psutil.Error:
                pass
        try:
            threads = root.num_threads()
        except psutil.Error:
            threads = None
        row = {"tree": s.pss, "driver": driver, "jvm": jvm, "rss": s.rss, "threads": threads, "procs": len(s.procs)}
        for k in ("tree", "driver", "jvm", "rss"):
            self.peak[k] = max(self.peak[k], row[k])
        self.load_max = max(self.load_max, load_average())
        return row

    def _sample(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            self.sample()
            self._stop.wait(self.interval)

    def events_in(self) -> int:
        with self._lock:
            return sum(int(m.group(2).replace(",", "")) for _, line in self.lines if (m := BATCH_LINE.search(line)))

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def tree_cpu(self) -> float:
        """CPU seconds of the tree so far: what each process used at its last sample, or (once the job is reaped)
        what the kernel accounts for the reaped tree, whichever is larger."""
        return max(sum(self.cpu.values()), self._children_cpu() - self.cpu0)

    def stop(self, timeout: float = 180.0) -> tuple[int | None, float]:
        """One SIGTERM (the job stops at a batch boundary and, with --drain-on-stop, drains); SIGKILL of its tree
        after ``timeout`` s."""
        from bench.livejob import kill_tree

        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.wait(timeout)
        if rc is None:
            kill_tree(self.pid)
            self.proc.wait()
        return rc, time.monotonic() - t

    def end(self) -> None:
        from bench.livejob import kill_tree

        self._stop.set()
        self._sampler.join(timeout=30)
        if self.proc.poll() is None:
            kill_tree(self.pid)
            self.proc.wait()
        self._reader.join(timeout=30)
        self._log.close()

    def output(self) -> str:
        with self._lock:
            return "\n".join(line for _, line in self.lines)


def count_sink(sink: Path, names: list[str]) -> dict[str, tuple[int, int, int]]:
    """Per type: (records over its manifests, late records among them, hours marked)."""
    out = {}
    for name in names:
        records = late = hours = 0
        for marker in sink.glob(f"{name}/dt=*/hour=*/_COMPLETE"):
            m = json.loads(marker.read_text())
            records += int(m["records"])
            late += int(m.get("late_records", 0))
            hours += 1
        out[name] = (records, late, hours)
    return out


def unclaimed_count(sink: Path) -> int:
    return sum(1 for _ in (sink / "_unclaimed").rglob("*.avro")) if (sink / "_unclaimed").exists() else 0


def check_sink(sink: Path, expected: dict[str, int], what: str) -> dict:
    got = count_sink(sink, list(expected))
    wrong = [f"{n}: {got[n][0]:,} in its manifests, {want:,} produced" for n, want in expected.items()
             if got[n][0] != want]
    if wrong:
        raise BenchError(f"WRONG OUTPUT ({what}): " + "; ".join(wrong[:5]))
    kept = unclaimed_count(sink)
    if kept:
        raise BenchError(f"WRONG OUTPUT ({what}): {kept} unclaimed file(s) under {sink / '_unclaimed'}")
    return {"records": sum(r for r, _, _ in got.values()), "hours": sum(h for _, _, h in got.values()),
            "late": sum(late for _, late, _ in got.values()), "types_checked": len(got)}


def job_env(bootstrap: str, props: Path | None, args) -> dict[str, str]:
    extra = {"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    if props is not None:
        extra["EVENT_ETL_KAFKA_PROPERTIES"] = str(props)
    return args.tree.env(extra)


def fleet_command(names: list[str], types_dir: Path, sink: Path, ck: Path, args, *extra: str) -> list[str]:
    return [str(args.tree.exe), "run", *names, "--event-types", str(types_dir), "--checkpoint-root", str(ck),
            "--sink", str(sink), "--master", args.master, *args.job_arg, *extra]


# ------------------------------------------------------------------------------------------ backlog


def scenario_backlog(args, work: Path) -> dict:
    from bench.kafka import broker_stats, start_broker, wait_idle, write_properties

    names = type_names(args.types)
    n, parts = args.records, args.partitions
    layouts = {"bus": names, "own": names, "one": ["pv_all"]}
    brokers: dict[str, object] = {}
    res: dict = {"kind": "backlog", "records": n, "types": args.types, "partitions": parts, "rounds": args.rounds,
                 "jobs": []}
    try:
        for lay in LAYOUTS:
            brokers[lay] = start_broker(work / f"broker-{lay}", "noida")
            b = brokers[lay]
            topics = ["bus"] if lay == "bus" else ["one"] if lay == "one" else [topic_of("own", x) for x in names]
            from confluent_kafka.admin import NewTopic

            admin = b.admin()
            for f in admin.create_topics([NewTopic(t, num_partitions=parts, replication_factor=1)
                                          for t in topics]).values():
                f.result(60)
            types_dir = work / f"types-{lay}"
            if lay == "bus":
                make_types(types_dir, dict.fromkeys(names, "kafka:bus"), route=True)
            elif lay == "own":
                make_types(types_dir, {x: f"kafka:{topic_of('own', x)}" for x in names}, route=False)
            else:
                make_types(types_dir, {"pv_all": "kafka:one"}, route=False)
        props = write_properties(work, "noida")
        dests = [Dest(brokers[lay].bootstrap, lay, parts) for lay in LAYOUTS]
        print(f"producing {n:,} records x 3 layouts from {args.producers} processes ...", flush=True)
        t0 = time.monotonic()
        outs = run_pool(backlog_worker, [BacklogPlan(dests, names, w, args.producers, n, args.seed)
                                         for w in range(args.producers)])
        per_type = dict.fromkeys(names, 0)
        for o in outs:
            for k, v in o["per_type"].items():
                per_type[k] += v
        res["produce_seconds"] = time.monotonic() - t0
        print(f"  produced in {res['produce_seconds']:.1f} s ({3 * n / res['produce_seconds']:,.0f} records/s)",
              flush=True)
        settle = {}
        for lay in LAYOUTS:
            settle[lay] = wait_idle(brokers[lay])
            settle[lay]["rss"] = broker_stats(brokers[lay])[1]
            settle[lay]["state_bytes"] = sum(f.stat().st_size for f in brokers[lay].workdir.rglob("*.json"))
        res["settle"] = settle
        print("  brokers settled: " + "; ".join(
            f"{lay} {s['seconds']:.0f} s, {s['cpu']:.0f} s CPU, RSS {s['rss'] / 2**20:,.0f} MiB, state "
            f"{s['state_bytes'] / 2**20:,.0f} MiB" for lay, s in settle.items()), flush=True)
        expected = {"bus": per_type, "own": per_type, "one": {"pv_all": n}}
        for r in range(args.rounds):
            for lay in LAYOUTS:
                j = backlog_job(lay, r, layouts[lay], expected[lay], brokers[lay], props, args, work)
                res["jobs"].append(j)
                (work / "bus-backlog.json").write_text(json.dumps(res, indent=1, default=str))
        if args.bare:
            from bench.kafka import bare_loop, client_conf

            quiet = wait_quiet(args.max_load, args.quiet_timeout)
            wait_idle(brokers["bus"])
            b0 = broker_stats(brokers["bus"])[0]
            bare = bare_loop(brokers["bus"].bootstrap, "bus", parts, n, conf=client_conf("noida"))
            bare.update(broker_cpu=broker_stats(brokers["bus"])[0] - b0, load=quiet["load"])
            res["bare"] = bare
            print(f"  bare consumer of the bus topic: {n:,} in {bare['seconds']:.1f} s = {bare['rate']:,.0f} "
                  f"records/s (load {quiet['load']:.2f})", flush=True)
    finally:
        for b in brokers.values():
            b.stop()
    res["summary"] = backlog_summary(res["jobs"])
    return res


def backlog_job(lay: str, rnd: int, names: list[str], expected: dict[str, int], broker, props: Path | None, args,
                work: Path) -> dict:
    from bench.kafka import broker_stats, wait_idle

    sink, ck = work / f"sink-{lay}", work / f"ck-{lay}"
    for d in (sink, ck):
        shutil.rmtree(d, ignore_errors=True)
    idle = wait_idle(broker)
    quiet = wait_quiet(args.max_load, args.quiet_timeout)
    cmd = fleet_command(names, work / f"types-{lay}", sink, ck, args, "--once", "--drain")
    label = LAYOUT_TEXT[lay].format(t=args.types)
    print(f"{label} (round {rnd + 1}), load {quiet['load']:.2f}: {' '.join(cmd[:3])} ... --once --drain", flush=True)
    b0 = broker_stats(broker)[0]
    job = Measured(cmd, job_env(broker.bootstrap, props, args), work / f"job-{lay}-{rnd + 1}.log",
                   interval=args.sample_interval)
    try:
        rc = job.wait(args.timeout)
        wall = time.monotonic() - job.t0
    finally:
        job.end()
    b1 = broker_stats(broker)[0]
    if rc != 0:
        raise BenchError(f"{label}: event-etl exited with {rc if rc is not None else 'nothing'} "
                         f"(log {work / f'job-{lay}-{rnd + 1}.log'}):\n" + "\n".join(job.output().splitlines()[-30:]))
    check = check_sink(sink, expected, label)
    out = job.output()
    batches = [(m.group(1), int(m.group(2).replace(",", ""))) for m in BATCH_LINE.finditer(out)]
    rounds_line = re.search(r"^\[fleet\] (\d+) rounds? with input took .*$", out, re.M)
    j = {"layout": lay, "round": rnd + 1, "wall": wall, "rate": args.records / wall, "cpu": job.tree_cpu(),
         "peak": dict(job.peak), "broker_cpu": b1 - b0, "broker_idle_wait": idle["seconds"], "load": quiet["load"],
         "load_max": job.load_max, "quiet_wait": quiet["waited"], "batch_lines": len(batches),
         "first_batch_line": job.first_batch, "rounds_line": rounds_line.group(0) if rounds_line else None,
         **check}
    print(f"  {args.records:,} in {wall:.1f} s = {j['rate']:,.0f} records/s, CPU {j['cpu']:.0f} s, broker CPU "
          f"{j['broker_cpu']:.1f} s, peak PSS tree {_mib(j['peak']['tree'])} (driver {_mib(j['peak']['driver'])}, "
          f"JVM {_mib(j['peak']['jvm'])}), {len(batches)} batch lines, {check['hours']} hours marked; load "
          f"{quiet['load']:.2f} -> max {job.load_max:.2f}", flush=True)
    shutil.rmtree(sink, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)
    return j


def _median(xs: list[float | None]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


def backlog_summary(jobs: list[dict]) -> dict:
    by = {lay: [j for j in jobs if j["layout"] == lay] for lay in LAYOUTS}
    med = {lay: {"rate": _median([j["rate"] for j in js]), "wall": _median([j["wall"] for j in js]),
                 "cpu": _median([j["cpu"] for j in js]), "driver_pss": _median([j["peak"]["driver"] for j in js]),
                 "tree_pss": _median([j["peak"]["tree"] for j in js]),
                 "broker_cpu": _median([j["broker_cpu"] for j in js])} for lay, js in by.items() if js}
    pairs = []  # per round: bus / own, bus / one (records/s), and the same in CPU (own CPU / bus CPU)
    for r in sorted({j["round"] for j in jobs}):
        got = {j["layout"]: j for j in jobs if j["round"] == r}
        if all(lay in got for lay in LAYOUTS):
            b, o, s = got["bus"], got["own"], got["one"]
            pairs.append({"round": r, "vs_own": b["rate"] / o["rate"], "vs_one": b["rate"] / s["rate"],
                          "cpu_vs_own": o["cpu"] / b["cpu"], "cpu_vs_one": s["cpu"] / b["cpu"]})
    return {"medians": med, "pairs": pairs,
            "vs_own": _median([p["vs_own"] for p in pairs]), "vs_one": _median([p["vs_one"] for p in pairs]),
            "cpu_vs_own": _median([p["cpu_vs_own"] for p in pairs]),
            "cpu_vs_one": _median([p["cpu_vs_one"] for p in pairs])}


# ------------------------------------------------------------------------------------------ live


def live_start(args) -> float:
    """Epoch seconds the feed starts: ``--live-boundary-at`` s before the first UTC hour boundary that leaves
    ``--live-setup`` s to set up (0: at once)."""
    if args.live_boundary_at <= 0:
        return 0.0
    now = time.time()
    b = (int(now) // 3600 + 1) * 3600
    while b - args.live_boundary_at < now + args.live_setup:
        b += 3600
    return float(b - args.live_boundary_at)


def scenario_live(args, work: Path) -> dict:
    from bench.kafka import (
        bare_loop,
        broker_stats,
        client_conf,
        start_broker,
        tail_of,
        wait_idle,
        write_properties,
    )

    names = type_names(args.types)
    ooo_ms = int(args.live_ooo * 1000)
    trigger = args.live_trigger
    trig_s = float(trigger[:-1]) if trigger.endswith("s") else float(trigger)
    parts = args.live_partitions
    res: dict = {"kind": "live", "types": args.types, "rate": args.live_rate, "seconds": args.live_seconds,
                 "ooo": args.live_ooo, "trigger": trigger, "bound": trig_s + 2, "broker": args.live_broker,
                 "partitions": parts, "producers": args.live_producers, "prime": args.prime}
    if tail_of(args.live_broker, parts):
        print("  tansu: a partition's high watermark is its last batch's base offset + 1; the feed is continuous, "
              "and the job is stopped with a drain after a tail of one record per partition", flush=True)
    start = live_start(args)
    res["quiet"] = wait_quiet(args.max_load, args.quiet_timeout)
    if start:
        wait = start - args.live_setup - time.time()
        print(f"live: the feed starts at {time.strftime('%H:%M:%S', time.gmtime(start))} UTC (an hour boundary "
              f"{args.live_boundary_at:.0f} s into {args.live_seconds:.0f} s); setting up in {max(0, wait):.0f} s",
              flush=True)
        if wait > 0:
            time.sleep(wait)
        res["quiet"] = wait_quiet(args.max_load, max(0.0, start - args.live_setup / 2 - time.time()))
    broker = start_broker(work / "broker-live", args.live_broker)
    job = None
    series: list[dict] = []
    try:
        broker.create_topic("bus", parts)
        types_dir, sink, ck = work / "types-live", work / "sink-live", work / "ck-live"
        for d in (sink, ck):
            shutil.rmtree(d, ignore_errors=True)
        make_types(types_dir, dict.fromkeys(names, "kafka:bus"), route=True, ooo=f"{args.live_ooo:g}s")
        props = write_properties(work, args.live_broker)
        prime = run_pool(live_worker, [LivePlan(broker.bootstrap, "bus", parts, names, 0, 1, 0, args.prime, None,
                                                0.0, ooo_ms, single=True)])
        cmd = fleet_command(names, types_dir, sink, ck, args, "--trigger-interval", trigger, "--drain-on-stop")
        res["load_start"] = load_average()
        job = Measured(cmd, job_env(broker.bootstrap, props, args), work / "job-live.log",
                       interval=max(2.0, args.sample_interval))  # PSS samples cost CPU: fewer over a long run
        while job.first_batch is None:
            if job.proc.poll() is not None:
                raise BenchError(f"the job exited with {job.proc.returncode} before its first batch:\n"
                                 + "\n".join(job.output().splitlines()[-30:]))
            if time.monotonic() - job.t0 > args.timeout:
                raise BenchError(f"no batch line within {args.timeout:.0f} s")
            time.sleep(0.2)
        res["up"] = job.first_batch
        t_pub = max(start, time.time() + 3.0)
        end_ms = int((t_pub + args.live_seconds) * 1000)
        boundaries = list(range((int(t_pub * 1000) // HOUR_MS + 1) * HOUR_MS, end_ms + 1, HOUR_MS))
        res["boundary_at"] = [(h / 1000 - t_pub) for h in boundaries]
        count = int(args.live_rate * args.live_seconds)
        w = args.live_producers
        plans = [LivePlan(broker.bootstrap, "bus", parts, names, k, w, args.prime, count, args.live_rate, t_pub,
                          ooo_ms, boundaries) for k in range(w)]
        print(f"live: job up in {job.first_batch:.1f} s; {args.live_rate:,} records/s for {args.live_seconds:.0f} s "
              f"from {w} process(es) at {time.strftime('%H:%M:%S', time.gmtime(t_pub))} UTC; hour boundaries at "
              + (", ".join(f"{x:.0f} s" for x in res["boundary_at"]) or "none") + " into the feed", flush=True)
        ctx = mp.get_context("spawn")
        pool = ctx.Pool(w)
        try:
            pending = pool.map_async(live_worker, plans)
            while time.time() < t_pub:
                time.sleep(0.05)
            c0 = time.monotonic()
            from bench.fleet_scale import proc_cpu_reaped

            j0, b0 = proc_cpu_reaped(job.pid), broker_stats(broker)[0]
            next_sample = c0
            next_print = c0 + 60
            while not pending.ready():
                now = time.monotonic()
                if now >= next_sample:
                    row = job.sample()
                    if row is not None:
                        series.append({"t": round(now - c0, 1), **row, "read": job.events_in(),
                                       "load": load_average()})
                    next_sample += args.live_series_every
                if now >= next_print:
                    print(f"  {now - c0:5.0f} s: the job has read {job.events_in():,}; load {load_average():.2f}",
                          flush=True)
                    next_print += 60
                if job.proc.poll() is not None:
                    raise BenchError(f"the job exited with {job.proc.returncode} while producing")
                pending.wait(0.5)
            got = pending.get()
        finally:
            pool.terminate()
            pool.join()
        tail = tail_of(args.live_broker, parts)
        if tail:  # tansu: every partition's last record alone, so that its high watermark covers the feed
            got += run_pool(live_worker, [LivePlan(broker.bootstrap, "bus", parts, names, 0, 1, args.prime + count,
                                                   tail, None, 0.0, ooo_ms, boundaries, single=True)])
        feed = merge_live(got)
        c1 = time.monotonic()
        secs = c1 - c0
        res.update({"window": secs, "tree_cores": (proc_cpu_reaped(job.pid) - j0) / secs,
                    "broker_cores": (broker_stats(broker)[0] - b0) / secs, "producer_cores": feed["cpu"] / secs})
        pr = merge_live(prime)
        for name, st in pr["types"].items():
            for h, k in st["by_hour"].items():
                feed["types"][name]["by_hour"][h] = feed["types"][name]["by_hour"].get(h, 0) + k
        total = args.prime + count + tail
        res["producer"] = {k: v for k, v in feed.items() if k != "types"}
        res["producer"]["planned"] = count + tail
        stopped = feed["t1"]  # the last acknowledgement
        deadline = time.monotonic() + max(120.0, args.live_seconds / 2)
        while job.events_in() < total and time.monotonic() < deadline and job.proc.poll() is None:
            row = job.sample() if time.monotonic() >= next_sample else None
            if row is not None:
                series.append({"t": round(time.monotonic() - c0, 1), **row, "read": job.events_in(),
                               "load": load_average()})
                next_sample += args.live_series_every
            time.sleep(0.2)
        done = None
        seen = 0
        for t, line in list(job.lines):
            if m := BATCH_LINE.search(line):
                seen += int(m.group(2).replace(",", ""))
                if seen >= total:
                    done = job.wall0 + t
                    break
        res["saved_after"] = None if done is None else done - stopped
        res["read_by_then"] = job.events_in()
        print(f"  produced {feed['produced']:,} at {feed['rate']:,.0f} records/s; everything saved "
              f"{_s(res['saved_after'])} after the last acknowledgement", flush=True)
        time.sleep(args.live_tail)
        row = job.sample()
        if row is not None:
            series.append({"t": round(time.monotonic() - c0, 1), **row, "read": job.events_in(),
                           "load": load_average()})
        res["load_max"] = job.load_max
        res["peak"] = dict(job.peak)
        rc, stop_s = job.stop(args.stop_timeout)
        res.update({"stop_exit": rc, "stop_seconds": stop_s})
        job.end()
        if rc != 0:
            raise BenchError(f"the live job exited with {rc}:\n" + "\n".join(job.output().splitlines()[-30:]))
        expected = {name: feed["types"][name]["sent"] + pr["types"][name]["sent"] for name in names}
        res["check"] = check_sink(sink, expected, "live")
        md = marker_delays(sink, names, {"types": feed["types"]}, ooo_ms)
        (work / "bus-live-markers.json").write_text(json.dumps(md["rows"], default=str))
        res["markers"] = {k: v for k, v in md.items() if k != "rows"}
        lag = []
        for t, line in job.lines:
            if (m := STATUS_LINE.match(line)) and (wm := _iso_s(m.group(2))) is not None:
                at = job.wall0 + t
                if t_pub + 30 <= at <= t_pub + args.live_seconds:
                    lag.append(at - wm)
        res["lag"] = spread(lag)
        out = job.output()
        res["batch_lines"] = len(BATCH_LINE.findall(out))
        rl = re.search(r"^\[fleet\] (\d+) rounds? with input took .*$", out, re.M)
        res["rounds_line"] = rl.group(0) if rl else None
        res["series"] = series
        if args.bare:
            wait_idle(broker)
            b0 = broker_stats(broker)[0]
            bare = bare_loop(broker.bootstrap, "bus", parts, total, conf=client_conf(args.live_broker))
            bare.update(broker_cpu=broker_stats(broker)[0] - b0, load=load_average())
            res["bare"] = bare
            print(f"  bare consumer of the topic: {total:,} in {bare['seconds']:.1f} s = {bare['rate']:,.0f} "
                  "records/s", flush=True)
        if not args.keep:
            shutil.rmtree(sink, ignore_errors=True)
            shutil.rmtree(ck, ignore_errors=True)
    finally:
        if job is not None:
            job.end()
        broker.stop()
    return res


def _iso_s(text: str) -> float | None:
    from bench.fleet_live import _iso_s as iso

    return iso(text)


# ------------------------------------------------------------------------------------------ the report


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def _mib(x: float | None) -> str:
    return "-" if not x else f"{x / 2**20:,.0f} MiB"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def _met(x: float | None, goal: float) -> str:
    return "-" if x is None else ("MET" if x >= goal else "NOT MET")


def backlog_text(res: dict, args) -> list[str]:
    rows = []
    for j in res["jobs"]:
        p = j["peak"]
        rows.append([f"{LAYOUT_TEXT[j['layout']].format(t=res['types'])} (round {j['round']})", f"{j['wall']:.1f}",
                     f"{j['rate']:,.0f}", f"{j['cpu']:.0f}", f"{j['broker_cpu']:.1f}", _mib(p["tree"]),
                     _mib(p["driver"]), _mib(p["jvm"]), j["batch_lines"], j["hours"], "yes",
                     f"{j['load']:.2f} / {j['load_max']:.2f}"])
    s = res["summary"]
    st = res.get("settle", {})
    state = ", ".join(f"{lay} {v['state_bytes'] / 2**20:,.0f} MiB" for lay, v in st.items())
    out = [f"**Backlog: {res['records']:,} records, {res['types']} types, drained with `--once --drain`** "
           f"(noida-db, a broker per layout holding only its {res['records']:,}; {res['partitions']} partitions a "
           f"topic; produced in {res['produce_seconds']:.0f} s, three layouts at once; state files {state})", "",
           markdown_table(["layout", "wall s", "records/s", "CPU s (tree)", "broker CPU s", "peak PSS tree",
                           "peak PSS Python driver", "peak PSS JVM", "batch lines", "hours marked",
                           "records per type = produced", "load start / max"], rows), ""]
    m = s["medians"]
    if s["pairs"]:
        rounds = f" (median of {len(s['pairs'])} rounds)" if len(s["pairs"]) > 1 else ""
        out += [f"- **bus / own topics: {_x(s['vs_own'])}** records/s{rounds} (goal ≥ 0.8×: "
                f"**{_met(s['vs_own'], 0.8)}**); **bus / one type: {_x(s['vs_one'])}** (goal ≥ 0.8×: "
                f"**{_met(s['vs_one'], 0.8)}**); per round: "
                + "; ".join(f"{p['vs_own']:.2f}× / {p['vs_one']:.2f}×" for p in s["pairs"]),
                f"- in CPU (a shared machine disturbs it less than wall time): own topics' CPU / the bus's "
                f"{_x(s['cpu_vs_own'])}, one type's / the bus's {_x(s['cpu_vs_one'])} (> 1: the bus used less)",
                "- medians: " + "; ".join(f"{lay} {v['wall']:.1f} s, {v['rate']:,.0f} records/s, CPU "
                                          f"{v['cpu']:.0f} s, broker CPU {v['broker_cpu']:.1f} s, driver PSS "
                                          f"{_mib(v['driver_pss'])}" for lay, v in m.items())]
    if res.get("bare"):
        b = res["bare"]
        out.append(f"- a bare consumer of the bus topic (confluent-kafka, no Spark, after the jobs): "
                   f"{b['seconds']:.1f} s, {b['rate']:,.0f} records/s (load {b['load']:.2f})")
    for j in res["jobs"]:
        if j.get("rounds_line"):
            out.append(f"- {j['layout']} round {j['round']}: `{j['rounds_line']}`")
    out.append("")
    return out


def live_text(res: dict, args) -> list[str]:
    m, pr = res["markers"], res["producer"]
    goal = f"≤ {res['bound']:g} s (1 trigger of {res['trigger']} + 2 s)"
    ok_saved = res["saved_after"] is not None and res["saved_after"] <= 15
    rows = [["all saved, after the last record's acknowledgement", "-", "-", "-", _s(res["saved_after"]), "≤ 15 s",
             "MET" if ok_saved else "NOT MET"]]
    for key, what in (("from_event", "marker: from the first record past hour end + ooo (acknowledged)"),
                      ("from_nominal", "marker: from hour end + ooo (wall clock)"),
                      ("completed_at_from_nominal", "(its manifest's completed_at, from hour end + ooo)")):
        d = m[key]
        ok = d["p99"] is not None and d["p99"] <= res["bound"]
        verdict = ("MET" if ok else "NOT MET") if d["n"] else "no hour closed"
        rows.append([what, d["n"], _s(d["p50"]), _s(d["p99"]), _s(d["max"]), goal if key != "completed_at_from_nominal"
                     else "", verdict if key == "from_event" else ""])
    lag = res["lag"]
    bounds = ", ".join(f"{x:.0f} s" for x in res.get("boundary_at", [])) or "none"
    out = [f"**Live: a bus of {res['types']} types on one {res['broker']} topic ({res['partitions']} partitions), "
           f"{res['rate']:,} records/s in all for {res['seconds']:g} s** (`run pv_01 ... --trigger-interval "
           f"{res['trigger']} --drain-on-stop`, out_of_orderness {res['ooo']:g} s, event time = produce time; hour "
           f"boundaries {bounds} into the feed; {res['prime']:,} priming records)", "",
           markdown_table(["figure", "types", "p50", "p99", "max", "goal", ""], rows), "",
           f"- producers: {res['producers']} process(es), {pr['produced']:,} of {pr['planned']:,} records, "
           f"**{pr['rate']:,.0f} records/s achieved** over {pr['span']:.1f} s (behind schedule p99 "
           f"{pr['behind_p99']:.2f} s, max {pr['behind_max']:.2f} s); their CPU {res['producer_cores']:.2f} cores",
           f"- markers missing: {m['missing_count']}; markers whose records differ from what was produced to their "
           f"hour: {m['wrong_count']}; late records: {m['late_records']}; every type's manifests after the drain: "
           f"{res['check']['records']:,} records = produced",
           f"- watermark lag (now - watermark at the status lines, every 30 s, after the first 30 s; includes the "
           f"{res['ooo']:g}-s out_of_orderness): p50 {_s(lag['p50'])}, p99 {_s(lag['p99'])}, max {_s(lag['max'])} "
           f"over {lag['n']} readings",
           f"- CPU over the feed ({res['window']:.0f} s): the job's tree {res['tree_cores']:.2f} cores, the broker "
           f"{res['broker_cores']:.2f}, the producers {res['producer_cores']:.2f}; load {res['load_start']:.2f} at "
           f"the start, {res['load_max']:.2f} at most",
           f"- job up (first batch line) in {res['up']:.1f} s; {res['batch_lines']} batch lines; "
           f"{res.get('rounds_line') or 'no round line'}; stop: SIGTERM -> exit {res['stop_exit']} in "
           f"{res['stop_seconds']:.1f} s; peak PSS tree {_mib(res['peak']['tree'])}, Python driver "
           f"{_mib(res['peak']['driver'])}, JVM {_mib(res['peak']['jvm'])}"]
    if res.get("bare"):
        b = res["bare"]
        out.append(f"- a bare consumer (confluent-kafka, no Spark) of the same {b['records']:,} records afterwards: "
                   f"{b['seconds']:.1f} s, **{b['rate']:,.0f} records/s** (broker CPU {b['broker_cpu']:.1f} s)")
    out += ["", "Memory series (t s into the feed: PSS of the job's tree MiB (JVM, Python driver), the driver's "
            "threads, records read so far, load):", ""]
    out.append("`" + "; ".join(f"{x['t']:.0f}: {x['tree'] / 2**20:.0f} ({x['jvm'] / 2**20:.0f}, "
                               f"{x['driver'] / 2**20:.0f}) {x['threads']}t {x['read']:,} {x['load']:.1f}"
                               for x in res["series"]) + "`")
    out.append("")
    return out


def report(res: dict, args, machine: dict, command: str) -> str:
    title = {"backlog": "a backlog drained", "live": "live"}[res["kind"]]
    label = f", {args.label}" if args.label else ""
    head = [f"## A bus of event types: {title} (bench/bus.py{label})", "",
            machine_lines(machine, command, res.get("load_start", (res.get("jobs") or [{}])[0].get("load"))), "",
            "Ten copies of `page_view` (`pv_01` .. `pv_10`), run together as `event-etl run pv_01 ... pv_10 "
            "--event-types DIR --checkpoint-root CK --sink SINK --master local[2]`; record `i` belongs to type "
            "`i % 10` and carries the Kafka header `type = pv_XX` (`route_attribute = \"type\"`, `route_value` its "
            "default, the type's name). The machine has 2 cores and may be shared: every figure has the load "
            "average beside it. See the docstring of bench/bus.py for how each figure is taken.", ""]
    body = backlog_text(res, args) if res["kind"] == "backlog" else live_text(res, args)
    return "\n".join(head + body)


def section_name(kind: str, label: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return f"bus-{kind}" + (f"-{slug}" if slug else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="backlog,live", help="comma-separated: backlog, live (default both)")
    ap.add_argument("--types", type=int, default=10, help="types on the bus (default 10)")
    ap.add_argument("--records", type=int, default=1_000_000, help="backlog: records in all (default 1,000,000)")
    ap.add_argument("--partitions", type=int, default=4, help="backlog: partitions of every topic (default 4)")
    ap.add_argument("--producers", type=int, default=2, help="backlog: producer processes (default 2)")
    ap.add_argument("--rounds", type=int, default=1, help="backlog: rounds of the three layouts (default 1)")
    ap.add_argument("--no-bare", dest="bare", action="store_false", help="leave out the bare consumer")
    ap.add_argument("--live-broker", choices=("tansu", "noida"), default="tansu", help="live: the broker")
    ap.add_argument("--live-partitions", type=int, default=4, help="live: partitions of the bus topic (default 4)")
    ap.add_argument("--live-rate", type=int, default=10_000, help="live: records/s in all (default 10,000)")
    ap.add_argument("--live-seconds", type=float, default=600.0, help="live: seconds of feed (default 600)")
    ap.add_argument("--live-producers", type=int, default=1, help="live: producer processes (default 1)")
    ap.add_argument("--live-ooo", type=float, default=5.0, help="live: the types' out_of_orderness, s (default 5)")
    ap.add_argument("--live-trigger", default="5s", help="live: --trigger-interval (default 5s)")
    ap.add_argument("--live-boundary-at", type=float, default=300.0,
                    help="live: a UTC hour boundary this many seconds into the feed (default 300; 0: start at once)")
    ap.add_argument("--live-setup", type=float, default=120.0, help="live: seconds set aside to set up (default 120)")
    ap.add_argument("--live-series-every", type=float, default=10.0, help="live: the memory series' step, s")
    ap.add_argument("--live-tail", type=float, default=20.0,
                    help="live: seconds the job runs on after everything is saved, before its SIGTERM (default 20)")
    ap.add_argument("--prime", type=int, default=1000, help="live: records that start the job (default 1,000)")
    ap.add_argument("--main-tree", type=Path, default=None,
                    help="measure this checkout (e.g. a git worktree of main's last commit, clean of others' work in "
                         "progress) with PYTHONPATH, as bench/fleet_scale.py does (default: this one)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--job-arg", action="append", default=[], help="an extra argument for every job")
    ap.add_argument("--sample-interval", type=float, default=0.5, help="seconds between samples of a job's tree")
    ap.add_argument("--max-load", type=float, default=3.0,
                    help="wait before each timed job until the 1-minute load is under this (default 3.0)")
    ap.add_argument("--quiet-timeout", type=float, default=900.0, help="wait for quiet at most this long, s")
    ap.add_argument("--timeout", type=float, default=1800.0, help="a job that has not ended by then fails, s")
    ap.add_argument("--stop-timeout", type=float, default=300.0)
    ap.add_argument("--label", default="", help="appended to the section names")
    ap.add_argument("--seed", type=int, default=59)
    ap.add_argument("--workdir", type=Path, default=None, help="keep logs and figures here")
    ap.add_argument("--keep", action="store_true", help="keep the live sink and checkpoints")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = set(args.scenarios) - {"backlog", "live"}
    if bad:
        ap.error(f"unknown scenarios: {', '.join(sorted(bad))}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/bus.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    created = args.workdir is None
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-bus-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    from bench.fleet_scale import make_tree

    args.tree = make_tree(args.main_tree or ROOT, "main")
    machine = describe()
    machine["event_etl"] += f"; measured: {args.tree.path} at git {args.tree.commit}"
    print(f"work folder {work}; load average {load_average():.2f} on {os.cpu_count()} cores; measuring "
          f"{args.tree.path} at {args.tree.commit}", flush=True)
    ok = False
    try:
        for kind in args.scenarios:
            res = scenario_backlog(args, work) if kind == "backlog" else scenario_live(args, work)
            (work / f"bus-{kind}.json").write_text(json.dumps(res, indent=1, default=str))
            text = report(res, args, machine, command)
            print()
            print(text)
            if not args.no_write:
                publish(section_name(kind, args.label), text, args.results)
        ok = True
    finally:
        print(f"raw figures in {work}", flush=True)
        if ok and created and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
