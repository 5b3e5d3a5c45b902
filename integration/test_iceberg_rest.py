"""The ``iceberg`` commit policy against a real Iceberg REST catalog (issue 60 item 7): lakana-server from PyPI,
started on 127.0.0.1 for the module (tests/lib/servers.py ``LakanaCatalog``: SQLite metadata, ``lakana-server
migrate``, then served), as integration/test_iceberg.py tests it against pyiceberg's SQL catalog.

The demo's type written in Parquet, run to its drain with the policy on the REST catalog: ``catalog_uri`` its URL
(pyiceberg takes a REST catalog from ``http://``), the credentials (``token``) and the environment (``prefix``) in
pyiceberg's configuration, ``PYICEBERG_CATALOG__LAKANA__*``, never in etl.toml; the table ``bronze.page_view`` (the
catalog allows the namespaces bronze, silver and gold only).  Then: every complete hour is one snapshot after its
marker, with the marker's sha256; the policy run again over every hour (a restart that finds what it committed,
as after a kill between the catalog's commit and its record), and again after the catalog server's restart, adds
nothing; pyiceberg, DuckDB's iceberg extension and ``hour_counts`` read each hour as its manifest counts it."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from event_etl.consumer import hour_statuses
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import iso, to_millis

pytestmark = pytest.mark.slow  # one run of the job, shared by the module

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("event-etl"))
SOURCE = "generate:rate=20000,speedup=3600,start=2026-11-20T10:00:00Z,count=50000,late=0.05,seed=7"
TABLE = "bronze.page_view"


@pytest.fixture(scope="module")
def lakana(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """lakana-server for the module (a missing package fails the test with the fix)."""
    from tests.lib.servers import LakanaCatalog

    server = LakanaCatalog(tmp_path_factory.mktemp("lakana")).start()
    try:
        yield server
    finally:
        server.stop()


def _catalog_env(lakana: Any) -> dict[str, str]:
    """The REST catalog ``lakana`` in pyiceberg's configuration: its token and environment (``prefix``)."""
    return {"PYICEBERG_CATALOG__LAKANA__TOKEN": lakana.token, "PYICEBERG_CATALOG__LAKANA__PREFIX": lakana.ENVIRONMENT}


