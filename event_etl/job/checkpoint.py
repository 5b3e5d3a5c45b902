"""The job's checkpoint: Spark's own under ``spark/``, event_etl's under ``etl/``.

::

    <checkpoint>/
      spark/                       Spark Structured Streaming (offsets, commits, state)
      etl/format.json              the format of etl/ (see "Formats" below)
      etl/job.json                 which event type, sink and source this checkpoint serves
      etl/state.json               WatermarkState after the last finished batch
      etl/batches/<id>.json        a batch's intent: the watermark and settings it is judged with
      etl/ledger/<hour>/<id>.json  files batch <id> wrote into <hour> (sizes, sha256)
      etl/ledger/<hour>/<gen>.merge  a merge of the hour's small files: members and merged files
      etl/source/...               the source's own durable logs (file list, message spool)
      etl/policies/<name>.json     a commit policy's record: the hours it has done (event_etl.job.policies)
      etl/registry/<id>.json       a schema registry's schema a batch read payloads in (payload = "confluent")
      metrics-history.jsonl[.1]    the job's metrics history, for `event-etl graphs` (event_etl.metrics.history)

The intent of a batch is written before any of its files, and never changed: a batch
that Spark replays after a crash is judged against the same watermark, with the same
settings and schema, as the first time, and so writes the same files.  Settings changed
in ``etl.toml`` meanwhile apply from the next new batch on.  The ledger is what a
``_COMPLETE`` manifest is built from; it is dropped once the hour is marked.  Markers
written by a job killed before it saved its state (in a batch, an idle advance or a
drain) are adopted when it starts again: each records the watermark that completed it.

Formats
-------
``etl/format.json`` says which format the rest of ``etl/`` is in.  A release reads every
format since the first, migrating what it must when it opens a checkpoint, and refuses a
checkpoint of a newer format with the versions and the fix:

1. event_etl 0.1.0 (git ``165ca81`` and before): no ``format.json``.
2. Batch intents freeze the settings and schema a batch is judged with, and the first
   batch's too-late reference; ``state.json`` gains ``max_counted_time`` and
   ``last_hour``; the directory source logs when it listed each file (``arrival``);
   duplicate keys are kept per batch in ``etl/dedupe/<id>.k2`` with their kind (id or
   message key) and ``<id>.acked`` once a batch's Pub/Sub messages were acknowledged
   (format 1's ``<id>.keys`` are still read, and still written beside, for a rollback); the Pub/Sub source spools to
   ``etl/source/pubsub/segments/`` (format 1's Avro spool files are still read).
   Migration from 1: nothing is rewritten (every new field has the meaning format 1 gave
   it when absent); ``format.json`` is added.  Release 0.1.0 can still open the result.
3. ``job.json`` gains ``split_plan`` (2): the directory source cuts a batch into a multiple
   of ``tasks_per_batch`` tasks (see :func:`event_etl.sources.directory.plan_tasks`).  Only
   a new checkpoint gets format 3: a batch must be cut the same way when it is replayed, by
   whichever release replays it, so a checkpoint of format 1 or 2 keeps the cut it had (no
   ``split_plan``: 1) and its format, and release 0.2.0 refuses a checkpoint of format 3
   instead of replaying its batches cut another way.  Also new in 0.3.0, within format 3: ``state.json``'s
   ``parts`` (the Kafka source's largest counted time per partition, for its watermark per partition; absent: no
   parts).  Only a Kafka checkpoint has it, and the Kafka source is new in 0.3.0: such a checkpoint is always of
   format 3 (0.2.0 refuses it, and no earlier release can read a ``kafka:`` source), so no release that would
   drop ``parts`` unseen opens it, and it needs no format of its own.  A later release that drops or changes
   ``parts`` raises the format.

A commit policy's record (``etl/policies/``) is a new file, not a new format: a release
without commit policies never opens it, and nothing it does read changes, so a rollback
keeps working (the hours it marks meanwhile are notified once the policies run again: at
least once).  The record carries its own ``"format": 1`` for a later change of its content.

The schemas of a type's schema registry (``etl/registry/``, ``payload = "confluent"`` or a schema attribute naming a
registry id) are new files, not a new format, for the same reason: only a type whose ``etl.toml`` names a
``schema_registry`` reads them, and a release that does not know that setting refuses such a type before it opens
its checkpoint.  Each file is ``{"format": 1, "schema": {...}}``, written once (a registry never changes the schema
of an id) before the batch that first read a payload in it is marked, so that a replay decides the same without the
registry.

The metrics history (``metrics-history.jsonl``, and ``metrics-history.jsonl.1`` once it has been rotated) is
not part of the format either: nothing reads it to run the job, it lies outside ``etl/`` and ``spark/``, a release
that does not know it leaves it alone, and a job given ``--metrics-history FILE`` keeps none there.

The checkpoint is a local (or mounted) folder: Spark's checkpoint needs a
Hadoop-compatible file system, and this one is written only by the driver.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from event_etl.errors import CheckpointFormatError, CheckpointMismatchError
from event_etl.rules.manifest import FileEntry
from event_etl.rules.watermark import WatermarkState
from event_etl.storage.atomic import fsync_dir, makedirs_durable, write_json_atomic

if TYPE_CHECKING:
    import numpy as np

    from event_etl.eventtypes import EventType

__all__ = ["Checkpoint", "BatchIntent", "write_json_atomic", "CHECKPOINT_FORMAT", "FROZEN_SETTINGS"]

CHECKPOINT_FORMAT = 3
"""The newest format of ``etl/`` this release reads, and the one a new checkpoint gets (see the module docstring)."""
MIGRATED_FORMAT = 2
"""The format an older checkpoint is migrated to: 3 would change how its batches are cut."""

FROZEN_SETTINGS = (
    "schema", "time_field", "time_format", "time_logical_divisor", "id_field", "out_of_orderness",
    "allowed_lateness", "max_future_skew", "dedupe_window", "max_events_per_file", "max_payload_bytes", "codec",
    "time_attribute", "publish_time_fallback", "schema_versions", "max_backfill", "format",
    "payload", "protobuf_message", "protobuf_descriptor", "schema_registry", "schema_attribute",
)
"""What of an event type decides which files a batch writes: frozen in the batch's intent.

