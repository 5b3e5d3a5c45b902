"""Reading the Iceberg table of a type with the ``iceberg`` commit policy (:mod:`event_etl.job.policy_iceberg`).

The table holds complete hours only, one snapshot each; ``etl_hour`` (the hour whose ``_COMPLETE`` lists a row's
file) and ``etl_late`` are its partition columns.  docs/consumers.md ("Iceberg tables") shows each reader in full:

- **pyiceberg**: ``load_catalog(...).load_table("event_etl.<type>").scan(row_filter=EqualTo("etl_hour", hour))``;
- **DuckDB**: :func:`duckdb_iceberg_connect` (DuckDB with its ``avro`` and ``iceberg`` extensions loaded by path
  from the ``duckdb-extension-avro`` and ``duckdb-extension-iceberg`` packages: no download), then
  ``iceberg_scan('<the table's metadata file>')``;
- **Spark**: a cluster adds ``org.apache.iceberg:iceberg-spark-runtime-4.0_2.13`` and a catalog
  (``spark.sql.catalog.<name>``); without that jar Spark reads the same hours from the manifests' files
  (:func:`event_etl.consumer.recipes.hour_uris`).

:func:`hour_counts` gives the records of each committed hour, from the snapshots' summaries (no data read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from event_etl.consumer.recipes import duckdb_avro_extension, import_duckdb
from event_etl.errors import UsageError
from event_etl.timeutil import iso, parse_hour

__all__ = ["duckdb_iceberg_extension", "duckdb_iceberg_connect", "hour_counts"]


def duckdb_iceberg_extension() -> str:
    """The path of DuckDB's iceberg extension for the installed DuckDB, from ``duckdb-extension-iceberg``."""
    duckdb = import_duckdb()
    try:
        import duckdb_extension_iceberg  # type: ignore[import-untyped]
    except ImportError as err:
        raise UsageError("DuckDB's iceberg extension is not installed",
                         fix=f"pip install 'event_etl[duckdb]' (or 'duckdb-extension-iceberg=={duckdb.__version__}', "
                             f"its build for DuckDB {duckdb.__version__})") from err
    path = Path(duckdb_extension_iceberg.__file__).parent / "extensions" / f"v{duckdb.__version__}" / \
        "iceberg.duckdb_extension"
    if not path.is_file():
        raise UsageError(f"duckdb-extension-iceberg holds no build for the installed DuckDB {duckdb.__version__}",
                         fix=f"pip install 'duckdb-extension-iceberg=={duckdb.__version__}'")
    return str(path)


def duckdb_iceberg_connect(database: str = ":memory:", **kwargs: Any) -> Any:
    """A DuckDB connection with the ``avro`` extension loaded, then ``iceberg`` (it reads Iceberg's Avro manifests
    through it): ``iceberg_scan`` works offline.  ``kwargs`` go to ``duckdb.connect``."""
    duckdb = import_duckdb()
    avro, iceberg = duckdb_avro_extension(), duckdb_iceberg_extension()
    con = duckdb.connect(database, **kwargs)
    for path in (avro, iceberg):
        con.execute("LOAD '" + path.replace("'", "''") + "'")
    return con


def hour_counts(table: Any, event_type: str | None = None) -> dict[str, int]:
    """``{hour: records}`` of the hours committed to a pyiceberg ``table``, from its snapshots' summaries
    (``event_etl.hour``, ``added-records``), optionally of one type.  An hour is its UTC start as the other
    commands and functions write it, ``2026-11-21T13:00:00Z``, in order."""
    out: dict[str, int] = {}
    for snap in table.snapshots():
        props = snap.summary.additional_properties if snap.summary else {}
        hour = props.get("event_etl.hour")
        if hour and (event_type is None or props.get("event_etl.event_type") == event_type):
            key = iso(parse_hour(hour))
            out[key] = out.get(key, 0) + int(props.get("added-records", 0))
    return dict(sorted(out.items()))
