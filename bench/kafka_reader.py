"""The Kafka reader alone against the bare confluent-kafka loop, in CPU per record (issue 48 item 5).

    .venv/bin/python bench/kafka_reader.py                          # noida-db, 200,000 records, 5 rounds
    .venv/bin/python bench/kafka_reader.py --broker tansu --records 400000
    .venv/bin/python bench/kafka_reader.py --tree /tmp/old-checkout  # + the reader of another checkout, alternating

One partition of ``--records`` page views of ~225 B (:func:`bench.datagen.make_record`) is produced, then each
round reads it whole, in a fresh process per reading (as an executor task reads a split; nothing is cached
between them), in this order:

- **bare**: a ``Consumer`` assigned the partition from offset 0, ``consume(10,000)`` until it has every record,
  taking each value's length: what the broker and librdkafka give;
- **reader** (one per ``--tree``; this checkout first): :func:`event_etl.sources.read.kafka_chunks` over the
  partition's whole range, as :class:`event_etl.sources.read.KafkaReader` hands the fast path its chunks
  (values joined by newlines, timestamps as an array, the message ids).

Each reading process first imports what an executor's Python worker holds (pyspark's worker and SQL modules,
event_etl's executor and fast path; ``--bare-heap``: none of it), so that the garbage collector walks a heap of the
worker's size. Each reading reports its wall time and its process's CPU time (librdkafka's threads included) from
the moment its consumer is made to its last record, and the figures are the medians over ``--rounds``: CPU is what
a loaded machine disturbs least. The reader's CPU above the bare loop's is what reading costs the job in Python.
Nothing is written to RESULTS.md: the figures are printed."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOIDA_RECEIVE_MAX = 2_000_000_000


def _bare(topic: str, n: int, conf: dict) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    c0, w0 = time.process_time(), time.perf_counter()
    c = Consumer({**conf, "group.id": "bench.bare", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = size = 0
    while got < n:
        msgs = c.consume(num_messages=10_000, timeout=1.0)
        for m in msgs:
            if m.error() is None:
                size += len(m.value())
                got += 1
    c.close()
    return {"records": got, "bytes": size, "cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}


def _reader(topic: str, n: int) -> dict:
    from event_etl.sources.read import kafka_chunks

    c0, w0 = time.process_time(), time.perf_counter()
    got = size = chunks = 0
    for kc in kafka_chunks(topic, 0, 0, n):
        assert kc.data is not None
        got += len(kc.offsets)
        size += len(kc.data)
        chunks += 1
        _ = kc.arrivals, kc.mids
    return {"records": got, "bytes": size, "chunks": chunks, "cpu": time.process_time() - c0,
            "wall": time.perf_counter() - w0}


def child(args: argparse.Namespace) -> None:
    conf = json.loads(args.conf)
    if args.heap:  # what an executor's Python worker holds when it reads a split
        import pyspark.sql
        import pyspark.worker  # noqa: F401

        import event_etl.task.executor
        import event_etl.task.fastpath  # noqa: F401
    out = _bare(args.topic, args.records, conf) if args.child == "bare" else _reader(args.topic, args.records)
    print(json.dumps(out))


def produce(bootstrap: str, topic: str, n: int) -> None:
    import orjson
    from confluent_kafka import Producer

    sys.path.insert(0, str(ROOT))
    from bench.datagen import make_record

    rng = random.Random(7)
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                     "queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 512_000})
    t = int(time.time() * 1000)
    for i in range(n):
        prod.produce(topic, orjson.dumps(make_record("page_view", i, t + i // 1000, rng)), partition=0)
        if i % 10_000 == 0:
            prod.poll(0)
    if prod.flush(60):
        raise SystemExit("records not delivered")


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, still: float = 2.0, most: float = 300.0) -> None:
    """Until the broker's CPU time stands still for ``still`` seconds (noida saves its state after a change)."""
    deadline = time.monotonic() + most
    last, since = _cpu_of(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _cpu_of(pid)
        if now - last > 0.02:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=("noida", "tansu"), default="noida")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[], help="another checkout whose reader runs too")
    ap.add_argument("--bare-heap", dest="heap", action="store_false",
                    help="read in a bare interpreter (default: with the modules an executor's worker imports, "
                    "pyspark's and event_etl's, loaded first: a heap of their size, which the garbage collector walks)")
    ap.add_argument("--child", choices=("bare", "reader"), help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--conf", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(ROOT))
    from tests.lib.servers import KafkaBroker, NoidaKafka

    work = Path(tempfile.mkdtemp(prefix="kreader-"))
    broker = (NoidaKafka if args.broker == "noida" else KafkaBroker)(work).start()
    try:
        topic = "reader"
        broker.create_topic(topic, 1)
        produce(broker.bootstrap, topic, args.records)
        assert broker.proc is not None
        wait_idle(broker.proc.pid)
        conf: dict = {"bootstrap.servers": broker.bootstrap}
        props = work / "kafka.properties"
        if args.broker == "noida":
            conf["receive.message.max.bytes"] = NOIDA_RECEIVE_MAX
            props.write_text(f"receive.message.max.bytes={NOIDA_RECEIVE_MAX}\n")
        else:
            props.write_text("")
        env = {**os.environ, "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
               "EVENT_ETL_KAFKA_PROPERTIES": str(props)}
        readers = [("bare", None), ("reader", str(ROOT))] + [("reader", t) for t in args.tree]
        runs: dict[str, list[dict]] = {}
        for r in range(args.rounds):
            for kind, tree in readers:
                name = kind if tree is None else f"reader {tree}"
                cenv = dict(env)
                if tree is not None:
                    cenv["PYTHONPATH"] = tree
                cmd = [sys.executable, __file__, "--child", kind, "--topic", topic, "--records", str(args.records),
                       "--conf", json.dumps(conf)] + ([] if args.heap else ["--bare-heap"])
                out = subprocess.run(cmd, env=cenv, cwd=tree or ROOT, capture_output=True, text=True, check=False)
                if out.returncode:
                    raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
                got = json.loads(out.stdout.strip().splitlines()[-1])
                if got["records"] != args.records:
                    raise SystemExit(f"{name} read {got['records']} records, not {args.records}")
                runs.setdefault(name, []).append(got)
                print(f"round {r + 1} {name}: {got['cpu'] * 1e6 / args.records:.2f} us CPU/record, "
                      f"{got['wall']:.2f} s", flush=True)
        bare_cpu = statistics.median(g["cpu"] for g in runs["bare"])
        print(f"\n{args.records:,} records of one partition on {broker.name}, medians of {args.rounds} rounds:")
        print("| reading | CPU us/record | CPU range | wall s | records/s | CPU over bare, us/record |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, got in runs.items():
            cpus = [g["cpu"] * 1e6 / args.records for g in got]
            cpu, wall = statistics.median(g["cpu"] for g in got), statistics.median(g["wall"] for g in got)
            print(f"| {name} | {cpu * 1e6 / args.records:.2f} | {min(cpus):.2f}-{max(cpus):.2f} | {wall:.2f} | "
                  f"{args.records / wall:,.0f} | {(cpu - bare_cpu) * 1e6 / args.records:+.2f} |")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
