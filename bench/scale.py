"""Scale notes: how event_etl's throughput changes with cores (local[1] vs local[2]) and with event size.

    .venv/bin/python bench/scale.py --mb 400

Two series, each configuration run as in :mod:`bench.compare` (own process, fresh sink and
checkpoint, output record count checked), event_etl and, unless ``--no-spark``, Spark's
JSON file sink on the same input for reference:

- **cores**: ``local[1]`` and ``local[2]`` on the standard page views (~225 B).
- **event size**: ~100 B (the bench-only ``small_view`` type: ``page_view``'s required
  fields alone take ~175 B of JSON), ~225 B (``page_view`` as generated), 1 KB and 10 KB
  (``page_view`` padded with a ``referrer_url``), on ``--master`` (default ``local[2]``).

Every input holds the **same number of bytes** (``--mb``), not the same number of events:
a 10 KB input then has 1/45 of the events of a 225 B input, and each run lasts about as
long, so per-event costs and per-byte costs can both be read off (events/s and MB/s are
both printed).  Results go to ``bench/RESULTS.md`` (section ``scale``).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import prepare_archives, prepare_input, run_one
from bench.contenders import RunResult
from bench.figures import median, mib
from bench.machine import ROOT, describe, load_average
from bench.results import machine_lines, markdown_table, publish

BENCH_TYPES = ROOT / "bench" / "event_types"
_APPROX_BYTES = {"page_view": 226, "small_view": 100}


@dataclass(frozen=True)
class Config:
    """One point of a series: which shape and size of event, on which master."""

    series: str
    label: str
    shape: str
    event_bytes: int | None
    master: str

    @property
    def bytes_per_event(self) -> int:
        return self.event_bytes or _APPROX_BYTES[self.shape]

    @property
    def event_type(self) -> str:
        return self.shape

    @property
    def event_types_dir(self) -> Path | None:
        return BENCH_TYPES if self.shape == "small_view" else None


def configs(master: str) -> list[Config]:
    return [
        Config("cores", "local[1]", "page_view", None, "local[1]"),
        Config("cores", "local[2]", "page_view", None, "local[2]"),
        Config("size", "~100 B", "small_view", 100, master),
        Config("size", "~225 B", "page_view", None, master),
        Config("size", "1 KB", "page_view", 1024, master),
        Config("size", "10 KB", "page_view", 10240, master),
    ]


def run_config(cfg: Config, work: Path, args) -> dict[str, list[RunResult]]:
    """Every contender on ``cfg``'s input, ``--rounds`` times alternating."""
    events = max(args.files, args.mb * 1_000_000 // cfg.bytes_per_event)
    inp, info = prepare_input(work, events=events, seed=args.seed, files=args.files, shape=cfg.shape,
                              event_bytes=cfg.event_bytes)
    contenders = ["event_etl"] + ([] if args.no_spark else ["spark-json"])
    run_args = argparse.Namespace(master=cfg.master, files_per_batch=args.files_per_batch, contenders=contenders)
    prepare_archives(work, inp, run_args, event_type=cfg.event_type)
    out: dict[str, list[RunResult]] = {c: [] for c in contenders}
    for _ in range(args.rounds):
        for c in contenders:
            r = run_one(c, inp, work, info, run_args, event_type=cfg.event_type,
                        event_types_dir=cfg.event_types_dir)
            out[c].append(r)
            print(f"{cfg.series:<5} {cfg.label:<9} {c:<10} {r.events:>10,} events  {r.rate:>9,.0f} ev/s  "
                  f"{r.input_bytes / r.wall / 1e6:6.1f} MB/s  steady "
                  f"{'-' if r.steady_rate is None else f'{r.steady_rate:,.0f}'} ev/s  peak RSS {mib(r.peak_rss)}",
                  flush=True)
    return out


def row(cfg: Config, results: dict[str, list[RunResult]]) -> list[str]:
    etl = results["event_etl"]
    e_rate = median(r.rate for r in etl)
    spark = results.get("spark-json") or []
    s_rate = median(r.rate for r in spark)
    first = etl[0]
    return [
        f"{cfg.series}: {cfg.label}", cfg.master, f"{first.events:,}", f"{first.input_bytes / first.events:,.0f}",
        f"{e_rate:,.0f}", f"{first.input_bytes / median(r.wall for r in etl) / 1e6:.1f}",
        f"{median(r.steady_rate for r in etl) or 0:,.0f}", mib(median(r.peak_rss for r in etl)),
        f"{median(r.cpu for r in etl):.1f}",
        "-" if s_rate is None else f"{s_rate:,.0f}", "-" if s_rate is None else f"{e_rate / s_rate:.2f}×",
    ]


HEADER = ["configuration", "master", "events", "B/event", "event_etl events/s (whole)", "MB/s (whole)",
          "events/s (steady)", "peak RSS", "CPU s", "Spark JSON events/s (whole)", "event_etl / Spark"]


def notes(rows_by_label: dict[str, dict[str, list[RunResult]]]) -> list[str]:
    """The two headline ratios: what a second core buys, and how the rate falls with size."""
    out = []
    one, two = rows_by_label.get("local[1]"), rows_by_label.get("local[2]")
    if one and two:
        a, b = median(r.rate for r in one["event_etl"]), median(r.rate for r in two["event_etl"])
        sa, sb = median(r.steady_rate for r in one["event_etl"]), median(r.steady_rate for r in two["event_etl"])
        out.append(f"local[2] / local[1]: {b / a:.2f}× over the whole process"
                   + (f", {sb / sa:.2f}× in steady state" if sa and sb else ""))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=400, help="MB of input per configuration (default 400)")
    ap.add_argument("--files", type=int, default=12, help="input files per configuration (default 12)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per configuration and contender (median)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[2]", help="master of the size series (default local[2])")
    ap.add_argument("--files-per-batch", type=int, default=64)
    ap.add_argument("--only", choices=("cores", "size"), default=None, help="run one series only")
    ap.add_argument("--no-spark", action="store_true", help="event_etl only (halves the time)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep inputs here (reused when options match)")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/scale.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        machine, load = describe(), load_average()
        done: dict[str, dict[str, list[RunResult]]] = {}
        by_setup: dict[tuple, dict[str, list[RunResult]]] = {}  # the same run is not repeated for both series
        rows = []
        for cfg in configs(args.master):
            if args.only and cfg.series != args.only:
                continue
            setup = (cfg.shape, cfg.event_bytes, cfg.master)
            if setup not in by_setup:
                by_setup[setup] = run_config(cfg, work, args)
            done[cfg.label] = by_setup[setup]
            rows.append(row(cfg, done[cfg.label]))
        table = markdown_table(HEADER, rows)
        print()
        print(table)
        for n in notes(done):
            print(n)
        if not args.no_write:
            body = "\n".join([
                "## Scale notes (bench/scale.py)", "", machine_lines(machine, command, load), "",
                f"Each configuration reads the same {args.mb} MB of JSON lines ({args.files} files, seed {args.seed}); "
                "the number of events follows from the event size. ~100 B events use the bench-only `small_view` "
                "type (page_view's required fields alone take ~175 B). Every output's record count was checked.", "",
                table, "", *[f"- {n}" for n in notes(done)],
            ])
            publish("scale", body, args.results)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from bench.livejob import run_main

    run_main(main)
