"""A type of ``format = "parquet"`` end to end through the command line (issue 51, item 1): ``run --drain`` on Spark
writes Parquet hours with manifests, ``verify`` and ``cat`` read them, and Spark reads the manifest's files with the
way of docs/consumers.md's Parquet recipe and counts each hour as its manifest does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from event_etl.consumer import hour_statuses
from event_etl.consumer.recipes import hour_uris, spark_format, type_root
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import to_millis

pytestmark = pytest.mark.slow  # one run of the job, shared by the module

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("event-etl"))
SOURCE = "generate:rate=20000,speedup=3600,start=2026-11-20T10:00:00Z,count=20000,late=0.05,seed=11"


def _env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("parquet")
    types = work / "types" / "page_view"
    types.mkdir(parents=True)
    src = ROOT / "event_types" / "page_view"
    (types / "schema.avsc").write_text((src / "schema.avsc").read_text())
    (types / "etl.toml").write_text((src / "etl.toml").read_text().replace(
        'codec = "snappy"\n', 'codec = "snappy"\nformat = "parquet"\n'))
    sink = work / "data"
    run = subprocess.run([EXE, "run", "page_view", "--event-types", str(work / "types"), "--source", SOURCE,
                          "--drain", "--sink", str(sink), "--checkpoint", str(work / "ckpt"), "--quiet",
                          "--master", "local[2]"], cwd=work, env=_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    manifests = {}
    for s in hour_statuses(str(sink), "page_view", "2026-11-20T00", "2026-11-21T00"):
        if s.is_complete:
            marker = (sink / hour_dir("page_view", to_millis(s.hour)) / MARKER_NAME).read_bytes()
            manifests[s.hour.strftime("%Y-%m-%dT%H")] = Manifest.from_bytes(marker)
    return {"work": work, "sink": sink, "types": work / "types", "manifests": manifests}


def test_a_parquet_type_marks_its_hours_with_parquet_files_that_verify_and_cat_read(job):
    manifests = job["manifests"]
    assert manifests and sum(m.records for m in manifests.values()) > 0
    for m in manifests.values():
        assert m.version == 4 and m.files and all(f.name.endswith(".parquet") for f in m.files)
    hour, m = max(manifests.items(), key=lambda kv: kv[1].records)
    verify = subprocess.run([EXE, "verify", "page_view", hour, "--sink", str(job["sink"])], env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    cat = subprocess.run([EXE, "cat", "page_view", hour, "--sink", str(job["sink"]), "--event-types",
                          str(job["types"])], env=_env(), capture_output=True, text=True, timeout=120)
    assert cat.returncode == 0, cat.stderr
    lines = cat.stdout.splitlines()
    assert len(lines) == m.records and json.loads(lines[0])["event_time"].endswith("Z")


def test_spark_reads_the_manifests_parquet_files_as_the_manifests_count(job, spark):
    sink, hours = str(job["sink"]), sorted(job["manifests"])
    # as the Parquet recipe of docs/consumers.md (run as the page writes it: integration/test_consumer_recipes.py)
    files = hour_uris(sink, "page_view", hours[0], until=hours[-1])
    df = spark.read.format(spark_format(files)).option("basePath", type_root(sink, "page_view")).load(files)
    per_hour = {(str(r["dt"]), int(r["hour"])): r["count"] for r in df.groupBy("dt", "hour").count().collect()}
    want = {(h[:10], int(h[11:13])): m.records for h, m in job["manifests"].items() if h != hours[-1] and m.records}
    assert per_hour == want
    assert dict(df.dtypes)["event_time"] == "timestamp"
