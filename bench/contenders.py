"""The contenders of the comparison, each run as its own measured process, and the checks of their output.

- ``event_etl``: ``event-etl run TYPE --source dir:IN --drain`` (``--drain`` implies
  ``--once``: everything available, then every hour holding data is marked), with all
  its work: validation against the Avro schema, routing, dedupe, Avro files, manifests.
- ``event_etl-parquet``: the same, with the type's ``format = "parquet"`` (a copy of its folder
  with that one line added): Parquet files instead of Avro ones (issue 51), the peer of ``spark-parquet``.
- ``spark-json`` / ``spark-parquet`` / ``spark-avro``: Spark's own streaming file sink
  (:mod:`bench.spark_sink`), partitioned by event date and hour; ``spark-avro`` writes snappy Avro
  with Spark's built-in ``AvroFileFormat``, the like-for-like peer of event_etl's files.

Every run gets a fresh sink and checkpoint.  Its figures:

- **whole process**: input events / wall time of the process, from its start (Python,
  the JVM, Spark's start-up) to its exit: what a user waits for.
- **steady state**: input events / time of the largest micro-batch, the rate once
  start-up costs are paid.  event_etl: its ``batch N: in X ... Ys`` progress line (the
  time of its ``foreachBatch``: tasks, ledger, markers, state); Spark: ``numInputRows``
  over ``durationMs.addBatch`` of that batch (the write job, its closest equivalent;
  ``triggerExecution`` would also count offset planning and the commit log, which
  event_etl's figure leaves out: the choice favours Spark a little).
- **memory and CPU** of the whole process tree (:mod:`bench.procstats`).
- **records checked**: event_etl's output is counted from the ``_COMPLETE`` manifests
  (sum of ``records``), Spark's from the files its ``_spark_metadata`` log committed (lines
  of JSON, rows of Parquet footers, record counts of Avro blocks).  A count different from the input fails the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.procstats import run_measured
from bench.spark_sink import PROGRESS_PREFIX

__all__ = ["RunResult", "WrongOutput", "run_event_etl", "run_spark", "count_manifests", "count_spark_output",
           "event_etl_batches", "ensure_event_etl_archive", "spark_archive_options", "parquet_type_dir", "CONTENDERS"]

BENCH = Path(__file__).resolve().parent
CONTENDERS = ("event_etl", "event_etl-parquet", "spark-json", "spark-parquet", "spark-avro")
_BATCH_LINE = re.compile(r"\] batch \d+(?: \(replay\))?: in ([\d,]+) .*?\s([\d.]+)s\s+[\d,]+ ev/s")
_RUN_LINE = re.compile(r"run finished: \d+ batches in ([\d.]+)s")


class WrongOutput(SystemExit):
    """A run whose output does not hold exactly the input's records: its figures must not be used."""


@dataclass
class RunResult:
    """The figures of one run of one contender."""

    contender: str
    events: int
    input_bytes: int
    wall: float
    cpu: float
    peak_rss: int
    peak_pss: int | None  # None: not sampled (a run that measured speed)
    records_checked: int
    files: int
    batches: int
    steady_events: int | None = None
    steady_seconds: float | None = None
    query_seconds: float | None = None

    @property
    def rate(self) -> float:
        """Events per second over the whole process."""
        return self.events / self.wall

    @property
    def steady_rate(self) -> float | None:
        if not self.steady_events or not self.steady_seconds:
            return None
        return self.steady_events / self.steady_seconds

    def as_dict(self) -> dict:
        return {**asdict(self), "rate": self.rate, "steady_rate": self.steady_rate}


