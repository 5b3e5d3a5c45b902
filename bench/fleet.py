"""How many event types one machine carries: a fleet in one Spark application, live, at a fixed total rate.

    .venv/bin/python bench/fleet.py --types 1,2,4,8 --total-rate 20000 --seconds 180 --trigger-interval 5s

For every ``N`` of ``--types``, a fresh folder of event types holds ``N`` copies of
``event_types/page_view`` named ``pv_01`` .. ``pv_N`` (same schema and settings; only each
one's ``source`` differs: its own ``dir:`` folder), and ``event-etl run --all --event-types
DIR --master local[2]`` runs them as one fleet: one shared micro-batch loop in one Spark
application (``--all`` so that ``N = 1`` is a fleet of one too, not a plain job).  Each type
has its own producer (:class:`bench.livefeed.Feed`): one JSON-lines file every
``--file-interval`` seconds, ``--total-rate / N`` events/s, so the fleet as a whole gets
``--total-rate`` events/s whatever ``N``.  The types' files arrive staggered over the
interval.  Event time runs ``--speedup`` times faster than the clock, the same for every
type, so all types close their hours at about the same moment: the fleet's worst case.  By
default an hour of event time takes 3 trigger intervals + 1 file interval of wall time (16 s
with a 5-s trigger: speedup 225), so the file that closes an hour arrives one file interval
later in the trigger's cycle each hour and the hours sample every phase of it, the worst
(just after a trigger fired) included; with a whole number of trigger intervals every hour
would see the same phase (see :func:`default_speedup`).

Per type, for every hour it closed on its own after ``--warmup``: the **marker delay**, from
the moment the watermark passed the hour's end (the arrival of the first input file holding
an event at or beyond hour end + out-of-orderness) to the first 0.1-s listing of the sink
that shows the hour's ``_COMPLETE`` (:mod:`bench.sinkwatch`), exactly as
``bench/latency.py`` measures it.  The bound is the latency target: **1 trigger interval +
2 s**.  A row is *within bound* when the fleet kept up with the feed and every type closed
at least one hour and its p99 (with a few hours: its worst) is within the bound.

The job's whole process tree (driver JVM, Python driver, Python workers) is sampled every
``--sample-interval`` s: peak RSS and PSS (:mod:`bench.procstats`), CPU seconds over the whole
run and the share of the machine's cores it kept busy while the feed ran.  At the end the
fleet is stopped with SIGTERM (stop at a batch boundary, drain every type), must exit with
0, and for every type the sum of ``records`` over its manifests must equal the events fed
to it; any difference stops the benchmark (``WRONG OUTPUT``).  Leftover processes of the
job are killed by pid.

Results: printed, the raw figures in ``results.json`` in the work folder, and the table in
``bench/RESULTS.md`` (section ``fleet-shared``; ``fleet`` holds the figures of 0.3's ``--engine queries``)
with the machine and this command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.contenders import count_manifests
from bench.figures import mib, percentile
from bench.livefeed import Feed
from bench.livejob import BATCH_LINE, LiveJob
from bench.machine import ROOT, describe, load_average
from bench.procstats import sample_tree
from bench.results import machine_lines, markdown_table, publish
from bench.sinkwatch import SinkWatcher

HOUR_MS = 3_600_000
TEMPLATE = ROOT / "event_types" / "page_view"
_BATCH_SECONDS = re.compile(r"\s([\d.]+)s\s+[\d,]+ ev/s")
_FAILED = re.compile(r"\[(\w+)\] quarantined")


class BenchError(SystemExit):
    """A run that cannot give figures: the message says why (the work folder is kept)."""


# ----------------------------------------------------------------------------------------------- setup


def type_names(n: int, width: int) -> list[str]:
    return [f"pv_{i:0{width}d}" for i in range(1, n + 1)]


def make_types(types_dir: Path, names: list[str], sources: dict[str, Path]) -> None:
    """``types_dir/<name>/`` for every name: page_view's schema and settings, reading its own ``dir:`` folder."""
    if not (TEMPLATE / "etl.toml").is_file() or not (TEMPLATE / "schema.avsc").is_file():
        raise BenchError(f"the template type is missing: {TEMPLATE} needs etl.toml and schema.avsc")
    settings = (TEMPLATE / "etl.toml").read_text()
    for name in names:
        d = types_dir / name
        d.mkdir(parents=True)
        shutil.copyfile(TEMPLATE / "schema.avsc", d / "schema.avsc")
        line = f"source = {json.dumps('dir:' + str(sources[name]))}"
        text, n = re.subn(r"(?m)^source\s*=.*$", lambda _m, line=line: line, settings)
        if n != 1:  # no `source` line to replace: add one (a top-level key, before the first table)
            text = f"source = {json.dumps('dir:' + str(sources[name]))}\n" + settings
        text = re.sub(r"(?m)^description\s*=.*$", lambda _m: 'description = "bench/fleet.py: copy of page_view"',
                      text)
        (d / "etl.toml").write_text(text)
    from event_etl.eventtypes import load_event_types  # fail here, with event_etl's message, if a copy is broken

    loaded = load_event_types(types_dir)
    for name in names:
        if loaded[name].source != f"dir:{sources[name]}":
            raise BenchError(f"{types_dir / name / 'etl.toml'}: source is {loaded[name].source!r}, "
                             f"expected dir:{sources[name]}")


