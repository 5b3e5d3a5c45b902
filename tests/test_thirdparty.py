"""event_etl.util.thirdparty reads private parts of fastavro, gcsfs and PySpark: each adapter against the installed
library, so that a release that renames or reshapes what it reads fails here, naming the library and its version."""

from __future__ import annotations

import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path

from event_etl.util.thirdparty import (
    avro_sync_marker,
    detach_accumulator_server,
    gcs_api_location,
    iceberg_arrow_fits,
    iceberg_schema_of_arrow,
    without_retry_decorator,
)

ROOT = Path(__file__).resolve().parents[1]


def _changed(library: str, version: str, what: str, adapter: str, seen) -> str:
    return (f"{library} {version} changed {what}, which event_etl.util.thirdparty.{adapter} reads (seen: {seen}); "
            f"adapt {adapter} to this release, or bound {library} in setup.cfg")


def test_fastavro_block_reader_keeps_the_files_sync_marker_in_its_header():
    import fastavro

    marker = bytes(range(16))
    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]},
                    [{"a": 1}, {"a": 2}], sync_marker=marker)
    reader = fastavro.block_reader(io.BytesIO(buf.getvalue()))
    header = getattr(reader, "_header", None)
    assert isinstance(header, dict) and isinstance(header.get("sync"), bytes), _changed(
        "fastavro", fastavro.__version__, "block_reader's private _header['sync']", "avro_sync_marker",
        type(header).__name__ if not isinstance(header, dict) else sorted(header))
    assert avro_sync_marker(reader) == marker, _changed(
        "fastavro", fastavro.__version__, "what block_reader's _header['sync'] holds", "avro_sync_marker",
        header["sync"])


def test_gcsfs_request_is_its_retry_decorator_around_one_attempt():
    from event_etl.storage.gcs import prepare_env

    prepare_env()
    import gcsfs
    import gcsfs.core

    request = gcsfs.core.GCSFileSystem._request
    once = without_retry_decorator(request)
    assert once is not request and inspect.iscoroutinefunction(once), _changed(
        "gcsfs", gcsfs.__version__, "GCSFileSystem._request's retry decorator (its __wrapped__ is the request tried "
        "once)", "without_retry_decorator", f"__wrapped__ {getattr(request, '__wrapped__', 'missing')!r}")
    assert list(inspect.signature(once).parameters)[:3] == ["self", "method", "path"], _changed(
        "gcsfs", gcsfs.__version__, "the signature of the undecorated GCSFileSystem._request",
        "without_retry_decorator", inspect.signature(once))


def test_gcsfs_file_system_knows_its_api_location():
    from event_etl.storage.gcs import prepare_env

    prepare_env()
    import gcsfs

    fs = gcsfs.GCSFileSystem(endpoint_url="http://127.0.0.1:9", token="anon", skip_instance_cache=True)
    seen = getattr(fs, "_location", "missing")
    assert seen == "http://127.0.0.1:9", _changed("gcsfs", gcsfs.__version__, "GCSFileSystem's private _location",
                                                  "gcs_api_location", repr(seen))
    assert gcs_api_location(fs) == "http://127.0.0.1:9"


_SPARK = """
import json, socketserver
import pyspark
from event_etl.job.session import get_session, stop_session
from event_etl.util.thirdparty import detach_accumulator_server

spark = get_session("local[1]", {"spark.ui.enabled": "false"}, app_name="event_etl-thirdparty")
sc = spark.sparkContext
server = getattr(sc, "_accumulatorServer", None)
got = detach_accumulator_server(sc)
seen = {"version": pyspark.__version__, "server": type(server).__name__, "same": got is server,
        "detached": getattr(sc, "_accumulatorServer", "missing") is None,
        "socketserver": isinstance(server, socketserver.BaseServer),
        "handle_error": callable(getattr(server, "handle_error", None)),
        "shutdown": callable(getattr(server, "shutdown", None))}
sc._accumulatorServer = server  # as it was: stop_session detaches it again, then shuts it down
stop_session(spark)
print(json.dumps(seen))
"""


def test_pyspark_context_keeps_its_accumulator_server():
    """A local SparkSession (in a process of its own: the unit tests run no JVM): its context's accumulator server
    is what stop_session detaches and shuts down itself."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    r = subprocess.run([sys.executable, "-c", _SPARK], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["same"] and seen["detached"] and seen["socketserver"] and seen["handle_error"] and \
        seen["shutdown"], _changed("PySpark", seen["version"], "SparkContext's private _accumulatorServer (a "
                                   "socketserver server)", "detach_accumulator_server", seen)


def test_detaching_from_a_context_without_a_server_is_none():
    class Context:
        pass

    assert detach_accumulator_server(None) is None and detach_accumulator_server(Context()) is None


def test_pyiceberg_maps_an_arrow_schema_and_checks_files_against_a_table():
    """The iceberg commit policy's two reaches into pyiceberg: an Arrow schema (Parquet columns without field ids)
    becomes an Iceberg schema, and a file's columns fit a table of that schema, not one whose column changed type."""
    import pyarrow as pa
    import pyiceberg
    from pyiceberg.schema import Schema, assign_fresh_schema_ids
    from pyiceberg.types import LongType, NestedField, StringType

    arrow = pa.schema([pa.field("id", pa.string()), pa.field("n", pa.int64())])
    try:
        schema = assign_fresh_schema_ids(iceberg_schema_of_arrow(arrow))
    except (ImportError, AttributeError, TypeError) as err:
        raise AssertionError(_changed("pyiceberg", pyiceberg.__version__, "pyiceberg.io.pyarrow."
                                      "_pyarrow_to_schema_without_ids", "iceberg_schema_of_arrow", err)) from err
    assert [(f.name, f.field_type) for f in schema.fields] == [("id", StringType()), ("n", LongType())]
    assert iceberg_arrow_fits(schema, arrow, format_version=2)
    other = assign_fresh_schema_ids(Schema(NestedField(-1, "id", LongType(), required=False),
                                           NestedField(-1, "n", LongType(), required=False)))
    assert not iceberg_arrow_fits(other, arrow, format_version=2)
