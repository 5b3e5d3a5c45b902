"""The ``iceberg`` commit policy on the real job (issue 51): the demo's type written in Parquet, run to its drain with
the policy on; every complete hour is one snapshot of the table, after its marker, and the readers of
docs/consumers.md ("Iceberg tables") count each hour as its manifest does: pyiceberg, DuckDB's iceberg extension
loaded offline, and Spark as far as it goes without ``iceberg-spark-runtime`` (the files the table plans)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from event_etl.consumer import hour_statuses
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import HOUR_MS, iso, to_millis

pytestmark = pytest.mark.slow  # one run of the job (~40 s on 2 busy cores), shared by the module

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("event-etl"))
START = "2026-11-20T10:00:00Z"
SOURCE = f"generate:rate=20000,speedup=3600,start={START},count=50000,late=0.05,seed=7"


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> dict:
    """The demo's page_view, format = "parquet" and an iceberg policy on a SQL catalog, run to its drain once."""
    work = tmp_path_factory.mktemp("iceberg")
    types = work / "types"
    (types / "page_view").mkdir(parents=True)
    src = ROOT / "event_types" / "page_view"
    (types / "page_view" / "schema.avsc").write_text((src / "schema.avsc").read_text())
    toml = (src / "etl.toml").read_text().replace('codec = "snappy"\n', 'codec = "snappy"\nformat = "parquet"\n')
    toml = toml.replace("[pubsub]", f'[[commit_policy]]\nkind = "iceberg"\ncatalog = "events"\n'
                                    f'catalog_uri = "sqlite:///{work}/catalog.db"\n'
                                    f'warehouse = "file://{work}/warehouse"\n\n[pubsub]', 1)
    (types / "page_view" / "etl.toml").write_text(toml)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}
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
    return {"work": work, "sink": sink, "manifests": manifests}


def _table(work: Path):
    # -- the recipe (docs/consumers.md, Iceberg: pyiceberg) --
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("events", type="sql", uri=f"sqlite:///{work}/catalog.db",
                           warehouse=f"file://{work}/warehouse")
    table = catalog.load_table("event_etl.page_view")
    # -- end of the recipe --
    return table


def test_every_complete_hour_is_one_snapshot_after_its_marker(job):
    manifests = job["manifests"]
    assert len(manifests) >= 3 and any(m.late_records for m, _ in manifests.values())
    table = _table(job["work"])
    snaps = table.snapshots()
    props = [s.summary.additional_properties for s in snaps if s.summary]
    got = [(p["event_etl.hour"], p["event_etl.marker_sha256"], int(p["added-records"])) for p in props]
    assert got == [(iso(h), sha, m.records) for h, (m, sha) in sorted(manifests.items()) if m.files]
    for s in snaps:  # never before its marker
        m, _ = manifests[to_millis(dt.datetime.fromisoformat(s.summary.additional_properties["event_etl.hour"]))]
        assert s.timestamp_ms >= m.completed_at
    assert table.scan().to_arrow().num_rows == sum(m.records for m, _ in manifests.values())


def test_pyiceberg_reads_an_hour_and_a_range_as_their_manifests(job):
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

    manifests = job["manifests"]
    table = _table(job["work"])
    # -- the recipe (docs/consumers.md, Iceberg: an hour, a range) --
    hour = table.scan(row_filter=EqualTo("etl_hour", "2026-11-20T11:00:00+00:00")).to_arrow()
    span = table.scan(row_filter=And(GreaterThanOrEqual("etl_hour", "2026-11-20T10:00:00+00:00"),
                                     LessThan("etl_hour", "2026-11-20T15:00:00+00:00")),
                      selected_fields=("event_id", "event_time", "etl_hour", "etl_late")).to_arrow()
    # -- end of the recipe --
    eleven = to_millis(dt.datetime.fromisoformat("2026-11-20T11:00:00+00:00"))
    hours = [h for h in manifests if eleven - HOUR_MS <= h < eleven + 4 * HOUR_MS]
    assert len(hours) >= 2 and hour.num_rows == manifests[eleven][0].records
    assert span.num_rows == sum(manifests[h][0].records for h in hours)
    late = span.filter(span.column("etl_late")).num_rows
    assert late == sum(manifests[h][0].late_records for h in hours) > 0


def test_duckdb_reads_the_table_offline_as_the_manifests(job):
    table = _table(job["work"])
    # -- the recipe (docs/consumers.md, Iceberg: DuckDB) --
    from event_etl.consumer.iceberg import duckdb_iceberg_connect

    con = duckdb_iceberg_connect()        # DuckDB with its avro, then iceberg extensions loaded by path: no download
    per_hour = con.execute("SELECT etl_hour, count(*) AS n, count(*) FILTER (WHERE etl_late) AS late "
                           "FROM iceberg_scan($metadata) GROUP BY etl_hour ORDER BY etl_hour",
                           {"metadata": table.metadata_location}).fetchall()
    # -- end of the recipe --
    assert [(to_millis(h), n, late) for h, n, late in per_hour] == [
        (h, m.records, m.late_records) for h, (m, _) in sorted(job["manifests"].items()) if m.files]


def test_spark_without_the_iceberg_runtime_reads_the_files_the_table_plans(job, spark):
    from pyspark.errors import PySparkException

    manifests = job["manifests"]
    table = _table(job["work"])
    with pytest.raises((PySparkException, Exception), match="(?i)iceberg"):  # a cluster adds iceberg-spark-runtime
        spark.read.format("iceberg").load("event_etl.page_view").count()
    # -- the recipe (docs/consumers.md, Iceberg: Spark without iceberg-spark-runtime) --
    from pyiceberg.expressions import EqualTo

    tasks = table.scan(row_filter=EqualTo("etl_hour", "2026-11-20T11:00:00+00:00")).plan_files()
    df = spark.read.parquet(*[task.file.file_path for task in tasks])
    # -- end of the recipe --
    assert df.count() == manifests[to_millis(dt.datetime.fromisoformat("2026-11-20T11:00:00+00:00"))][0].records