@pytest.fixture(scope="module")
def job(lakana: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The demo's page_view in Parquet with an iceberg policy on the REST catalog, run to its drain once; pyiceberg's
    configuration names the catalog for the module's readers too."""
    work = tmp_path_factory.mktemp("iceberg-rest")
    types = work / "types" / "page_view"
    types.mkdir(parents=True)
    src = ROOT / "event_types" / "page_view"
    (types / "schema.avsc").write_text((src / "schema.avsc").read_text())
    policy = (f'format = "parquet"\n\n[[commit_policy]]\nkind = "iceberg"\ncatalog = "lakana"\n'
              f'catalog_uri = "{lakana.url}"\ntable = "{TABLE}"\n')
    (types / "etl.toml").write_text((src / "etl.toml").read_text().replace("\n[pubsub]", "\n" + policy + "\n[pubsub]"))
    env = {**os.environ, **_catalog_env(lakana), "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}
    run = subprocess.run([EXE, "run", "page_view", "--event-types", str(work / "types"), "--source", SOURCE,
                          "--drain", "--sink", str(work / "data"), "--checkpoint", str(work / "ckpt"), "--quiet",
                          "--master", "local[2]"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    sink = work / "data"
    hours = {}
    for s in hour_statuses(str(sink), "page_view", "2026-11-20T00", "2026-11-21T00"):
        if s.is_complete:
            marker = (sink / hour_dir("page_view", to_millis(s.hour)) / MARKER_NAME).read_bytes()
            hours[to_millis(s.hour)] = marker
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config

    with pytest.MonkeyPatch.context() as mp:  # pyiceberg read its configuration when it was first imported
        for name, value in _catalog_env(lakana).items():
            mp.setenv(name, value)
        mp.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())
        yield {"work": work, "sink": sink, "types": work / "types", "markers": hours}


def _table(lakana: Any) -> Any:
    from pyiceberg.catalog import load_catalog

    return load_catalog("lakana", uri=lakana.url).load_table(TABLE)


def _manifests(job: dict[str, Any]) -> dict[int, tuple[Manifest, str]]:
    return {h: (Manifest.from_bytes(b), hashlib.sha256(b).hexdigest()) for h, b in job["markers"].items()}


def _committed(table: Any) -> list[tuple[str, str, int]]:
    props = [s.summary.additional_properties for s in table.snapshots() if s.summary]
    return [(p["event_etl.hour"], p["event_etl.marker_sha256"], int(p["added-records"])) for p in props]


def test_every_complete_hour_is_one_snapshot_of_the_rest_catalogs_table_after_its_marker(job, lakana):
    manifests = _manifests(job)
    assert len(manifests) >= 3 and any(m.late_records for m, _ in manifests.values())
    table = _table(lakana)
    assert _committed(table) == [(iso(h), sha, m.records) for h, (m, sha) in sorted(manifests.items()) if m.files]
    for s in table.snapshots():  # never before its marker
        m, _ = manifests[to_millis(dt.datetime.fromisoformat(s.summary.additional_properties["event_etl.hour"]))]
        assert s.timestamp_ms >= m.completed_at
    assert table.properties["event_etl.committed_through"] == iso(max(manifests))
    assert table.metadata_location.startswith(lakana.warehouse.as_uri()), "the catalog's own warehouse"
    files = {t.file.file_path for t in table.scan().plan_files()}
    assert files and all(f.startswith(job["sink"].as_uri()) for f in files), "the sink's files, not copies"


def test_a_restart_finds_what_it_committed_and_adds_nothing(job, lakana):
    """The policy run again over every complete hour, as a restart after a kill between the catalog's commit and the
    policy's record would: each hour is found in the table; and again once the catalog server has restarted."""
    from event_etl.eventtypes import load_event_type
    from event_etl.job.policies import CompleteHour
    from event_etl.job.policy_iceberg import IcebergPolicy
    from event_etl.storage.sink import Storage

    before = _committed(_table(lakana))
    et = load_event_type(job["types"] / "page_view")
    config = {"kind": "iceberg", "name": "iceberg", "catalog": "lakana", "catalog_uri": lakana.url, "table": TABLE}
    storage = Storage(str(job["sink"]))

    def run_again() -> None:
        policy = IcebergPolicy(config, et, storage)
        for h, marker in sorted(job["markers"].items()):
            folder = hour_dir("page_view", h)
            policy.run(CompleteHour("page_view", h, marker, f"{job['sink']}/{folder}/{MARKER_NAME}",
                                    f"{job['sink']}/{folder}", Manifest.from_bytes(marker)))
        policy.close()

    run_again()
    assert _committed(_table(lakana)) == before
    lakana.restart()
    assert _committed(_table(lakana)) == before, "the catalog kept its snapshots across its restart"
    run_again()
    assert _committed(_table(lakana)) == before


def test_pyiceberg_duckdb_and_hour_counts_read_each_hour_as_its_manifest(job, lakana):
    from pyiceberg.expressions import EqualTo

    from event_etl.consumer.iceberg import duckdb_iceberg_connect, hour_counts

    manifests = {h: m for h, (m, _) in _manifests(job).items() if m.files}
    table = _table(lakana)
    assert hour_counts(table) == {iso(h): m.records for h, m in sorted(manifests.items())}
    h, m = max(manifests.items(), key=lambda kv: kv[1].records)
    one = table.scan(row_filter=EqualTo("etl_hour", iso(h).replace("Z", "+00:00")),
                     selected_fields=("event_id", "etl_hour", "etl_late")).to_arrow()
    assert one.num_rows == m.records and one.filter(one.column("etl_late")).num_rows == m.late_records
    con = duckdb_iceberg_connect()
    per_hour = con.execute("SELECT etl_hour, count(*) AS n, count(*) FILTER (WHERE etl_late) AS late "
                           "FROM iceberg_scan($metadata) GROUP BY etl_hour ORDER BY etl_hour",
                           {"metadata": table.metadata_location}).fetchall()
    assert [(to_millis(t), n, late) for t, n, late in per_hour] == [
        (h, m.records, m.late_records) for h, m in sorted(manifests.items())]
