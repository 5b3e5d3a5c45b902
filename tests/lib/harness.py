"""Test helpers: a tiny event type, a fake clock, and a pipeline that runs batches without Spark.

Reading a sink and the transcripts' times (``t``, ``hour``) come from :mod:`event_etl.testing.transcripts`.

``LocalPipeline`` drives the *real* executor (:func:`event_etl.task.executor.process_split`)
and the *real* controller (:class:`event_etl.job.controller.Controller`) on local disk; only the
Spark query around them is left out.  It is what the event-time transcripts run on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from event_etl.eventtypes import EventType, load_event_type
from event_etl.job.checkpoint import Checkpoint
from event_etl.job.controller import BatchEvent, Controller
from event_etl.job.phases import MARKED, Tasks
from event_etl.sources.splits import Split
from event_etl.storage import Storage
from event_etl.task.executor import process_split
from event_etl.testing.transcripts import (  # noqa: F401 - the tests' helpers, shared with the transcripts
    BASE_DAY,
    HourContent,
    check_manifest_matches_folder,
    hour,
    read_avro,
    read_deadletter,
    read_sink,
    t,
)

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


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class LocalPipeline:
    """Batches through the real executor and controller, on local disk, without Spark."""

    def __init__(self, tmp: Path, event_type: EventType, clock: FakeClock, *, sink_url: str | None = None) -> None:
        """``sink_url`` (e.g. ``gs://bucket/prefix``) replaces the local sink ``tmp/sink``;
        the checkpoint stays local."""
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
        self.ckpt.sweep_temporaries()  # as a job does once it holds the checkpoint
        self.controller = Controller(
            event_type=self.et,
            storage=self.storage,
            checkpoint=self.ckpt,
            clock=self.clock,
            listeners=[lambda kind, payload: self.events.append((kind, payload))],
        )

    def batch(self, lines: list[bytes], *, batch_id: int | None = None, shards: int = 1,
              at_marked: Callable[[], None] | None = None) -> BatchEvent:
        """Run one micro-batch over ``lines``, cut into ``shards`` splits (calling ``at_marked`` when its phases
        say that its markers are written).

        The payloads arrive at the clock's now.  Giving the ``batch_id`` of an earlier batch
        replays it as Spark would after a crash: same input file, same arrival time.
        """
        batch_id, splits = self.prepare(lines, batch_id=batch_id, shards=shards)
        if at_marked is None:
            return self.controller.run_batch(batch_id, self.task_runner(splits))
        run_tasks, phases = self.task_runner(splits), self.controller.batch_phases(batch_id)
        try:  # the phases driven by hand, as an engine does: ``at_marked`` where they say their markers are out
            request = next(phases)
            while True:
                if isinstance(request, Tasks):
                    request = phases.send(run_tasks(request.ctx, request.shards))
                else:
                    assert request == MARKED, request
                    at_marked()
                    request = phases.send(None)
        except StopIteration as done:
            return done.value

    def batch_parts(self, by_part: dict[str, list[bytes]], *, batch_id: int | None = None) -> BatchEvent:
        """One micro-batch of a partitioned source (as Kafka's): one split per part (``{part: lines}``), each
        split's report naming its part, as a Kafka split's does (:meth:`event_etl.sources.read.KafkaReader.part`).
        The payloads arrive at the clock's now; an earlier ``batch_id`` replays it (same input, same arrival)."""
        if batch_id is None:
            batch_id = self.next_batch
            self.next_batch += 1
        if batch_id not in self.arrivals:
            self.arrivals[batch_id] = self.clock()
        splits, part_of = [], {}
        for shard, (part, lines) in enumerate(sorted(by_part.items())):
            path = self.inputs / f"batch-{batch_id:06d}-part-{part}.jsonl"
            if not path.exists():
                path.write_bytes(b"\n".join(lines))
            splits.append(Split.of_files(shard, [(str(path), 0, path.stat().st_size, self.arrivals[batch_id])]))
            part_of[shard] = part

        def run_tasks(ctx, shards):
            out = []
            for sp in splits:
                if shards is None or sp.shard in shards:
                    rep, keys = process_split(sp, ctx, self.storage)
                    out.append(({**rep, "part": part_of[sp.shard]}, keys))
            return out

        return self.controller.run_batch(batch_id, run_tasks)

    def prepare(self, lines: list[bytes], *, batch_id: int | None = None, shards: int = 1) -> tuple[int, list[Split]]:
        """The input of a micro-batch over ``lines`` (see :meth:`batch`): its number and its splits."""
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
        return batch_id, splits

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
