"""Recipes for the tools consumers use (event_etl.consumer.recipes) and the Airflow sensor's logic
(event_etl.consumer.airflow).

Airflow is not installed here: the sensor's poke rule and its trigger's event stream are tested
as the functions the Airflow classes call (``poke``, ``watch``); the classes themselves, which only
wire those into Airflow's base classes, are not exercised.  DuckDB and pandas are real (the test
extra), and so is DuckDB's Avro extension (``duckdb-extension-avro``, loaded by path: no download).
BigQuery's ``bq`` is not here: its command line and DDL are checked for their form, not run.
Spark's recipe runs in integration/test_consumer_recipes.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

import pytest

from event_etl.consumer import CouldNotCheckError, HourNotCompleteError, hour_status, read_table
from event_etl.consumer.recipes import (
    bq_external_table_ddl,
    bq_load_command,
    duckdb_avro_extension,
    duckdb_connect,
    hour_uris,
    shell,
    type_root,
)
from event_etl.errors import NoDataError, UsageError
from tests.lib.consumer_scenario import (
    RECIPE_HOUR_13,
    RECIPE_HOUR_14,
    RECIPE_TEMPORARY,
    build_hours,
    build_recipe_hours,
)
from tests.lib.doc_recipes import CONSUMERS, run_recipe


@pytest.fixture
def sc(tmp_path):
    return build_hours(tmp_path)


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    """The recipes' sink (tests/test_consumer_scenario.py build_recipe_hours), read only: built once."""
    return build_recipe_hours(tmp_path_factory.mktemp("recipes"))


DAY = dt.date(2026, 11, 21)


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


# -- DuckDB's Avro extension, pandas, BigQuery: each recipe of docs/consumers.md, read from the page ----------
def test_the_manifests_count_what_the_recipes_must_read(rs):
    assert hour_status(rs.sink, "click", "2026-11-21T13").records == RECIPE_HOUR_13
    assert hour_status(rs.sink, "click", "2026-11-21T14").records == RECIPE_HOUR_14
    names = {p.name for p in Path(type_root(rs.sink, "click")).rglob("*")}
    assert RECIPE_TEMPORARY in names and any(n.startswith("dl-") for n in names) and "_COMPLETE" in names


def test_duckdb_reads_the_manifests_files_with_its_avro_extension(rs):
    pytest.importorskip("duckdb_extension_avro")
    sink = rs.sink
    recipe = run_recipe(CONSUMERS, "duckdb", sink=sink)  # the page's text, as it stands
    con, files, per_hour = recipe["con"], recipe["files"], recipe["per_hour"]
    assert per_hour == [(DAY, 13, RECIPE_HOUR_13), (DAY, 14, RECIPE_HOUR_14)], "each hour's count is its manifest's"
    own = hour_uris(sink, "click", "2026-11-21T14", include_late=False)
    n_own = con.execute("SELECT count(*) FROM read_avro($files)", {"files": own}).fetchone()
    assert n_own == (RECIPE_HOUR_14 - 2,), "the late file is the only difference"
    cols = [c[0] for c in con.execute("DESCRIBE SELECT * FROM read_avro($files, hive_partitioning = true)",
                                      {"files": files}).fetchall()]
    assert cols == ["id", "ts", "page", "dt", "hour"]


def test_duckdb_decodes_what_read_table_decodes(rs):
    """Every value equal to the checked fastavro read, the nullable union across DuckDB's 2,048-row vectors
    included (duckdb/duckdb#21444: a union read as NULL at multiples of the vector size)."""
    pytest.importorskip("duckdb_extension_avro")
    con = duckdb_connect()
    files = hour_uris(rs.sink, "click", "2026-11-21T13")
    got = con.execute("SELECT id, epoch_ms(ts), page FROM read_avro($files)", {"files": files}).fetchall()
    want = read_table(rs.sink, "click", "2026-11-21T13").to_pylist()
    assert len(got) == len(want) == RECIPE_HOUR_13 > 2048
    assert got == [(r["id"], int(r["ts"].timestamp() * 1000), r["page"]) for r in want]
    assert sum(p is None for _, _, p in got) == 420 + 1, "every 5th of the 2,100, and b1"


