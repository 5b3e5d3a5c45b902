"""Where event_etl reaches into other libraries' private parts: one function each, named for what it does.

Each is checked against the installed library by ``tests/test_thirdparty.py``: a release that renames or
reshapes what it reads fails there, with a message naming the library and its version, instead of failing
in a job.  Nothing here imports the libraries: the callers hand over their objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["avro_sync_marker", "without_retry_decorator", "gcs_api_location", "detach_accumulator_server"]


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
