"""Recipes for the tools consumers use (event_etl.consumer.recipes) and the Airflow sensor's logic
(event_etl.consumer.airflow).

Airflow is not installed here: the sensor's poke rule and its trigger's event stream are tested
as the functions the Airflow classes call (``poke``, ``watch``); the classes themselves, which only
wire those into Airflow's base classes, are not exercised.  DuckDB and pandas are real (the test
extra).  BigQuery's ``bq`` is not here: its command line is checked, not run.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from event_etl.consumer import CouldNotCheckError, HourNotCompleteError, read_table
from event_etl.consumer.recipes import bq_load_command, hour_uris, shell, type_root
from event_etl.errors import NoDataError, UsageError
from tests.test_consumer_scenario import build_hours


@pytest.fixture
def sc(tmp_path):
    return build_hours(tmp_path)


def test_hour_uris_are_the_manifests_files_and_nothing_else(sc):
    uris = hour_uris(sc.sink, "click", "2026-11-21T14")
    assert [Path(u).name for u in uris] == sorted(Path(u).name for u in uris)
    assert {Path(u).name.split("-")[0] for u in uris} == {"part", "late"}
    assert all(Path(u).is_file() and "/dt=2026-11-21/hour=14/" in u for u in uris)
    own = hour_uris(sc.sink, "click", "2026-11-21T14", include_late=False)
    assert len(own) == 1 and Path(own[0]).name.startswith("part-")
    both = hour_uris(sc.sink, "click", "2026-11-21T13", until="2026-11-21T15")
    assert len(both) == 4 and all("/_deadletter/" not in u for u in both)
    # a glob of the type's folder would also catch the open hour 15 (and, with dead letters, _deadletter/)
    globbed = sorted(str(p) for p in Path(type_root(sc.sink, "click")).rglob("*.avro"))
    assert set(both) < set(globbed) and any("hour=15" in g for g in globbed)


def test_an_open_hour_has_no_uris(sc):
    with pytest.raises(HourNotCompleteError):
        hour_uris(sc.sink, "click", "2026-11-21T15")
    with pytest.raises(HourNotCompleteError):
        hour_uris(sc.sink, "click", "2026-11-21T13", until="2026-11-21T16")
    with pytest.raises(NoDataError):
        hour_uris(sc.sink + "-typo", "click", "2026-11-21T13")


def test_gs_sinks_give_gs_uris():
    cmd = bq_load_command(["gs://b/p/page_view/dt=2026-11-21/hour=13/part-a.avro",
                           "gs://b/p/page_view/dt=2026-11-21/hour=13/part-b.avro"], "ds.page_view",
                          time_partitioning_field="event_time", replace_partition=True, hour="2026-11-21T13")
    assert cmd == ["bq", "load", "--source_format=AVRO", "--use_avro_logical_types",
                   "--time_partitioning_field=event_time", "--time_partitioning_type=HOUR", "--replace",
                   "ds.page_view$2026112113",
                   "gs://b/p/page_view/dt=2026-11-21/hour=13/part-a.avro,gs://b/p/page_view/dt=2026-11-21/hour=13/part-b.avro"]
    assert "'ds.page_view$2026112113'" in shell(cmd)
    for bad in (
        ["gs://b/p/page_view/*.avro"],
        ["gs://b/p/page_view/_deadletter/dt=2026-11-21/dl.avro"],
        ["/local.avro"],
        [],
    ):
        with pytest.raises(UsageError):
            bq_load_command(bad, "ds.t")


def test_duckdb_reads_the_hours_table(sc):
    duckdb = pytest.importorskip("duckdb")
    tbl = read_table(sc.sink, sc.et, "2026-11-21T13", until="2026-11-21T15")  # noqa: F841 - DuckDB finds it by name
    rows = duckdb.sql("SELECT id, count(*) AS n FROM tbl GROUP BY id ORDER BY id").fetchall()
    assert rows == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]


def test_pandas_reads_an_hour(sc):
    pytest.importorskip("pandas")
    df = read_table(sc.sink, sc.et, "2026-11-21T14", include_late=False).to_pandas()
    assert list(df["id"]) == ["c"] and str(df["ts"].dt.tz) == "UTC"


# -- Airflow ------------------------------------------------------------------------------------------------
def test_poke_answers_done_not_yet_or_fails(sc, tmp_path):
    from event_etl.consumer.airflow import poke

    got = poke(sc.sink, "click", "2026-11-21 14:00:00+00:00")  # as Airflow renders data_interval_start
    assert got.done and got.summary["records"] == 2 and got.summary["hour"] == "2026-11-21T14:00:00Z"
    assert poke(sc.sink, "click", "2026-11-21T15").done is False
    with pytest.raises(NoDataError):
        poke(str(tmp_path / "wrong"), "click", "2026-11-21T15")
    with pytest.raises(UsageError):  # before the job's first hour: never marked
        poke(sc.sink, "click", "2026-11-21T12")
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(CouldNotCheckError):
        poke(str(blocked), "click", "2026-11-21T15")


def test_the_trigger_polls_until_complete_then_yields_once(sc):
    from event_etl.consumer.airflow import watch
    from tests.test_consumer_scenario import complete_hour_15

    naps = []

    async def sleep(s):
        naps.append(s)
        if len(naps) == 2:
            complete_hour_15(sc)  # the job marks the hour while the trigger waits

    async def collect():
        return [e async for e in watch(sc.sink, "click", "2026-11-21T15", poke_interval=30, sleep=sleep)]

    events = asyncio.run(collect())
    assert naps == [30, 30] and len(events) == 1
    assert events[0]["status"] == "complete" and events[0]["hour"] == "2026-11-21T15:00:00Z"


def test_the_trigger_reports_a_wrong_sink_as_an_error_event(tmp_path):
    from event_etl.consumer.airflow import watch

    async def collect():
        return [e async for e in watch(str(tmp_path / "nope"), "click", "2026-11-21T15", poke_interval=1)]

    (event,) = asyncio.run(collect())
    assert event["status"] == "error" and event["exit_code"] == 6 and "--sink" in event["fix"]


def test_the_marker_object_for_gcs_object_existence_sensor():
    from event_etl.consumer.airflow import marker_object

    assert marker_object("gs://my-events/prod", "page_view", "2026-11-21 13:00:00+00:00") == (
        "my-events", "prod/page_view/dt=2026-11-21/hour=13/_COMPLETE")
    assert marker_object("gs://my-events", "page_view", "2026-11-21T13") == (
        "my-events", "page_view/dt=2026-11-21/hour=13/_COMPLETE")


def test_the_sensor_without_airflow_says_what_is_missing():
    code = ("import event_etl.consumer.airflow as a\n"
            "try:\n    a.HourCompleteSensor\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    try:
        import airflow  # noqa: F401
    except ImportError:
        assert "needs Apache Airflow" in out
    else:  # pragma: no cover - only where Airflow is installed
        assert out == ""


def test_the_paths_of_release_0_3_still_import_what_they_did():
    """DAGs and scripts written against 0.3 import ``event_etl.airflow`` and ``event_etl.recipes``; a trigger that
    0.3 deferred is re-created from ``event_etl.airflow.HourCompleteTrigger``.  Importing the old path still
    imports no Airflow, and every name is the same object as at its new home."""
    code = ("import sys\nimport event_etl.airflow as old, event_etl.consumer.airflow as new\n"
            "import event_etl.recipes as old_r, event_etl.consumer.recipes as new_r\n"
            "assert 'airflow' not in sys.modules, 'importing the old path imported Airflow'\n"
            "assert old.poke is new.poke and old.marker_object is new.marker_object\n"
            "assert old_r.hour_uris is new_r.hour_uris and old_r.__all__ == new_r.__all__\n"
            "from event_etl.airflow import PokeResult, watch\n"
            "try:\n    old.HourCompleteTrigger\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    try:
        import airflow  # noqa: F401
    except ImportError:
        assert "needs Apache Airflow" in run.stdout
