"""The Spark recipe on real Spark, and hour_uris on the GCS emulator.

spark-avro is not on this machine (no Maven access), so Spark reads the manifest's files with
its built-in ``binaryFile`` source instead of ``avro``: what is tested is the recipe's shape --
``basePath`` plus exactly the manifest's files gives the ``dt``/``hour`` partition columns and
no open hour, no ``_deadletter/`` -- not spark-avro's decoding.  The decoding of the same files
is what ``read_table`` does (tests/test_consumer*.py).
"""

from __future__ import annotations

from pathlib import Path

from event_etl.consumer.recipes import hour_uris, spark_avro_package, type_root
from tests.test_consumer_scenario import build_hours


def test_spark_reads_exactly_the_manifests_files_with_base_path(spark, tmp_path):
    sc = build_hours(tmp_path)
    uris = hour_uris(sc.sink, "click", "2026-11-21T13", until="2026-11-21T15")
    df = (spark.read.format("binaryFile").option("basePath", type_root(sc.sink, "click")).load(uris))
    rows = sorted((Path(r.path).name, str(r.dt), r.hour) for r in df.select("path", "dt", "hour").collect())
    assert rows == sorted((Path(u).name, "2026-11-21", int(u.split("hour=")[1][:2])) for u in uris)
    assert {h for _, _, h in rows} == {13, 14}, "partition columns from basePath, the open hour 15 left out"
    # the plain partition scan the recipe replaces: it takes in the open hour too
    scan = spark.read.format("binaryFile").option("pathGlobFilter", "*.avro").load(type_root(sc.sink, "click"))
    assert {r.hour for r in scan.select("hour").distinct().collect()} == {13, 14, 15}


def test_the_spark_avro_package_matches_the_installed_spark():
    import pyspark

    assert spark_avro_package() == f"org.apache.spark:spark-avro_2.13:{pyspark.__version__}"


def test_hour_uris_on_gcs_are_gs_urls(tmp_path, gcs_bucket):
    sc = build_hours(tmp_path, sink_url=f"{gcs_bucket}/events")
    uris = hour_uris(sc.sink, "click", "2026-11-21T14")
    assert len(uris) == 2 and all(u.startswith(f"{gcs_bucket}/events/click/dt=2026-11-21/hour=14/") for u in uris)
