"""What a ``gs://`` sink needs of GCS and gcsfs (used by :class:`event_etl.storage.Storage`).

- the file system: gcsfs's, with each HTTP request tried once (:func:`open_fs`), against the
  emulator at ``$STORAGE_EMULATOR_HOST`` when it is set (:func:`fs_options`);
- which errors are transient, for the storage's own retries (:func:`is_transient`);
- the compare-and-swap upload gcsfs does not offer (:func:`upload_if_generation`).

gcsfs is imported only when a ``gs://`` sink is opened: a local sink needs none of it.  Without gcsfs (the light
install) a ``gs://`` sink is read and written through :mod:`event_etl.storage.gcs_light`.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from event_etl.util.thirdparty import gcs_api_location, without_retry_decorator

__all__ = ["prepare_env", "fs_options", "open_fs", "gcsfs_installed", "is_transient", "upload_if_generation"]


def prepare_env() -> None:
    # gcsfs probes for hierarchical-namespace buckets unless told not to; against the
    # emulator that probe hangs for a minute (see docs/production.md, "Pitfalls").
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def fs_options(url: str) -> dict[str, Any]:
    """The file system options of a sink URL: the emulator's endpoint, anonymously, for ``gs://`` when
    ``$STORAGE_EMULATOR_HOST`` is set; none otherwise."""
    if url.startswith("gs://"):
        prepare_env()
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            endpoint = emulator if "://" in emulator else f"http://{emulator}"
            return {"endpoint_url": endpoint, "token": "anon"}
    return {}


_NOT_TRANSIENT = (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError, IsADirectoryError)


def is_transient(err: BaseException) -> bool:
    """Errors worth retrying on an object store: network trouble, timeouts, 429 and 5xx answers, and whatever
    gcsfs itself would retry (an expired token's refresh, a checksum mismatch, 408...)."""
    if isinstance(err, _NOT_TRANSIENT):
        return False
    status = getattr(err, "status", None)  # aiohttp's answers (their .code is deprecated)
    code = status if isinstance(status, int) else getattr(err, "code", None)  # gcsfs's HttpError
    gcs_retry = sys.modules.get("gcsfs.retry")  # imported with gcsfs, for a gs:// sink only
    if isinstance(code, int):  # an answer: 408, 429 and 5xx, and what gcsfs retries of its HttpErrors (expired token)
        return code in (408, 429) or code >= 500 or (
            gcs_retry is not None and isinstance(err, gcs_retry.HttpError) and gcs_retry.is_retriable(err))
    if gcs_retry is not None and gcs_retry.is_retriable(err):  # e.g. a token's refresh, a checksum mismatch
        return True
    # aiohttp's (gcsfs), and google-auth's failures to reach the token endpoint (the light file system, without
    # gcsfs: gcsfs.retry takes a RefreshError as transient too)
    return isinstance(err, (OSError, TimeoutError, ConnectionError)) or type(err).__name__ in (
        "ClientError", "ServerDisconnectedError", "ClientConnectorError", "ClientOSError", "TimeoutError",
        "TransportError", "RefreshError")


@functools.cache
def _single_attempt_gcs() -> type[Any]:
    """gcsfs's file system with each HTTP request tried once, for :class:`~event_etl.storage.Storage`, whose
    ``_retry`` owns the retries.  gcsfs retries every request 6 times over ~31 s of backoff (a number fixed when
    its class is defined) beneath ours: with the bucket unreachable, a command took ~31 s to say so even with a
    1-s budget, and the 120-s default could run to ~150 s.  A subclass, not a registration: other users of
    gcsfs in the same process (an Airflow worker's) keep gcsfs's own behaviour."""
    prepare_env()
    import gcsfs
    import gcsfs.core

    # the request itself, without retry_request (a gcsfs without that decorator keeps its own behaviour)
    once = without_retry_decorator(gcsfs.core.GCSFileSystem._request)

    # gcsfs has no type information: its class is Any to mypy, which --strict refuses to subclass
    class SingleAttemptGCSFileSystem(gcsfs.GCSFileSystem):  # type: ignore[misc]
        _request = once

    return SingleAttemptGCSFileSystem


def gcsfs_installed() -> bool:
    """Whether gcsfs can be imported (the ``[gcs]`` and ``[job]`` extras bring it; the light install does not)."""
    import importlib.util

    return importlib.util.find_spec("gcsfs") is not None


def open_fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The file system of a ``gs://`` sink URL (:func:`_single_attempt_gcs`'s) and the root's path in it; without
    gcsfs (the light install), the one of :mod:`event_etl.storage.gcs_light`."""
    if not gcsfs_installed():
        from event_etl.storage.gcs_light import GCSLightFileSystem

        light = GCSLightFileSystem(**options)
        return light, light._strip_protocol(url)
    cls = _single_attempt_gcs()
    fs = cls(**{**cls._get_kwargs_from_urls(url), **options})
    return fs, fs._strip_protocol(url)


def upload_if_generation(fs: Any, path: str, data: bytes, generation: str) -> None:
    """Upload ``data`` to ``path`` on GCS only if the object is at ``generation`` (JSON API, ``ifGenerationMatch``).

    gcsfs offers create-only uploads (generation 0) but not a match on another generation.  A
    mismatch is answered 412, which gcsfs raises as ``FileExistsError``.  Without gcsfs, the light file system's
    own :meth:`~event_etl.storage.gcs_light.GCSLightFileSystem.upload_if_generation` does the same."""
    light = getattr(fs, "upload_if_generation", None)
    if light is not None:
        light(path, data, generation)
        return
    import json as _json
    from urllib.parse import quote

    bucket, key, _ = fs.split_path(path)
    meta = _json.dumps({"name": key})
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
            "Content-Type: application/octet-stream\n\n").encode() + data + b"\n--==0==--"
    fs.call("POST", f"{gcs_api_location(fs)}/upload/storage/v1/b/{quote(bucket)}/o", uploadType="multipart",
            headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body, json_out=True,
            ifGenerationMatch=str(generation))
    fs.invalidate_cache(path)