def fleet_command(types_dir: Path, *, sink: Path, checkpoint: Path, master: str, trigger_interval: str,
                  max_files_per_batch: int | None) -> list[str]:
    cmd = [str(Path(sys.executable).with_name("event-etl")), "run", "--all", "--event-types", str(types_dir),
           "--sink", str(sink), "--checkpoint", str(checkpoint), "--master", master,
           "--trigger-interval", trigger_interval, "--drain-on-stop"]
    if max_files_per_batch:
        cmd += ["--max-files-per-batch", str(max_files_per_batch)]
    return cmd


def zipf_shares(n: int, exponent: float) -> list[float]:
    """Each type's share of the total rate: ``1/rank^exponent``, normalised (0: equal shares)."""
    weights = [1 / (k ** exponent) for k in range(1, n + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def files_over_bound(sink: Path, name: str, max_events_per_file: int) -> list[str]:
    """The complete hours of ``name`` with more data files than ``ceil(records / max_events_per_file) + 2``."""
    out = []
    for marker in sink.glob(f"{name}/dt=*/hour=*/_COMPLETE"):
        m = json.loads(marker.read_text())
        bound = -(-int(m["records"]) // max_events_per_file) + 2
        if len(m["files"]) > bound:
            out.append(f"{name} {m['hour']}: {len(m['files'])} files > {bound}")
    return out


# ------------------------------------------------------------------------------------------ measuring


PARTS = ("JVM", "Python driver", "other Python")


def classify(proc: dict, root_pid: int) -> str:
    """Which part of the fleet a sampled process is: the driver JVM, the ``event-etl`` process itself, or another
    Python process under the JVM (pyspark daemons, task workers)."""
    if proc["pid"] == root_pid:
        return "Python driver"
    cmd = proc.get("cmdline", "")
    if cmd.split(" ", 1)[0].endswith("java"):
        return "JVM"
    return "other Python"


class TreeSampler:
    """Samples the job's process tree every ``interval`` s: peak RSS/PSS, CPU seconds over time, every process seen."""

    def __init__(self, pid: int, *, interval: float) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.procs: dict[int, psutil.Process] = {pid: self.root}
        self.cpu: dict[int, float] = {}
        self.timeline: list[tuple[float, float]] = []  # (time.time(), CPU seconds of the tree so far)
        self.peak_rss = self.peak_pss = 0
        self.peak_parts: dict[str, dict[str, int]] = {}  # by part: PSS, RSS and processes, at the peak PSS
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for p in self.root.children(recursive=True):
                    self.procs.setdefault(p.pid, p)
            except psutil.Error:
                pass
            s = sample_tree(self.root, with_cmdline=True)
            if s is None:
                break
            self.samples += 1
            self.peak_rss = max(self.peak_rss, s.rss)
            if s.pss >= self.peak_pss:
                self.peak_pss = s.pss
                parts = {k: {"pss": 0, "rss": 0, "procs": 0} for k in PARTS}
                for p in s.procs:
                    part = parts[classify(p, self.root.pid)]
                    part["pss"] += p["pss"]
                    part["rss"] += p["rss"]
                    part["procs"] += 1
                self.peak_parts = parts
            for p in s.procs:
                self.cpu[p["pid"]] = max(self.cpu.get(p["pid"], 0.0), p["cpu"])
            self.timeline.append((time.time(), sum(self.cpu.values())))
            self._stop.wait(self.interval)

    def cpu_at(self, t: float) -> float:
        """CPU seconds of the tree at the last sample taken at or before ``t`` (0 before the first)."""
        best = 0.0
        for at, cpu in self.timeline:
            if at > t:
                break
            best = cpu
        return best

    def kill_leftovers(self, grace: float = 0.0) -> list[dict]:
        """Processes of the job's tree still alive ``grace`` s after it ended, SIGKILLed; zombies only listed.

        Only processes this sampler saw in the job's tree are touched, by their pid; psutil checks
        each one's start time first, so a reused pid is never signalled."""
        alive = []
        for p in self.procs.values():
            try:
                if p.is_running():
                    alive.append(p)
            except psutil.Error:
                pass
        if alive and grace > 0:
            _gone, alive = psutil.wait_procs(alive, timeout=grace)
        out = []
        for p in alive:
            try:
                status, cmd = p.status(), " ".join(p.cmdline())[:160] or p.name()
                if status != psutil.STATUS_ZOMBIE:
                    p.kill()
                out.append({"pid": p.pid, "status": status, "cmdline": cmd,
                            "killed": status != psutil.STATUS_ZOMBIE})
            except psutil.Error:
                pass
        return out


def _parse_ms(iso_text: str) -> int:
    return int(datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp() * 1000)


def watermark_passing(feed: Feed, hour_end_ms: int, out_of_orderness: int) -> float | None:
    """Wall time the type was first given an event that moves its watermark to ``hour_end_ms`` or past it."""
    times = [f.arrival for f in feed.fed
             if f.arrival is not None and f.max_event_time - out_of_orderness >= hour_end_ms]
    return min(times) if times else None


def marker_rows(sink: Path, name: str, seen: dict[str, float], feed: Feed, out_of_orderness: int,
                since: float) -> list[dict]:
    """Per hour ``name`` closed on its own after ``since``: watermark passing, ``completed_at``, marker visible."""
    rows = []
    for marker in sorted(sink.glob(f"{name}/dt=*/hour=*/_COMPLETE")):
        m = json.loads(marker.read_text())
        passed = watermark_passing(feed, _parse_ms(m["hour"]) + HOUR_MS, out_of_orderness)
        if passed is None or passed < since:
            continue  # closed by the final drain, or during the warm-up
        visible = seen.get(str(marker.relative_to(sink)))
        rows.append({"hour": m["hour"], "passed": passed, "written": _parse_ms(m["completed_at"]) / 1000,
                     "visible": visible, "delay": None if visible is None else visible - passed})
    return rows


def per_type_lines(job: LiveJob, name: str, since: float) -> dict:
    """From the job's output: batches of ``name`` after ``since`` (count, seconds) and events it read (no replays)."""
    prefix = f"[{name}] batch "
    secs, read = [], 0
    for t, line in list(job.lines):
        if prefix not in line:
            continue
        m = BATCH_LINE.search(line)
        if not m:
            continue
        if "(replay)" not in line:
            read += int(m.group(2).replace(",", ""))
        if t >= since and (d := _BATCH_SECONDS.search(line)):
            secs.append(float(d.group(1)))
    return {"batches": len(secs), "batch_seconds_mean": sum(secs) / len(secs) if secs else 0.0,
            "batch_seconds_max": max(secs, default=0.0), "events_read": read}


# ------------------------------------------------------------------------------------------------ run


def run_one(n: int, args, out_of_orderness: int, trigger_s: float) -> dict:
    """One fleet of ``n`` types: stage, start, feed, stop with a drain, check, measure."""
    work = args.work / f"n{n:03d}"
    if work.exists():
        shutil.rmtree(work)
    types_dir, sink, ckpt = work / "event_types", work / "sink", work / "ckpt"
    names = type_names(n, max(2, len(str(max(args.types)))))
    shares = zipf_shares(n, args.zipf)
    per_files = {name: round(args.total_rate * share * args.file_interval) for name, share in zip(names, shares)}
    per_file = round(args.total_rate / n * args.file_interval)  # the mean
    if min(per_files.values()) < 1:
        raise BenchError(f"--total-rate {args.total_rate} over {n} types is less than one event per file for the "
                         f"smallest type; raise --total-rate or --file-interval, or lower --zipf")
    files = 1 + max(1, round(args.seconds / args.file_interval))  # file 0 primes each type
    event_start = Feed.event_start_for(int(time.time() * 1000), files=files, interval=args.file_interval,
                                       speedup=args.speedup)
    feeds: dict[str, Feed] = {}
    for i, name in enumerate(names):
        feeds[name] = Feed(work / "in" / name, work / "stage" / name, files=files, events_per_file=per_files[name],
                           interval=args.file_interval, speedup=args.speedup, seed=args.seed + i,
                           event_start=event_start)
    for f in feeds.values():
        f.source.mkdir(parents=True, exist_ok=True)  # `dir:` sources must exist when the fleet starts
    make_types(types_dir, names, {name: f.source for name, f in feeds.items()})
    t_stage = time.monotonic()
    print(f"[N={n}] staging {n} × {files} files of {min(per_files.values()):,} .. {max(per_files.values()):,} events "
          f"({sum(per_files.values()) / args.file_interval:,.0f} events/s in all) ...", flush=True)
    for f in feeds.values():
        f.stage_all()
        f.drop(0)
    print(f"[N={n}] staged in {time.monotonic() - t_stage:.0f} s; starting the fleet", flush=True)

    cmd = fleet_command(types_dir, sink=sink, checkpoint=ckpt, master=args.master,
                        trigger_interval=args.trigger_interval, max_files_per_batch=args.max_files_per_batch)
    (work / "command.txt").write_text(" ".join(map(shlex.quote, cmd)) + "\n")
    rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t_launch = time.time()
    job = LiveJob(cmd, log=work / "job.log")
    sampler = TreeSampler(job.pid, interval=args.sample_interval).start()
    watcher = SinkWatcher(sink).start()
    feed_lag = 0.0
    try:
        for name in names:  # every type has run its priming batch: Spark is up
            job.wait_for(re.compile(rf"\[{re.escape(name)}\] batch \d+"), timeout=args.start_timeout)
        ready = time.time()
        start = ready + 0.5
        print(f"[N={n}] fleet ready after {ready - t_launch:.0f} s; feeding {n} × "
              f"{per_file / args.file_interval:,.0f} events/s for {args.seconds:.0f} s", flush=True)
        schedule = sorted((start + (k - 1) * args.file_interval + i * args.file_interval / n, k, name)
                          for i, name in enumerate(names) for k in range(1, files))
        for due, k, name in schedule:
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            if not job.running():
                raise BenchError(f"the fleet exited (code {job.proc.poll()}) while being fed:\n{job.tail()}")
            feed_lag = max(feed_lag, feeds[name].drop(k) - due)
        feed_end = time.time()
        total = files * sum(per_files.values())
        caught_up = job.wait_events(total, timeout=args.catch_up_timeout)
        caught_at = time.time()
        if not caught_up:
            print(f"[N={n}] the fleet did NOT keep up: {job.events_in():,} of {total:,} events read "
                  f"{args.catch_up_timeout:.0f} s after the feed ended; stopping it", flush=True)
        time.sleep(0.5)  # one more listing after the last batch
        t_stop = time.time()
        code = job.stop(timeout=args.stop_timeout)  # SIGTERM: stop at a batch boundary, drain every type
        stopped = time.time()
    except BaseException:
        _hard_stop(job, sampler)
        raise
    finally:
        sampler.stop()
        watcher.stop()
    leftovers = sampler.kill_leftovers(grace=args.exit_grace)
    if code != 0:
        raise BenchError(f"[N={n}] event-etl exited with {code} after SIGTERM (log: {work / 'job.log'}):\n{job.tail()}")
    rusage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped_cpu = (rusage_after.ru_utime + rusage_after.ru_stime) - (rusage_before.ru_utime + rusage_before.ru_stime)

    since = start + args.warmup
    per_type: dict[str, dict] = {}
    wrong = []
    from event_etl.eventtypes import load_event_type

    max_events_per_file = load_event_type(TEMPLATE).max_events_per_file
    over_bound = []
    for name in names:
        fed = files * per_files[name]
        records, out_files, hours = count_manifests(sink, name)
        over_bound += files_over_bound(sink, name, max_events_per_file)
        lines = per_type_lines(job, name, since)
        expected = fed if caught_up else lines["events_read"]
        if records != expected:
            wrong.append(f"{name}: {records:,} records in {hours} manifests, {expected:,} events "
                         f"{'fed' if caught_up else 'read'}")
        rows = marker_rows(sink, name, watcher.seen, feeds[name], out_of_orderness, since)
        delays = [r["delay"] for r in rows if r["delay"] is not None]
        per_type[name] = {"fed": fed, "records": records, "manifests": hours, "files": out_files, **lines,
                          "markers": rows, "hours": len(delays),
                          "p50": percentile(delays, 50), "p99": percentile(delays, 99),
                          "max": max(delays, default=None)}
    if wrong:
        raise BenchError(f"[N={n}] WRONG OUTPUT (log: {work / 'job.log'}):\n  " + "\n  ".join(wrong))
    restarts = [line for _, line in job.lines if _FAILED.search(line)]

    delays = [r["delay"] for t in per_type.values() for r in t["markers"] if r["delay"] is not None]
    written = [r["written"] - r["passed"] for t in per_type.values() for r in t["markers"]]
    bound = trigger_s + 2
    worst = max((t["p99"] for t in per_type.values() if t["p99"] is not None), default=None)
    every_type_closed = all(t["hours"] > 0 for t in per_type.values())
    within = (caught_up and every_type_closed and worst is not None and worst <= bound and not restarts
              and not over_bound)
    feed_cpu = sampler.cpu_at(feed_end) - sampler.cpu_at(start)
    feed_span = max(feed_end - start, 1e-9)
    result = {
        "types": n, "names": names, "per_file": per_file, "files": files,
        "total_rate": sum(per_files.values()) / args.file_interval, "per_type_rate": per_file / args.file_interval,
        "smallest_rate": min(per_files.values()) / args.file_interval,
        "largest_rate": max(per_files.values()) / args.file_interval, "engine": "shared", "zipf": args.zipf,
        "hours_over_file_bound": over_bound, "fed": files * sum(per_files.values()),
        "records": sum(t["records"] for t in per_type.values()),
        "manifests": sum(t["manifests"] for t in per_type.values()),
        "caught_up": caught_up, "catch_up_s": caught_at - feed_end, "feed_lag_s": feed_lag,
        "start_s": ready - t_launch, "drain_s": stopped - t_stop, "run_s": stopped - t_launch,
        "hours": len(delays), "p50": percentile(delays, 50), "p99": percentile(delays, 99),
        "max": max(delays, default=None), "written_p99": percentile(written, 99),
        "worst_type_p99": worst, "worst_type": max(
            (name for name, t in per_type.items() if t["p99"] is not None),
            key=lambda k: per_type[k]["p99"], default=None),
        "every_type_closed": every_type_closed, "bound": bound, "within": within,
        "peak_pss": sampler.peak_pss, "peak_rss": sampler.peak_rss, "peak_parts": sampler.peak_parts,
        "cpu_s": max(sum(sampler.cpu.values()), reaped_cpu), "feed_cpu_s": feed_cpu,
        "feed_busy": feed_cpu / feed_span / (os.cpu_count() or 1),
        "batch_seconds_max": max(t["batch_seconds_max"] for t in per_type.values()),
        "batch_seconds_mean": sum(t["batch_seconds_mean"] * t["batches"] for t in per_type.values())
        / max(1, sum(t["batches"] for t in per_type.values())),
        "restarts": restarts, "leftovers_killed": leftovers, "samples": sampler.samples,
        "rounds": next((line for _, line in job.lines if "rounds with input took" in line), None),
        "per_type": per_type,
    }
    print(f"[N={n}] {result['records']:,} records checked in {result['manifests']} manifests; "
          f"{len(delays)} hours closed live: marker p50 {_s(result['p50'])}  p99 {_s(result['p99'])}  "
          f"max {_s(result['max'])}  (worst type p99 {_s(worst)}; bound {bound:.0f} s: "
          f"{'yes' if within else 'NO'}); peak PSS {mib(sampler.peak_pss)}, RSS {mib(sampler.peak_rss)}; "
          f"CPU {result['cpu_s']:.0f} s, {result['feed_busy'] * 100:.0f} % of the cores while fed", flush=True)
    if result["rounds"]:  # the engine's own account of its rounds
        print(f"[N={n}] {result['rounds']}", flush=True)
    print(f"[N={n}] at the peak: " + ", ".join(f"{k} {mib(v['pss'])} PSS ({v['procs']} process"
                                             f"{'es' if v['procs'] != 1 else ''})"
                                             for k, v in sampler.peak_parts.items()), flush=True)
    if restarts:
        print(f"[N={n}] {len(restarts)} type failure(s):\n  " + "\n  ".join(restarts), flush=True)
    for p in leftovers:
        print(f"[N={n}] {'killed' if p['killed'] else 'left as is'}: pid {p['pid']} ({p['status']}) still in the "
              f"job's tree {args.exit_grace:g} s after event-etl exited: {p['cmdline']}", flush=True)
    if feed_lag > 0.5:
        print(f"[N={n}] the producer fell {feed_lag:.1f} s behind its schedule (busy machine): arrivals are still "
              f"exact, the rate was lower for a while", flush=True)
    return result


def _hard_stop(job: LiveJob, sampler: TreeSampler) -> None:
    """Interrupted or failed: SIGTERM, a short wait, then SIGKILL every process of the job's tree."""
    try:
        if job.running():
            job.proc.send_signal(signal.SIGTERM)
            try:
                job.proc.wait(timeout=20)
            except Exception:  # noqa: BLE001 - killed below
                pass
    finally:
        sampler.stop()
        sampler.kill_leftovers()
        try:
            job.proc.kill()
            job.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - already gone
            pass


# --------------------------------------------------------------------------------------------- report


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def table(results: list[dict]) -> str:
    header = ["engine", "types", "total ev/s", "ev/s per type (min .. max)", "hours closed", "marker p50", "p99", "max",
              "worst type p99", "within bound", "peak PSS", "peak RSS", "CPU s", "cores busy (fed)",
              "records checked"]
    rows = []
    for r in results:
        verdict = "yes" if r["within"] else "no" + (" (fell behind)" if not r["caught_up"] else
                                                     " (a type closed no hour)" if not r["every_type_closed"] else
                                                     " (a type failed)" if r["restarts"] else
                                                     " (files over bound)" if r.get("hours_over_file_bound") else "")
        per_type = (f"{r['smallest_rate']:,.0f} .. {r['largest_rate']:,.0f}" if "smallest_rate" in r
                    else f"{r['per_type_rate']:,.0f}")
        rows.append([r["engine"], r["types"], f"{r['total_rate']:,.0f}", per_type, r["hours"],
                     _s(r["p50"]), _s(r["p99"]), _s(r["max"]), _s(r["worst_type_p99"]), verdict,
                     mib(r["peak_pss"]), mib(r["peak_rss"]), f"{r['cpu_s']:.0f}", f"{r['feed_busy'] * 100:.0f} %",
                     f"{r['records']:,}"])
    return markdown_table(header, rows)


def parts_table(results: list[dict]) -> str:
    rows = []
    for r in results:
        parts = r["peak_parts"]
        rows.append([r["types"], *(f"{mib(parts[k]['pss'])} ({parts[k]['procs']})" if k in parts else "-"
                                   for k in PARTS), mib(r["peak_pss"])])
    return markdown_table(["types", "driver JVM", "Python driver", "other Python workers", "whole tree"], rows)


def verdict_line(results: list[dict], args) -> str:
    ok = [r["types"] for r in results if r["within"]]
    rate = f"{args.total_rate:,} events/s in all"
    if not ok:
        return f"No fleet size tried stayed within the bound at {rate}."
    return (f"At {rate}, the largest fleet tried whose every type closed its hours within "
            f"{results[0]['bound']:.0f} s: **{max(ok)} types** (tried {', '.join(str(r['types']) for r in results)}).")


def report(results: list[dict], args, machine: dict, command: str, load: float) -> str:
    r0 = results[0]
    return "\n".join([
        "## Event types per machine: a fleet in one application (bench/fleet.py, shared engine)", "",
        machine_lines(machine, command, load), "",
        f"`event-etl run --all` over N copies of `page_view` (`pv_01` .. `pv_N`) in "
        f"one Spark application on `{args.master}` (one shared micro-batch loop), "
        f"trigger interval {args.trigger_interval}. Each type reads its own "
        f"folder: one JSON-lines file every {args.file_interval:g} s holding "
        f"{f'a Zipf share (exponent {args.zipf:g}) of' if args.zipf else '1/N of'} `--total-rate` events, types "
        f"staggered over the interval, {args.seconds:.0f} s of feed, event time {args.speedup:g}× the clock "
        f"(every type closes an hour every {3600 / args.speedup:.3g} s, all at about the same moment, at a "
        f"phase of the trigger's cycle that moves from hour to hour); "
        f"the first {args.warmup:g} s left out. Bound: marker delay ≤ 1 trigger interval + 2 s = "
        f"{r0['bound']:.0f} s for every type (its p99; with a few hours, its worst hour), the fleet keeping up.", "",
        table(results), "",
        verdict_line(results, args), "",
        "Memory at the peak, by part (PSS, processes):", "",
        parts_table(results), "",
        "*Marker delay*: from the watermark passing an hour's end (the arrival of the first input file holding an "
        "event at or beyond hour end + out-of-orderness, 2 min) to the first 0.1-s listing of the sink showing the "
        "hour's `_COMPLETE`; hours closed only by the final drain are not counted. *hours closed*: such hours over "
        "all types. Memory: the peak of the sum over the job's process tree (driver JVM, Python driver, Python "
        "workers), sampled every " f"{args.sample_interval:g} s; PSS shares pages between forked workers, RSS counts "
        "them once per process. *CPU s*: the whole run (JVM start and drain included); *cores busy*: CPU seconds "
        "while the feed ran over (feed seconds × cores). *records checked*: sum of `records` over every type's "
        "manifests after a SIGTERM drain, equal, type by type, to the events fed.",
    ])


# ----------------------------------------------------------------------------------------------- main


def _types_arg(text: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write numbers of types separated by commas, e.g. 1,2,4,8") from None
    if not vals or vals[0] < 1 or vals[-1] > 999:
        raise argparse.ArgumentTypeError(f"{text!r}: numbers of types from 1 to 999")
    return vals


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", type=_types_arg, default=[1, 2, 4, 8],
                    help="fleet sizes to try, comma-separated (default 1,2,4,8)")
    ap.add_argument("--total-rate", type=int, default=20_000,
                    help="events per wall-clock second over all types together (default 20,000)")
    ap.add_argument("--seconds", type=float, default=180, help="how long to feed each fleet (default 180)")
    ap.add_argument("--file-interval", type=float, default=1.0, help="seconds between a type's input files (default 1)")
    ap.add_argument("--trigger-interval", default="5s", help="the fleet's trigger interval (default 5s)")
    ap.add_argument("--speedup", type=float, default=None,
                    help="event time per wall time (default: an hour every 3 trigger intervals + 1 file interval, "
                         "225 with 5s and 1 s, so hours close in the run at every phase of the trigger)")
    ap.add_argument("--warmup", type=float, default=20, help="seconds of feed left out of the figures (default 20)")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--zipf", type=float, default=0.0,
                    help="rates by type follow Zipf with this exponent: type k gets 1/k^s of the total, normalised "
                         "(default 0: equal rates; 1: a few big types and a long tail of tiny ones)")
    ap.add_argument("--exit-grace", type=float, default=10,
                    help="seconds the job's processes get to end after event-etl exits before being killed "
                         "(default 10)")
    ap.add_argument("--max-files-per-batch", type=int, default=None,
                    help="passed to event-etl run (default: event_etl's own)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sample-interval", type=float, default=1.0,
                    help="seconds between samples of the process tree's memory and CPU (default 1)")
    ap.add_argument("--start-timeout", type=float, default=300, help="seconds to wait for the fleet to start")
    ap.add_argument("--catch-up-timeout", type=float, default=120,
                    help="seconds after the feed for the fleet to read everything (default 120)")
    ap.add_argument("--stop-timeout", type=float, default=300,
                    help="seconds to wait for the SIGTERM drain before killing the job (default 300)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="work here (event types, input, sink, checkpoints, job.log per fleet size) instead of "
                         "a temporary folder")
    ap.add_argument("--keep", action="store_true", help="keep the work folder at the end (always kept on failure)")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--section", default=None,
                    help="the section of RESULTS.md to write (default: fleet-shared)")
    args = ap.parse_args(argv)
    if args.seconds <= args.warmup:
        ap.error(f"--seconds ({args.seconds:g}) must be longer than --warmup ({args.warmup:g})")
    if args.file_interval <= 0 or (args.speedup is not None and args.speedup <= 0) or args.sample_interval <= 0:
        ap.error("--file-interval, --speedup and --sample-interval must be positive")
    return args


def default_speedup(trigger_s: float, file_interval: float) -> float:
    """Event time per wall time such that an hour takes 3 trigger intervals + 1 file interval of wall time.

    Triggers fire at fixed wall-clock instants (multiples of the interval), and the input file
    that moves the watermark past an hour's end arrives once an hour of event time.  Were an
    hour a whole number of trigger intervals (240: 15 s with a 5-s trigger), that file would
    arrive at the same point of the trigger's cycle every hour, and every hour's marker delay
    would be the same, set by the chance of when the feed started.  One file interval more
    moves the arrival along the cycle hour after hour, so the hours sample every phase,
    the worst (just after a trigger fired) included."""
    return 3600 / (3 * trigger_s + file_interval)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/fleet.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    from event_etl.eventtypes import load_event_type
    from event_etl.timeutil import parse_duration

    try:
        trigger_s = parse_duration(args.trigger_interval) / 1000
    except ValueError as err:
        raise SystemExit(f"--trigger-interval: {err}") from None
    out_of_orderness = load_event_type(TEMPLATE).out_of_orderness
    if args.speedup is None:
        args.speedup = default_speedup(trigger_s, args.file_interval)
    created = args.workdir is None
    args.work = (args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-fleet-"))).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    ok = False
    t0 = time.monotonic()
    try:
        machine, load = describe(), load_average()
        print(f"work folder {args.work}; load average {load:.2f} on {os.cpu_count()} cores", flush=True)
        results = []
        for n in args.types:
            results.append(run_one(n, args, out_of_orderness, trigger_s))
            (args.work / "results.json").write_text(json.dumps(results, indent=2, default=str))
            if not args.keep:  # the next size needs the disk more than this one's input
                for sub in ("in", "stage", "sink"):
                    shutil.rmtree(args.work / f"n{n:03d}" / sub, ignore_errors=True)
        print()
        print(table(results))
        print()
        print(verdict_line(results, args))
        print(f"({time.monotonic() - t0:.0f} s in all)")
        if not args.no_write:
            section = args.section or "fleet-shared"
            publish(section, report(results, args, machine, command, load), args.results)
        ok = True
    except BenchError as err:
        print(f"error: {err.code}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("interrupted; the job was stopped", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if ok and not args.keep:
            if created:
                shutil.rmtree(args.work, ignore_errors=True)
            else:  # a folder the user named: remove what this script made in it, keep results.json
                for sub in args.work.glob("n[0-9][0-9][0-9]"):
                    shutil.rmtree(sub, ignore_errors=True)
        else:
            print(f"work folder kept: {args.work}", file=sys.stdout if ok else sys.stderr)


if __name__ == "__main__":
    main()