def _fresh(*dirs: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _failed(name: str, r: dict) -> SystemExit:
    tail = "\n".join(r["output"].splitlines()[-40:])
    return SystemExit(f"{name} failed with exit code {r['returncode']}; the end of its output:\n{tail}")


def count_manifests(sink: Path, event_type: str) -> tuple[int, int, int]:
    """``(records, files, hours)`` over the ``_COMPLETE`` manifests of ``event_type`` in ``sink``."""
    records = files = hours = 0
    for marker in sink.glob(f"{event_type}/dt=*/hour=*/_COMPLETE"):
        m = json.loads(marker.read_text())
        records += int(m["records"])
        files += len(m["files"])
        hours += 1
    return records, files, hours


def event_etl_batches(output: str) -> list[tuple[int, float]]:
    """``(events in, seconds)`` of every micro-batch line event_etl printed."""
    return [(int(m.group(1).replace(",", "")), float(m.group(2))) for m in _BATCH_LINE.finditer(output)]


def _spark_committed_files(sink: Path) -> list[Path]:
    """The data files Spark's file sink committed, from its ``_spark_metadata`` log (compactions included)."""
    log = sink / "_spark_metadata"
    if not log.is_dir():
        raise WrongOutput(f"WRONG OUTPUT: {sink} has no _spark_metadata log: the Spark query committed nothing")
    added: set[str] = set()
    deleted: set[str] = set()
    for entry in sorted(log.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".crc"):
            continue
        for line in entry.read_text().splitlines()[1:]:  # line 1: the log's version ("v1")
            if line.strip():
                e = json.loads(line)
                (added if e.get("action", "add") == "add" else deleted).add(e["path"])
    return [Path(p[len("file:"):] if p.startswith("file:") else p) for p in sorted(added - deleted)]


def count_spark_output(sink: Path, fmt: str) -> tuple[int, int]:
    """``(rows, files)`` in the files Spark committed: lines of JSON, rows from Parquet footers, or the record
    counts of Avro blocks (read from each block's header, not decoded)."""
    files = _spark_committed_files(sink)
    rows = 0
    for f in files:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            rows += pq.ParquetFile(f).metadata.num_rows
        elif fmt == "avro":
            import fastavro

            with open(f, "rb") as fh:
                rows += sum(block.num_records for block in fastavro.block_reader(fh))
        else:
            with open(f, "rb") as fh:
                rows += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return rows, len(files)


def _check(contender: str, records: int, events: int) -> None:
    if records != events:
        raise WrongOutput(f"WRONG OUTPUT from {contender}: {records:,} records in its output, {events:,} expected; "
                          "a run that loses or adds records has no valid figures")


def _env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}


def run_event_etl(inp: Path, work: Path, *, events: int, input_bytes: int, master: str, files_per_batch: int,
                  event_type: str = "page_view", event_types_dir: Path | None = None,
                  extra_args: tuple[str, ...] = (), pss: bool = True, contender: str = "event_etl") -> RunResult:
    """One measured ``event-etl run --drain`` over the folder ``inp``; fails loudly on a wrong record count.
    ``pss``: sample the tree's PSS too (see :func:`bench.procstats.run_measured`); ``contender``: its name in the
    figures (``event_etl-parquet`` for a type of ``format = "parquet"``, from ``event_types_dir``)."""
    sink, ckpt = work / "etl-sink", work / "etl-ckpt"
    _fresh(sink, ckpt)
    cmd = [str(Path(sys.executable).with_name("event-etl")), "run", event_type, "--source", f"dir:{inp}",
           "--sink", str(sink), "--checkpoint", str(ckpt), "--drain", "--master", master,
           "--max-files-per-batch", str(files_per_batch), *extra_args]
    if event_types_dir is not None:
        cmd += ["--event-types", str(event_types_dir)]
    r = run_measured(cmd, env=_env(), pss=pss)
    if r["returncode"] != 0:
        raise _failed("event-etl", r)
    records, files, _ = count_manifests(sink, event_type)
    _check(contender, records, events)
    batches = event_etl_batches(r["output"])
    steady = max(batches) if batches else (None, None)
    run = _RUN_LINE.search(r["output"])
    _fresh(sink, ckpt)
    return RunResult(contender, events, input_bytes, r["wall"], r["cpu"], r["peak_rss"], r["peak_pss"], records,
                     files, len(batches), steady[0], steady[1], float(run.group(1)) if run else None)


QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def parquet_type_dir(work: Path, event_type: str, source: Path) -> Path:
    """A folder of event types holding a copy of ``source/event_type`` with ``format = "parquet"`` in its etl.toml
    (made in ``work``): the same type, writing Parquet files."""
    root = work / "types-parquet"
    dest = root / event_type
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source / event_type, dest)
    toml = dest / "etl.toml"
    lines = [ln for ln in toml.read_text().splitlines() if not ln.strip().startswith("format")]
    head = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")]  # top-level keys go before any table
    at = head[0] if head else len(lines)
    toml.write_text("\n".join([*lines[:at], 'format = "parquet"', *lines[at:]]) + "\n")
    return root


