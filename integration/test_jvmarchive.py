"""`event-etl warmup` builds the archive of Spark's JVM classes, and a job's JVM maps it (real Java and Spark)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

EXE = str(Path(sys.executable).with_name("event-etl"))

PROBE = """
import sys
from event_etl.job.session import get_session, stop_session
from pyspark.core.context import SparkContext
spark = get_session("local[1]")
assert spark.sparkContext.parallelize(range(3), 1).map(lambda x: x * 2).collect() == [0, 2, 4]
maps = open(f"/proc/{SparkContext._gateway.proc.pid}/maps").read()
print("mapped" if sys.argv[1] in maps else "not mapped")
stop_session(spark)
"""


def test_warmup_builds_the_archive_and_a_job_maps_it(tmp_path):
    env = {**os.environ, "EVENT_ETL_CACHE_DIR": str(tmp_path / "cache"), "PYSPARK_PYTHON": sys.executable}
    r = subprocess.run([EXE, "warmup", "--check"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "run event-etl warmup" in r.stdout, r.stdout + r.stderr
    folder = tmp_path / "cache" / "jvm"
    folder.mkdir(parents=True)
    stale, other = folder / "spark-0000000000000000.jsa", folder / "spark-1111111111111111.jsa"
    stale.write_bytes(b"made for a Java that is gone")
    os.utime(stale, (time.time() - 40 * 86400,) * 2)
    other.write_bytes(b"another virtual environment's, mapped yesterday")
    os.utime(other, (time.time() - 86400,) * 2)
    r = subprocess.run([EXE, "warmup"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not stale.exists(), "an archive unused for 40 days is deleted by the next build"
    assert other.exists(), "another install's archive in use stays"
    archives = [p for p in folder.iterdir() if p != other]
    assert len(archives) == 1 and archives[0].suffix == ".jsa", archives
    assert archives[0].stat().st_size > 10 * 2**20
    assert str(archives[0]) in r.stdout
    r = subprocess.run([sys.executable, "-c", PROBE, str(archives[0])], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "mapped", "the job's JVM maps the archive"
    assert "[cds" not in r.stderr and "][cds" not in r.stderr, r.stderr  # the JVM says nothing about its archive
