"""Test helpers: a tiny event type, a fake clock, and a pipeline that runs batches without Spark.

``LocalPipeline`` drives the *real* executor (:func:`event_etl.executor.process_split`)
and the *real* controller (:class:`event_etl.driver.Controller`) on local disk; only the
Spark query around them is left out.  It is what the event-time transcripts run on.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fastavro

from event_etl.checkpoint import Checkpoint
from event_etl.driver import BatchEvent, Controller
from event_etl.eventtypes import EventType, load_event_type
from event_etl.executor import process_split
from event_etl.rules.buckets import MARKER_NAME, hour_dir, parse_data_file_name
from event_etl.rules.manifest import Manifest
from event_etl.sources.splits import Split
from event_etl.storage import Storage
from event_etl.timeutil import to_millis

BASE_DAY = "2026-11-21"

CLICK_SCHEMA = {
    "type": "record",
    "name": "Click",
    "namespace": "test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "page", "type": ["null", "string"], "default": None},
    ],
}


def make_event_type(root: Path, name: str = "click", schema: dict | None = None, **settings: Any) -> EventType:
    """Write ``root/<name>/{schema.avsc,etl.toml}`` and load it."""
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "schema.avsc").write_text(json.dumps(schema or CLICK_SCHEMA))
    settings.setdefault("time_field", "ts")
    settings.setdefault("id_field", "id")
    lines = []
    for k, v in settings.items():
        lines.append(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}")
    (d / "etl.toml").write_text("\n".join(lines) + "\n")
    return load_event_type(d)


def t(text: str) -> int:
    """``"13:05"`` (on BASE_DAY), ``"13:05:30.250"`` or a full ISO time, in ms UTC."""
    text = str(text)
    if "T" not in text and len(text) <= 12:
        text = f"{BASE_DAY}T{text}"
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return to_millis(dt)


def hour(text: str) -> int:
    """``"13"`` (on BASE_DAY) or ``"2026-11-20T23"``: the hour's start in ms."""
    text = str(text)
    if "T" not in text:
        text = f"{BASE_DAY}T{int(text):02d}"
    return t(text + ":00")


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass
class HourContent:
    timely: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    marker: Manifest | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def read_avro(data: bytes) -> list[dict]:
    return list(fastavro.reader(io.BytesIO(data)))


def read_sink(sink: Path, event_type: str, id_field: str = "id") -> dict[int, HourContent]:
    """Everything in the hour folders of ``event_type`` under ``sink``, by hour start."""
    out: dict[int, HourContent] = {}
    base = Path(sink) / event_type
    if not base.is_dir():
        return out
    for day in sorted(base.glob("dt=*")):
        for hdir in sorted(day.glob("hour=*")):
            from event_etl.rules.buckets import parse_hour_dir

            _, h = parse_hour_dir(f"{event_type}/{day.name}/{hdir.name}")
            hc = out.setdefault(h, HourContent())
            for f in sorted(hdir.iterdir()):
                if f.name == MARKER_NAME:
                    hc.marker = Manifest.from_bytes(f.read_bytes())
                elif f.name.endswith(".avro"):
                    data = f.read_bytes()
                    hc.files[f.name] = data
                    ids = [str(r[id_field]) for r in read_avro(data)]
                    (hc.late if parse_data_file_name(f.name).late else hc.timely).extend(ids)
    return out


def read_deadletter(sink: Path, event_type: str) -> list[dict]:
    out = []
    base = Path(sink) / event_type / "_deadletter"
    for f in sorted(base.rglob("*.avro")) if base.is_dir() else []:
        out.extend(read_avro(f.read_bytes()))
    return out


def check_manifest_matches_folder(sink: Path, event_type: str, h: int) -> Manifest:
    """The marker of hour ``h`` lists exactly the folder's .avro files with true counts, sizes and sha256."""
    import hashlib

    folder = Path(sink) / hour_dir(event_type, h)
    m = Manifest.from_bytes((folder / MARKER_NAME).read_bytes())
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".avro"))
    assert [f.name for f in m.files] == names, f"manifest of {folder} lists {[f.name for f in m.files]}, folder has {names}"
    for f in m.files:
        data = (folder / f.name).read_bytes()
        assert f.bytes == len(data)
        assert f.sha256 == hashlib.sha256(data).hexdigest()
        assert f.records == len(read_avro(data))
        assert f.late == f.name.startswith("late-")
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")], "temporary files left in a marked hour"
    return m


class LocalPipeline:
    """Batches through the real executor and controller, on local disk, without Spark."""

    def __init__(self, tmp: Path, event_type: EventType, clock: FakeClock, *, sink_url: str | None = None) -> None:
        """``sink_url`` (e.g. ``gs://bucket/prefix``) replaces the local sink ``tmp/sink``; the checkpoint stays local."""
        self.tmp = Path(tmp)
        self.et = event_type
        self.clock = clock
        self.sink = self.tmp / "sink"
        self.inputs = self.tmp / "inputs"
        self.inputs.mkdir(parents=True, exist_ok=True)
        self.storage = Storage(sink_url or str(self.sink))
        self.ckpt = Checkpoint(self.tmp / "ckpt")
        self.events: list[tuple[str, Any]] = []
        self.next_batch = 0
        self.arrivals: dict[int, int] = {}
        self.restart()

    def restart(self) -> None:
        """A new controller on the same checkpoint, as after a process restart."""
        self.controller = Controller(
            event_type=self.et,
            storage=self.storage,
            checkpoint=self.ckpt,
            clock=self.clock,
            listeners=[lambda kind, payload: self.events.append((kind, payload))],
        )

    def batch(self, lines: list[bytes], *, batch_id: int | None = None, shards: int = 1) -> BatchEvent:
        """Run one micro-batch over ``lines``, cut into ``shards`` splits.

        The payloads arrive at the clock's now.  Giving the ``batch_id`` of an earlier batch
        replays it as Spark would after a crash: same input file, same arrival time.
        """
        if batch_id is None:
            batch_id = self.next_batch
            self.next_batch += 1
        path = self.inputs / f"batch-{batch_id:06d}.jsonl"
        if batch_id not in self.arrivals:
            path.write_bytes(b"\n".join(lines))
            self.arrivals[batch_id] = self.clock()
        data = path.read_bytes()
        splits = [Split.of_files(shard, [(str(path), a, b, self.arrivals[batch_id])])
                  for shard, (a, b) in enumerate(_line_bounds(data, shards))]
        return self.controller.run_batch(batch_id, self.task_runner(splits))

    def task_runner(self, splits: list[Split]):
        """What Spark does for the controller: run the executor on all splits, or on some shards again."""

        def run_tasks(ctx, shards):
            return [process_split(sp, ctx, self.storage) for sp in splits if shards is None or sp.shard in shards]

        return run_tasks


def _line_bounds(data: bytes, shards: int) -> list[tuple[int, int]]:
    if not data:
        return []
    cuts = [0]
    for k in range(1, shards):
        pos = data.find(b"\n", len(data) * k // shards)
        if pos < 0 or pos + 1 >= len(data) or pos + 1 <= cuts[-1]:
            continue
        cuts.append(pos + 1)
    cuts.append(len(data))
    return list(zip(cuts, cuts[1:]))


def click(id_: str, ts: str | int, **extra: Any) -> bytes:
    ms = ts if isinstance(ts, int) else t(ts)
    return json.dumps({"id": id_, "ts": ms, **extra}).encode()


os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
