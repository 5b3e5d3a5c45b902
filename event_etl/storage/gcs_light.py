"""A ``gs://`` sink without gcsfs: the light consumer's GCS file system (used by :func:`event_etl.storage.gcs.open_fs`
when gcsfs is not installed).

gcsfs brings aiohttp and, since it depends on ``google-cloud-storage-control``, grpc and its protos: ~50 MB of the
~100 MB the light install was (docs/install.md).  A consumer lists folders, reads an object's metadata and its
bytes, and writes a few small objects (an audit's record, create-only).  That is a handful of requests of the GCS
JSON API, made here with ``requests`` and ``google-auth`` (the credentials gcsfs would use: Application Default
Credentials, or anonymous access to the emulator at ``$STORAGE_EMULATOR_HOST``).  The answers have gcsfs's shape
(``name`` is ``bucket/key``, ``type`` is ``file`` or ``directory``, ``size`` an int, ``generation`` a string;
``FileNotFoundError`` for 404, ``FileExistsError`` for a failed precondition, 412), so that
:class:`~event_etl.storage.Storage` uses both alike.  Each request is tried once: :class:`~event_etl.storage.Storage`
owns the retries (:func:`event_etl.storage.gcs.is_transient` reads the ``code`` of :class:`GCSHTTPError`).
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import quote

__all__ = ["GCSLightFileSystem", "GCSHTTPError"]

API = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
TIMEOUT = (10.0, 60.0)  # connect, read (seconds)


class GCSHTTPError(OSError):
    """An answer of the GCS JSON API other than 2xx, 404 (``FileNotFoundError``) and 401/403 (``PermissionError``);
    ``code`` is its HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def _session(token: Any) -> Any:
    """An HTTP session carrying the credentials: none for ``token="anon"`` (the emulator), else Application Default
    Credentials (scope devstorage.read_write, gcsfs's default), and anonymous when there are none (a public bucket;
    a private one then answers 401/403, said with the fix)."""
    import requests

    if token == "anon":
        return requests.Session()
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.auth.transport.requests import AuthorizedSession

    try:
        credentials, _ = google.auth.default(scopes=[SCOPE])
    except DefaultCredentialsError:
        return requests.Session()
    return AuthorizedSession(credentials)  # type: ignore[no-untyped-call]


