"""The job's checkpoint: Spark's own under ``spark/``, event_etl's under ``etl/``.

::

    <checkpoint>/
      spark/                       Spark Structured Streaming (offsets, commits, state)
      etl/job.json                 which event type, sink and source this checkpoint serves
      etl/state.json               WatermarkState after the last finished batch
      etl/batches/<id>.json        a batch's intent: the watermark it is judged against
      etl/ledger/<hour>/<id>.json  files batch <id> wrote into <hour> (sizes, sha256)
      etl/source/...               the source's own durable logs (file list, message spool)

The intent of a batch is written before any of its files, and never changed: a batch
that Spark replays after a crash is judged against the same watermark as the first
time, and so writes the same files.  The ledger is what a ``_COMPLETE`` manifest is
built from; it is dropped once the hour is marked.

The checkpoint is a local (or mounted) folder: Spark's checkpoint needs a
Hadoop-compatible file system, and this one is written only by the driver.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from event_etl.errors import CheckpointMismatchError
from event_etl.rules.manifest import FileEntry
from event_etl.rules.watermark import WatermarkState

__all__ = ["Checkpoint", "BatchIntent", "write_json_atomic"]


def write_json_atomic(path: Path, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as JSON, durably (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@dataclass(frozen=True)
class BatchIntent:
    """What a micro-batch is judged against, fixed before it writes anything."""

    batch_id: int
    wm_start: int | None
    started_at: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "BatchIntent":
        return cls(int(d["batch_id"]), d["wm_start"], int(d["started_at"]))


class Checkpoint:
    """event_etl's part of a job checkpoint (see the module docstring for the layout)."""

    JOB_KEYS = ("event_type", "sink")

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.etl = self.root / "etl"

    @property
    def spark_dir(self) -> Path:
        return self.root / "spark"

    def source_dir(self, name: str) -> Path:
        d = self.etl / "source" / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- job binding -----------------------------------------------------------------------
    def bind(self, job: dict[str, Any]) -> dict[str, Any]:
        """Record which job uses this checkpoint, or check that it is the same job as before."""
        path = self.etl / "job.json"
        if path.exists():
            old = _read_json(path)
            for key in self.JOB_KEYS:
                if old.get(key) != job.get(key):
                    raise CheckpointMismatchError(
                        f"checkpoint {self.root} belongs to {key}={old.get(key)!r}, not {job.get(key)!r}",
                        fix=f"run with the same --{key.replace('_', '-')} as before, or give this job its own --checkpoint DIR",
                    )
            return old
        write_json_atomic(path, job)
        return job

    def job(self) -> dict[str, Any] | None:
        path = self.etl / "job.json"
        return _read_json(path) if path.exists() else None

    # -- watermark state -------------------------------------------------------------------
    def load_state(self) -> WatermarkState:
        path = self.etl / "state.json"
        return WatermarkState.from_json(_read_json(path)) if path.exists() else WatermarkState()

    def save_state(self, state: WatermarkState) -> None:
        write_json_atomic(self.etl / "state.json", state.to_json())

    # -- batch intents ---------------------------------------------------------------------
    def _intent_path(self, batch_id: int) -> Path:
        return self.etl / "batches" / f"{batch_id:010d}.json"

    def load_intent(self, batch_id: int) -> BatchIntent | None:
        path = self._intent_path(batch_id)
        return BatchIntent.from_json(_read_json(path)) if path.exists() else None

    def save_intent(self, intent: BatchIntent) -> None:
        write_json_atomic(self._intent_path(intent.batch_id), intent.to_json())

    def latest_intent_id(self) -> int | None:
        d = self.etl / "batches"
        if not d.is_dir():
            return None
        ids = [int(p.stem) for p in d.glob("*.json") if p.stem.isdigit()]  # not the .drop.json files
        return max(ids) if ids else None

    def prune_intents(self, keep_after: int) -> None:
        """Forget intents of batches up to ``keep_after`` (Spark will never replay them)."""
        d = self.etl / "batches"
        if d.is_dir():
            for p in d.glob("*.json"):
                stem = p.name.split(".", 1)[0]
                if stem.isdigit() and int(stem) <= keep_after:
                    p.unlink(missing_ok=True)

    # -- duplicates ------------------------------------------------------------------------
    def _drops_path(self, batch_id: int) -> Path:
        return self.etl / "batches" / f"{batch_id:010d}.drop.json"

    def save_drops(self, batch_id: int, drops: dict[str, tuple[int, ...]]) -> None:
        """Which records of a batch were found to be duplicates (file name -> positions)."""
        write_json_atomic(self._drops_path(batch_id), {k: list(v) for k, v in drops.items()})

    def load_drops(self, batch_id: int) -> dict[str, tuple[int, ...]]:
        p = self._drops_path(batch_id)
        return {k: tuple(v) for k, v in _read_json(p).items()} if p.exists() else {}

    def save_dedupe_rows(self, batch_id: int, rows) -> None:
        """The keys a batch wrote (numpy ``KEY_DTYPE`` rows), durably."""
        d = self.etl / "dedupe"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{batch_id:010d}.keys"
        tmp = d / f".{path.name}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(rows.tobytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def load_dedupe_rows(self):
        from event_etl.dedupe import KEY_DTYPE
        import numpy as np

        d = self.etl / "dedupe"
        out = []
        if d.is_dir():
            for p in sorted(d.glob("*.keys")):
                out.append((int(p.stem), np.frombuffer(p.read_bytes(), dtype=KEY_DTYPE).copy()))
        return out

    def drop_dedupe_rows(self, batch_id: int) -> None:
        (self.etl / "dedupe" / f"{batch_id:010d}.keys").unlink(missing_ok=True)

    # -- ledger ----------------------------------------------------------------------------
    def _ledger_dir(self, hour: int) -> Path:
        return self.etl / "ledger" / str(hour)

    def write_ledger(self, hour: int, batch_id: int, entries: list[FileEntry]) -> None:
        write_json_atomic(self._ledger_dir(hour) / f"{batch_id:010d}.json", [e.to_json() for e in entries])

    def read_ledger(self, hour: int) -> list[FileEntry]:
        d = self._ledger_dir(hour)
        out: list[FileEntry] = []
        if d.is_dir():
            for p in sorted(d.glob("*.json")):
                out.extend(FileEntry.from_json(e) for e in _read_json(p))
        return out

    def drop_ledger(self, hour: int) -> None:
        shutil.rmtree(self._ledger_dir(hour), ignore_errors=True)
