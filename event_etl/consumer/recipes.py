"""Reading complete hours with the tools people use: Spark, BigQuery, DuckDB, pandas.

Every recipe starts from the same place: the **manifest's file list** of complete hours
(:func:`hour_uris`), never a glob or a partition scan of the type's folder.  A plain scan of
``<sink>/<type>/`` is wrong in three ways:

- it reads **open hours**, still being written (files of the next batch appear later);
- it reads ``_deadletter/`` (rejected records, another schema) unless the glob is careful;
- it reads each hour's ``late-`` files **as if they belonged to that hour's event time**:
  they hold records of *earlier* hours that arrived after those were complete.  The list
  keeps them (as the manifest counts them) unless ``include_late=False``.

Recipes (docs/consumers.md shows each in full, as the tests run it):

- **Spark** (PySpark 4, no package): ``spark.read.format(SPARK_AVRO_FORMAT).option("basePath",
  type_root(sink, t)).load(hour_uris(...))``; ``basePath`` keeps ``dt`` and ``hour`` as partition
  columns although files, not folders, are named.  ``format("avro")`` would ask for the
  ``spark-avro`` package (:func:`spark_avro_package`, for Spark 3 clusters).
- **BigQuery**: :func:`bq_load_command` -- ``bq load --source_format=AVRO
  --use_avro_logical_types`` of exactly the manifest's ``gs://`` URIs (``hive_partitioning=True``
  adds the ``dt``/``hour`` columns), and :func:`bq_external_table_ddl`, an external table over them.
- **DuckDB**: :func:`duckdb_connect` (DuckDB with its Avro extension loaded from the
  ``duckdb-extension-avro`` package, no download) and ``read_avro($files, hive_partitioning=true)``;
  or ``duckdb.sql("... FROM tbl")`` over ``tbl = read_table(...)`` (Arrow, checked against the manifest).
- **pandas**: ``read_table(...).to_pandas()`` (``pip install 'event_etl[pandas]'``).

A type of ``format = "parquet"`` lists ``.parquet`` files, read with each tool's Parquet reader:
:func:`files_format` says which of the two a list holds, :func:`spark_format` gives Spark's
source (``"parquet"`` or :data:`SPARK_AVRO_FORMAT`), :func:`duckdb_reader` DuckDB's table function
(``read_parquet`` or ``read_avro``), and :func:`bq_load_command` and :func:`bq_external_table_ddl`
pick ``PARQUET`` (with list inference, so an Avro array is a REPEATED column) or ``AVRO`` by the
files they are given.  A list of both (a type whose format changed within the range) is refused:
list the hours before and after the change apart.

Nothing here imports Spark, BigQuery, DuckDB or pandas at import time (:func:`duckdb_connect`
imports DuckDB when called).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from event_etl.consumer.hours import HourLike, hour_ms, hour_text
from event_etl.consumer.read import hour_files
from event_etl.consumer.sink import EventTypeLike, SinkLike, open_sink, type_name
from event_etl.consumer.status import hour_status, hour_statuses, require_complete
from event_etl.errors import UsageError
from event_etl.rules.buckets import hour_dir

__all__ = ["SPARK_AVRO_FORMAT", "bq_external_table_ddl", "bq_load_command", "duckdb_avro_extension", "duckdb_connect",
           "duckdb_reader", "files_format", "hour_uris", "shell", "spark_avro_package", "spark_format", "type_root"]

SPARK_AVRO_FORMAT = "org.apache.spark.sql.avro.AvroFileFormat"
"""Spark's Avro source by its class name: PySpark 4 has it built in (``format("avro")``, the short name, is only
registered with the ``spark-avro`` package)."""

HIVE_KEYS = (("dt", "DATE"), ("hour", "INTEGER"))  # the sink's partition keys, as BigQuery's load types them


def type_root(sink: SinkLike, event_type: EventTypeLike) -> str:
    """``<sink>/<event_type>``: Spark's ``basePath`` (partition columns ``dt`` and ``hour`` below it)."""
    storage = open_sink(sink)
    name = type_name(event_type)
    return storage.path(name) if storage.local else f"{storage.url}/{name}"


