"""Memory of a long live run of event_etl: does it stay flat as event time goes by?

    .venv/bin/python bench/memory.py --minutes 30

Runs ``event-etl run page_view --source generate:rate=R,speedup=S`` live (no ``--once``)
for ``--minutes``, with the generator's event time running fast enough that at least
``--event-hours`` hours (default 24) pass, so the job opens and closes an hour every minute
or so: per-hour state (ledgers, dedupe keys, markers) that was never released would show.
The generator's default mix is kept: out-of-order, late, too-late, future, invalid events,
so every path (late files, dead-letter files) runs.

Every ``--sample-every`` seconds the job's process tree is sampled and each process counted
in one part, by what it is:

- **driver JVM**: the ``java`` process (Spark's driver and, on ``local[N]``, its executors);
- **Python driver**: the ``event-etl`` process itself (the controller, ``foreachBatch``);
- **Python workers**: every other Python process under the JVM (``pyspark.daemon`` and the
  workers it forks, the data source's planner).

It prints each part's RSS at the start (the first window after ``--warmup``), the middle and
the end of the run (medians over windows of samples, so one sample taken mid-collection
does not decide), the growth from start to end in %, and a verdict: **flat** when no part
and not the whole tree grew by more than ``--tolerance`` % (default 10).  At the end the job
is stopped with SIGTERM (drain) and must exit cleanly; the number of hours it marked is
checked against ``--event-hours``.  Samples go to ``samples.json`` in the work folder, the
summary to ``bench/RESULTS.md`` (section ``memory``).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.contenders import count_manifests
from bench.livejob import BATCH_LINE, LiveJob, event_etl_command
from bench.machine import describe, load_average
from bench.procstats import sample_tree
from bench.results import machine_lines, markdown_table, publish

PARTS = ("driver JVM", "Python driver", "Python workers", "other")


def classify(proc: dict, root_pid: int) -> str:
    """Which part of the job a sampled process is (see the module docstring)."""
    if proc["pid"] == root_pid:
        return "Python driver"
    cmd = proc.get("cmdline", "")
    first = cmd.split(" ", 1)[0]
    if first.endswith("java") or "/java " in cmd[:200]:
        return "driver JVM"
    if "python" in first:
        return "Python workers"
    return "other"


def take_sample(root: psutil.Process, t0: float) -> dict | None:
    """One sample: seconds since start, and RSS/PSS/process count per part."""
    s = sample_tree(root, with_cmdline=True)
    if s is None:
        return None
    parts = {p: {"rss": 0, "pss": 0, "procs": 0} for p in PARTS}
    for proc in s.procs:
        part = parts[classify(proc, root.pid)]
        part["rss"] += proc["rss"]
        part["pss"] += proc["pss"]
        part["procs"] += 1
    return {"t": s.at - t0, "parts": parts, "rss": s.rss, "pss": s.pss}


def window(samples: list[dict], lo: float, hi: float) -> list[dict]:
    return [s for s in samples if lo <= s["t"] <= hi]


def figures(samples: list[dict], lo: float, hi: float) -> dict[str, float]:
    """Median RSS (bytes) of each part, the tree's RSS and PSS, over the samples in ``[lo, hi]`` seconds."""
    w = window(samples, lo, hi) or samples[-1:]
    out = {p: statistics.median(s["parts"][p]["rss"] for s in w) for p in PARTS}
    out.update({f"{p} processes": statistics.median(s["parts"][p]["procs"] for s in w) for p in PARTS})
    out["whole tree (RSS)"] = statistics.median(s["rss"] for s in w)
    out["whole tree (PSS)"] = statistics.median(s["pss"] for s in w)
    return out


def summarize(samples: list[dict], *, warmup: float, tolerance: float) -> dict:
    """Start, middle and end figures, growth per part, and the verdict."""
    end = samples[-1]["t"]
    span = max(15.0, 0.05 * end)
    start_f = figures(samples, warmup, warmup + span)
    mid = (warmup + end) / 2
    mid_f = figures(samples, mid - span / 2, mid + span / 2)
    end_f = figures(samples, end - span, end)
    growth = {k: (end_f[k] - start_f[k]) / start_f[k] * 100 if start_f[k] else 0.0
              for k in start_f if not k.endswith("processes")}
    late = {k: (end_f[k] - mid_f[k]) / mid_f[k] * 100 if mid_f[k] else 0.0 for k in growth}
    judged = [k for k in growth if k != "other" and start_f[k]]
    flat = all(growth[k] <= tolerance for k in judged)
    return {"start": start_f, "middle": mid_f, "end": end_f, "growth": growth, "late_growth": late, "flat": flat,
            "window_s": span, "times": (warmup, mid, end)}


