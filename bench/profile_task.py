"""Where an event_etl task spends its time: ``executor.process_split`` over one input file, without Spark.

    .venv/bin/python bench/profile_task.py --events 200000

What an executor task does per micro-batch, run in this process on one core: read the
file's lines, decode and validate each payload against the Avro schema, judge it against
the watermark, Avro-encode it into its hour's file, hash the files (sha256), write them,
and return the report with the dedupe keys.  Three passes over the same file:

1. unprofiled: the task's own rate on one core (the ceiling for one Spark task slot);
2. ``py-spy record --native`` on this process (pip install py-spy): samples summed into
   categories by :mod:`bench.flame` (JSON parsing, fastavro validation, event_etl's own
   checks, Avro encoding, snappy, sha256, file system, dedupe keys, the executor's loop...),
   with C extensions counted as what they do rather than as their Python caller (which is
   what a Python-level profiler such as cProfile would show: fastavro's Cython functions are
   invisible to it);
3. ``pyinstrument`` (if installed): the Python call tree, written to ``profile-task.txt`` in
   the work folder, its top printed.

What this leaves out is measured by comparing with :mod:`bench.compare`: the JVM, Spark's
scheduling, the transfer of splits and reports between the JVM and the Python workers,
and the driver's per-batch work (intent, ledger, markers, state).  For the whole process
tree, sample it with ``py-spy record --subprocesses`` (see the README).  The summary goes to
``bench/RESULTS.md`` (section ``profile``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import prepare_input
from bench.datagen import START_MS
from bench.flame import categorize, py_spy, read_raw
from bench.machine import describe, load_average
from bench.results import machine_lines, markdown_table, publish


def load_type(name: str, event_types_dir: Path | None):
    from event_etl.eventtypes import load_event_types, resolve_event_types_dir

    return load_event_types(resolve_event_types_dir(str(event_types_dir) if event_types_dir else None))[name]


def make_call(inp_file: Path, sink: Path, et):
    """A function that runs ``process_split`` over the whole file into a fresh sink (judged as timely)."""
    from event_etl.sources.splits import Split
    from event_etl.storage import open_storage
    from event_etl.task.executor import BatchContext, process_split

    size = inp_file.stat().st_size
    arrival = int(inp_file.stat().st_mtime * 1000)
    split = Split.of_files(0, [(str(inp_file), 0, size, arrival)])
    batch = [0]

    def call():
        shutil.rmtree(sink, ignore_errors=True)
        sink.mkdir(parents=True)
        batch[0] += 1  # a new batch id each pass: file names differ, nothing is skipped as already written
        ctx = BatchContext(et, str(sink), batch[0], START_MS - 3_600_000, int(time.time() * 1000))
        return process_split(split, ctx, open_storage(str(sink)))

    return call


def py_spy_categories(call, out: Path, *, passes: int = 3, rate: int = 250) -> Counter:
    """Samples per category (:mod:`bench.flame`) of ``passes`` calls, from ``py-spy`` attached to this process."""
    raw = out / "profile-task-py-spy.txt"
    spy = subprocess.Popen([py_spy(), "record", "--pid", str(os.getpid()), "--native", "--rate", str(rate),
                            "--format", "raw", "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # let it attach
    for _ in range(passes):
        call()
    spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    spy.wait(timeout=60)
    if not raw.exists():
        raise SystemExit(f"py-spy wrote nothing: {spy.stderr.read().decode(errors='replace')[-500:]}")
    stacks = [(frames, n) for frames, n in read_raw(raw) if any("process_split" in f for f in frames)]
    return categorize(stacks)


def pyinstrument_tree(call, out: Path) -> str | None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    os.environ.setdefault("PYINSTRUMENT_IGNORE_OVERHEAD_WARNING", "1")  # the shares are what matter here
    prof = Profiler(interval=0.001)
    prof.start()
    call()
    prof.stop()
    text = prof.output_text(unicode=True, color=False, show_all=False)
    out.write_text(text)
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="events in the file (default 200,000)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--event-bytes", type=int, default=None, help="pad events to this size (default ~225 B)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the input and profile-task.txt here")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/profile_task.py",
                        *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        machine, load = describe(), load_average()
        inp, info = prepare_input(work, events=args.events, seed=args.seed, files=1, event_bytes=args.event_bytes)
        call = make_call(next(inp.iterdir()), work / "profile-sink", load_type("page_view", None))
        call()  # warm-up: imports, the decoder, the schema
        t0 = time.perf_counter()
        report, _keys = call()
        plain = time.perf_counter() - t0
        if report["counts"].get("timely") != args.events:
            raise SystemExit(f"WRONG OUTPUT: the task judged {report['counts']} instead of {args.events:,} timely")
        cats = py_spy_categories(call, work)
        total = sum(cats.values()) or 1
        tree = pyinstrument_tree(call, work / "profile-task.txt")
        print(f"process_split over {args.events:,} events ({info['bytes_per_event']:.0f} B): {plain:.2f} s, "
              f"{args.events / plain:,.0f} events/s on one core (unprofiled)")
        rows = [[name, f"{n / total * 100:.1f} %", f"{n / total * plain:.2f}"] for name, n in cats.most_common()
                if n / total >= 0.001]
        table = markdown_table(["where (py-spy, native frames)", "share of samples", "≈ s of the unprofiled run"],
                               rows)
        print(table)
        if tree:
            print("pyinstrument (top of the tree; all of it in profile-task.txt):")
            print("\n".join(tree.splitlines()[:40]))
        if not args.no_write:
            body = "\n".join([
                "## Profile of one executor task (bench/profile_task.py)", "",
                machine_lines(machine, command, load), "",
                f"`event_etl.task.executor.process_split` over one file of {args.events:,} page views "
                f"({info['bytes_per_event']:.0f} B), in one process, without Spark: **{args.events / plain:,.0f} "
                f"events/s on one core** unprofiled. Its samples under py-spy by kind of work (the seconds "
                f"apply the shares to the unprofiled time):", "",
                table,
            ])
            publish("profile", body, args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
