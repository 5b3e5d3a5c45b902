"""Writing a local file atomically: whole under its final name, or not there at all; and durably.

The checkpoint, the sources' logs and a fleet's status files are small JSON documents on
local disk (or a shared mount), replaced by a temporary file and a rename, so a crash never
leaves half a file to read.  (The sink's own atomic writes, on any store, are
:meth:`event_etl.storage.Storage.write_atomic`.)

A rename (a link, an unlink, a new folder) changes the folder that holds the name, not the
file: ``fsync`` of the file makes its bytes durable, but after a power cut the rename itself
can be lost while later ones, in other folders, survive.  So a durable write also syncs the
folder after the rename (:func:`fsync_dir`), and a folder it creates is made durable in its
parent first (:func:`makedirs_durable`).  That costs one folder sync per rename.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "makedirs_durable", "write_json_atomic", "write_text_atomic"]

_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of the folder ``path`` durable (renames, links, unlinks, sub-folders made in it).

    A platform or file system that cannot sync a folder (``fsync`` answers ``EINVAL`` or ``EBADF``:
    some network and FUSE file systems) is left as it is; any other error is raised."""
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def makedirs_durable(path: str | os.PathLike[str]) -> None:
    """``mkdir -p path``, each folder it creates made durable in its parent (the parent synced).

    A folder that already exists costs one ``stat``.  One created by another process at the
    same moment (ours is refused) is synced in its parent too: that process may not have yet."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent and parent != os.path.abspath(path):
        makedirs_durable(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    fsync_dir(parent)


def write_json_atomic(path: Path, doc: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with ``doc`` as JSON (temporary file, rename; synced unless ``durable=False``)."""
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True), durable=durable)


def write_text_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` (temporary file, rename).

    ``durable`` (the default): the file is synced before the rename and its folder after it
    (and any folder created for it in its parent), so the new content survives a power cut
    once this returns.  ``durable=False`` (status files rewritten every few seconds): atomic
    only; after a power cut the file may hold its previous content, or be missing."""
    path = Path(path)
    if durable:
        makedirs_durable(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)