def test_duckdb_folder_globs_against_the_manifest(rs):
    """A complete hour's folder glob reads what its manifest lists (``*.avro`` never matches ``_COMPLETE`` or a
    temporary ``.….tmp``); the type-wide globs take in the open hour, and ``**`` the dead letters."""
    pytest.importorskip("duckdb_extension_avro")
    con = duckdb_connect()
    root = type_root(rs.sink, "click")
    hour13 = con.execute("SELECT count(*), count(DISTINCT filename) FROM read_avro($g, filename = true)",
                         {"g": f"{root}/dt=2026-11-21/hour=13/*.avro"}).fetchone()
    assert hour13 == (RECIPE_HOUR_13, len(hour_uris(rs.sink, "click", "2026-11-21T13")))
    hours = con.execute("SELECT hour, count(*) FROM read_avro($g, hive_partitioning = true) GROUP BY hour "
                        "ORDER BY hour", {"g": f"{root}/dt=*/hour=*/*.avro"}).fetchall()
    assert hours == [(13, RECIPE_HOUR_13), (14, RECIPE_HOUR_14), (15, 1)], "the open hour 15 is in the scan"
    dead = [f for (f,) in con.execute("SELECT file FROM glob($g)", {"g": f"{root}/**/*.avro"}).fetchall()
            if "/_deadletter/" in f]
    everything = con.execute("SELECT count(*) FROM read_avro($g)", {"g": f"{root}/**/*.avro"}).fetchone()
    assert len(dead) == 2 and everything == (RECIPE_HOUR_13 + RECIPE_HOUR_14 + 1 + 2,), \
        "** reads the open hour and the dead letters, as clicks, without a word"


def test_duckdb_over_the_checked_arrow_table(rs):
    duckdb = pytest.importorskip("duckdb")
    tbl = read_table(rs.sink, "click", "2026-11-21T13", until="2026-11-21T15")  # noqa: F841 - found by name
    assert duckdb.sql("SELECT count(*) FROM tbl").fetchone() == (RECIPE_HOUR_13 + RECIPE_HOUR_14,)


def test_the_avro_extension_is_the_installed_duckdbs():
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("duckdb_extension_avro")
    path = Path(duckdb_avro_extension())
    assert path.is_file() and path.parent.name == f"v{duckdb.__version__}" and path.name == "avro.duckdb_extension"


