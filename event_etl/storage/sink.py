"""The sink: a local folder or ``gs://bucket/prefix``, through fsspec.

Two guarantees the rest of event_etl builds on:

- :meth:`Storage.write_atomic` makes a file appear under its final name only when it is
  whole: a temporary name (starting with ``.``, never ending in ``.avro``) and a rename
  on local disk, a single upload on object stores.
- :meth:`Storage.create_only` never overwrites: a hard link on local disk, an upload
  with ``ifGenerationMatch=0`` on GCS.  A second writer gets ``False``, not an overwrite.
  :meth:`Storage.write_if` replaces a file only if it is still the version that was read
  (compare-and-swap: a generation match on GCS, a lock file on local disk); the lease is
  built on it.

On local disk these writes are durable when they return, against a power cut too: the file is synced
before its rename or link, and its folder after it (and a folder created for it, in its parent:
:func:`event_etl.storage.atomic.makedirs_durable`).  So is :meth:`Storage.delete` unless told
otherwise.

Only sinks whose writes are proven create-only and atomic are accepted: local folders and
``gs://``.  Other fsspec schemes (``s3://``, ``hdfs://``, ...) are refused with that reason:
their "create unless it exists" is a check followed by a write, which two writers can both pass.

All paths given to a :class:`Storage` are relative to its root and checked: absolute
paths, ``..`` and empty components are refused, so nothing is ever written outside the
sink.  Missing and unreadable are different answers: :meth:`exists` and
:meth:`list_files` raise :class:`~event_etl.errors.StorageError` when they cannot tell.
"""

from __future__ import annotations

import logging
import os
import posixpath
import uuid
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from event_etl.errors import StorageError
from event_etl.settings import current_settings
from event_etl.storage import gcs
from event_etl.storage.atomic import fsync_dir, makedirs_durable

__all__ = ["Storage", "open_storage", "safe_relpath"]

T = TypeVar("T")

log = logging.getLogger("event_etl.storage")  # the name it had when this was the whole package: logging set-ups use it


def safe_relpath(rel: str) -> str:
    """Normalise a path relative to a sink root, refusing anything that could leave it."""
    if not isinstance(rel, str) or not rel:
        raise ValueError("empty path")
    if rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise ValueError(f"{rel!r} is absolute; paths inside a sink are relative to its root")
    parts = rel.replace("\\", "/").split("/")
    for p in parts:
        if p in ("", ".", ".."):
            raise ValueError(f"{rel!r} has an empty, '.' or '..' component; it could leave the sink root")
    return "/".join(parts)