def ensure_event_etl_archive() -> str:
    """event_etl's JVM class archive (``event-etl warmup``, as bin/ builds it at install), built if missing."""
    exe = str(Path(sys.executable).with_name("event-etl"))
    check = subprocess.run([exe, "warmup", "--check"], env=_env(), capture_output=True, text=True)
    if check.returncode == 3:
        subprocess.run([exe, "warmup"], env=_env(), check=True, capture_output=True, text=True)
        check = subprocess.run([exe, "warmup", "--check"], env=_env(), capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"event-etl warmup --check: {check.stdout}{check.stderr}")
    return check.stdout.strip()


def spark_archive_options(work: Path, small_input: Path, *, fmt: str, schema: Path, master: str,
                          time_field: str = "event_time") -> str:
    """Driver JVM options mapping a class archive of Spark's own file-sink run (``fmt``), built once in ``work``.

    Each side starts from an archive of its own kind of run, as a team running either would set it
    up: event_etl's from ``event-etl warmup``, Spark's from its file sink over ``small_input``
    (its JVM dumps the classes it loaded when it exits, which it does after the Python process)."""
    import psutil

    final = work / f"spark-{fmt}.jsa"
    if not final.is_file():
        tmp = work / f"spark-{fmt}.jsa.tmp"
        tmp.unlink(missing_ok=True)
        sink, ckpt = work / f"archive-{fmt}-sink", work / f"archive-{fmt}-ckpt"
        _fresh(sink, ckpt)
        cmd = [sys.executable, str(BENCH / "spark_sink.py"), "--source", str(small_input), "--sink", str(sink),
               "--checkpoint", str(ckpt), "--format", fmt, "--schema", str(schema), "--time-field", time_field,
               "--master", master, f"--java-options=-XX:ArchiveClassesAtExit={tmp} {QUIET_CDS}"]
        subprocess.run(cmd, env=_env(), check=True, capture_output=True, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(str(tmp) in " ".join(p.info["cmdline"] or ())
                                                  for p in psutil.process_iter(["cmdline"])):
            time.sleep(0.5)  # its JVM is still writing the archive
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise SystemExit(f"Spark's JVM wrote no class archive to {tmp}")
        tmp.rename(final)
        _fresh(sink, ckpt)
    return f"-XX:SharedArchiveFile={final} {QUIET_CDS}"


def run_spark(inp: Path, work: Path, *, fmt: str, events: int, input_bytes: int, master: str, files_per_batch: int,
              schema: Path, time_field: str = "event_time", java_options: str = "", pss: bool = True) -> RunResult:
    """One measured run of :mod:`bench.spark_sink` (``fmt``: json, parquet or avro); fails loudly on a wrong count.
    ``pss``: as :func:`run_event_etl`'s."""
    sink, ckpt = work / f"spark-{fmt}-sink", work / f"spark-{fmt}-ckpt"
    _fresh(sink, ckpt)
    cmd = [sys.executable, str(BENCH / "spark_sink.py"), "--source", str(inp), "--sink", str(sink),
           "--checkpoint", str(ckpt), "--format", fmt, "--schema", str(schema), "--time-field", time_field,
           "--files-per-trigger", str(files_per_batch), "--master", master, f"--java-options={java_options}"]
    r = run_measured(cmd, env=_env(), pss=pss)
    if r["returncode"] != 0:
        raise _failed(f"spark_sink --format {fmt}", r)
    records, files = count_spark_output(sink, fmt)
    _check(f"spark-{fmt}", records, events)
    line = next((ln for ln in r["output"].splitlines() if ln.startswith(PROGRESS_PREFIX)), None)
    if line is None:
        raise SystemExit(f"spark_sink --format {fmt} printed no {PROGRESS_PREFIX.strip()} line")
    progress = json.loads(line[len(PROGRESS_PREFIX):])
    timed = [b for b in progress["batches"] if b.get("add_batch_ms")]
    big = max(timed, key=lambda b: b["rows"]) if timed else None
    _fresh(sink, ckpt)
    return RunResult(f"spark-{fmt}", events, input_bytes, r["wall"], r["cpu"], r["peak_rss"], r["peak_pss"], records,
                     files, len(progress["batches"]), big["rows"] if big else None,
                     big["add_batch_ms"] / 1000 if big else None, progress["query_seconds"])
