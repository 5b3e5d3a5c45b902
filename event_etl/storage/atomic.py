"""Writing a local file atomically: whole under its final name, or not there at all.

The checkpoint, the sources' logs and a fleet's status files are small JSON documents on
local disk (or a shared mount), replaced by a temporary file and a rename, so a crash never
leaves half a file to read.  (The sink's own atomic writes, on any store, are
:meth:`event_etl.storage.Storage.write_atomic`.)
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "write_text_atomic"]


def write_json_atomic(path: Path, doc: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with ``doc`` as JSON (temporary file, fsync unless ``durable=False``, rename)."""
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True), durable=durable)


def write_text_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` (temporary file, fsync unless ``durable=False``, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
