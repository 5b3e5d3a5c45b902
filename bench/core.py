"""Benchmark of the core path: JSON lines -> Avro buckets with markers, through `event-etl run --once --drain`.

Prints events/s over the whole process (start-up included) and peak memory of the process tree.
Usage: .venv/bin/python bench/core.py [--events 1000000] [--master local[2]]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.datagen import generate
from bench.procstats import run_measured


def count_records(sink: Path, event_type: str) -> tuple[int, int]:
    records = files = 0
    for marker in sink.glob(f"{event_type}/dt=*/hour=*/_COMPLETE"):
        m = json.loads(marker.read_text())
        records += m["records"]
        files += len(m["files"])
    return records, files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-bench-"))
    inp = work / "in"
    if inp.exists():
        shutil.rmtree(inp)
    info = generate(inp, args.events, files=args.files)
    print(f"input: {info['events']:,} events, {info['bytes'] / 1e6:.0f} MB, {info['bytes_per_event']:.0f} B/event, "
          f"{args.files} files, 6 event-time hours")
    for d in ("sink", "ckpt"):
        shutil.rmtree(work / d, ignore_errors=True)
    exe = Path(sys.executable).with_name("event-etl")
    cmd = [str(exe), "run", "page_view", "--source", f"dir:{inp}", "--sink", str(work / "sink"),
           "--checkpoint", str(work / "ckpt"), "--drain", "--master", args.master]
    r = run_measured(cmd, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    if r["returncode"] != 0:
        print(r["output"])
        raise SystemExit(f"event-etl failed with exit code {r['returncode']}")
    records, files = count_records(work / "sink", "page_view")
    if records != args.events:
        raise SystemExit(f"WRONG OUTPUT: {records:,} records in the buckets, {args.events:,} expected")
    batches = [(int(m.group(1).replace(",", "")), float(m.group(2)))
               for m in re.finditer(r"batch \d+: in ([\d,]+) .* ([\d.]+)s +[\d,]+ ev/s", r["output"])]
    run = re.search(r"run finished: \d+ batches in ([\d.]+)s", r["output"])
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"master {args.master}"
    )
    print(
        f"event_etl run --once --drain: {r['wall']:.1f} s wall, {args.events / r['wall']:,.0f} events/s, "
        f"CPU {r['cpu']:.1f} s, peak RSS {r['peak_rss'] / 2**20:,.0f} MiB, {files} files, {records:,} records checked"
    )
    if run:
        print(
            f"  from query start to end: {float(run.group(1)):.1f} s, {args.events / float(run.group(1)):,.0f} events/s"
        )
    if batches:
        n, secs = max(batches)
        print(f"  largest micro-batch: {n:,} events in {secs:.2f} s, {n / secs:,.0f} events/s (steady state)")
    if not args.keep and args.workdir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
