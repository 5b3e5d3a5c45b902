"""The consumers' recipes of docs/consumers.md and README.md run as the pages write them (issue 60 item 1).

Each block marked ``<!-- recipe: NAME -->`` is read from the page and run as it stands (tests/lib/doc_recipes.py),
``sink`` taken from ``$EVENT_ETL_SINK`` as the first example does, on hours written by the real executor and
controller.  This module runs the recipes that need no Spark and no Cloud Storage, and checks that every Python
block of the two pages is run by a test or says why not; integration/test_consumer_recipes.py runs Spark's, the
Parquet one and BigQuery's (on a ``gs://my-events/prod`` sink), integration/test_iceberg.py the Iceberg ones.
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from pathlib import Path

import pytest

from event_etl.consumer import HourState
from tests.lib.doc_recipes import (
    CLICK_13,
    CLICK_14,
    CONSUMERS,
    PAGE_VIEW_13,
    README,
    ROOT,
    blocks,
    build_docs_sink,
    recipe,
    run_recipe,
)

DAY = dt.date(2026, 11, 21)

RUN_BY = {
    "api": "tests/test_docs_recipes.py",
    "readme": "tests/test_docs_recipes.py",
    "duckdb": "tests/test_docs_recipes.py",
    "duckdb-arrow": "tests/test_docs_recipes.py",
    "pandas": "tests/test_docs_recipes.py",
    "spark": "integration/test_consumer_recipes.py",
    "parquet": "integration/test_consumer_recipes.py",
    "bigquery-load": "integration/test_consumer_recipes.py",
    "bigquery-external-table": "integration/test_consumer_recipes.py",
    "bigquery-external-table-output": "integration/test_consumer_recipes.py",
    "iceberg-etl-toml": "integration/test_iceberg.py",
    "iceberg-catalog-env": "integration/test_iceberg.py",
    "iceberg-pyiceberg": "integration/test_iceberg.py",
    "iceberg-duckdb": "integration/test_iceberg.py",
    "iceberg-spark": "integration/test_iceberg.py",
}
"""Each recipe of the pages and the test module that runs it (names the module spells out)."""


@pytest.fixture(scope="module")
def sink(tmp_path_factory) -> str:
    return build_docs_sink(tmp_path_factory.mktemp("docs-sink"))


def test_every_python_block_of_the_consumer_pages_is_run_or_says_why():
    marked = []
    for page in (CONSUMERS, README):
        for b in blocks(page):
            if b.lang == "python":
                assert b.mark is not None, f"{b.where}: mark it <!-- recipe: NAME --> and run it, or say " \
                                           "<!-- not run: WHY -->"
            if b.mark and b.mark[0] == "recipe":
                marked.append(b.mark[1])
    assert sorted(marked) == sorted(RUN_BY), "a recipe of the pages and the tests that run it (RUN_BY)"
    for name, module in RUN_BY.items():
        assert f'"{name}"' in (ROOT / module).read_text(), f"{module} runs recipe {name}"


def test_the_first_example_reads_the_sink_of_event_etl_sink(sink, monkeypatch):
    monkeypatch.setenv("EVENT_ETL_SINK", sink)
    ns = run_recipe(CONSUMERS, "api")
    assert ns["sink"] == sink
    assert ns["manifest"].records == PAGE_VIEW_13 and ns["table"].num_rows == PAGE_VIEW_13
    assert ns["own_hour_only"].num_rows == PAGE_VIEW_13 and ns["record"]["event_time"].tzinfo is not None
    assert ns["report"].ok
    status = ns["status"]
    assert (status.state, status.records, status.completed_at, status.marker_delay) == (HourState.OPEN, None, None,
                                                                                         None)


def test_the_readme_example(sink, monkeypatch):
    monkeypatch.setenv("EVENT_ETL_SINK", sink)
    ns = run_recipe(README, "readme")
    assert len(ns["df"]) == PAGE_VIEW_13 and str(ns["df"]["event_time"].dt.tz) == "UTC"
    assert [Path(f).name for f in ns["files"]] == ["part-2026112113-b0000000000-s0000-0000.avro"]


def test_duckdb_with_its_avro_extension_counts_each_hour_as_its_manifest(sink):
    ns = run_recipe(CONSUMERS, "duckdb", sink=sink)
    assert ns["per_hour"] == [(DAY, 13, CLICK_13), (DAY, 14, CLICK_14)]


def test_duckdb_over_the_checked_arrow_table(sink, capsys):
    ns = run_recipe(CONSUMERS, "duckdb-arrow", sink=sink)
    assert ns["tbl"].num_rows == CLICK_13 + CLICK_14
    shown = capsys.readouterr().out
    assert re.search(r"/late\s.*\b1\b", shown) and re.search(r"/c\s.*\b3\b", shown), shown


def test_pandas_reads_an_hour_with_its_late_records(sink):
    df = run_recipe(CONSUMERS, "pandas", sink=sink)["df"]
    assert len(df) == CLICK_14 and str(df["ts"].dt.tz) == "UTC"
    assert sorted(df.loc[df["ts"].dt.hour == 13, "id"]) == ["d0", "d1"], "the late records of 13:30"


def test_the_iceberg_recipe_loads_the_catalog_the_docs_etl_toml_names():
    """The issue's case: the recipe loaded "events" while the page's etl.toml left the catalog at "event_etl", and
    load_table raised NoSuchTableError.  integration/test_iceberg.py runs the three; this is the quick check."""
    name = tomllib.loads(recipe(CONSUMERS, "iceberg-etl-toml").text)["commit_policy"][0].get("catalog", "event_etl")
    env = re.findall(r"^export (PYICEBERG_CATALOG__(\w+?)__\w+)=", recipe(CONSUMERS, "iceberg-catalog-env").text, re.M)
    assert env and {catalog for _, catalog in env} == {name.upper()}
    loads = re.findall(r"load_catalog\(\"(\w+)\"", recipe(CONSUMERS, "iceberg-pyiceberg").text)
    assert loads == [name]