def test_a_mismatched_avro_extension_says_which_versions(monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("duckdb_extension_avro")
    monkeypatch.setattr(duckdb, "__version__", "0.9.0")
    with pytest.raises(UsageError, match=r"not for the installed DuckDB 0\.9\.0") as err:
        duckdb_avro_extension()
    assert "duckdb-extension-avro==0.9.0" in (err.value.fix or "")


def test_pandas_reads_hours_with_their_late_records(rs):
    pytest.importorskip("pandas")
    sink = rs.sink
    df = run_recipe(CONSUMERS, "pandas", sink=sink)["df"]  # the page's text, as it stands
    assert len(df) == RECIPE_HOUR_14 and str(df["ts"].dt.tz) == "UTC"
    assert sorted(df.loc[df["ts"].dt.hour == 13, "id"]) == ["d0", "d1"], "the late records of 13:30"
    own = read_table(sink, "click", "2026-11-21T14", include_late=False).to_pandas()
    assert sorted(own["id"]) == ["c0", "c1", "c2"]
    both = read_table(sink, "click", "2026-11-21T13", until="2026-11-21T15").to_pandas()
    assert len(both) == RECIPE_HOUR_13 + RECIPE_HOUR_14 and both["page"].isna().sum() == 420 + 1 + 1


def _as_gs(rs, uris):
    """The local sink's URIs as a gs:// sink's (hour_uris on the GCS emulator: integration/test_consumer_recipes.py)."""
    return ["gs://my-events/prod" + u[len(rs.sink):] for u in uris]


def test_the_bigquery_external_table_ddl_lists_exactly_the_manifests_files(rs):
    uris = _as_gs(rs, hour_uris(rs.sink, "click", "2026-11-21T13", until="2026-11-21T15"))
    ddl = bq_external_table_ddl(uris, "analytics.click_hours")
    assert ddl.startswith("CREATE OR REPLACE EXTERNAL TABLE `analytics.click_hours`\n"
                          "WITH PARTITION COLUMNS (dt DATE, hour INT64)\nOPTIONS (\n") and ddl.endswith("\n);")
    for option in ("format = 'AVRO'", "enable_logical_types = TRUE",
                   "hive_partition_uri_prefix = 'gs://my-events/prod/click'"):
        assert f"  {option},\n" in ddl
    listed = re.findall(r"'(gs://[^']*)'", ddl.split("uris = [", 1)[1])
    assert listed == uris and len(listed) == 3
    assert all(re.fullmatch(r"gs://my-events/prod/click/dt=2026-11-21/hour=1[34]/(part|late)-[^/*]+\.avro", u)
               for u in listed), "only listed data files: no glob, no _COMPLETE, no temporary, no _deadletter"
    assert ddl.count("(") == ddl.count(")") and ddl.count("[") == ddl.count("]") and ddl.count("'") % 2 == 0
    assert bq_external_table_ddl(uris[:1], "d.t", replace=False).startswith("CREATE EXTERNAL TABLE `d.t`")


def test_the_bq_load_with_hive_partitioning(rs):
    uris = _as_gs(rs, hour_uris(rs.sink, "click", "2026-11-21T14"))
    cmd = bq_load_command(uris, "analytics.click", hive_partitioning=True, time_partitioning_field="ts")
    assert cmd[:2] == ["bq", "load"] and cmd[-2:] == ["analytics.click", ",".join(uris)]
    flags = dict(c.split("=", 1) if "=" in c else (c, "") for c in cmd[2:-2])
    assert flags == {"--source_format": "AVRO", "--use_avro_logical_types": "",
                     "--hive_partitioning_mode": "CUSTOM",
                     "--hive_partitioning_source_uri_prefix": "gs://my-events/prod/click/{dt:DATE}/{hour:INTEGER}",
                     "--time_partitioning_field": "ts", "--time_partitioning_type": "HOUR"}
    assert all(u.startswith("gs://my-events/prod/click/dt=2026-11-21/hour=14/") for u in cmd[-1].split(","))
    dead = "gs://my-events/prod/click/_deadletter/dt=2026-11-21/dl-b0000000000-s0000.avro"
    for bad in ([dead], [uris[0].rsplit("/", 1)[0] + "/_COMPLETE"], ["gs://my-events/prod/click/dt=*"],
                [uris[0], "gs://other/prod/click/dt=2026-11-21/hour=14/part-x.avro"]):
        with pytest.raises(UsageError):
            bq_load_command(bad, "d.t", hive_partitioning=True)
        with pytest.raises(UsageError):
            bq_external_table_ddl(bad, "d.t")


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
    from tests.lib.consumer_scenario import complete_hour_15

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


def test_the_trigger_keeps_the_sensors_timeout_and_yields_a_timeout_event(sc):
    """A deferrable sensor on an hour that never completes: the trigger polled on for ever (Airflow's `dags test`
    enforces no deferral timeout). It now stops at the sensor's deadline, waking for it rather than a whole poke."""
    from event_etl.consumer.airflow import watch

    now = [1000.0]
    naps = []

    async def sleep(s):
        naps.append(s)
        now[0] += s

    async def collect():
        return [e async for e in watch(sc.sink, "click", "2026-11-21T15", poke_interval=30, sleep=sleep,
                                       deadline=1070.0, clock=lambda: now[0])]

    (event,) = asyncio.run(collect())
    assert naps == [30, 30, 10], "the last nap ends at the deadline"
    assert event["status"] == "timeout" and "2026-11-21T15:00:00Z was not complete (open)" in event["message"]


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


def test_duckdbs_hour_is_one_type_whatever_the_hours(tmp_path):
    """DuckDB guesses a hive key's type from the folder names: ``hour=09`` made ``hour`` a VARCHAR (issue 60 item
    4); the recipe's ``hive_types`` gives BIGINT for a read of hours 08..10 as for 13..14."""
    pytest.importorskip("duckdb_extension_avro")
    from event_etl.consumer.recipes import duckdb_connect, hour_uris
    from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

    et = make_event_type(tmp_path / "types")
    pipe = LocalPipeline(tmp_path, et, FakeClock(t("11:00")))
    pipe.batch([click(f"e{i}", t("08:30") + i * 40 * 60_000) for i in range(4)])  # 08:30, 09:10, 09:50, 10:30
    pipe.controller.drain()
    con = duckdb_connect()
    files = hour_uris(str(pipe.sink), "click", "2026-11-21T08", until="2026-11-21T11")
    rows = con.execute("SELECT typeof(hour), hour, count(*) AS n FROM read_avro($files, hive_partitioning = true, "
                       "hive_types = {'dt': DATE, 'hour': BIGINT}) GROUP BY ALL ORDER BY hour",
                       {"files": files}).fetchall()
    assert rows == [("BIGINT", 8, 1), ("BIGINT", 9, 2), ("BIGINT", 10, 1)]
