"""The recipes of docs/consumers.md that need Spark or Cloud Storage, run as the page writes them
(tests/lib/doc_recipes.py): Spark's and the Parquet one on real Spark, BigQuery's on a ``gs://my-events/prod`` sink
on the GCS emulator (the DDL printed is the page's, byte for byte); and hour_uris on the GCS emulator.

PySpark 4 reads the sink's Avro with its built-in source, named by its class
(``SPARK_AVRO_FORMAT``, ``org.apache.spark.sql.avro.AvroFileFormat``): no ``spark-avro`` package,
which ``format("avro")`` asks for.  One Spark session (the suite's), the small sink of
tests/lib/consumer_scenario.py ``build_recipe_hours``.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from event_etl.consumer import hour_status, read_table
from event_etl.consumer.recipes import (
    SPARK_AVRO_FORMAT,
    bq_external_table_ddl,
    hour_uris,
    spark_avro_package,
    type_root,
)
from tests.lib.consumer_scenario import RECIPE_HOUR_13, RECIPE_HOUR_14, build_hours, build_recipe_hours
from tests.lib.doc_recipes import CLICK_13, CLICK_14, CONSUMERS, build_docs_sink, recipe, run_recipe

DAY = dt.date(2026, 11, 21)


def test_spark_reads_the_manifests_files_with_its_built_in_avro_source(spark, tmp_path):
    sink = build_recipe_hours(tmp_path).sink
    df = run_recipe(CONSUMERS, "spark", sink=sink, spark=spark)["df"]
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


def test_the_parquet_recipe_reads_a_parquet_types_hours_with_spark_and_duckdb(spark, tmp_path):
    sink = build_docs_sink(tmp_path, fmt="parquet")
    ns = run_recipe(CONSUMERS, "parquet", sink=sink, spark=spark)
    assert all(f.endswith(".parquet") for f in ns["files"]) and len(ns["files"]) == 3
    assert sorted(tuple(r) for r in ns["df"].groupBy("hour").count().collect()) == [(13, CLICK_13), (14, CLICK_14)]
    assert ns["per_hour"] == [(13, CLICK_13), (14, CLICK_14)]


@pytest.fixture(scope="module")
def my_events(gcs_server, tmp_path_factory) -> str:
    """The page's sink, ``gs://my-events/prod``, on the GCS emulator: the recipes' URIs are the page's."""
    gcs_server.create_bucket("my-events")
    return build_docs_sink(tmp_path_factory.mktemp("my-events"), sink_url="gs://my-events/prod")


def test_the_bigquery_load_recipe_on_a_gcs_sink(my_events, capsys):
    ns = run_recipe(CONSUMERS, "bigquery-load", sink=my_events)
    assert ns["uris"] == ["gs://my-events/prod/page_view/dt=2026-11-21/hour=13/part-2026112113-b0000000000-s0000-0000"
                          ".avro"]
    printed = capsys.readouterr().out
    assert printed.startswith("bq load --source_format=AVRO --use_avro_logical_types "
                              "--time_partitioning_field=event_time --time_partitioning_type=HOUR --replace "
                              "'analytics.page_view$2026112113' gs://my-events/prod/page_view/"), printed
    commented = [line.lstrip("# ").split()[:3] for line in recipe(CONSUMERS, "bigquery-load").text.splitlines()
                 if line.startswith("# bq load")]
    assert commented == [printed.split()[:3]], "the page's comment shows the command printed"


def test_the_bigquery_external_table_recipe_prints_the_pages_ddl(my_events, capsys):
    run_recipe(CONSUMERS, "bigquery-external-table", sink=my_events)
    assert capsys.readouterr().out == recipe(CONSUMERS, "bigquery-external-table-output").text
