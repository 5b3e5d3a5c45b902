"""Where the whole ``event-etl run --drain`` spends its CPU: the JVM, and every Python process, by kind of work.

    .venv/bin/python bench/profile_job.py --events 500000

Runs the same job as :mod:`bench.compare` (directory source, ``--drain``, ``local[2]``) and
profiles each of its Python processes with ``py-spy record --native`` (pip install py-spy).
``py-spy --subprocesses`` does not follow processes through the JVM, so this script
watches the process tree every 50 ms and attaches one py-spy to each new Python process:
the ``event-etl`` driver, the streaming source runner, the data-source planners and the
``pyspark.worker`` processes that run the executor tasks.  The JVM's CPU time is read
from the kernel (py-spy cannot see into Java).

It prints, per kind of process, its CPU seconds and what its Python side spends them on
(:mod:`bench.flame`: JSON parsing, validation, Avro encoding, snappy, sha256, Arrow and
pyspark serialization between the JVM and Python, imports, file system, driver work...).
Each sample counts 1/rate s.  py-spy samples a thread that is running or waiting for a CPU
or the disk, and also many that wait on a socket (those are set apart as "waiting"), so
on a busy machine sampled seconds can exceed the kernel's CPU seconds: read the shares,
not the totals.  Profiling slows the job down too.
The summary goes to ``bench/RESULTS.md`` (section ``profile-job``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import prepare_input
from bench.contenders import count_manifests
from bench.flame import WAITING, categorize, py_spy, read_raw
from bench.livejob import LiveJob
from bench.machine import describe, load_average
from bench.procstats import sample_tree
from bench.results import machine_lines, markdown_table, publish

ROLES = [  # (role, test on the command line), first match wins
    ("driver JVM (Spark)", lambda c: c.split(" ", 1)[0].endswith("java")),
    ("Python driver (event-etl: controller, foreachBatch)", lambda c: "event-etl" in c),
    ("executor tasks (pyspark.worker)", lambda c: "pyspark.daemon pyspark.worker" in c or c.endswith("pyspark.worker")),
    ("streaming source runner", lambda c: "python_streaming_source_runner" in c),
    ("data source planning and lookup", lambda c: "data_source" in c),
]


def role_of(cmdline: str) -> str:
    for name, test in ROLES:
        if test(cmdline):
            return name
    return "other"


class Profilers:
    """One ``py-spy record`` per Python process of the job, started as the processes appear."""

    def __init__(self, out: Path, rate: int) -> None:
        self.out, self.rate, self.exe = out, rate, py_spy()
        self.procs: dict[int, subprocess.Popen] = {}
        self.cmdlines: dict[int, str] = {}

    def attach(self, pid: int, cmdline: str) -> None:
        if pid in self.procs:
            return
        self.cmdlines[pid] = cmdline
        self.procs[pid] = subprocess.Popen(
            [self.exe, "record", "--pid", str(pid), "--native", "--rate", str(self.rate), "--format", "raw",
             "-o", str(self.out / f"raw-{pid}.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self, timeout: float = 60) -> None:
        """py-spy stops by itself when its process exits; stop any still running after ``timeout``."""
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
                p.wait()


def watch(job: LiveJob, profilers: Profilers) -> dict[int, tuple[str, float]]:
    """Until the job ends: attach py-spy to new Python processes; returns pid -> (command line, CPU s)."""
    root = psutil.Process(job.pid)
    seen: dict[int, tuple[str, float]] = {}
    while job.running():
        s = sample_tree(root, with_cmdline=True, with_pss=False)
        if s is None:
            break
        for p in s.procs:
            cmd = p.get("cmdline", "")
            seen[p["pid"]] = (cmd, max(p["cpu"], seen.get(p["pid"], ("", 0.0))[1]))
            if "python" in cmd.split(" ", 1)[0]:
                profilers.attach(p["pid"], cmd)
        time.sleep(0.05)
    return seen


def summarize(seen: dict[int, tuple[str, float]], out: Path, rate: int) -> tuple[dict, dict]:
    """CPU seconds per role, and sampled seconds per (role, category)."""
    cpu: Counter = Counter()
    for cmd, secs in seen.values():
        cpu[role_of(cmd)] += secs
    cats: dict[str, Counter] = {}
    for raw in out.glob("raw-*.txt"):
        pid = int(raw.stem.split("-")[1])
        role = role_of(seen.get(pid, ("", 0.0))[0])
        c = categorize(read_raw(raw))
        cats.setdefault(role, Counter()).update({k: v / rate for k, v in c.items()})
    return dict(cpu), cats


def tables(cpu: dict, cats: dict) -> tuple[str, str]:
    """CPU per kind of process; then, per kind, what its busy samples were doing (waiting samples left out)."""
    total = sum(cpu.values()) or 1
    t1 = markdown_table(["process", "CPU s (kernel)", "share of the tree's CPU", "waiting s (py-spy)"],
                        [[r, f"{s:.1f}", f"{s / total * 100:.0f} %",
                          "-" if r not in cats else f"{cats[r].get(WAITING, 0):.1f}"]
                         for r, s in sorted(cpu.items(), key=lambda x: -x[1]) if s >= 0.05])
    rows = []
    for role, c in sorted(cats.items(), key=lambda x: -cpu.get(x[0], 0)):
        if cpu.get(role, 0) < 0.05:
            continue
        busy = {k: v for k, v in c.items() if k != WAITING}
        whole = sum(busy.values()) or 1
        for name, secs in sorted(busy.items(), key=lambda x: -x[1])[:8]:
            if secs / whole >= 0.02:
                rows.append([role, name, f"{secs:.1f}", f"{secs / whole * 100:.0f} %"])
    t2 = markdown_table(["process", "work (py-spy, native frames)", "busy s (sampled)", "share of its busy time"],
                        rows)
    return t1, t2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=500_000, help="input events (default 500,000)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--files-per-batch", type=int, default=64)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default 100)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the input, the raw py-spy files and job.log here")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/profile_job.py",
                        *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-profile-job-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        machine, load = describe(), load_average()
        inp, info = prepare_input(work, events=args.events, seed=args.seed, files=args.files)
        out, sink, ckpt = work / "py-spy", work / "sink", work / "ckpt"
        for d in (out, sink, ckpt):
            shutil.rmtree(d, ignore_errors=True)
        out.mkdir()
        cmd = [str(Path(sys.executable).with_name("event-etl")), "run", "page_view", "--source", f"dir:{inp}",
               "--sink", str(sink), "--checkpoint", str(ckpt), "--drain", "--master", args.master,
               "--max-files-per-batch", str(args.files_per_batch)]
        t0 = time.monotonic()
        job = LiveJob(cmd, log=work / "job.log")
        profilers = Profilers(out, args.rate)
        try:
            seen = watch(job, profilers)
        finally:
            code = job.stop()  # a --drain run ends by itself; interrupted, it is stopped (and drained) here
        wall = time.monotonic() - t0
        profilers.wait()
        if code != 0:
            raise SystemExit(f"event-etl exited with {code}:\n{job.tail()}")
        records, _, _ = count_manifests(sink, "page_view")
        if records != info["events"]:
            raise SystemExit(f"WRONG OUTPUT: {records:,} records in the manifests, {info['events']:,} expected")
        (work / "processes.json").write_text(json.dumps({pid: {"cmdline": c, "cpu": s, "role": role_of(c)}
                                                          for pid, (c, s) in seen.items()}, indent=1))
        cpu, cats = summarize(seen, out, args.rate)
        t1, t2 = tables(cpu, cats)
        head = (f"`event-etl run page_view --drain` on `{args.master}` over {info['events']:,} events "
                f"({info['bytes_per_event']:.0f} B) under py-spy: {wall:.1f} s wall, "
                f"{sum(cpu.values()):.1f} CPU s in the tree.")
        print(head, "", t1, "", t2, sep="\n")
        if not args.no_write:
            body = "\n".join(["## Profile of the whole job (bench/profile_job.py)", "",
                              machine_lines(machine, command, load), "", head, "", t1, "", t2])
            publish("profile-job", body, args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
