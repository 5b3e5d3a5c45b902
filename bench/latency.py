"""Latency of event_etl in a live run at a fixed rate: event arrival -> file visible, watermark -> marker.

    .venv/bin/python bench/latency.py --rate 20000 --seconds 300 --trigger-interval 5s

A producer (:mod:`bench.livefeed`) drops one JSON-lines file every ``--file-interval`` seconds
into a folder (``--rate`` events/s), and a live ``event-etl run page_view --source dir:...``
(no ``--once``) reads it.  A watcher (:mod:`bench.sinkwatch`) lists the sink every 0.1 s and
records when each file first appears.  Event time runs ``--speedup`` times faster than the
clock, so hours close during the run; arrival and visibility are wall-clock instants.

Two latencies, p50 and p99:

- **visible**: for every event, (first listing that shows the ``.avro`` file holding it) -
  (wall time its input file arrived).  Each output record is traced to its input file by
  the file index in its UUID (read after the run, so the measurement costs the job nothing).
  Target: p99 <= 2 trigger intervals + 2 s.
- **marker**: for every hour the job closed on its own, (``_COMPLETE`` visible) - (the
  moment the watermark passed the hour's end).  The watermark is the largest event time
  seen minus the type's out-of-orderness, so it passes the end of hour H as soon as the job
  has *been given* an event at or after H's end + out-of-orderness: the arrival of the first
  input file holding one.  The figure is therefore how long the job takes to act on it
  (wait for the next trigger, run the batch, write the marker).  ``completed_at`` in the
  manifest (when the job decided; the file is visible just after) is shown too.  Hours
  closed by the final drain have no such moment and are left out.  Target: p99 <= 1
  trigger interval + 2 s.

The first ``--warmup`` seconds of the feed (Python workers starting, JIT) are left out of
both.  Before the feed, one priming file lets the job start and run its first batch; its
events are left out too.  At the end the job is stopped with SIGTERM (drain), and the sum
of ``records`` over the manifests must equal every event fed.  Results go to
``bench/RESULTS.md`` (section ``latency``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.contenders import count_manifests
from bench.figures import weighted_percentile
from bench.livefeed import Feed, file_index_of
from bench.livejob import BATCH_LINE, LiveJob, event_etl_command
from bench.machine import describe, load_average
from bench.results import machine_lines, markdown_table, publish
from bench.sinkwatch import SinkWatcher

EVENT_TYPE = "page_view"
HOUR_MS = 3_600_000


def visible_latencies(sink: Path, seen: dict[str, float], arrivals: dict[int, float]) -> tuple[Counter, int]:
    """``Counter[(latency s rounded to ms)] = events`` over the output files, and how many events were left out.

    Reads every ``.avro`` file the watcher saw, from the hard links it kept in ``sink`` (files the
    job merged away since are still there), maps each record to its input file through its UUID,
    and takes, per event, (first file that held it seen) - (input file arrival): a merged file
    holds records that were visible before, in the files it replaced.
    """
    import fastavro

    first: dict[str, tuple[float, int]] = {}  # event id -> (first seen, input file)
    for rel, first_seen in seen.items():
        if not rel.endswith(".avro") or not (sink / rel).exists():
            continue
        with open(sink / rel, "rb") as fh:
            for rec in fastavro.reader(fh):
                eid = str(rec["event_id"])
                if eid not in first or first_seen < first[eid][0]:
                    first[eid] = (first_seen, file_index_of(eid))
    hist: Counter = Counter()
    left_out = 0  # events of input files not in ``arrivals`` (priming file, warm-up)
    for first_seen, k in first.values():
        if k in arrivals:
            hist[round(first_seen - arrivals[k], 3)] += 1
        else:
            left_out += 1
    return hist, left_out


def watermark_passing(feed: Feed, hour_end_ms: int, out_of_orderness: int) -> float | None:
    """Wall time the job was first given an event that moves its watermark to ``hour_end_ms`` or past it."""
    times = [f.arrival for f in feed.fed
             if f.arrival is not None and f.max_event_time - out_of_orderness >= hour_end_ms]
    return min(times) if times else None


def marker_latencies(sink: Path, seen: dict[str, float], feed: Feed, out_of_orderness: int,
                     since: float) -> list[dict]:
    """Per hour the job closed after ``since`` on its own: hour, watermark passing, marker written and visible."""
    rows = []
    for marker in sorted(sink.glob(f"{EVENT_TYPE}/dt=*/hour=*/_COMPLETE")):
        m = json.loads(marker.read_text())
        hour = _parse_ms(m["hour"])
        passed = watermark_passing(feed, hour + HOUR_MS, out_of_orderness)
        if passed is None or passed < since:
            continue
        rel = str(marker.relative_to(sink))
        rows.append({"hour": m["hour"], "passed": passed, "written": _parse_ms(m["completed_at"]) / 1000,
                     "visible": seen.get(rel)})
    return rows


def _parse_ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _ooo_ms() -> int:
    from event_etl.eventtypes import load_event_types, resolve_event_types_dir

    return load_event_types(resolve_event_types_dir(None))[EVENT_TYPE].out_of_orderness


def _trigger_seconds(text: str) -> float:
    from event_etl.timeutil import parse_duration

    return parse_duration(text) / 1000


def batch_figures(job: LiveJob, since: float) -> dict:
    """Batches after ``since``: how many, events per batch, time per batch (from the progress lines)."""
    import re

    secs, sizes = [], []
    for t, line in job.lines:
        m = BATCH_LINE.search(line)
        if m and t >= since:
            sizes.append(int(m.group(2).replace(",", "")))
            d = re.search(r"\s([\d.]+)s\s+[\d,]+ ev/s", line)
            if d:
                secs.append(float(d.group(1)))
    return {"batches": len(sizes), "events_per_batch": sum(sizes) / len(sizes) if sizes else 0,
            "max_batch_seconds": max(secs, default=0.0), "mean_batch_seconds": sum(secs) / len(secs) if secs else 0.0}


def run(args) -> dict:
    """Stage the feed, start the job, feed at the fixed rate, stop, check the output; returns the raw figures."""
    work = args.work
    source, stage, sink, ckpt = work / "in", work / "stage", work / "sink", work / "ckpt"
    seen_files = work / "seen-files"  # hard links of every data file as first seen (see SinkWatcher)
    for d in (source, stage, sink, ckpt, seen_files):
        shutil.rmtree(d, ignore_errors=True)
    per_file = max(1, round(args.rate * args.file_interval))
    files = 1 + max(1, round(args.seconds / args.file_interval))  # file 0 primes the job
    feed = Feed(source, stage, files=files, events_per_file=per_file, interval=args.file_interval,
                speedup=args.speedup, seed=args.seed,
                event_start=Feed.event_start_for(int(time.time() * 1000), files=files, interval=args.file_interval,
                                                 speedup=args.speedup))
    print(f"staging {files} files of {per_file:,} events ...", flush=True)
    feed.stage_all()
    feed.drop(0)
    cmd = event_etl_command(EVENT_TYPE, source=f"dir:{source}", sink=sink, checkpoint=ckpt, master=args.master,
                            trigger_interval=args.trigger_interval)
    job = LiveJob(cmd, log=work / "job.log")
    watcher = SinkWatcher(sink, keep=seen_files).start()
    try:
        job.wait_for(BATCH_LINE, timeout=300)  # the priming batch: Spark is up
        start = time.time() + 0.5
        print(f"job ready; feeding {args.rate:,} events/s for {args.seconds:.0f} s", flush=True)
        feed.run(1, start=start)
        total = files * per_file
        caught_up = job.wait_events(total, timeout=args.seconds + 120)
        time.sleep(0.5)  # one more listing after the last batch
    finally:
        code = job.stop()
        watcher.stop()
    if code != 0:
        raise SystemExit(f"event-etl exited with {code}:\n{job.tail()}")
    records, _, hours = count_manifests(sink, EVENT_TYPE)
    if records != total:
        raise SystemExit(f"WRONG OUTPUT: {records:,} records in the manifests, {total:,} events fed")
    since = start + args.warmup
    arrivals = {f.index: f.arrival for f in feed.fed if f.index > 0 and f.arrival is not None and f.arrival >= since}
    hist, _excluded = visible_latencies(seen_files, watcher.seen, arrivals)
    markers = marker_latencies(sink, watcher.seen, feed, _ooo_ms(), since)
    return {"hist": hist, "markers": markers, "records": records, "hours": hours, "caught_up": caught_up,
            "batches": batch_figures(job, since), "fed": total, "per_file": per_file, "files": files,
            "feed_seconds": time.time() - start}


def summarize(raw: dict, trigger_s: float) -> dict:
    """p50/p99/max of both latencies and the targets."""
    hist = raw["hist"]
    vals, weights = list(hist), list(hist.values())
    vis = {q: weighted_percentile(vals, weights, q) for q in (50, 99, 100)}
    written = [m["written"] - m["passed"] for m in raw["markers"]]
    visible = [m["visible"] - m["passed"] for m in raw["markers"] if m["visible"] is not None]
    one = [1] * len(visible)
    mark = {q: weighted_percentile(visible, one, q) for q in (50, 99, 100)}
    mark_w = {q: weighted_percentile(written, [1] * len(written), q) for q in (50, 99, 100)}
    vis_target, mark_target = 2 * trigger_s + 2, trigger_s + 2
    return {
        "visible": vis, "visible_events": sum(weights), "visible_target": vis_target,
        "visible_ok": vis[99] is not None and vis[99] <= vis_target,
        "marker": mark, "marker_written": mark_w, "marker_hours": len(visible), "marker_target": mark_target,
        "marker_ok": mark[99] is not None and mark[99] <= mark_target,
    }


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def report(raw: dict, s: dict, args, machine: dict, command: str, load: float) -> str:
    b = raw["batches"]
    rows = [
        ["event arrival → file visible", f"{s['visible_events']:,} events", _s(s["visible"][50]),
         _s(s["visible"][99]), _s(s["visible"][100]), f"≤ {s['visible_target']:.0f} s",
         "MET" if s["visible_ok"] else "NOT MET"],
        ["watermark passes hour end → `_COMPLETE` visible", f"{s['marker_hours']} hours", _s(s["marker"][50]),
         _s(s["marker"][99]), _s(s["marker"][100]), f"≤ {s['marker_target']:.0f} s",
         "MET" if s["marker_ok"] else "NOT MET"],
        ["… to `completed_at` in the manifest", f"{s['marker_hours']} hours", _s(s["marker_written"][50]),
         _s(s["marker_written"][99]), _s(s["marker_written"][100]), "", ""],
    ]
    return "\n".join([
        "## Latency in a live run (bench/latency.py)", "",
        machine_lines(machine, command, load), "",
        f"Directory source, one file of {raw['per_file']:,} events every {args.file_interval:g} s "
        f"({args.rate:,} events/s) for {args.seconds:.0f} s, trigger interval {args.trigger_interval}, "
        f"`{args.master}`, event time {args.speedup:g}× the clock; the first {args.warmup:g} s left out. "
        f"{raw['records']:,} records checked in {raw['hours']} manifests. Batches after warm-up: {b['batches']}, "
        f"{b['events_per_batch']:,.0f} events each on average, {b['mean_batch_seconds']:.2f} s mean / "
        f"{b['max_batch_seconds']:.2f} s longest. "
        + ("" if raw["caught_up"] else "**The job did not keep up with the feed.** "), "",
        markdown_table(["latency", "samples", "p50", "p99", "max", "target (p99)", ""], rows), "",
        "Arrival is the wall-clock instant an input file was renamed into the source folder; visible is the "
        "first 0.1-s listing of the sink that showed the output file (so figures are up to 0.1 s late, never "
        "early). The watermark passes an hour's end when the job is given the first event at or beyond "
        "hour end + out-of-orderness (2 min); hours closed only by the final drain are not counted. "
        "With few hours, p99 is the worst hour.",
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=20_000, help="events per wall-clock second (default 20,000)")
    ap.add_argument("--seconds", type=float, default=300, help="how long to feed (default 300)")
    ap.add_argument("--file-interval", type=float, default=1.0, help="seconds between input files (default 1)")
    ap.add_argument("--trigger-interval", default="5s", help="the job's trigger interval (default 5s)")
    ap.add_argument("--speedup", type=float, default=None,
                    help="event time per wall time (default: an hour every 3 trigger intervals + 1 file interval, "
                         "225 with the defaults, so hours close in the run and each closes at another phase of "
                         "the trigger's cycle, the worst included; see bench.fleet.default_speedup)")
    ap.add_argument("--warmup", type=float, default=20, help="seconds of feed left out of the figures (default 20)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=None, help="keep input, sink and job.log here")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    if args.speedup is None:
        from bench.fleet import default_speedup

        args.speedup = default_speedup(_trigger_seconds(args.trigger_interval), args.file_interval)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/latency.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    args.work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-latency-"))
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        machine, load = describe(), load_average()
        raw = run(args)
        s = summarize(raw, _trigger_seconds(args.trigger_interval))
        print(f"visible: p50 {_s(s['visible'][50])}  p99 {_s(s['visible'][99])}  max {_s(s['visible'][100])}  "
              f"({s['visible_events']:,} events; target p99 ≤ {s['visible_target']:.0f} s: "
              f"{'MET' if s['visible_ok'] else 'NOT MET'})")
        print(f"marker:  p50 {_s(s['marker'][50])}  p99 {_s(s['marker'][99])}  max {_s(s['marker'][100])}  "
              f"({s['marker_hours']} hours; target p99 ≤ {s['marker_target']:.0f} s: "
              f"{'MET' if s['marker_ok'] else 'NOT MET'})")
        b = raw["batches"]
        print(f"batches after warm-up: {b['batches']}, {b['events_per_batch']:,.0f} events each on average, "
              f"{b['mean_batch_seconds']:.2f} s mean, {b['max_batch_seconds']:.2f} s longest")
        if not raw["caught_up"]:
            print("the job did NOT keep up with the feed")
        if not args.no_write:
            publish("latency", report(raw, s, args, machine, command, load), args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