def hour_uris(sink: SinkLike, event_type: EventTypeLike, hour: HourLike, *, until: HourLike | None = None,
              include_late: bool = True) -> list[str]:
    """The files of a complete hour (or of every hour of ``[hour, until)``), from their manifests.

    Local sinks give absolute paths, ``gs://`` sinks ``gs://`` URIs.  Every hour must be complete
    (``HourNotCompleteError`` otherwise, exit code 3 on the command line): an open hour is never
    listed.  The list is what the manifests vouch for; :func:`~event_etl.consumer.verify_hour`
    checks the bytes, :func:`~event_etl.consumer.read_table` checks them as it reads.
    """
    storage = open_sink(sink)
    if until is None:
        statuses = [hour_status(storage, event_type, hour)]
    else:
        statuses = hour_statuses(storage, event_type, hour, until)
    out = []
    for status in statuses:
        manifest = require_complete(status)
        rel = hour_dir(status.event_type, manifest.hour)
        for f in hour_files(manifest, include_late=include_late):
            out.append(storage.path(f"{rel}/{f.name}") if storage.local else f"{storage.url}/{rel}/{f.name}")
    return out


def files_format(uris: Sequence[str]) -> str:
    """``avro`` or ``parquet``: the format of the data files ``uris`` (from :func:`hour_uris`), all of one format
    (:class:`UsageError` for a list of both, or of anything else)."""
    formats = {"avro" if u.endswith(".avro") else "parquet" if u.endswith(".parquet") else "" for u in uris}
    if "" in formats:
        raise UsageError("the list holds something else than data files (.avro, .parquet)",
                         fix="pass hour_uris(...): the manifest's files")
    if len(formats) > 1:
        raise UsageError("the list holds Avro and Parquet files (the type's format changed within these hours)",
                         fix="list the hours before and after the change apart: hour_uris(..., until=...) for each")
    return formats.pop() if formats else "avro"


def spark_format(uris: Sequence[str]) -> str:
    """The Spark source that reads ``uris``: ``"parquet"``, or :data:`SPARK_AVRO_FORMAT` for Avro files."""
    return "parquet" if files_format(uris) == "parquet" else SPARK_AVRO_FORMAT


def duckdb_reader(uris: Sequence[str]) -> str:
    """The DuckDB table function that reads ``uris``: ``read_parquet`` (built in) or ``read_avro`` (the extension
    :func:`duckdb_connect` loads)."""
    return "read_parquet" if files_format(uris) == "parquet" else "read_avro"


def spark_avro_package(spark_version: str | None = None, scala: str = "2.13") -> str:
    """The Maven coordinates of ``spark-avro`` for ``--packages`` (default: the installed PySpark's version).

    Only for ``format("avro")`` on a cluster without Spark's built-in Avro source (Spark 3); PySpark 4
    reads the sink with ``format(SPARK_AVRO_FORMAT)`` and no package.
    """
    if spark_version is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            spark_version = version("pyspark")
        except PackageNotFoundError as err:
            raise UsageError("no PySpark installed to take the Spark version from",
                             fix="pass spark_version='4.0.1' (your cluster's Spark version)") from err
    return f"org.apache.spark:spark-avro_{scala}:{spark_version}"


def _check_gs_uris(uris: Sequence[str]) -> None:
    if not uris:
        raise UsageError("no files to load", fix="an hour without records needs no load; check hour_uris(...) first")
    bad = [u for u in uris if not u.startswith("gs://")]
    if bad:
        raise UsageError(f"BigQuery reads Cloud Storage only, not {bad[0]}", fix="read a gs:// sink")
    if any("/_deadletter/" in u or "*" in u or not u.endswith((".avro", ".parquet")) for u in uris):
        raise UsageError("the list holds a glob, a marker or dead-letter files",
                         fix="pass hour_uris(...): the manifest's files")
    files_format(uris)


