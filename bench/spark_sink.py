"""The baseline: Spark's own streaming file sink on the benchmark input, as its own process.

What it does is what a team would write without event_etl: read the folder of JSON lines
with Spark's streaming JSON source (the event type's schema, parsed in the JVM), add the
UTC date and hour of the event time, and append the rows with Spark's file sink,
partitioned by ``dt`` and ``hour``, as JSON, Parquet or Avro::

    spark.readStream.schema(S).option("maxFilesPerTrigger", N).json(IN)
         .withColumn("dt", ...).withColumn("hour", ...)
         .writeStream.format("json" | "parquet" | AVRO).partitionBy("dt", "hour")
         .option("checkpointLocation", CK).trigger(availableNow=True).start(OUT)

``AVRO`` is Spark's built-in Avro source by its class name,
``org.apache.spark.sql.avro.AvroFileFormat`` (PySpark 4: no ``spark-avro`` package), writing
snappy Avro container files (``spark.sql.avro.compression.codec``'s default) as event_etl does:
the like-for-like peer of event_etl's output (the schema's ``timestamp-millis`` fields are
written as plain ``long``, as the input carries them).

No validation, no dead-letter area, no late/too-late routing, no completeness markers:
it is the floor event_etl is measured against.  Spark runs with its own defaults plus the
few settings event_etl's session also uses (UI off, 1 GiB driver heap, loopback, quiet
logs), so neither side gets a tuning the other lacks.  ``maxFilesPerTrigger`` is the same
number of files per micro-batch that event_etl is given (``--max-files-per-batch``).

At the end it prints one line ``SPARK_PROGRESS {json}``: the query's wall time and, per
micro-batch, ``numInputRows`` and ``durationMs`` (from ``query.recentProgress``), from
which the harness takes the steady-state rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PROGRESS_PREFIX = "SPARK_PROGRESS "

FORMATS = {"json": "json", "parquet": "parquet", "avro": "org.apache.spark.sql.avro.AvroFileFormat"}
"""``--format`` to the name given to ``writeStream.format``."""

_AVRO_TO_SPARK = {"string": "string", "long": "bigint", "int": "int", "double": "double", "float": "float",
                  "boolean": "boolean", "bytes": "binary", "enum": "string"}


def spark_ddl(avro_schema: dict) -> str:
    """A Spark DDL schema (``a string, b bigint``) for a flat Avro record schema.

    Logical types keep their base type (``timestamp-millis`` stays a ``bigint`` of
    milliseconds, as producers write it), enums become strings, ``["null", T]`` is ``T``.
    """
    cols = []
    for f in avro_schema["fields"]:
        t = f["type"]
        if isinstance(t, list):
            t = next(x for x in t if x != "null")
        name = t["type"] if isinstance(t, dict) else t
        if name not in _AVRO_TO_SPARK:
            raise SystemExit(f"spark_sink: field {f['name']!r} has type {name!r}, which this baseline does not map")
        cols.append(f"`{f['name']}` {_AVRO_TO_SPARK[name]}")
    return ", ".join(cols)


def session(master: str, java_options: str = ""):
    """A local SparkSession with the same non-default settings as event_etl's own session (``java_options``:
    its driver JVM's, given at launch)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master).appName("bench:spark_file_sink")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_query(spark, *, source: Path, sink: Path, checkpoint: Path, fmt: str, ddl: str, time_field: str,
                files_per_trigger: int):
    """Start the streaming query (available-now trigger: everything in the folder, then stop)."""
    from pyspark.sql import functions as F

    ts = F.timestamp_millis(F.col(time_field))
    stream = (
        spark.readStream.schema(ddl).option("maxFilesPerTrigger", files_per_trigger).json(str(source))
        .withColumn("dt", F.date_format(ts, "yyyy-MM-dd"))
        .withColumn("hour", F.date_format(ts, "HH"))
    )
    return (
        stream.writeStream.format(FORMATS[fmt]).partitionBy("dt", "hour").outputMode("append")
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(str(sink))
    )


def _progress_dict(p) -> dict:
    if isinstance(p, dict):
        return p
    return json.loads(p.json)  # StreamingQueryProgress (PySpark 4)


def progress_summary(query, seconds: float) -> dict:
    """The query's wall time and the figures of each micro-batch (for the steady-state rate)."""
    batches = []
    for p in map(_progress_dict, query.recentProgress):
        rows = int(p.get("numInputRows") or 0)
        if rows:
            d = p.get("durationMs") or {}
            batches.append({"batch": p["batchId"], "rows": rows, "add_batch_ms": d.get("addBatch"),
                            "trigger_ms": d.get("triggerExecution")})
    return {"query_seconds": seconds, "batches": batches}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, required=True, help="folder of JSON-lines files")
    ap.add_argument("--sink", type=Path, required=True, help="output folder (partitioned dt=/hour=)")
    ap.add_argument("--checkpoint", type=Path, required=True, help="streaming checkpoint folder (fresh per run)")
    ap.add_argument("--format", choices=tuple(FORMATS), default="json")
    ap.add_argument("--schema", type=Path, required=True, help="the event type's schema.avsc")
    ap.add_argument("--time-field", default="event_time", help="field of epoch milliseconds to bucket by")
    ap.add_argument("--files-per-trigger", type=int, default=64, help="maxFilesPerTrigger (as event_etl's "
                    "--max-files-per-batch)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--java-options", default="", help="the driver JVM's options (spark.driver.extraJavaOptions)")
    args = ap.parse_args(argv)
    ddl = spark_ddl(json.loads(args.schema.read_text()))
    spark = session(args.master, args.java_options)
    t0 = time.monotonic()
    query = start_query(spark, source=args.source, sink=args.sink, checkpoint=args.checkpoint, fmt=args.format,
                        ddl=ddl, time_field=args.time_field, files_per_trigger=args.files_per_trigger)
    query.awaitTermination()
    seconds = time.monotonic() - t0
    if query.exception() is not None:
        raise SystemExit(f"spark_sink: the query failed: {query.exception()}")
    print(PROGRESS_PREFIX + json.dumps(progress_summary(query, seconds)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
