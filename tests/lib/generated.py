"""Generated events as a directory source's input, and where each landed in the sink: what the Spark job's tests
(integration/test_spark_job.py, integration/test_cluster.py) feed a job and check."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from event_etl.sources.generator import Generator, GeneratorParams
from tests.lib.harness import read_sink, t

__all__ = ["GEN", "placement", "write_inputs"]

GEN = GeneratorParams(start=t("10:50"), rate=20, speedup=60, seed=11, out_of_order=0.1, late=0.04, too_late=0.02,
                      future=0.01, invalid=0.03, duplicate=0.0)


def write_inputs(et, folder: Path, files: int, per_file: int, params=GEN) -> list[list]:
    """Generated events in ``files`` files (they arrive when the job lists them:
    see ``listed_arrivals`` in integration/test_spark_job.py)."""
    gen = Generator(et, params)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(files):
        evs = [gen.one(i) for i in range(k * per_file, (k + 1) * per_file)]
        f = folder / f"events-{k:04d}.jsonl"
        f.write_bytes(b"\n".join(g.payload for g in evs) + b"\n")
        out.append(evs)
    return out


def placement(sink: Path, et_name: str, id_field: str = "event_id") -> Counter:
    """Multiset of (hour, id, late) over every data file of the sink."""
    c = Counter()
    for h, hc in read_sink(sink, et_name, id_field).items():
        c.update((h, i, False) for i in hc.timely)
        c.update((h, i, True) for i in hc.late)
    return c
