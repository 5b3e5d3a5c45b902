"""Where one run's time goes, phase by phase: JVM start, session, planning, first task, tasks, driver per batch.

One command::

    .venv/bin/python bench/phases.py --events 300000,1500000,3000000 --rounds 2

For each size (the input of :mod:`bench.compare`: page views of ~226 B, 12 files, seed 7), runs
``event-etl run page_view --source dir:IN --drain`` on ``local[2]`` ``--rounds`` times, each in
a process of its own, and reports the median of each phase:

- *Python imports, checks and lease*: from the process's start (``/proc``) to the JVM's launch;
- *JVM start*: spark-submit and the py4j gateway;
- *SparkContext and session*;
- *controller, metrics, source, planning*: until the batch's Spark job is submitted;
- *submit to the first task*: until the first task of the batch starts (Spark's event log);
- *tasks*: first task start to last task end (event log), with the tasks' summed run time;
- *results to the driver*: last task end until the driver has them;
- *driver per batch*: from there to the batch's end (dedupe; ledger, watermark, markers, state);
- *drain and stopping Spark*: to the process's end.

The driver's instants come from the process itself: it runs the CLI in-process with a few
functions wrapped to note the time (nothing else changes); the tasks' from Spark's event log
(``spark.eventLog.enabled``, which costs the JVM a little).  The whole input fits one batch
(at most 64 files), as in :mod:`bench.compare`, so the batch includes its first tasks' start-up
in cold workers.  Writes section ``phases`` of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# bench's own modules are imported by the parent only: the child's imports are part of what it measures

PHASES = [
    ("imports", "Python imports of the driver, checks and lease"),
    ("jvm", "JVM start (spark-submit, py4j gateway)"),
    ("session", "SparkContext and session (the Python workers start meanwhile)"),
    ("planning", "controller, metrics, source, planning"),
    ("first_task", "submit to the first task's start"),
    ("tasks", "tasks: first start to last end"),
    ("results", "results (reports, dedupe keys) to the driver"),
    ("driver", "driver per batch: dedupe; ledger, watermark, markers, state"),
    ("stop", "drain and stopping Spark"),
]


# -- the child: one run, timed ---------------------------------------------------------------------
def _process_start() -> float:
    """When this process started (epoch seconds), from ``/proc``."""
    boot = next(float(ln.split()[1]) for ln in open("/proc/stat") if ln.startswith("btime"))
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def child(argv: list[str], out: Path) -> int:
    """Run ``event-etl`` with ``argv`` in this process, noting when the driver passes a few points."""
    marks: dict[str, list[float]] = {"process": [_process_start()]}

    def note(name: str) -> None:
        marks.setdefault(name, []).append(time.time())

    def wrap(owner, attr: str, before: str | None, after: str | None) -> None:
        fn = getattr(owner, attr)

        def wrapped(*a, **kw):
            if before:
                note(before)
            try:
                return fn(*a, **kw)
            finally:
                if after:
                    note(after)

        setattr(owner, attr, wrapped)

    from event_etl.job import controller, engine, session

    wrap(session, "_launch_own_jvm", "jvm_launch", "jvm_up")
    wrap(session, "get_session", None, "session")
    wrap(engine.Engine, "_run_splits", "submit", "collected")
    wrap(controller.Controller, "run_batch", None, "batch_end")
    wrap(controller.Controller, "drain", "drain_start", "drain_end")
    wrap(session, "stop_session", "stop_start", "stop_end")
    from event_etl.cli import main

    code = 0
    sys.argv = ["event-etl", *argv]
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    note("end")
    out.write_text(json.dumps(marks))
    return code


# -- the parent: runs, event logs, table -----------------------------------------------------------
def task_times(event_log_dir: Path) -> list[tuple[float, float, float, int]]:
    """``(launch, finish, executor run seconds, job id)`` of every task in the run's event log."""
    logs = [p for p in event_log_dir.rglob("*") if p.is_file() and not p.name.startswith(".")]
    if len(logs) != 1:
        raise SystemExit(f"expected one event log in {event_log_dir}, found {[p.name for p in logs]}")
    stage_job: dict[int, int] = {}
    out = []
    for line in logs[0].read_text().splitlines():
        ev = json.loads(line)
        if ev["Event"] == "SparkListenerJobStart":
            for sid in ev["Stage IDs"]:
                stage_job[sid] = ev["Job ID"]
        elif ev["Event"] == "SparkListenerTaskEnd":
            info = ev["Task Info"]
            run = ev.get("Task Metrics", {}).get("Executor Run Time", 0) / 1000
            out.append((info["Launch Time"] / 1000, info["Finish Time"] / 1000, run, stage_job.get(ev["Stage ID"], -1)))
    return out