def hive_prefix(uris: Sequence[str]) -> str:
    """The common ``<sink>/<type>`` of the manifest's URIs, where the ``dt=``/``hour=`` keys begin (BigQuery's
    ``hive_partition_uri_prefix``)."""
    prefixes = set()
    for u in uris:
        head, sep, _ = u.partition("/dt=")
        if not sep or "/hour=" not in u:
            raise UsageError(f"{u} is not in a dt=/hour= folder", fix="pass hour_uris(...): the manifest's files")
        prefixes.add(head)
    if len(prefixes) != 1:
        raise UsageError(f"the files are of several types or sinks: {sorted(prefixes)}",
                         fix="one type's files per table")
    return prefixes.pop()


def bq_load_command(uris: Sequence[str], table: str, *, time_partitioning_field: str | None = None,
                    time_partitioning_type: str = "HOUR", replace_partition: bool = False,
                    hour: HourLike | None = None, hive_partitioning: bool = False) -> list[str]:
    """The ``bq load`` command that loads exactly ``uris`` (``gs://``, from :func:`hour_uris`) into ``table``.

    Parquet files (a type of ``format = "parquet"``) load with ``--source_format=PARQUET
    --parquet_enable_list_inference``; Avro files with ``--use_avro_logical_types``, which makes
    ``timestamp-millis`` fields TIMESTAMP columns (Parquet's are already), so the
    table can be partitioned by event time (``time_partitioning_field``, a TIMESTAMP field
    such as page_view's ``event_time``).  ``replace_partition`` with ``hour`` writes to the
    hour's partition decorator (``table$YYYYMMDDHH``) with ``--replace``: a retried load of the
    hour replaces what an earlier try wrote instead of doubling it.  Late records of earlier
    hours (``late-`` files) belong to other partitions: leave them out of such a load
    (``hour_uris(..., include_late=False)``) and load them separately, or append.

    ``hive_partitioning`` adds the folders' keys as columns ``dt`` (DATE) and ``hour`` (INTEGER):
    ``--hive_partitioning_mode=CUSTOM`` with the source URI prefix ``<sink>/<type>/{dt:DATE}/{hour:INTEGER}``.
    Only the listed files are read, so the ``_deadletter/dt=...`` folder under the same prefix,
    which does not follow the ``dt=/hour=`` layout, is never looked at.
    """
    _check_gs_uris(uris)
    target = table
    if files_format(uris) == "parquet":  # Parquet's own timestamp types; arrays as REPEATED columns
        cmd = ["bq", "load", "--source_format=PARQUET", "--parquet_enable_list_inference"]
    else:
        cmd = ["bq", "load", "--source_format=AVRO", "--use_avro_logical_types"]
    if hive_partitioning:
        keys = "/".join(f"{{{k}:{t}}}" for k, t in HIVE_KEYS)
        cmd += ["--hive_partitioning_mode=CUSTOM", f"--hive_partitioning_source_uri_prefix={hive_prefix(uris)}/{keys}"]
    if time_partitioning_field:
        cmd += [f"--time_partitioning_field={time_partitioning_field}",
                f"--time_partitioning_type={time_partitioning_type}"]
    if replace_partition:
        if hour is None:
            raise UsageError("replace_partition needs the hour", fix="pass hour=... (the hour the files are of)")
        h = hour_ms(hour)
        stamp = hour_text(h).replace("-", "").replace("T", "").split(":")[0]  # YYYYMMDDHH
        if time_partitioning_type == "DAY":
            stamp = stamp[:8]
        target = f"{table}${stamp}"
        cmd.append("--replace")
    cmd += [target, ",".join(uris)]
    return cmd


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def bq_external_table_ddl(uris: Sequence[str], table: str, *, replace: bool = True) -> str:
    """GoogleSQL DDL of an external table over exactly ``uris`` (``gs://``, from :func:`hour_uris`), hive-partitioned.

    ``dt`` (DATE) and ``hour`` (INT64) come from the folders (``WITH PARTITION COLUMNS``,
    ``hive_partition_uri_prefix`` = ``<sink>/<type>``); ``enable_logical_types`` makes
    ``timestamp-millis`` fields TIMESTAMP columns.  The table is the hours whose files are
    listed: re-create it (``CREATE OR REPLACE``, the default) for another range.  A wildcard
    (``<type>/*``) would take in open hours and the ``_deadletter/dt=...`` folder, which under
    the same prefix breaks BigQuery's hive layout rule (one key order for every file).
    Run it with ``bq query --use_legacy_sql=false``.
    """
    _check_gs_uris(uris)
    prefix = hive_prefix(uris)
    create = "CREATE OR REPLACE EXTERNAL TABLE" if replace else "CREATE EXTERNAL TABLE"
    listed = ",\n    ".join(_sql_string(u) for u in uris)
    options = ("  format = 'PARQUET',\n  enable_list_inference = TRUE,\n" if files_format(uris) == "parquet"
               else "  format = 'AVRO',\n  enable_logical_types = TRUE,\n")
    return (f"{create} `{table}`\n"
            "WITH PARTITION COLUMNS (dt DATE, hour INT64)\n"
            "OPTIONS (\n"
            f"{options}"
            f"  hive_partition_uri_prefix = {_sql_string(prefix)},\n"
            f"  uris = [\n    {listed}\n  ]\n"
            ");")