def _durable_temp(target: str, data: bytes) -> str:
    """Write ``data`` to a hidden temporary file next to ``target`` (never ending in .avro), synced."""
    d = os.path.dirname(target)
    makedirs_durable(d)  # a new hour's folder (and day's) must not vanish with a power cut, files and all
    tmp = os.path.join(d, f".{os.path.basename(target)}.{uuid.uuid4().hex[:12]}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def _open_fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The file system of a sink URL and the root's path in it (``fsspec.core.url_to_fs``, but a gs:// sink gets
    gcsfs's file system with each request tried once: :func:`event_etl.storage.gcs.open_fs`)."""
    import fsspec

    if url.startswith("gs://"):
        return gcs.open_fs(url, options)
    fs, root = fsspec.core.url_to_fs(url, **options)
    return fs, root


SUPPORTED_SCHEMES = ("gs",)
"""Remote schemes a sink may use (besides local paths and ``file://``)."""


def check_sink_url(url: str) -> None:
    """Refuse a sink on a file system whose writes event_etl cannot make create-only."""
    from event_etl.storage.locations import is_remote

    if not is_remote(url):
        return
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise StorageError(
            f"sink {url!r}: {scheme}:// is not supported: event_etl needs writes that cannot overwrite "
            "(markers are created once, the lease is compare-and-swap), and on this file system they would be a "
            "check followed by a write, which two writers can both pass",
            fix="write to a local folder (or a mounted shared volume) or to gs://bucket/prefix",
        )


class Storage:
    """A sink root and the few operations event_etl needs on it.

    On object stores, transient errors are retried with exponential backoff for up to
    ``retry_seconds`` (default 120, or ``$EVENT_ETL_STORAGE_RETRY_SECONDS``); after that the
    operation fails with a :class:`StorageError` that says so.
    """

    def __init__(self, url: str, **options: Any) -> None:
        from fsspec.implementations.local import LocalFileSystem

        check_sink_url(url)
        self.url = url.rstrip("/") if url not in ("/",) else url
        opts = {**gcs.fs_options(url), **options}
        try:
            self.fs, root = _open_fs(self.url, opts)
        except (ImportError, ValueError) as err:
            raise StorageError(
                f"cannot open sink {url!r}: {err}",
                fix="use a local folder or gs://bucket/prefix (a job reaches gs:// through gcsfs: pip install "
                    "'event_etl[gcs]'; the light install reads it without)",
            ) from err
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.local else root.rstrip("/")
        self.retry_seconds = current_settings().storage_retry_seconds

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (an object-store call), retrying transient errors with backoff: 0.25 s, doubling up to 8 s,
        while the next wait ends within ``retry_seconds`` of the first try."""
        if self.local:
            return fn()
        import time

        from event_etl.util.retry import retry_call

        def unreachable(err: Exception) -> NoReturn:
            raise StorageError(
                f"{what}: the storage was unreachable for {self.retry_seconds:.0f}s "
                f"({type(err).__name__}: {err})",
                fix="check the network and the bucket; the job can be restarted on the same checkpoint "
                    "and loses nothing",
            ) from err

        return retry_call(
            fn, retryable=gcs.is_transient, first=0.25, cap=8.0, deadline=time.monotonic() + self.retry_seconds,
            on_retry=lambda err, delay: log.warning("%s failed (%s); retrying in %.1fs", what, err, delay),
            on_give_up=unreachable)

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def __reduce__(self) -> tuple[type[Storage], tuple[str]]:  # picklable for executors: rebuild from the URL
        return (Storage, (self.url,))

    def path(self, rel: str) -> str:
        """Absolute path (in the file system's terms) of ``rel`` under the root."""
        rel = safe_relpath(rel)
        return os.path.join(self.root, *rel.split("/")) if self.local else posixpath.join(self.root, rel)

    def display(self, rel: str) -> str:
        """A path for messages: the sink URL joined with ``rel``."""
        return f"{self.url}/{safe_relpath(rel)}"

    # -- writes ----------------------------------------------------------------------------
    def write_atomic(self, rel: str, data: bytes) -> None:
        """Store ``data`` so that ``rel`` appears only complete (replacing any previous content)."""
        target = self.path(rel)
        try:
            if self.local:
                os.replace(_durable_temp(target, data), target)
                fsync_dir(os.path.dirname(target))  # the rename itself, or a power cut can undo it
            else:
                self._retry(f"writing {self.display(rel)}", lambda: self.fs.pipe_file(target, data))
        except OSError as err:
            raise StorageError(f"cannot write {self.display(rel)}: {err}",
                               fix="check the sink's space and permissions") from err

    def create_only(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` with ``data`` unless it exists.  ``True`` if created, ``False`` if it already existed."""
        target = self.path(rel)
        try:
            if self.local:
                tmp = _durable_temp(target, data)
                try:
                    os.link(tmp, target)
                    created = True
                except FileExistsError:
                    created = False
                finally:
                    os.unlink(tmp)
                # One sync for the link and the temporary's unlink (before it, a power cut may lose either:
                # nothing relied on them yet).  Also when the file was there: a process killed before it
                # synced its own link may have made it, and the caller takes it as durable now.
                fsync_dir(os.path.dirname(target))
                return created
            try:
                self._retry(f"creating {self.display(rel)}", lambda: self.fs.pipe_file(target, data, mode="create"))
            except FileExistsError:
                return False
            return True
        except OSError as err:
            raise StorageError(f"cannot create {self.display(rel)}: {err}", fix="check the sink's permissions") from err

    def read_versioned(self, rel: str) -> tuple[bytes, str] | None:
        """The content of ``rel`` and its version (for :meth:`write_if`), or ``None`` if it does not exist."""
        target = self.path(rel)
        try:
            if self.local:
                with open(target, "rb") as fh:
                    data = fh.read()
                import hashlib

                return data, hashlib.sha256(data).hexdigest()
            info = self._retry(f"reading {self.display(rel)}", lambda: self.fs.info(target))
            generation = str(info.get("generation") or "")
            data = self._retry(f"reading {self.display(rel)}", lambda: self.fs.cat_file(target, generation=generation)
                               if generation else self.fs.cat_file(target))
            return data, generation
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StorageError(f"cannot read {self.display(rel)}: {err}", fix="check credentials and network") from err

    def write_if(self, rel: str, data: bytes, version: str | None) -> bool:
        """Replace ``rel`` with ``data`` only if it is still at ``version`` (``None``: only if it does not exist).

        ``False`` when another writer changed (or created) it since it was read: nothing is written.
        """
        if version is None:
            return self.create_only(rel, data)
        target = self.path(rel)
        if self.local:
            import fcntl
            import hashlib

            lock = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.lock")
            with open(lock, "a+b") as lk:
                fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
                try:
                    with open(target, "rb") as fh:
                        if hashlib.sha256(fh.read()).hexdigest() != version:
                            return False
                except FileNotFoundError:
                    return False
                self.write_atomic(rel, data)
                return True
        try:
            self._retry(f"replacing {self.display(rel)}",
                        lambda: gcs.upload_if_generation(self.fs, target, data, version))
        except FileExistsError:  # 412: the generation changed
            return False
        except FileNotFoundError:
            return False
        except OSError as err:
            raise StorageError(f"cannot write {self.display(rel)}: {err}", fix="check the sink's permissions") from err
        return True

    def check_writable(self) -> None:
        """Fail fast, with the fix, if the sink cannot be written (missing bucket, no permission, no network)."""
        rel = f".event_etl-probe-{uuid.uuid4().hex}"
        if self.local and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StorageError(f"the sink {self.url} is a file, not a folder",
                               fix="give the folder the hours are written under (made if missing), e.g. --sink "
                                   "./data; move the file away if it is in the way")
        try:
            self.write_atomic(rel, b"probe")
            self.delete(rel)
        except StorageError as err:
            fix = ("make the folder writable by the job's user (chmod, chown, or a volume mounted read-write), or "
                   "give another --sink" if self.local else
                   "create the bucket and grant write access (roles/storage.objectAdmin; credentials through "
                   "Application Default Credentials, or STORAGE_EMULATOR_HOST for an emulator)")
            raise StorageError(f"the sink {self.url} cannot be written: {err.message}", fix=fix) from err

    def delete(self, rel: str, *, durable: bool = True) -> None:
        """Delete ``rel`` (nothing if it is not there).

        On local disk the folder is synced afterwards (unless ``durable=False``), so that a power cut
        cannot bring the file back: a batch's files that its duplicates emptied, or a first batch's
        files written before it knew its "too late" reference, are recorded nowhere, and one that
        came back would keep its hour from being marked.  A caller that deletes again what comes back
        (a merge's members: the next merge or the marker deletes them, and the marker's own sync comes
        first) may save the sync with ``durable=False``."""
        target = self.path(rel)
        try:
            if self.local:
                try:
                    os.unlink(target)
                except FileNotFoundError:
                    if not os.path.isdir(os.path.dirname(target)):
                        return
                if durable:  # also when it was gone: a killed process may have unlinked it, unsynced
                    fsync_dir(os.path.dirname(target))
                return
            self._retry(f"deleting {self.display(rel)}", lambda: self.fs.rm_file(target))
        except FileNotFoundError:
            pass
        except OSError as err:
            raise StorageError(f"cannot delete {self.display(rel)}: {err}") from err

    def remove_empty_folder(self, rel_dir: str) -> bool:
        """Remove the folder ``rel_dir`` if it is empty (temporaries that writes killed before their rename left
        aside: they go with it); True if it was removed.  On an object store a folder is only a prefix of objects
        and goes with its last one: nothing to do."""
        if not self.local:
            return False
        target = self.path(rel_dir)
        try:
            with os.scandir(target) as it:
                names = [e.name for e in it]
            if names and all(n.startswith(".") and n.endswith(".tmp") for n in names):
                for n in names:  # temporaries of writes killed before their rename (see _durable_temp)
                    os.unlink(os.path.join(target, n))
            os.rmdir(target)
        except OSError:  # not empty, or already gone
            return False
        fsync_dir(os.path.dirname(target))  # or a power cut brings back an empty hour that never gets a marker
        return True

    # -- reads -----------------------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists.  Raises :class:`StorageError` when that cannot be told."""
        target = self.path(rel)
        try:
            if self.local:
                return os.path.exists(target)
            # never from a cached listing of its folder: other processes (executors) write there
            self.fs.invalidate_cache(posixpath.dirname(target))
            self._retry(f"checking {self.display(rel)}", lambda: self.fs.info(target))
            return True
        except FileNotFoundError:
            return False
        except OSError as err:
            raise StorageError(f"cannot check {self.display(rel)}: {err}", fix="check credentials and network") from err

    def read(self, rel: str) -> bytes:
        target = self.path(rel)
        try:
            if self.local:
                with open(target, "rb") as fh:
                    return fh.read()
            data: bytes = self._retry(f"reading {self.display(rel)}", lambda: self.fs.cat_file(target))
            return data
        except FileNotFoundError:
            raise
        except OSError as err:
            raise StorageError(f"cannot read {self.display(rel)}: {err}", fix="check credentials and network") from err

    def _ls_fresh(self, rel_dir: str, target: str) -> list[dict[str, Any]]:
        """The object store's listing of ``target`` as it is now, neither read from gcsfs' cache nor left in it:
        a kept listing would answer later exists() and info() calls from the past, and executors (other
        processes) add files to these folders."""
        self.fs.invalidate_cache(target)
        try:
            entries: list[dict[str, Any]] = self._retry(f"listing {self.display(rel_dir)}",
                                                        lambda: self.fs.ls(target, detail=True))
            return entries
        finally:
            self.fs.invalidate_cache(target)

    def list_files(self, rel_dir: str) -> dict[str, int]:
        """``{name: size}`` of the files directly in ``rel_dir``; ``{}`` if the folder does not exist."""
        target = self.path(rel_dir)
        try:
            if self.local:
                out = {}
                with os.scandir(target) as it:
                    for e in it:
                        if e.is_file():
                            out[e.name] = e.stat().st_size
                return out
            return {
                posixpath.basename(e["name"].rstrip("/")): int(e.get("size") or 0)
                for e in self._ls_fresh(rel_dir, target)
                if e.get("type") == "file"
            }
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise StorageError(f"cannot list {self.display(rel_dir)}: {err}",
                               fix="check credentials and network") from err

    def list_dirs(self, rel_dir: str) -> list[str]:
        """Names of the sub-folders of ``rel_dir`` (sorted); ``[]`` if it does not exist."""
        target = self.path(rel_dir)
        try:
            if self.local:
                with os.scandir(target) as it:
                    return sorted(e.name for e in it if e.is_dir())
            return sorted(
                posixpath.basename(e["name"].rstrip("/"))
                for e in self._ls_fresh(rel_dir, target)
                if e.get("type") == "directory"
            )
        except FileNotFoundError:
            return []
        except OSError as err:
            raise StorageError(f"cannot list {self.display(rel_dir)}: {err}",
                               fix="check credentials and network") from err


Storage.__module__ = "event_etl.storage"  # where it is imported from: pickles (an executor's) name it as before


_CACHE: dict[tuple[Any, ...], Storage] = {}


def _cache_key(url: str) -> tuple[Any, ...]:
    """What a cached :class:`Storage` depends on: its URL and the settings it was opened with."""
    return (url, os.environ.get("STORAGE_EMULATOR_HOST"), current_settings().storage_retry_seconds)


def open_storage(url: str) -> Storage:
    """A cached :class:`Storage` per URL, settings and process (executors reuse file system clients across
    tasks).  The cache is emptied in a forked child: a file system client is not shared across processes."""
    key = _cache_key(url)
    st = _CACHE.get(key)
    if st is None:
        st = _CACHE[key] = Storage(url)
    return st


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CACHE.clear)
