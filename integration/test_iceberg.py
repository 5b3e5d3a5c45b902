"""The ``iceberg`` commit policy on the real job (issue 51): the demo's type written in Parquet, run to its drain with
the policy on; every complete hour is one snapshot of the table, after its marker, and the readers of
docs/consumers.md ("Iceberg tables") count each hour as its manifest does: pyiceberg, DuckDB's iceberg extension
loaded offline, and Spark as far as it goes without ``iceberg-spark-runtime`` (the files the table plans).

The type's settings are the page's (``iceberg-etl-toml``: the lines it adds to the demo's etl.toml), its catalog the
page's variables (``iceberg-catalog-env``, ``/var/lib/etl`` a folder of the test's), and the readers the page's
recipes as they stand (tests/lib/doc_recipes.py): issue 60 item 1, the recipe loaded a catalog name the page's
etl.toml did not set."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from event_etl.consumer import hour_statuses
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import HOUR_MS, iso, to_millis
from tests.lib.doc_recipes import CONSUMERS, recipe, run_recipe

pytestmark = pytest.mark.slow  # one run of the job (~40 s on 2 busy cores), shared by the module

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("event-etl"))
START = "2026-11-20T10:00:00Z"
SOURCE = f"generate:rate=20000,speedup=3600,start={START},count=50000,late=0.05,seed=7"


def _catalog_env(work: Path) -> dict[str, str]:
    """The page's variables for the catalog, its ``/var/lib/etl`` in ``work``."""
    lines = re.findall(r"^export (\w+)=(\S+)", recipe(CONSUMERS, "iceberg-catalog-env").text, re.M)
    assert lines, "the page sets the catalog's properties with export lines"
    return {name: value.replace("/var/lib/etl", str(work)) for name, value in lines}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Iterator[dict]:
    """The demo's page_view with the page's lines (format = "parquet", an iceberg policy on the catalog the page's
    variables configure), run to its drain once; the variables stay set for the module's readers."""
    work = tmp_path_factory.mktemp("iceberg")
    types = work / "types"
    (types / "page_view").mkdir(parents=True)
    src = ROOT / "event_types" / "page_view"
    (types / "page_view" / "schema.avsc").write_text((src / "schema.avsc").read_text())
    toml = (src / "etl.toml").read_text()
    assert toml.count("\n[pubsub]") == 1, "the page puts its lines before the demo's first table, [pubsub]"
    toml = toml.replace("\n[pubsub]", "\n" + recipe(CONSUMERS, "iceberg-etl-toml").text + "\n[pubsub]")
    (types / "page_view" / "etl.toml").write_text(toml)
    catalog_env = _catalog_env(work)
    env = {**os.environ, **catalog_env, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}
    run = subprocess.run([EXE, "run", "page_view", "--event-types", str(types), "--source", SOURCE, "--drain",
                          "--sink", str(work / "data"), "--checkpoint", str(work / "ckpt"), "--quiet"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    sink = work / "data"
    manifests = {}
    for s in hour_statuses(str(sink), "page_view", "2026-11-20T00", "2026-11-21T00"):
        if s.is_complete:
            marker = (sink / hour_dir("page_view", to_millis(s.hour)) / MARKER_NAME).read_bytes()
            manifests[to_millis(s.hour)] = (Manifest.from_bytes(marker), hashlib.sha256(marker).hexdigest())
    # the readers run here: pyiceberg read its configuration from the environment when it was first imported
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config

    with pytest.MonkeyPatch.context() as mp:
        for name, value in catalog_env.items():
            mp.setenv(name, value)
        mp.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())
        yield {"work": work, "sink": sink, "manifests": manifests,
               "pyiceberg": run_recipe(CONSUMERS, "iceberg-pyiceberg")}


def _table(job: dict):
    return job["pyiceberg"]["table"]


def test_every_complete_hour_is_one_snapshot_after_its_marker(job):
    manifests = job["manifests"]
    assert len(manifests) >= 3 and any(m.late_records for m, _ in manifests.values())
    table = _table(job)
    snaps = table.snapshots()
    props = [s.summary.additional_properties for s in snaps if s.summary]
    got = [(p["event_etl.hour"], p["event_etl.marker_sha256"], int(p["added-records"])) for p in props]
    assert got == [(iso(h), sha, m.records) for h, (m, sha) in sorted(manifests.items()) if m.files]
    for s in snaps:  # never before its marker
        m, _ = manifests[to_millis(dt.datetime.fromisoformat(s.summary.additional_properties["event_etl.hour"]))]
        assert s.timestamp_ms >= m.completed_at
    assert table.scan().to_arrow().num_rows == sum(m.records for m, _ in manifests.values())


def test_pyiceberg_reads_an_hour_and_a_range_as_their_manifests(job):
    manifests = job["manifests"]
    hour, span = job["pyiceberg"]["hour"], job["pyiceberg"]["span"]
    eleven = to_millis(dt.datetime.fromisoformat("2026-11-20T11:00:00+00:00"))
    hours = [h for h in manifests if eleven - HOUR_MS <= h < eleven + 4 * HOUR_MS]
    assert len(hours) >= 2 and hour.num_rows == manifests[eleven][0].records
    assert span.num_rows == sum(manifests[h][0].records for h in hours)
    late = span.filter(span.column("etl_late")).num_rows
    assert late == sum(manifests[h][0].late_records for h in hours) > 0


def test_duckdb_reads_the_table_offline_as_the_manifests(job):
    per_hour = run_recipe(CONSUMERS, "iceberg-duckdb", table=_table(job))["per_hour"]
    assert [(to_millis(h), n, late) for h, n, late in per_hour] == [
        (h, m.records, m.late_records) for h, (m, _) in sorted(job["manifests"].items()) if m.files]


def test_spark_without_the_iceberg_runtime_reads_the_files_the_table_plans(job, spark):
    from pyspark.errors import PySparkException

    manifests = job["manifests"]
    with pytest.raises((PySparkException, Exception), match="(?i)iceberg"):  # a cluster adds iceberg-spark-runtime
        spark.read.format("iceberg").load("event_etl.page_view").count()
    df = run_recipe(CONSUMERS, "iceberg-spark", table=_table(job), spark=spark)["df"]
    assert df.count() == manifests[to_millis(dt.datetime.fromisoformat("2026-11-20T11:00:00+00:00"))][0].records