def phases_of(marks: dict[str, list[float]], tasks: list[tuple[float, float, float, int]]) -> dict[str, float]:
    """Seconds per phase of one run (one batch: its Spark job is the last one submitted before ``collected``)."""
    submit, collected = marks["submit"][0], marks["collected"][0]
    batch = [t for t in tasks if submit <= t[0] <= collected]
    if not batch:
        raise SystemExit("no task of the batch in the event log")
    first, last = min(t[0] for t in batch), max(t[1] for t in batch)
    p = {
        "imports": marks["jvm_launch"][0] - marks["process"][0],
        "jvm": marks["jvm_up"][0] - marks["jvm_launch"][0],
        "session": marks["session"][0] - marks["jvm_up"][0],
        "planning": submit - marks["session"][0],
        "first_task": first - submit,
        "tasks": last - first,
        "results": collected - last,
        "driver": marks["batch_end"][0] - collected,
        "stop": marks["end"][0] - marks["batch_end"][0],
    }
    p["total"] = marks["end"][0] - marks["process"][0]
    p["batch"] = marks["batch_end"][0] - submit
    p["task_run"] = sum(t[2] for t in batch)
    p["task_count"] = len(batch)
    return p


def one_run(inp: Path, work: Path, master: str) -> dict[str, float]:
    for d in ("sink", "ckpt", "evlog"):
        shutil.rmtree(work / d, ignore_errors=True)
    (work / "evlog").mkdir(parents=True)
    marks = work / "marks.json"
    argv = ["run", "page_view", "--source", f"dir:{inp}", "--drain", "--quiet", "--master", master,
            "--sink", str(work / "sink"), "--checkpoint", str(work / "ckpt"),
            "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir=file://{work / 'evlog'}",
            "--conf", "spark.eventLog.compress=false", "--conf", "spark.eventLog.rolling.enabled=false"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, __file__, "--child", str(marks), "--", *argv], env=env, capture_output=True,
                       text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"event-etl run failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return phases_of(json.loads(marks.read_text()), task_times(work / "evlog"))


def report(by_size: dict[int, list[dict[str, float]]], info: dict[int, dict], machine, command, load) -> str:
    from bench.results import machine_lines, markdown_table

    sizes = sorted(by_size)

    def med(size: int, key: str) -> float:
        return statistics.median(r[key] for r in by_size[size])

    header = ["phase", *[f"{s / 1e6:g} M events" for s in sizes]]
    rows = [[label, *[f"{med(s, key):.2f} s" for s in sizes]] for key, label in PHASES]
    rows.append(["**total (process)**", *[f"**{med(s, 'total'):.2f} s**" for s in sizes]])
    rows.append(["the batch (submit to its end)", *[f"{med(s, 'batch'):.2f} s = {s / med(s, 'batch'):,.0f} events/s"
                                                     for s in sizes]])
    rows.append(["tasks: summed run time (count)", *[f"{med(s, 'task_run'):.2f} s ({int(med(s, 'task_count'))})"
                                                      for s in sizes]])
    rounds = len(next(iter(by_size.values())))
    sizes_mb = ", ".join(f"{info[s]['bytes'] / 1e6:.0f} MB" for s in sizes)
    lines = ["## Where a run's time goes (bench/phases.py)", "", machine_lines(machine, command, load), "",
             f"`event-etl run page_view --source dir:IN --drain` on `local[2]`, one batch (the input fits in one), "
             f"input of `bench/compare.py` ({sizes_mb}); "
             f"median of {rounds} run(s) per size, each its own process. The driver's instants are noted in the "
             "process; the tasks' come from Spark's event log.", "",
             markdown_table(header, rows), "",
             "Tasks run on 2 cores: *tasks* (wall) against their summed run time shows how well both cores were "
             "kept busy; the rest of *the batch* is Spark starting the tasks and the driver's own work."]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default="300000,1500000,3000000", help="sizes, comma-separated")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/event_etl-phases"))
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.events.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--events {args.events!r}: give sizes as integers, e.g. --events 300000,3000000")
    if not args.sizes or min(args.sizes) <= 0:
        ap.error("--events: give at least one positive size")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        raise SystemExit(child(argv[3:], Path(argv[1])))
    from bench.compare import prepare_input
    from bench.contenders import ensure_event_etl_archive
    from bench.machine import describe, load_average
    from bench.results import publish

    args = parse_args(argv)
    machine, load = describe(), load_average()
    command = ".venv/bin/python bench/phases.py " + shlex.join(argv)
    ensure_event_etl_archive()
    by_size: dict[int, list[dict[str, float]]] = {}
    info: dict[int, dict] = {}
    for size in args.sizes:
        inp, info[size] = prepare_input(args.workdir, events=size, seed=args.seed, files=args.files)
        for k in range(args.rounds):
            r = one_run(inp, args.workdir / "run", args.master)
            by_size.setdefault(size, []).append(r)
            print(f"{size:,} events, run {k + 1}: " + "  ".join(f"{key} {r[key]:.2f}" for key, _ in PHASES)
                  + f"  total {r['total']:.2f}  batch {r['batch']:.2f}", flush=True)
    body = report(by_size, info, machine, command, load)
    print(body)
    if not args.no_write:
        publish("phases", body, args.results)


if __name__ == "__main__":
    main()
