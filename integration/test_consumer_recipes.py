"""The Spark recipe on real Spark, and hour_uris and the BigQuery DDL on the GCS emulator.

PySpark 4 reads the sink's Avro with its built-in source, named by its class
(``SPARK_AVRO_FORMAT``, ``org.apache.spark.sql.avro.AvroFileFormat``): no ``spark-avro`` package,
which ``format("avro")`` asks for.  One Spark session (the suite's), the small sink of
tests/test_consumer_scenario.py ``build_recipe_hours``.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from event_etl.consumer import hour_status, read_table
from event_etl.consumer.recipes import SPARK_AVRO_FORMAT, bq_external_table_ddl, hour_uris, spark_avro_package
from tests.lib.consumer_scenario import RECIPE_HOUR_13, RECIPE_HOUR_14, build_hours, build_recipe_hours

DAY = dt.date(2026, 11, 21)


def test_spark_reads_the_manifests_files_with_its_built_in_avro_source(spark, tmp_path):
    sink = build_recipe_hours(tmp_path).sink
    # -- the recipe (docs/consumers.md, Spark) --
    from event_etl.consumer.recipes import SPARK_AVRO_FORMAT, hour_uris, type_root

    files = hour_uris(sink, "click", "2026-11-21T13", until="2026-11-21T15")     # complete hours, late files too
    df = (spark.read.format(SPARK_AVRO_FORMAT)                  # org.apache.spark.sql.avro.AvroFileFormat
          .option("basePath", type_root(sink, "click"))          # dt and hour stay partition columns
          .load(files))                                          # a list: exactly these files
    # -- end of the recipe --
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("id", "string"), ("ts", "timestamp"), ("page", "string"), ("dt", "date"), ("hour", "int")]
    per_hour = [tuple(r) for r in df.groupBy("dt", "hour").count().orderBy("hour").collect()]
    manifests = [hour_status(sink, "click", h).records for h in ("2026-11-21T13", "2026-11-21T14")]
    assert per_hour == [(DAY, 13, RECIPE_HOUR_13), (DAY, 14, RECIPE_HOUR_14)]
    assert [n for _, _, n in per_hour] == manifests
    # the late records of 13:30 are in hour 14's folder, as its manifest counts them
    late = df.where("hour = 14 AND ts < timestamp'2026-11-21 14:00:00'").select("id").collect()
    assert sorted(r.id for r in late) == ["d0", "d1"]
    # one hour, as read_table reads it (values and nulls)
    one = (spark.read.format(SPARK_AVRO_FORMAT).option("basePath", type_root(sink, "click"))
           .load(hour_uris(sink, "click", "2026-11-21T14")))
    want = read_table(sink, "click", "2026-11-21T14").to_pylist()
    assert sorted((r.id, r.page) for r in one.collect()) == sorted((r["id"], r["page"]) for r in want)
    # the plain scan of the type's folder that the recipe replaces: Spark skips _COMPLETE, _deadletter/ and the
    # temporaries (names starting with "." or "_"), but takes in the open hour 15
    scan = spark.read.format(SPARK_AVRO_FORMAT).load(type_root(sink, "click"))
    assert [tuple(r) for r in scan.groupBy("hour").count().orderBy("hour").collect()] == [
        (13, RECIPE_HOUR_13), (14, RECIPE_HOUR_14), (15, 1)]
    assert scan.inputFiles() and not [f for f in scan.inputFiles() if "_deadletter" in f or not f.endswith(".avro")]


def test_format_avro_is_the_package_s_name_and_is_not_needed(spark, tmp_path):
    from pyspark.errors import AnalysisException

    sc = build_hours(tmp_path)
    with pytest.raises(AnalysisException, match="AVRO_DATA_SOURCE_NOT_ENABLED|Failed to find data source: avro"):
        spark.read.format("avro").load(hour_uris(sc.sink, "click", "2026-11-21T13")).count()


def test_the_spark_avro_package_matches_the_installed_spark():
    import pyspark

    assert spark_avro_package() == f"org.apache.spark:spark-avro_2.13:{pyspark.__version__}"
    assert SPARK_AVRO_FORMAT == "org.apache.spark.sql.avro.AvroFileFormat"


def test_hour_uris_and_the_bigquery_ddl_on_gcs(tmp_path, gcs_bucket):
    sc = build_hours(tmp_path, sink_url=f"{gcs_bucket}/events")
    uris = hour_uris(sc.sink, "click", "2026-11-21T14")
    assert len(uris) == 2 and all(u.startswith(f"{gcs_bucket}/events/click/dt=2026-11-21/hour=14/") for u in uris)
    ddl = bq_external_table_ddl(uris, "analytics.click_hours")
    assert f"hive_partition_uri_prefix = '{gcs_bucket}/events/click'" in ddl
    assert re.findall(r"'(gs://[^']*\.avro)'", ddl) == uris
