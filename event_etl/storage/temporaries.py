"""Temporary files a killed writer left, found and removed before anything is judged.

Every local write of event_etl goes through a hidden temporary name and a rename (or a
link): ``.<name>.<id>.tmp`` (data and dead-letter files, markers, merged files, the
checkpoint's JSON documents and key files, spool segments).  A process killed between the
write and the rename leaves the temporary behind.  Nothing ever reads one, but one left in
an hour folder keeps that folder from being removed when the hour turns out to hold no
data (a job's first batch writes some splits again: see ``Rewriter.settle_first_batch``),
and so from ever being marked, and one left in a marked hour is a file its manifest does
not list.  So a job removes them when it starts, before it replays or judges anything, and
removes the folders they alone kept.

Only local disk has them: an object store writes each object in one request.
"""

from __future__ import annotations

import os

__all__ = ["sweep_temporaries", "is_temporary"]


def is_temporary(name: str) -> bool:
    """Whether ``name`` is the temporary name of a write (``.<name>.<id>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def sweep_temporaries(root: str | os.PathLike[str], *, keep_top: bool = False) -> list[str]:
    """Remove every temporary file under the local folder ``root``, and each folder that held nothing else (an hour
    folder, then its day's).  ``keep_top``: leave the files directly in ``root`` (the sink lease's, renewed by a
    thread of the running job).  Returns the removed files' paths, relative to ``root``.  Call it only while no
    writer runs there (the job holds the checkpoint lock and the sink lease, and has not started its tasks)."""
    top = os.fspath(root)
    if not os.path.isdir(top):
        return []
    removed: list[str] = []
    emptied: set[str] = set()
    for folder, subfolders, files in os.walk(top, topdown=False):
        here = []
        if not (keep_top and folder == top):
            for name in files:
                if is_temporary(name):
                    path = os.path.join(folder, name)
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        continue
                    here.append(os.path.relpath(path, top))
        removed.extend(here)
        held_only_temporaries = here or any(os.path.join(folder, d) in emptied for d in subfolders)
        if folder != top and held_only_temporaries and not os.listdir(folder):
            os.rmdir(folder)
            emptied.add(folder)
    if removed:
        from event_etl.storage.atomic import fsync_dir

        for folder in {os.path.dirname(os.path.join(top, r)) for r in removed} | emptied:
            parent = folder if os.path.isdir(folder) else os.path.dirname(folder)
            if os.path.isdir(parent):
                fsync_dir(parent)
    return sorted(removed)