# -- DuckDB ---------------------------------------------------------------------------------------------------
def duckdb_avro_extension() -> str:
    """The path of DuckDB's Avro extension for the installed DuckDB, from the ``duckdb-extension-avro`` package.

    ``LOAD '<path>'`` loads it with no download (``read_avro`` alone tries to download the
    extension, and fails without the internet).  The package holds one DuckDB version's build
    (``extensions/v1.5.5/avro.duckdb_extension``) and pins that DuckDB: a mismatch is a
    ``UsageError`` naming both versions.
    """
    duckdb = import_duckdb()
    try:
        import duckdb_extension_avro  # type: ignore[import-untyped]
    except ImportError as err:
        raise UsageError("DuckDB's Avro extension is not installed",
                         fix=f"pip install 'duckdb-extension-avro=={duckdb.__version__}' (its build for DuckDB "
                             f"{duckdb.__version__})") from err
    root = Path(duckdb_extension_avro.__file__).parent / "extensions"
    path = root / f"v{duckdb.__version__}" / "avro.duckdb_extension"
    if not path.is_file():
        have = sorted(p.parent.name for p in root.glob("v*/avro.duckdb_extension"))
        raise UsageError(f"duckdb-extension-avro holds builds for {', '.join(have) or 'no DuckDB'}, "
                         f"not for the installed DuckDB {duckdb.__version__}",
                         fix=f"pip install 'duckdb-extension-avro=={duckdb.__version__}', or the DuckDB it was "
                             "built for")
    return str(path)


def import_duckdb() -> Any:
    """The ``duckdb`` module; :class:`UsageError` with the install line when it is missing (the light install)."""
    try:
        import duckdb
    except ImportError as err:
        raise UsageError("DuckDB is not installed (the light install has no DuckDB)",
                         fix="pip install 'event_etl[duckdb]' (DuckDB with its Avro and Iceberg extensions, no "
                             "download at run time)") from err
    return duckdb


def duckdb_connect(database: str = ":memory:", **kwargs: Any) -> Any:
    """A DuckDB connection with the Avro extension loaded (:func:`duckdb_avro_extension`): ``read_avro`` works
    offline.  ``kwargs`` go to ``duckdb.connect``."""
    duckdb = import_duckdb()
    path = duckdb_avro_extension()
    con = duckdb.connect(database, **kwargs)
    con.execute(f"LOAD {_duck_string(path)}")
    return con


def _duck_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def shell(cmd: Sequence[str]) -> str:
    """A command as one line for a shell."""
    return " ".join(shlex.quote(c) for c in cmd)