``schema_versions`` (the registered writer schemas, whose single-object payloads are accepted
and resolved to ``schema``): a replay must accept and dead-letter exactly what its first
attempt did, even if a version was registered or removed meanwhile.  ``max_backfill`` (how far
before its arrival an event of a job without a watermark may be): an intent written before it
existed judged with no bound, and so does its replay.  ``format`` (``avro`` or ``parquet``: the files' format and
names): a batch replayed after the type's format changed writes the files its first attempt wrote; an intent
written before Parquet existed wrote Avro.  ``payload`` and its keys (the producers' dialect, the Protobuf
message and descriptor set, the registry, the schema attribute): a replay decodes as its first attempt did, even
after ``schema.desc`` changed; an intent written before them read JSON (and single-object Avro)."""


_SLICE_ROWS = 1 << 16  # key rows converted and written at a time (format 1's layout: 1.8 MB)


def _buffer(rows: np.ndarray) -> memoryview:
    """The bytes of a contiguous numpy array, without copying them (``tobytes()`` would)."""
    return rows.data.cast("B") if rows.flags.c_contiguous else memoryview(rows.tobytes())


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@dataclass(frozen=True)
class BatchIntent:
    """What a micro-batch is judged against, fixed before it writes anything.

    - ``wm_start``: the watermark when it began;
    - ``started_at``: when it began (names its dead-letter files);
    - ``settings``: the event type's :data:`FROZEN_SETTINGS` it is judged and written with
      (``None`` in an intent of format 1: the settings of the day);
    - ``reference``: for a job's first batch (no watermark yet), the watermark its own events
      would give, against which "too late" is measured (one for the whole batch).
    """

    batch_id: int
    wm_start: int | None
    started_at: int
    settings: dict[str, Any] | None = None
    reference: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchIntent:
        return cls(int(d["batch_id"]), d["wm_start"], int(d["started_at"]), d.get("settings"), d.get("reference"))

    def judged_with(self, event_type: EventType) -> EventType:
        """The event type as the batch was first judged: its frozen settings and schema over ``event_type``'s
        (today's)."""
        if not self.settings:
            return event_type
        from dataclasses import replace

        frozen = {k: v for k, v in self.settings.items() if k in FROZEN_SETTINGS}
        frozen.setdefault("schema_versions", ())  # an intent from before schema versions accepted its schema only
        frozen.setdefault("max_backfill", 0)  # an intent from before max_backfill judged with no bound
        frozen.setdefault("format", "avro")  # an intent from before Parquet wrote Avro
        frozen.setdefault("payload", "json")  # an intent from before the producers' dialects read JSON
        return replace(event_type, **frozen)


class Checkpoint:
    """event_etl's part of a job checkpoint (see the module docstring for the layout)."""

    JOB_KEYS = ("event_type", "sink", "source")

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.etl = self.root / "etl"

    @property
    def spark_dir(self) -> Path:
        return self.root / "spark"

    def source_dir(self, name: str) -> Path:
        from event_etl.storage.atomic import makedirs_durable

        d = self.etl / "source" / name
        makedirs_durable(d)  # the source's logs in it must not vanish with a power cut
        return d

    # -- format ----------------------------------------------------------------------------
    def open_format(self, *, release: str = "") -> int:
        """Check the format of ``etl/`` and migrate an older one.  Returns the format found.

        A new checkpoint gets the current format.  One of an earlier format is migrated (see
        the module docstring); one of a newer format is refused, untouched.
        """
        path = self.etl / "format.json"
        found = self._found_format()
        if found > CHECKPOINT_FORMAT or found < 0:
            doc = _read_json(path) if path.exists() else {}
            by = doc.get("written_by") or "a newer event_etl"
            raise CheckpointFormatError(
                f"checkpoint {self.root} is in format {found}, written by {by}; this release "
                f"({release or 'event_etl'}) reads formats 1 to {CHECKPOINT_FORMAT}",
                fix=f"run the release that wrote it ({by}) or a newer one; the checkpoint was left unchanged",
            )
        if found < MIGRATED_FORMAT:
            new: dict[str, Any] = {"format": MIGRATED_FORMAT if found else CHECKPOINT_FORMAT, "written_by": release}
            if found:
                new["migrated_from"] = found
            write_json_atomic(path, new)
        return found

    def _found_format(self) -> int:
        """The format of ``etl/`` as found: ``format.json``'s, 1 without it (event_etl 0.1.0), 0 for a new one."""
        path = self.etl / "format.json"
        if path.exists():
            return int(_read_json(path).get("format", 0))
        if (self.etl / "job.json").exists() or (self.etl / "state.json").exists():
            return 1  # event_etl 0.1.0 wrote no format file
        return 0  # new

    @property
    def format(self) -> int:
        """The format of ``etl/`` (after :meth:`open_format`, which gives a new checkpoint the current one)."""
        return self._found_format() or CHECKPOINT_FORMAT

    def sweep_temporaries(self) -> list[str]:
        """Remove the temporary files a killed run left in the checkpoint (see :mod:`event_etl.storage.temporaries`):
        only while no writer runs (the job holds the checkpoint's lock, and its source has not started)."""
        from event_etl.storage.temporaries import sweep_temporaries

        return sweep_temporaries(self.root)

    # -- job binding -----------------------------------------------------------------------
    def bind(self, job: dict[str, Any]) -> dict[str, Any]:
        """Record which job uses this checkpoint, or check that it is the same job as before."""
        path = self.etl / "job.json"
        if path.exists():
            old = _read_json(path)
            for key in self.JOB_KEYS:
                if key in old and key in job and old[key] != job[key]:
                    raise CheckpointMismatchError(
                        f"checkpoint {self.root} belongs to {key}={old.get(key)!r}, not {job.get(key)!r}",
                        fix=f"run with the same --{key.replace('_', '-')} as before, or give this job its own "
                            "--checkpoint DIR (a new checkpoint starts with no watermark and reads its source "
                            "from the beginning)",
                    )
            bound: dict[str, Any] = old
            return bound
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

    # -- a schema registry's schemas ----------------------------------------------------------
    def registry_schemas(self) -> dict[str, Any]:
        """The registry's schemas kept so far (id -> schema, as :class:`event_etl.payloads.registry.RegistrySchema`
        writes it)."""
        d = self.etl / "registry"
        if not d.is_dir():
            return {}
        return {p.stem: _read_json(p)["schema"] for p in sorted(d.glob("*.json")) if p.stem.isdigit()}

    def keep_registry_schemas(self, schemas: dict[str, Any]) -> None:
        """Keep schemas a batch's tasks fetched (id -> schema), each durable once; one directory sync for all."""
        d = self.etl / "registry"
        new = {k: v for k, v in schemas.items() if k.isdigit() and not (d / f"{k}.json").exists()}
        if not new:
            return
        makedirs_durable(d)
        for k, v in sorted(new.items()):
            write_json_atomic(d / f"{k}.json", {"format": 1, "schema": v})

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

    def prune_intents(self, keep_after: int, *, sweep: bool = True) -> None:
        """Forget intents of batches up to ``keep_after`` (Spark will never replay them): every one when
        ``sweep``, else only those of batch ``keep_after`` (a job that swept once forgets one batch a batch)."""
        d = self.etl / "batches"
        if not sweep:
            for suffix in (".json", ".drop.json", ".dropkeys"):
                (d / f"{keep_after:010d}{suffix}").unlink(missing_ok=True)
            return
        if d.is_dir():
            for p in [*d.glob("*.json"), *d.glob("*.dropkeys")]:
                stem = p.name.split(".", 1)[0]
                if stem.isdigit() and int(stem) <= keep_after:
                    p.unlink(missing_ok=True)

    # -- duplicates ------------------------------------------------------------------------
    def _drops_path(self, batch_id: int) -> Path:
        return self.etl / "batches" / f"{batch_id:010d}.drop.json"

    def save_drops(self, batch_id: int, drops: dict[str, tuple[int, ...]]) -> None:
        """Which records of a batch were found to be duplicates (file name -> positions)."""
        write_json_atomic(self._drops_path(batch_id), {k: list(v) for k, v in drops.items()})

    def save_dropped_keys(self, batch_id: int, rows: np.ndarray) -> None:
        """The keys of the records a batch dropped as duplicates (``STORED_DTYPE`` rows), durably."""
        path = self.etl / "batches" / f"{batch_id:010d}.dropkeys"
        makedirs_durable(path.parent)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(_buffer(rows))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)  # the rename too: a power cut must not take it back once the drops are saved

    def load_dropped_keys(self, batch_id: int) -> np.ndarray:
        import numpy as np

        from event_etl.task.dedupe import STORED_DTYPE

        path = self.etl / "batches" / f"{batch_id:010d}.dropkeys"
        return np.frombuffer(path.read_bytes(), dtype=STORED_DTYPE).copy() if path.exists() else \
            np.zeros(0, dtype=STORED_DTYPE)

    def has_drops(self, batch_id: int) -> bool:
        """Whether the batch's duplicates were decided (its drop list written, empty when it dropped nothing)."""
        return self._drops_path(batch_id).exists()

    def load_drops(self, batch_id: int) -> dict[str, tuple[int, ...]]:
        p = self._drops_path(batch_id)
        return {k: tuple(v) for k, v in _read_json(p).items()} if p.exists() else {}

    def save_dedupe_rows(self, batch_id: int, rows: np.ndarray) -> None:
        """The keys a batch wrote (``STORED_DTYPE`` rows of :mod:`event_etl.task.dedupe`), durably."""
        from event_etl.task.dedupe import legacy_rows

        d = self.etl / "dedupe"
        makedirs_durable(d)
        path = d / f"{batch_id:010d}.k2"
        tmp = d / f".{path.name}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(_buffer(rows))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(d)  # the rename too, before the state that relies on these keys is saved
        # The same keys in format 1's layout, for a rollback to release 0.1.0 (which reads only .keys):
        # not synced (neither the file nor its rename), since this release reads .k2; a rolled-back job
        # without them would let copies through.
        # Written a slice at a time: a batch of millions of keys would otherwise take a second copy of them
        # (~28 B a key), whose fresh pages cost more than the copying.
        old = d / f"{batch_id:010d}.keys"
        tmp = d / f".{old.name}.tmp"
        with open(tmp, "wb") as fh:
            for at in range(0, len(rows), _SLICE_ROWS):
                fh.write(_buffer(legacy_rows(rows[at:at + _SLICE_ROWS])))
        os.replace(tmp, old)

    def mark_dedupe_acked(self, batch_id: int) -> None:
        """The batch's Pub/Sub messages were acknowledged: their keys follow the arrival clock."""
        (self.etl / "dedupe" / f"{batch_id:010d}.acked").touch()

    def load_dedupe_rows(self) -> list[tuple[int, np.ndarray, bool]]:
        """``[(batch id, STORED_DTYPE rows, acknowledged)]`` of every batch whose keys are kept.

        Batches of format 1 (``.keys``) had no kinds: their keys are all forgotten by the event
        clock, as format 1 did; their messages are taken as acknowledged."""
        import numpy as np

        from event_etl.task.dedupe import ID_KEY, LEGACY_KEY_DTYPE, STORED_DTYPE

        d = self.etl / "dedupe"
        out = []
        if d.is_dir():
            for p in sorted(d.glob("*.keys")):
                if (d / f"{p.stem}.k2").exists():
                    continue  # written beside .k2 for a rollback: .k2 says more
                old = np.frombuffer(p.read_bytes(), dtype=LEGACY_KEY_DTYPE)
                rows = np.empty(len(old), dtype=STORED_DTYPE)
                rows["key"], rows["time"], rows["kind"] = old["key"], old["time"], ID_KEY
                out.append((int(p.stem), rows, True))
            for p in sorted(d.glob("*.k2")):
                rows = np.frombuffer(p.read_bytes(), dtype=STORED_DTYPE).copy()
                has_messages = bool((rows["kind"] != ID_KEY).any())
                acked = not has_messages or (d / f"{p.stem}.acked").exists()
                out.append((int(p.stem), rows, acked))
        return out

    def drop_dedupe_rows(self, batch_id: int) -> None:
        for ext in ("keys", "k2", "acked"):
            (self.etl / "dedupe" / f"{batch_id:010d}.{ext}").unlink(missing_ok=True)

    # -- ledger ----------------------------------------------------------------------------
    def _ledger_dir(self, hour: int) -> Path:
        return self.etl / "ledger" / str(hour)

    def write_ledger(self, hour: int, batch_id: int, entries: list[FileEntry]) -> None:
        away = {n for members, _ in self.read_merges(hour) for n in members}
        if away:  # a replay of a batch whose files were merged since: the merged files stand for them
            entries = [e for e in entries if e.name not in away]
        write_json_atomic(self._ledger_dir(hour) / f"{batch_id:010d}.json", [e.to_json() for e in entries])

    def read_ledger(self, hour: int) -> list[FileEntry]:
        """The hour's files: what its batches wrote, with its recorded merges applied (sorted by name)."""
        from event_etl.rules.compaction import apply_merges

        d = self._ledger_dir(hour)
        out: dict[str, FileEntry] = {}
        if d.is_dir():
            for p in sorted(d.glob("*.json")):  # batches' files (and merged.json, 0.1.0's view of the merges)
                out.update((e.name, e) for e in map(FileEntry.from_json, _read_json(p)))
        merges = self.read_merges(hour)
        return apply_merges(out.values(), merges) if merges else [out[n] for n in sorted(out)]

    def read_merges(self, hour: int) -> list[tuple[list[str], list[FileEntry]]]:
        """The hour's merges, oldest first: ``(member names, merged files)``."""
        d = self._ledger_dir(hour)
        out = []
        for p in sorted(d.glob("*.merge")) if d.is_dir() else []:
            m = _read_json(p)
            out.append(([str(n) for n in m["members"]], [FileEntry.from_json(e) for e in m["merged"]]))
        return out

    def save_merge(self, hour: int, generation: int, members: list[str], merged: list[FileEntry]) -> None:
        """Record a merge (after its files are durable, before its members are deleted)."""
        write_json_atomic(self._ledger_dir(hour) / f"{generation:04d}.merge",
                          {"members": list(members), "merged": [e.to_json() for e in merged]})
        self.project_merges(hour)

    def project_merges(self, hour: int) -> None:
        """Write the hour's merges into release 0.1.0's layout too (it reads every ``*.json`` of the ledger and
        knows no ``.merge``): the batches' files without the merged-away members, and ``merged.json`` listing the
        merged files, so that a job rolled back to 0.1.0 marks the hour with the files it holds.  Repeatable."""
        d = self._ledger_dir(hour)
        merges = self.read_merges(hour)
        if not merges:
            return
        final = {e.name: e for e in self.read_ledger(hour)}
        for p in sorted(d.glob("*.json")):
            if p.name == "merged.json":
                continue
            entries = [FileEntry.from_json(e) for e in _read_json(p)]
            kept = [e for e in entries if e.name in final]
            if not kept:  # every file of the batch merged away (the usual case): nothing of it to write again
                p.unlink(missing_ok=True)
            elif len(kept) != len(entries):
                write_json_atomic(p, [e.to_json() for e in kept])
        from event_etl.rules.compaction import is_merged_name

        merged = [e.to_json() for n, e in sorted(final.items()) if is_merged_name(n)]
        try:
            same = _read_json(d / "merged.json") == merged
        except (FileNotFoundError, ValueError):
            same = False
        if not same:  # every merge of the hour begins by projecting again: most find it done
            write_json_atomic(d / "merged.json", merged)

    def ledger_hours(self) -> list[int]:
        """The hours that have a ledger (open, or marked and not yet dropped)."""
        d = self.etl / "ledger"
        return sorted(int(p.name) for p in d.iterdir() if p.name.lstrip("-").isdigit()) if d.is_dir() else []

    def drop_ledger(self, hour: int) -> None:
        shutil.rmtree(self._ledger_dir(hour), ignore_errors=True)

    # -- commit policies -------------------------------------------------------------------
    def load_policy_record(self, name: str) -> dict[str, Any] | None:
        """Commit policy ``name``'s record (see :mod:`event_etl.job.policies`); ``None`` before its first run."""
        path = self.etl / "policies" / f"{name}.json"
        return _read_json(path) if path.exists() else None

    def save_policy_record(self, name: str, record: dict[str, Any]) -> None:
        write_json_atomic(self.etl / "policies" / f"{name}.json", record)

    def policy_records(self) -> dict[str, dict[str, Any]]:
        """Every commit policy's record, by name (for ``event-etl status``)."""
        d = self.etl / "policies"
        return {p.stem: _read_json(p) for p in sorted(d.glob("*.json"))} if d.is_dir() else {}
