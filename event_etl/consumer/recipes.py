"""Reading complete hours with the tools people use: Spark, BigQuery, DuckDB, pandas.

Every recipe starts from the same place: the **manifest's file list** of complete hours
(:func:`hour_uris`), never a glob or a partition scan of the type's folder.  A plain scan of
``<sink>/<type>/`` is wrong in three ways:

- it reads **open hours**, still being written (files of the next batch appear later);
- it reads ``_deadletter/`` (rejected records, another schema) unless the glob is careful;
- it reads each hour's ``late-`` files **as if they belonged to that hour's event time**:
  they hold records of *earlier* hours that arrived after those were complete.  The list
  keeps them (as the manifest counts them) unless ``include_late=False``.

Recipes (docs/consumers.md shows each in full):

- **Spark**: ``spark.read.format("avro").option("basePath", type_root(sink, t)).load(hour_uris(...))`` (a list of paths)
  with the ``spark-avro`` package (:func:`spark_avro_package`); ``basePath`` keeps ``dt`` and
  ``hour`` as partition columns although files, not folders, are named.
- **BigQuery**: :func:`bq_load_command` -- ``bq load --source_format=AVRO
  --use_avro_logical_types`` of exactly the manifest's ``gs://`` URIs into an event-time
  partitioned table.
- **DuckDB**: ``duckdb.sql("... FROM tbl")`` over ``tbl = read_table(...)`` (Arrow; no DuckDB
  extension to download).
- **pandas**: ``read_table(...).to_pandas()`` (``pip install 'event_etl[pandas]'``).

Nothing here imports Spark, BigQuery, DuckDB or pandas.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from event_etl.consumer.hours import HourLike, hour_ms, hour_text
from event_etl.consumer.read import hour_files
from event_etl.consumer.sink import EventTypeLike, SinkLike, open_sink, type_name
from event_etl.consumer.status import hour_status, hour_statuses, require_complete
from event_etl.errors import UsageError
from event_etl.rules.buckets import hour_dir

__all__ = ["bq_load_command", "hour_uris", "shell", "spark_avro_package", "type_root"]


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


def spark_avro_package(spark_version: str | None = None, scala: str = "2.13") -> str:
    """The Maven coordinates of ``spark-avro`` for ``--packages`` (default: the installed PySpark's version)."""
    if spark_version is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            spark_version = version("pyspark")
        except PackageNotFoundError as err:
            raise UsageError("no PySpark installed to take the Spark version from",
                             fix="pass spark_version='4.0.1' (your cluster's Spark version)") from err
    return f"org.apache.spark:spark-avro_{scala}:{spark_version}"


def bq_load_command(uris: Sequence[str], table: str, *, time_partitioning_field: str | None = None,
                    time_partitioning_type: str = "HOUR", replace_partition: bool = False,
                    hour: HourLike | None = None) -> list[str]:
    """The ``bq load`` command that loads exactly ``uris`` (``gs://``, from :func:`hour_uris`) into ``table``.

    ``--use_avro_logical_types`` makes ``timestamp-millis`` fields TIMESTAMP columns, so the
    table can be partitioned by event time (``time_partitioning_field``, a TIMESTAMP field
    such as page_view's ``event_time``).  ``replace_partition`` with ``hour`` writes to the
    hour's partition decorator (``table$YYYYMMDDHH``) with ``--replace``: a retried load of the
    hour replaces what an earlier try wrote instead of doubling it.  Late records of earlier
    hours (``late-`` files) belong to other partitions: leave them out of such a load
    (``hour_uris(..., include_late=False)``) and load them separately, or append.
    """
    if not uris:
        raise UsageError("no files to load", fix="an hour without records needs no load; check hour_uris(...) first")
    bad = [u for u in uris if not u.startswith("gs://")]
    if bad:
        raise UsageError(f"bq load reads Cloud Storage only, not {bad[0]}", fix="read a gs:// sink")
    if any("/_deadletter/" in u or "*" in u for u in uris):
        raise UsageError("the list holds a glob or dead-letter files", fix="pass hour_uris(...): the manifest's files")
    target = table
    cmd = ["bq", "load", "--source_format=AVRO", "--use_avro_logical_types"]
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


def shell(cmd: Sequence[str]) -> str:
    """A command as one line for a shell."""
    return " ".join(shlex.quote(c) for c in cmd)
