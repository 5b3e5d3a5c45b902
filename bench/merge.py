"""What merging an hour's small files costs the driver, and where the marker bound stops holding (issue 14).

    .venv/bin/python bench/merge.py                 # page views, snappy, 10 k .. 500 k records
    .venv/bin/python bench/merge.py --records 20000,100000 --files 720

Before an hour's ``_COMPLETE``, the driver merges its remaining small files (see
docs/design.md, "Few files per hour").  Rolling merges keep those below one file's worth
(``max_events_per_file`` records, 500,000 by default), so the final merge of any hour, however
big, copies at most that many records.  This script times :func:`event_etl.storage.compaction.merge_containers`
plus the writes and deletes on local disk, for small files of page views (about 225 bytes
each, the shipped type's schema and codec) in ``--files`` files, and prints the throughput
and whether the merge alone fits the marker bound's 2 s of slack.
"""

from __future__ import annotations

import argparse
import io
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fastavro

from bench.datagen import make_record
from bench.machine import describe, load_average
from bench.results import machine_lines, markdown_table, publish
from event_etl.eventtypes import load_event_type
from event_etl.storage.avroio import sync_marker_for
from event_etl.storage.compaction import merge_containers

ROOT = Path(__file__).resolve().parent.parent


def small_files(et, records: int, files: int, seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    t0 = 1_795_266_000_000
    recs = [make_record("page_view", i, t0 + i, rng) for i in range(records)]
    schema = et.parsed_schema() if callable(et.parsed_schema) else et.parsed_schema
    out = []
    per = -(-records // files)
    for k in range(files):
        part = recs[k * per:(k + 1) * per]
        if not part:
            break
        name = f"part-2026112113-b{k:010d}-s0000-0000.avro"
        buf = io.BytesIO()
        fastavro.writer(buf, schema, part, codec=et.codec, sync_marker=sync_marker_for(name))
        out.append((name, buf.getvalue()))
    return out


def measure(et, records: int, files: int, per_file: int, seed: int, work: Path) -> dict:
    members = small_files(et, records, files, seed)
    for name, data in members:
        (work / name).write_bytes(data)
    size = sum(len(d) for _, d in members)
    t0 = time.perf_counter()
    datas = [(p.name, p.read_bytes()) for p in sorted(work.glob("part-*-s0000-*.avro"))]
    outputs = merge_containers(datas, per_file, lambda seq: f"part-2026112113-b{files:010d}-s9000-{seq:04d}.avro")
    for name, data, _ in outputs:
        (work / name).write_bytes(data)
    for name, _ in datas:
        (work / name).unlink()
    seconds = time.perf_counter() - t0
    for name, _, _ in outputs:
        (work / name).unlink()
    assert sum(n for _, _, n in outputs) == records, "WRONG OUTPUT"
    return {"records": records, "files": len(members), "mb": size / 1e6, "seconds": seconds,
            "outputs": len(outputs), "mb_s": size / 1e6 / seconds}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", default="10000,50000,100000,250000,500000")
    ap.add_argument("--files", type=int, default=720,
                    help="small files the records are in (default 720: a 5-s trigger)")
    ap.add_argument("--max-events-per-file", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    et = load_event_type(ROOT / "event_types" / "page_view")
    rows = []
    with tempfile.TemporaryDirectory(prefix="event_etl-merge-") as tmp:
        for n in [int(x) for x in args.records.split(",")]:
            r = measure(et, n, args.files, args.max_events_per_file, args.seed, Path(tmp))
            fits = "yes" if r["seconds"] <= 2.0 else "no"
            rows.append([f"{r['records']:,}", r["files"], f"{r['mb']:.1f}", f"{r['seconds']:.2f}", f"{r['mb_s']:.0f}",
                         r["outputs"], fits])
            print(f"{r['records']:>9,} records in {r['files']} files ({r['mb']:.1f} MB): merged in "
                  f"{r['seconds']:.2f} s "
                  f"({r['mb_s']:.0f} MB/s) into {r['outputs']} files; within 2 s: {fits}", flush=True)
    command = " ".join([".venv/bin/python bench/merge.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    body = "\n".join([
        "## Merging an hour's small files (bench/merge.py)", "",
        machine_lines(describe(), command, load_average()), "",
        f"Page views ({et.codec}), in {args.files} small files, merged into files of "
        f"{args.max_events_per_file:,} records (read, merge, write, delete on local disk).", "",
        markdown_table(["records", "small files", "MB", "seconds", "MB/s", "merged files", "within 2 s"], rows), "",
        "Rolling merges keep an open hour's small files below one file's worth, so the merge before a marker "
        "copies at most `max_events_per_file` records, whatever the hour's size: the last row is the worst case "
        "of the default setting.",
    ])
    if not args.no_write:
        publish("merge", body, None)


if __name__ == "__main__":
    main()