class GCSLightFileSystem:
    """The part of gcsfs's ``GCSFileSystem`` that :class:`~event_etl.storage.Storage` uses: ``ls``, ``info``,
    ``cat_file``, ``pipe_file`` (``mode="create"``: only if absent), ``rm_file``, :meth:`upload_if_generation`, and
    ``invalidate_cache`` (nothing is cached here)."""

    protocol = ("gs", "gcs")

    def __init__(self, endpoint_url: str | None = None, token: Any = None, **_: Any) -> None:
        self.endpoint = (endpoint_url or API).rstrip("/")
        self._token = token
        self._local = threading.local()  # a requests session per thread (Storage may be read from several)

    @property
    def session(self) -> Any:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = _session(self._token)
        return s

    # -- paths -----------------------------------------------------------------------------
    @staticmethod
    def _strip_protocol(path: str) -> str:
        for p in ("gs://", "gcs://"):
            if path.startswith(p):
                path = path[len(p):]
        return path.rstrip("/")

    @classmethod
    def split_path(cls, path: str) -> tuple[str, str, None]:
        bucket, _, key = cls._strip_protocol(path).partition("/")
        return bucket, key, None

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing is cached: every call asks GCS."""

    # -- requests --------------------------------------------------------------------------
    def _request(self, method: str, url: str, path: str, *, data: bytes | None = None,
                 headers: dict[str, str] | None = None, **params: Any) -> Any:
        r = self.session.request(method, url, params={k: v for k, v in params.items() if v is not None}, data=data,
                                 headers=headers, timeout=TIMEOUT)
        doing = "reading" if method == "GET" else "writing" if method == "POST" else "deleting"
        if r.status_code == 404:
            raise FileNotFoundError(path)
        if r.status_code == 412:  # ifGenerationMatch failed: created (or changed) by another writer
            raise FileExistsError(path)
        if r.status_code in (401, 403):
            raise PermissionError(f"{r.status_code} {doing} gs://{path}: {_reason(r)} (credentials: Application "
                                  "Default Credentials, e.g. `gcloud auth application-default login` or "
                                  "GOOGLE_APPLICATION_CREDENTIALS)")
        if r.status_code >= 300:
            raise GCSHTTPError(r.status_code, f"{doing} gs://{path}: {_reason(r)}")
        return r

    def _get(self, url: str, path: str, **params: Any) -> Any:
        return self._request("GET", url, path, **params)

    def _object_url(self, bucket: str, key: str) -> str:
        return f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}"

    def _list(self, bucket: str, prefix: str, *, max_results: int | None = None) -> tuple[list[dict[str, Any]],
                                                                                             list[str]]:
        items: list[dict[str, Any]] = []
        prefixes: list[str] = []
        token = None
        while True:
            page = self._get(f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}/o", f"{bucket}/{prefix}",
                             prefix=prefix or None, delimiter="/", pageToken=token, maxResults=max_results).json()
            items += page.get("items", [])
            prefixes += page.get("prefixes", [])
            token = page.get("nextPageToken")
            if not token or max_results:
                return items, prefixes

    @staticmethod
    def _file(bucket: str, meta: dict[str, Any]) -> dict[str, Any]:
        out = dict(meta)
        out.update(name=f"{bucket}/{meta['name']}", size=int(meta.get("size", 0)), type="file")
        if "generation" in meta:
            out["generation"] = str(meta["generation"])
        return out

    @staticmethod
    def _dir(bucket: str, name: str) -> dict[str, Any]:
        return {"bucket": bucket, "name": f"{bucket}/{name}".rstrip("/"), "size": 0, "type": "directory"}

    # -- what Storage reads ------------------------------------------------------------------
    def ls(self, path: str, detail: bool = True, **_: Any) -> list[Any]:
        """The objects and pseudo-folders directly under ``path`` (gcsfs's entries); a file's own entry when
        ``path`` is a file; ``FileNotFoundError`` when there is nothing at ``path``."""
        bucket, key, _g = self.split_path(path)
        prefix = f"{key}/" if key else ""
        items, prefixes = self._list(bucket, prefix)
        out = [self._dir(bucket, p.rstrip("/")) for p in prefixes]
        out += [self._file(bucket, m) for m in items if m["name"] != prefix]  # not a folder's own marker
        if not out:
            if not key:
                return []  # an empty bucket (a missing one answered 404 above)
            out = [self.info(path)]
            if out[0]["type"] == "directory":
                out = []
        return out if detail else [e["name"] for e in out]

    def info(self, path: str, **_: Any) -> dict[str, Any]:
        """A file's metadata (``generation`` included), or a folder's entry when objects lie under ``path``."""
        bucket, key, _g = self.split_path(path)
        if not key:
            self._get(f"{self.endpoint}/storage/v1/b/{quote(bucket, safe='')}", bucket)
            return self._dir(bucket, "")
        try:
            return self._file(bucket, self._get(self._object_url(bucket, key), path).json())
        except FileNotFoundError:
            items, prefixes = self._list(bucket, f"{key}/", max_results=1)
            if items or prefixes:
                return self._dir(bucket, key)
            raise

    def cat_file(self, path: str, generation: str | None = None, **_: Any) -> bytes:
        """The bytes of the object at ``path`` (of ``generation``, when given)."""
        bucket, key, _g = self.split_path(path)
        if not key:
            raise IsADirectoryError(path)
        data: bytes = self._get(self._object_url(bucket, key), path, alt="media", generation=generation).content
        return data

    def exists(self, path: str) -> bool:
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite", **_: Any) -> None:
        """Write ``data`` to ``path`` in one request; ``mode="create"``: only if nothing is there
        (``FileExistsError`` otherwise)."""
        self._upload(path, data, if_generation="0" if mode == "create" else None)

    def upload_if_generation(self, path: str, data: bytes, generation: str) -> None:
        """Replace ``path`` with ``data`` only if it is at ``generation`` (``FileExistsError`` otherwise)."""
        self._upload(path, data, if_generation=str(generation))

    def _upload(self, path: str, data: bytes, *, if_generation: str | None) -> None:
        bucket, key, _g = self.split_path(path)
        meta = json.dumps({"name": key})
        body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
                "Content-Type: application/octet-stream\n\n").encode() + data + b"\n--==0==--"
        self._request("POST", f"{self.endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o", path, data=body,
                      headers={"Content-Type": 'multipart/related; boundary="==0=="'}, uploadType="multipart",
                      ifGenerationMatch=if_generation)

    def rm_file(self, path: str) -> None:
        bucket, key, _g = self.split_path(path)
        self._request("DELETE", self._object_url(bucket, key), path)


def _reason(response: Any) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):  # not the JSON API's error body: its text, shortened
        message = (response.text or response.reason or "").strip()[:200]
    return str(message)
