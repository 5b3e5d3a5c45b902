"""Reading a job bundle from inside it: the zip ``event_etl`` was imported from, and its event types.

A submitted job imports ``event_etl`` from the bundle :mod:`event_etl.cluster.bundle` builds
(``--py-files``).  Its driver loads the event types from the bundle's ``event_types/``,
extracted once into a local folder; :func:`event_etl.eventtypes.resolve_event_types_dir`
falls back to it.  Building bundles is :mod:`event_etl.cluster.bundle`'s business.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from event_etl.errors import EventEtlError

__all__ = ["TYPES_DIR", "package_archive", "bundled_event_types"]

TYPES_DIR = "event_types"


def package_archive() -> Path | None:
    """The zip ``event_etl`` was imported from (``--py-files`` of a submitted job),
    or None when it is installed as files."""
    import event_etl

    archive = getattr(getattr(event_etl, "__loader__", None), "archive", None)  # a zipimport.zipimporter
    return Path(archive) if archive else None


def bundled_event_types(
    archive: str | os.PathLike[str], *, cache_root: str | os.PathLike[str] | None = None
) -> Path | None:
    """The ``event_types/`` folder of a bundle, extracted once to a local folder; None if the zip has none.

    The folder is ``<tmp>/event_etl-bundle-<sha256 of the zip>/event_types``: extracted to a
    temporary folder first and renamed, so a driver never loads half-extracted types.
    """
    archive = Path(archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()[:16]
    home = Path(cache_root or tempfile.gettempdir()) / f"event_etl-bundle-{digest}"
    target = home / TYPES_DIR
    if target.is_dir():
        return target
    with zipfile.ZipFile(archive) as zf:
        names = [n for n in zf.namelist() if n.startswith(f"{TYPES_DIR}/") and not n.endswith("/")]
        if not names:
            return None
        home.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=home))
        for name in names:
            parts = Path(name).parts
            if ".." in parts or Path(name).is_absolute():
                raise EventEtlError(
                    f"bundle {archive} holds a suspicious path {name!r}",
                    fix="rebuild the bundle with `event-etl submit` (delete its .event_etl-submit/ folder)",
                )
            zf.extract(name, staging)
    try:
        os.rename(staging / TYPES_DIR, target)
    except OSError:
        if not target.is_dir():  # not a concurrent driver that got there first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
