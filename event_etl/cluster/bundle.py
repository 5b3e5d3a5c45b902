"""The job bundle: the event_etl package and a folder of event types in one zip, for spark-submit.

``event-etl submit`` ships a single file to the cluster with ``--py-files``.  Python imports
``event_etl`` straight from it (zip import), on the driver and on every executor, so the
nodes need nothing installed but Python and event_etl's dependencies.

Layout::

    event_etl/...               the package: its modules and package data (log4j2.properties)
    event_types/<name>/...      the event types of the submitting side's --event-types folder

The zip is deterministic (sorted names, fixed timestamps and modes) and named after a hash of
its content, ``event_etl-<version>-<hash>.zip``: submitting unchanged code and types again
reuses the file built before, and a changed bundle can never be taken for an old one.

Executors never read the event types: the loaded :class:`~event_etl.eventtypes.EventType`
travels pickled inside each task.  Only the driver loads them, and it reads files, so the
driver extracts the bundle's ``event_types/`` once into a local folder
(:func:`event_etl.bundled.bundled_event_types`); :func:`event_etl.eventtypes.resolve_event_types_dir` falls
back to it when ``event_etl`` itself was imported from a bundle.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from event_etl import __version__
from event_etl.bundled import TYPES_DIR, bundled_event_types, package_archive
from event_etl.errors import EventEtlError

__all__ = ["PACKAGE", "TYPES_DIR", "bundle_members", "build_bundle", "package_archive", "bundled_event_types"]

PACKAGE = "event_etl"

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can hold: same content, same bytes
_SKIP_DIRS = {"__pycache__"}


def _package_dir() -> Path:
    here = Path(__file__).resolve().parents[1]  # event_etl/, this module being event_etl/cluster/bundle.py
    if not here.is_dir():
        raise EventEtlError(
            f"event_etl is imported from {here.parent}, not from files, and cannot bundle itself",
            fix="run `event-etl submit` from an installed event_etl (pip install event_etl, or this project's .venv)",
        )
    return here


def _files_under(root: Path) -> list[Path]:
    """Regular files under ``root``, without hidden files, caches and compiled Python."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        out.extend(Path(dirpath) / f for f in filenames if not f.startswith(".") and not f.endswith((".pyc", ".pyo")))
    return out


def bundle_members(
    event_types_dir: str | os.PathLike[str], *, package_dir: Path | None = None
) -> list[tuple[str, Path]]:
    """``(name in the zip, file)`` of every file of the bundle, sorted by name.

    The package's files go under ``event_etl/``; the type folders of ``event_types_dir`` (as
    :func:`~event_etl.eventtypes.load_event_types` sees them: no hidden or ``_`` folders) under
    ``event_types/``.
    """
    package_dir = package_dir or _package_dir()
    members = [(f"{PACKAGE}/{f.relative_to(package_dir).as_posix()}", f) for f in _files_under(package_dir)]
    types_root = Path(event_types_dir)
    for child in sorted(types_root.iterdir()):
        if child.is_dir() and not child.name.startswith((".", "_")):
            members.extend((f"{TYPES_DIR}/{f.relative_to(types_root).as_posix()}", f) for f in _files_under(child))
    return sorted(members)


def _content_hash(members: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for name, path in members:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def build_bundle(event_types_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                 package_dir: Path | None = None) -> tuple[Path, bool]:
    """The bundle zip of the package and ``event_types_dir``, in ``out_dir``; and whether it was built now.

    Named by content hash, so an unchanged bundle is reused rather than built again.  Written
    under a temporary name and renamed, so a bundle file is always whole.
    """
    members = bundle_members(event_types_dir, package_dir=package_dir)
    out = Path(out_dir)
    path = out / f"{PACKAGE}-{__version__}-{_content_hash(members)[:16]}.zip"
    if path.is_file():
        return path, False
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{path.name}.{os.getpid()}.tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, file in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, file.read_bytes())
    os.replace(tmp, path)
    return path, True
