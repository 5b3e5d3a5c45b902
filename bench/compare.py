"""event_etl against Spark's own streaming file sink, on the same input, on this machine.

One command::

    .venv/bin/python bench/compare.py --events 3000000 --seed 7 --rounds 2

1. Generates the input once (:mod:`bench.datagen`: page views of ~225 bytes as JSON lines,
   6 hours of event time, mild disorder; same ``--events``/``--seed``/``--files``, same bytes).
2. Runs the contenders in turn, alternating round after round (A B C A B C ...), each as its
   own process with a fresh sink and checkpoint, on ``--master`` (default ``local[2]``):
   ``event_etl`` (``event-etl run page_view --source dir:IN --drain``: validation, routing,
   dedupe, snappy Avro files, ``_COMPLETE`` manifests with sha256), then Spark's file sink
   partitioned by event date and hour as JSON, as Parquet and as snappy Avro (Spark's built-in
   ``AvroFileFormat``: the same kind of files as event_etl's, its like-for-like peer) (:mod:`bench.spark_sink`).
   Both sides are given the same number of files per micro-batch (``--files-per-batch``,
   event_etl's default of 64; Spark's own default is unlimited).
   ``event_etl-protobuf`` and ``event_etl-confluent`` (not run unless named in ``--contenders``) are the same
   events sent as Protobuf and as Confluent-framed Avro (:mod:`bench.dialects`: one base64 line each, the same
   files and arrival times), read by the types ``page_view_pb`` and ``page_view_cf`` through their fast path.
   Before the first measured run, each side gets a JVM class archive of its own kind of run
   (event_etl: ``event-etl warmup``; Spark: its file sink over 20,000 of the input's events),
   so both start as a machine set up to run them would.
   Then ``--memory-rounds`` more (default 1) that also sample the trees' PSS: reading it makes
   the kernel walk every page of every process, ~17 ms a sample on 2 cores, CPU taken from the
   run it measures (event_etl's batch ran ~10 % slower under it), so the speed rounds do not.
3. Checks every output's record count against the input (a wrong count stops everything).
4. Prints, per contender, the median over rounds of: events/s over the whole process,
   events/s in steady state (largest micro-batch), CPU seconds, and from the memory rounds the
   peak memory of the process tree (RSS summed, and PSS: shared pages counted once); and the
   ratios event_etl / Spark.  Writes the table, every round's figures and the machine to ``bench/RESULTS.md``
   (section ``compare``).

See :mod:`bench.contenders` for exactly what each figure measures.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.contenders import (
    CONTENDERS,
    RunResult,
    ensure_event_etl_archive,
    parquet_type_dir,
    run_event_etl,
    run_spark,
    spark_archive_options,
)
from bench.datagen import generate
from bench.figures import median, mib, rate, ratio
from bench.machine import ROOT, describe, load_average
from bench.results import machine_lines, markdown_table, publish

DIALECT_CONTENDERS = ("event_etl-protobuf", "event_etl-confluent")
"""Issue 56: the page views as Protobuf and as Confluent-framed Avro, beside JSON (named in ``--contenders``)."""
DIALECT_TARGET = 1.0  # issue 56: each dialect at least as fast as the JSON path on the same events

SCHEMAS = {"page_view": ROOT / "event_types" / "page_view" / "schema.avsc",
           "small_view": ROOT / "bench" / "event_types" / "small_view" / "schema.avsc"}


def prepare_input(work: Path, *, events: int, seed: int, files: int, shape: str = "page_view",
                  event_bytes: int | None = None) -> tuple[Path, dict]:
    """The input folder for these options, generated unless ``work`` already holds exactly it."""
    params = {"events": events, "seed": seed, "files": files, "shape": shape, "event_bytes": event_bytes}
    tag = f"in-{shape}-{events}-{seed}-{files}-{event_bytes or 0}"
    inp, stamp = work / tag, work / f"{tag}.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("params") == params and inp.is_dir():
        return inp, json.loads(stamp.read_text())["info"]
    shutil.rmtree(inp, ignore_errors=True)
    t0 = time.monotonic()
    info = generate(inp, events, files=files, seed=seed, shape=shape, event_bytes=event_bytes)
    info["generate_seconds"] = time.monotonic() - t0
    stamp.write_text(json.dumps({"params": params, "info": info}))
    return inp, info


def run_one(contender: str, inp: Path, work: Path, info: dict, args, *, event_type: str = "page_view",
            event_types_dir: Path | None = None, pss: bool = True) -> RunResult:
    """One measured run of ``contender`` over ``inp`` (``pss``: sample its tree's PSS, which slows it)."""
    common = dict(events=info["events"], input_bytes=info["bytes"], master=args.master,
                  files_per_batch=args.files_per_batch, pss=pss)
    if contender == "event_etl":
        return run_event_etl(inp, work, event_type=event_type, event_types_dir=event_types_dir, **common)
    if contender in DIALECT_CONTENDERS:  # the same events, as another producer sends them
        from bench.dialects import TYPES, dialect_input, dialect_types

        dialect = contender.split("-", 1)[1]
        types = dialect_types(work) if not (work / "types-dialects").is_dir() else work / "types-dialects"
        return run_event_etl(dialect_input(inp, work, dialect, types), work, event_type=TYPES[dialect],
                             event_types_dir=types, contender=contender, **common)
    if contender == "event_etl-parquet":  # the same type, format = "parquet"
        types = parquet_type_dir(work, event_type, event_types_dir or ROOT / "event_types")
        return run_event_etl(inp, work, event_type=event_type, event_types_dir=types, contender=contender, **common)
    fmt = contender.split("-", 1)[1]
    return run_spark(inp, work, fmt=fmt, schema=SCHEMAS[event_type],
                     java_options=getattr(args, "spark_java_options", {}).get(fmt, ""), **common)


def prepare_archives(work: Path, inp: Path, args, *, event_type: str = "page_view") -> None:
    """Each contender's JVM class archive, built before the first measured run (see
    :func:`bench.contenders.spark_archive_options`); Spark's are kept in ``work``."""
    print(f"class archives: event_etl {ensure_event_etl_archive()}", flush=True)
    small = work / "archive-input"
    if not small.is_dir():
        small.mkdir()
        first = sorted(inp.iterdir())[0]
        with open(first, "rb") as src, open(small / first.name, "wb") as dst:
            for _, line in zip(range(20_000), src):
                dst.write(line)
    args.spark_java_options = {}
    for c in args.contenders:
        if c.startswith("spark-"):
            fmt = c.split("-", 1)[1]
            args.spark_java_options[fmt] = spark_archive_options(work, small, fmt=fmt, schema=SCHEMAS[event_type],
                                                                 master=args.master)
            print(f"class archives: {c} {args.spark_java_options[fmt].split()[0].split('=', 1)[1]}", flush=True)


def describe_run(r: RunResult) -> str:
    steady = ("-" if r.steady_rate is None
              else f"{r.steady_rate:,.0f}/s ({r.steady_events:,} in {r.steady_seconds:.2f}s)")
    return (f"{r.contender:<14} {r.wall:6.1f}s wall  {r.rate:>9,.0f} ev/s  steady {steady}  "
            f"CPU {r.cpu:5.1f}s  {_memory(r)}  "
            f"{r.batches} batches, {r.files} files, {r.records_checked:,} records checked")


def _memory(r: RunResult) -> str:
    """A run's peak memory, from the runs that sampled PSS: a speed run's summed RSS is no measure (it counts
    a process that forks twice while the child shares its pages, e.g. a JVM starting a helper)."""
    return "memory not sampled" if r.peak_pss is None else f"peak RSS {mib(r.peak_rss)}  PSS {mib(r.peak_pss)}"


def summary_rows(results: dict[str, list[RunResult]],
                 memory: dict[str, list[RunResult]] | None = None) -> list[list[str]]:
    """One row per contender: medians over rounds, and ratios against event_etl (memory from the ``memory`` runs,
    if given: see :func:`main`)."""
    rows = []
    mem = memory or results
    etl = results.get("event_etl", [])
    e_rate = median(r.rate for r in etl)
    e_steady = median(r.steady_rate for r in etl)
    e_rss = median(r.peak_rss for r in mem.get("event_etl", []))
    e_pss = median(r.peak_pss for r in mem.get("event_etl", []))
    for name, runs in results.items():
        if not runs:
            continue
        m_rate, m_steady = median(r.rate for r in runs), median(r.steady_rate for r in runs)
        m_rss, m_pss = median(r.peak_rss for r in mem.get(name, [])), median(r.peak_pss for r in mem.get(name, []))
        own = name == "event_etl"
        rows.append([
            name, len(runs), f"{median(r.wall for r in runs):.1f}", rate(m_rate), rate(m_steady),
            mib(m_rss), mib(m_pss), f"{median(r.cpu for r in runs):.1f}",
            "-" if own else ratio(e_rate, m_rate), "-" if own else ratio(e_steady, m_steady),
            "-" if own else ratio(e_rss, m_rss), "-" if own else ratio(e_pss, m_pss),
        ])
    return rows


HEADER = ["contender", "runs", "wall s", "events/s whole process", "events/s steady", "peak RSS (tree)",
          "peak PSS (tree)", "CPU s", "event_etl / this: whole", "… steady", "… RSS", "… PSS"]


def whole_process_target(events: int, contender: str) -> float:
    """Issue 15's target for the whole-process ratio: ahead of Spark's JSON sink by 1.2x from 300 k events and
    by 1.3x from 1.5 M, at least even with Parquet at every size."""
    if contender != "spark-json":
        return 1.0
    return 1.3 if events >= 1_500_000 else 1.2 if events >= 300_000 else 1.0


PSS_TARGET = 1.2  # issue 15: peak memory (PSS) at most 1.2x Spark's
STEADY_TARGET = 600_000  # issue 15: events/s of the steady batch on 2 cores


def verdict(results: dict[str, list[RunResult]], memory: dict[str, list[RunResult]] | None = None) -> list[str]:
    """Issue 15's targets: the whole-process ratio (:func:`whole_process_target`), peak memory (PSS) <= 1.2x.

    Memory is judged on PSS, the tree's real footprint: summed RSS counts the pages that
    Spark's forked Python workers share once per worker, which event_etl has many of and
    Spark's JVM-only sink none.  The RSS ratio is printed next to it.  Memory comes from the
    ``memory`` runs if given (see :func:`main`).
    """
    etl = results.get("event_etl", [])
    mem = memory or results
    out = []
    for name in ("spark-json", "spark-parquet"):
        runs = results.get(name)
        if not etl or not runs:
            continue
        t = median(r.rate for r in etl) / median(r.rate for r in runs)
        e_mem, m_mem = mem.get("event_etl", []), mem.get(name, [])
        m_rss = (median(r.peak_rss for r in e_mem) or 0) / (median(r.peak_rss for r in m_mem) or 1)
        m_pss = (median(r.peak_pss for r in e_mem) or 0) / (median(r.peak_pss for r in m_mem) or 1)
        target = whole_process_target(etl[0].events, name)
        ok = t >= target and m_pss <= PSS_TARGET
        out.append(f"vs {name}: throughput {t:.2f}× (target ≥ {target:.1f}), "
                   f"peak memory {m_pss:.2f}× PSS (target ≤ {PSS_TARGET}×; {m_rss:.2f}× RSS): "
                   f"{'MET' if ok else 'NOT MET'}")
    out += _parquet_verdict(results)
    out += _dialect_verdict(results)
    steady = median(r.steady_rate for r in etl)
    if steady is not None:
        out.append(f"event_etl steady batch: {steady:,.0f} events/s (target ≥ {STEADY_TARGET:,} on 2 cores): "
                   f"{'MET' if steady >= STEADY_TARGET else 'NOT MET'}")
    return out


PARQUET_TARGET = 2.0  # issue 51: event_etl Parquet >= 2x Spark's Parquet sink, as its Avro is against Spark's Avro


def _parquet_verdict(results: dict[str, list[RunResult]]) -> list[str]:
    """Issue 51's goal, whole process and steady batch: event_etl's Parquet files against Spark's Parquet sink (and,
    beside it, event_etl's Avro against Spark's Avro sink)."""
    out = []
    for mine, theirs, target in (("event_etl-parquet", "spark-parquet", PARQUET_TARGET),
                                 ("event_etl", "spark-avro", None)):
        a, b = results.get(mine), results.get(theirs)
        if not a or not b:
            continue
        whole = median(r.rate for r in a) / median(r.rate for r in b)
        sa, sb = median(r.steady_rate for r in a), median(r.steady_rate for r in b)
        steady = f"{sa / sb:.2f}×" if sa and sb else "-"
        goal = "" if target is None else (f" (goal ≥ {target:.1f}×): "
                                          f"{'MET' if whole >= target else 'NOT MET'}")
        out.append(f"{mine} vs {theirs}: throughput {whole:.2f}× whole process, {steady} steady{goal}")
    return out


def _dialect_verdict(results: dict[str, list[RunResult]]) -> list[str]:
    """Issue 56's goal: each producer's dialect at least as fast as JSON on the same events (whole process and steady
    batch, medians)."""
    out = []
    json_runs = results.get("event_etl")
    for name in DIALECT_CONTENDERS:
        runs = results.get(name)
        if not runs or not json_runs:
            continue
        whole = median(r.rate for r in runs) / median(r.rate for r in json_runs)
        sa, sb = median(r.steady_rate for r in runs), median(r.steady_rate for r in json_runs)
        steady = sa / sb if sa and sb else None
        cpu = median(r.cpu for r in runs) / median(r.cpu for r in json_runs)
        ok = whole >= DIALECT_TARGET and (steady is None or steady >= DIALECT_TARGET)
        out.append(f"{name} vs event_etl (JSON): throughput {whole:.2f}× whole process, "
                   f"{'-' if steady is None else f'{steady:.2f}×'} steady, CPU {cpu:.2f}× "
                   f"(goal ≥ {DIALECT_TARGET:.1f}×): {'MET' if ok else 'NOT MET'}")
    return out


def report(results, info, args, machine, command, load, memory=None) -> str:
    """The Markdown section for RESULTS.md."""
    memory = memory or {}

    def line(label, r):
        return [label, r.contender, f"{r.wall:.1f}", f"{r.rate:,.0f}",
                "-" if r.steady_rate is None else f"{r.steady_rate:,.0f}",
                "-" if r.peak_pss is None else mib(r.peak_rss), mib(r.peak_pss),
                f"{r.cpu:.1f}", f"{r.records_checked:,}"]

    per_round = [line(f"{i + 1}", runs[i]) for i in range(args.rounds) for runs in results.values() if len(runs) > i]
    per_round += [line(f"memory {i + 1}", runs[i]) for i in range(args.memory_rounds) for runs in memory.values()
                  if len(runs) > i]
    rounds = markdown_table(["round", "contender", "wall s", "events/s whole", "events/s steady", "peak RSS",
                             "peak PSS", "CPU s", "records checked"], per_round)
    return "\n".join([
        "## event_etl vs Spark's file sink (bench/compare.py)", "",
        machine_lines(machine, command, load), "",
        f"Input: {info['events']:,} page views, {info['bytes'] / 1e6:,.0f} MB of JSON lines "
        f"({info['bytes_per_event']:.0f} B/event), {info['files']} files, {info['hours']} hours of event time, "
        f"seed {args.seed}. Master `{args.master}`, at most {args.files_per_batch} files per micro-batch for both "
        "sides (event_etl `--max-files-per-batch`, Spark `maxFilesPerTrigger`). Outputs: event_etl snappy Avro + "
        "manifests (`event_etl-parquet`: the same type with `format = \"parquet\"`, snappy Parquet + manifests), "
        "Spark JSON "
        "uncompressed (its default), Spark Parquet snappy (its default), Spark Avro snappy (its default; Spark's "
        "built-in `org.apache.spark.sql.avro.AvroFileFormat`, the same kind of container files as event_etl's). "
        "Spark runs with its defaults plus the "
        "settings event_etl's session also sets (UI off, 1 GiB driver heap, loopback). Each side's JVM maps a "
        "class archive of its own kind of run (AppCDS: event_etl's from `event-etl warmup`, Spark's from its "
        "file sink over 20,000 of these events), built before the first measured run; event_etl's driver JVM "
        "also compiles with C1 only and collects with the serial collector, its defaults for local jobs (Spark "
        "keeps its default JIT and collector: its work runs in the JVM, and C1 only slowed its 3 M-event JSON run "
        "from 24.5 s to 32.3 s). "
        f"Medians over {args.rounds} round(s), contenders alternating; then {args.memory_rounds} round(s) that "
        "sample the process trees' PSS, which the memory columns come from (sampling PSS costs the sampler ~17 ms "
        "a sample on 2 cores, CPU taken from the run it measures: the speed rounds read only CPU times).",
        "",
        markdown_table(HEADER, summary_rows(results, memory)), "",
        *[f"- {v}" for v in verdict(results, memory)], "",
        "Every round:", "", rounds, "",
        "How to read it: *whole process* is input events over the wall time of the process, JVM start-up "
        "included; *steady* is the largest micro-batch (event_etl: its `foreachBatch` time; Spark: "
        "`durationMs.addBatch`). Memory is the peak of the sum over the process tree (JVM, Python driver, "
        "Python workers): RSS counts pages shared by forked workers once per process, PSS shares them out. "
        "Every output's record count was checked against the input (event_etl: `_COMPLETE` manifests; "
        "Spark: files in `_spark_metadata`). event_etl also validates every event, dedupes by id, writes "
        "sha256 manifests and routes late data; Spark's sink does none of that.",
    ])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3_000_000, help="input events (default 3,000,000)")
    ap.add_argument("--seed", type=int, default=7, help="input seed: same seed and size, same bytes")
    ap.add_argument("--files", type=int, default=12, help="input files (default 12)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of A B C (median over rounds)")
    ap.add_argument("--memory-rounds", type=int, default=1,
                    help="rounds of A B C that also sample PSS, for the memory columns (default 1)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--files-per-batch", type=int, default=64,
                    help="files per micro-batch, for both sides (event_etl --max-files-per-batch, Spark "
                         "maxFilesPerTrigger; default 64, event_etl's default)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS),
                    help=f"comma-separated subset of {','.join(CONTENDERS + DIALECT_CONTENDERS)} (the last two: "
                         "the same events as Protobuf and as Confluent-framed Avro; not run by default)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep input and outputs here (input reused when the options match); default: a temporary "
                         "folder, removed at the end")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(args.contenders) - set(CONTENDERS) - set(DIALECT_CONTENDERS)
    if unknown:
        ap.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS + DIALECT_CONTENDERS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/compare.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        machine, load = describe(), load_average()
        print("\n".join(f"{k}: {v}" for k, v in machine.items()), f"\nload average: {load:.2f}", flush=True)
        if load > 0.5:
            print(f"note: the machine is busy (load {load:.2f}); figures will be noisy", flush=True)
        inp, info = prepare_input(work, events=args.events, seed=args.seed, files=args.files)
        print(f"input: {info['events']:,} events, {info['bytes'] / 1e6:,.0f} MB, "
              f"{info['bytes_per_event']:.0f} B/event, "
              f"{info['files']} files in {inp}", flush=True)
        prepare_archives(work, inp, args)
        results: dict[str, list[RunResult]] = {c: [] for c in args.contenders}
        for rnd in range(args.rounds):  # speed: the trees' RSS and CPU times only (cheap to read)
            for c in args.contenders:
                r = run_one(c, inp, work, info, args, pss=False)
                results[c].append(r)
                print(f"round {rnd + 1}: {describe_run(r)}", flush=True)
        memory: dict[str, list[RunResult]] = {c: [] for c in args.contenders}
        for rnd in range(args.memory_rounds):  # memory: PSS sampled too, which slows the runs
            for c in args.contenders:
                r = run_one(c, inp, work, info, args, pss=True)
                memory[c].append(r)
                print(f"memory round {rnd + 1}: {describe_run(r)}", flush=True)
        (work / "compare-runs.json").write_text(json.dumps(
            {"speed": {c: [r.as_dict() for r in rs] for c, rs in results.items()},
             "memory": {c: [r.as_dict() for r in rs] for c, rs in memory.items()}}, indent=1))
        print()
        print(markdown_table(HEADER, summary_rows(results, memory)))
        for v in verdict(results, memory):
            print(v)
        if not args.no_write:
            body = report(results, info, args, machine, command, load, memory)
            if set(args.contenders) <= {"event_etl", *DIALECT_CONTENDERS}:  # the dialects beside JSON: a section
                body = body.replace("## event_etl vs Spark's file sink (bench/compare.py)",  # of their own
                                    "## Producers' dialects: Protobuf and Confluent-framed Avro beside JSON "
                                    "(bench/compare.py, issue 56)", 1)
                publish("dialects", body, args.results)
            else:
                publish("compare", body, args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