def run(args) -> tuple[list[dict], dict]:
    """The live run: start, sample until ``--minutes`` have passed, drain, check."""
    work = args.work
    sink, ckpt = work / "sink", work / "ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    source = f"generate:rate={args.rate},speedup={args.speedup:g},seed={args.seed}"
    job = LiveJob(event_etl_command("page_view", source=source, sink=sink, checkpoint=ckpt, master=args.master,
                                    trigger_interval=args.trigger_interval), log=work / "job.log")
    root = psutil.Process(job.pid)
    samples: list[dict] = []
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60
    next_print = t0
    try:
        while time.monotonic() < deadline and job.running():
            s = take_sample(root, t0)
            if s is None:
                break
            samples.append(s)
            if time.monotonic() >= next_print:
                print(f"{s['t']:7.0f} s  " + "  ".join(f"{p} {s['parts'][p]['rss'] / 2**20:,.0f} MiB"
                                                      for p in PARTS[:3]), flush=True)
                next_print += 60
            time.sleep(max(0.0, args.sample_every - (time.monotonic() - t0 - s["t"])))
    finally:
        code = job.stop()
    if code != 0:
        raise SystemExit(f"event-etl exited with {code}:\n{job.tail()}")
    records, _, hours = count_manifests(sink, "page_view")
    batches = sum(1 for _, line in job.lines if BATCH_LINE.search(line))
    facts = {"hours": hours, "records": records, "events_in": job.events_in(), "batches": batches}
    (work / "samples.json").write_text(json.dumps(samples))
    return samples, facts


def _mib(x: float) -> str:
    return f"{x / 2**20:,.0f} MiB"


def _cell(summary: dict, when: str, part: str) -> str:
    n = summary[when].get(f"{part} processes")
    return _mib(summary[when][part]) + ("" if n is None or n == 1 else f" ({n:g} processes)")


def table(summary: dict) -> str:
    rows = [[k, _cell(summary, "start", k), _cell(summary, "middle", k), _cell(summary, "end", k),
             f"{summary['growth'][k]:+.1f} %", f"{summary['late_growth'][k]:+.1f} %"]
            for k in summary["growth"] if k != "other"]
    t = summary["times"]
    return markdown_table(["part", f"start ({t[0]:.0f} s)", f"middle ({t[1]:.0f} s)", f"end ({t[2]:.0f} s)",
                           "growth start → end", "middle → end"], rows)


def report(summary: dict, facts: dict, args, machine: dict, command: str, load: float) -> str:
    return "\n".join([
        "## Memory over a long live run (bench/memory.py)", "",
        machine_lines(machine, command, load), "",
        f"Generator source at {args.rate:,} events/s, event time {args.speedup:g}× the clock, for "
        f"{args.minutes:g} minutes, trigger interval {args.trigger_interval}, `{args.master}`: {facts['batches']} "
        f"batches, {facts['events_in']:,} events read, {facts['hours']} event-time hours marked "
        f"({facts['records']:,} records in their manifests). RSS sampled every {args.sample_every:g} s; each figure "
        f"is the median over {summary['window_s']:.0f} s of samples; start is after {args.warmup:g} s of warm-up.",
        "",
        table(summary), "",
        f"Verdict: **{'flat' if summary['flat'] else 'GROWING'}** (no part may grow more than {args.tolerance:g} % "
        "from start to end). Growth in the first half only (middle → end near 0) is warm-up, such as the JVM "
        "heap expanding towards its limit; a leak grows in both halves.",
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30, help="length of the run (default 30)")
    ap.add_argument("--event-hours", type=float, default=24, help="event-time hours the run must cover (default 24)")
    ap.add_argument("--speedup", type=float, default=None,
                    help="event time per wall time (default: enough for --event-hours in --minutes, +10 %%)")
    ap.add_argument("--rate", type=int, default=20_000, help="events per wall-clock second (default 20,000)")
    ap.add_argument("--trigger-interval", default="5s")
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples (default 5)")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before the start window (default: 10 %% of "
                    "the run, at least 30)")
    ap.add_argument("--tolerance", type=float, default=10.0, help="largest growth in %% still called flat")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=None, help="keep sink, job.log and samples.json here")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    if args.speedup is None:
        args.speedup = math.ceil(args.event_hours * 3600 / (args.minutes * 60) * 1.1)
    if args.warmup is None:
        args.warmup = max(30.0, 0.1 * args.minutes * 60)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/memory.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    args.work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-memory-"))
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        machine, load = describe(), load_average()
        print(f"live run: {args.minutes:g} min, {args.rate:,} events/s, speedup {args.speedup:g} "
              f"(~{args.minutes * 60 * args.speedup / 3600:.0f} event-time hours)", flush=True)
        samples, facts = run(args)
        if len(samples) < 3:
            raise SystemExit("too few samples: the job ended early; see job.log")
        summary = summarize(samples, warmup=args.warmup, tolerance=args.tolerance)
        print(table(summary))
        print(f"{facts['hours']} event-time hours marked, {facts['batches']} batches, {facts['events_in']:,} events")
        if facts["hours"] < args.event_hours:
            print(f"note: only {facts['hours']} hours were marked (< {args.event_hours:g}): raise --speedup")
        print(f"verdict: {'flat' if summary['flat'] else 'GROWING'} (tolerance {args.tolerance:g} %)")
        if not args.no_write:
            publish("memory", report(summary, facts, args, machine, command, load), args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
