"""Where event_etl reaches into other libraries' private parts: one function each, named for what it does.

Each is checked against the installed library by ``tests/test_thirdparty.py``: a release that renames or
reshapes what it reads fails there, with a message naming the library and its version, instead of failing
in a job.  Nothing here imports a library when this module is imported: the callers hand over their objects,
or a function imports what it reaches into when it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

__all__ = ["avro_sync_marker", "without_retry_decorator", "gcs_api_location", "detach_accumulator_server",
           "iceberg_schema_of_arrow", "iceberg_arrow_fits"]


def avro_sync_marker(reader: Any) -> bytes:
    """The 16-byte sync marker of the Avro container file a ``fastavro.block_reader`` reads (the file header's
    ``sync``: fastavro keeps the header in its private ``_header`` and offers no accessor)."""
    sync: bytes = reader._header["sync"]
    return sync


def without_retry_decorator(method: Callable[..., Any]) -> Callable[..., Any]:
    """The function a decorator wraps (its ``__wrapped__``, which ``functools.wraps`` sets): gcsfs's
    ``GCSFileSystem._request`` without ``retry_request``, so that a request is tried once.  The method itself
    when it is not decorated."""
    return getattr(method, "__wrapped__", method)


def gcs_api_location(fs: Any) -> str:
    """The base URL of the GCS JSON API a ``gcsfs.GCSFileSystem`` talks to (``https://storage.googleapis.com``,
    or the emulator's endpoint): gcsfs's private ``_location``."""
    location: str = fs._location
    return location


def detach_accumulator_server(sc: Any) -> Any:
    """PySpark's accumulator server of the SparkContext ``sc`` (a ``socketserver`` server), detached from the
    context, whose ``stop()`` then leaves it to the caller to shut down; None when the context has none (or
    ``sc`` is None).  PySpark keeps it in the context's private ``_accumulatorServer``."""
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None:
        sc._accumulatorServer = None
    return server


def iceberg_schema_of_arrow(arrow: Any) -> Any:
    """The Iceberg schema (``pyiceberg.schema.Schema``, field ids still to assign) of a pyarrow schema without
    Parquet field ids, as pyiceberg's ``add_files`` maps one: pyiceberg's private
    ``pyiceberg.io.pyarrow._pyarrow_to_schema_without_ids``."""
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids

    return _pyarrow_to_schema_without_ids(arrow)


def iceberg_arrow_fits(schema: Any, arrow: Any, *, format_version: Literal[1, 2, 3]) -> bool:
    """Whether the columns of a pyarrow schema fit an Iceberg table's ``schema`` as they are (the check
    ``add_files`` makes: pyiceberg's private ``pyiceberg.io.pyarrow._check_pyarrow_schema_compatible``, which
    raises ``ValueError`` when they do not)."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

    try:
        _check_pyarrow_schema_compatible(schema, arrow, format_version=format_version)
    except ValueError:
        return False
    return True
