"""Event-time transcripts: cases written as data, run by every pipeline that can run them.

A transcript (a YAML file of cases, e.g. ``tests/transcripts/core.yaml``) says what arrives
when and what the sink must hold afterwards.  A *pipeline* is anything that implements the
small protocol :class:`TranscriptPipeline`: feed it a batch, let the clock move, drain,
restart, replay a batch, and :meth:`~TranscriptPipeline.observe` what it wrote.  The local
pipeline (the real executor and controller without Spark, ``tests/test_transcripts.py``)
and the Spark job (``integration/test_spark_transcripts.py``) both implement it, and
:func:`run_case` runs a case on either, as Beam's ``TranscriptTest`` is run by several runners.

Each case declares where it runs (``runs_on``, default every pipeline); a case whose
step a pipeline cannot take (the Spark job lists files at the real clock, so it cannot
take arrivals at given times, idle ticks or replays) says ``runs_on: [local]``.

:func:`check` compares what a pipeline observed with a step's ``expect`` and raises
:class:`TranscriptMismatch` (an ``AssertionError``) naming what differs; negative
transcripts (cases with ``fails: <what>``) prove it catches a wrong expectation.

Steps: ``batch`` (events ``{id, t}``, JSON payloads; ``raw`` for a literal payload) arriving
``at`` a time; ``idle`` (the clock moves, no input, the job ticks); ``drain``; ``restart``;
``replay: N`` (batch N again, as Spark after a crash before its commit).  ``expect`` is
cumulative (the whole sink): ``watermark``; ``hours: {hour: {timely: [ids], late: [ids]}}``;
``complete: [hours]``; ``records`` and ``late_records`` per complete hour; ``deadletter:
{reason: [ids] or count}``.  Times: ``"13:05"`` is on :data:`BASE_DAY` UTC.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

from event_etl.rules.buckets import MARKER_NAME, hour_dir, parse_data_file_name, parse_hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import to_millis

__all__ = ["BASE_DAY", "DEFAULT_SETTINGS", "PIPELINES", "Case", "Observed", "TranscriptPipeline", "TranscriptMismatch",
           "load_cases", "payload", "check", "run_case", "t", "hour", "HourContent", "read_avro", "read_sink",
           "read_deadletter", "check_manifest_matches_folder"]

BASE_DAY = "2026-11-21"
PIPELINES = ("local", "spark")
"""The pipelines a case may name in ``runs_on``."""

DEFAULT_SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}
"""The event type's settings unless a case sets others."""


def t(text: str) -> int:
    """``"13:05"`` (on BASE_DAY), ``"13:05:30.250"`` or a full ISO time, in ms UTC."""
    text = str(text)
    if "T" not in text and len(text) <= 12:
        text = f"{BASE_DAY}T{text}"
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return to_millis(dt)


def hour(text: str) -> int:
    """``"13"`` (on BASE_DAY) or ``"2026-11-20T23"``: the hour's start in ms."""
    text = str(text)
    if "T" not in text:
        text = f"{BASE_DAY}T{int(text):02d}"
    return t(text + ":00")


# -- reading a local sink ------------------------------------------------------------------------
@dataclass
class HourContent:
    timely: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    marker: Manifest | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def read_avro(data: bytes) -> list[dict[str, Any]]:
    import fastavro

    # the records of a record schema (every schema here) are dicts; fastavro types them as any Avro value
    return cast("list[dict[str, Any]]", list(fastavro.reader(io.BytesIO(data))))


def read_sink(sink: Path, event_type: str, id_field: str = "id") -> dict[int, HourContent]:
    """Everything in the hour folders of ``event_type`` under ``sink``, by hour start."""
    out: dict[int, HourContent] = {}
    base = Path(sink) / event_type
    if not base.is_dir():
        return out
    for day in sorted(base.glob("dt=*")):
        for hdir in sorted(day.glob("hour=*")):
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


def read_deadletter(sink: Path, event_type: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    base = Path(sink) / event_type / "_deadletter"
    for f in sorted(base.rglob("*.avro")) if base.is_dir() else []:
        out.extend(read_avro(f.read_bytes()))
    return out


def check_manifest_matches_folder(sink: Path, event_type: str, h: int) -> Manifest:
    """The marker of hour ``h`` lists exactly the folder's .avro files with true counts, sizes and sha256."""
    folder = Path(sink) / hour_dir(event_type, h)
    m = Manifest.from_bytes((folder / MARKER_NAME).read_bytes())
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".avro"))
    assert [f.name for f in m.files] == names, (
        f"manifest of {folder} lists {[f.name for f in m.files]}, folder has {names}"
    )
    for f in m.files:
        data = (folder / f.name).read_bytes()
        assert f.bytes == len(data)
        assert f.sha256 == hashlib.sha256(data).hexdigest()
        assert f.records == len(read_avro(data))
        assert f.late == f.name.startswith("late-")
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")], "temporary files left in a marked hour"
    return m


# -- cases ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One transcript case: its steps, its event type's settings, where it runs, and (negative) what must fail."""

    file: str
    name: str
    steps: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    runs_on: tuple[str, ...] = PIPELINES
    fails: str | None = None
    """A negative case: the expectation that is wrong on purpose, named as :class:`TranscriptMismatch` names it."""

    @property
    def id(self) -> str:
        return f"{self.file}:{self.name}"

    def runs_here(self, pipeline: str) -> bool:
        return pipeline in self.runs_on

    def event_type_settings(self) -> dict[str, Any]:
        return {**DEFAULT_SETTINGS, **self.settings}


def load_cases(paths: Iterable[Path]) -> list[Case]:
    """The cases of the transcript files ``paths``, checked to run somewhere."""
    import yaml

    out = []
    for p in paths:
        for doc in yaml.safe_load(Path(p).read_text(encoding="utf-8")):
            case = Case(file=Path(p).stem, name=doc["name"], steps=doc["steps"], settings=doc.get("settings", {}),
                        runs_on=tuple(doc.get("runs_on", PIPELINES)), fails=doc.get("fails"))
            unknown = set(case.runs_on) - set(PIPELINES)
            if unknown or not case.runs_on:
                raise ValueError(f"{case.id}: runs_on {list(case.runs_on)} (pipelines: {', '.join(PIPELINES)})")
            out.append(case)
    return out


def payload(ev: dict[str, Any]) -> bytes:
    """The payload of a transcript event: ``raw`` as given, else the JSON of its ``id`` and time ``t``."""
    if "raw" in ev:
        raw: str = ev["raw"]
        return raw.encode()
    return json.dumps({"id": ev["id"], "ts": t(ev["t"])}).encode()


# -- the protocol and the runner -----------------------------------------------------------------
@dataclass(frozen=True)
class Observed:
    """What a pipeline has done so far: where it wrote, for which type, and its watermark."""

    sink: Path
    event_type: str
    watermark: int | None


class TranscriptPipeline(Protocol):
    """What :func:`run_case` needs of a pipeline.  ``name`` is what cases name in ``runs_on``."""

    name: str

    def batch(self, payloads: list[bytes], *, at: int) -> None:
        """One micro-batch of ``payloads`` arriving at ``at`` (ms).  A case whose events name a ``part`` (a
        partition of a source read in partitions, as Kafka's) passes ``parts=[part of each payload]`` too: only a
        pipeline that runs such cases takes it."""

    def idle(self, at: int) -> None:
        """The clock moves to ``at`` with no input; the job ticks."""

    def drain(self) -> None:
        """End of input: every hour holding data is closed."""

    def restart(self) -> None:
        """The job restarts on its checkpoint."""

    def replay(self, batch: int) -> None:
        """Batch number ``batch`` runs again, as Spark does after a crash before its commit."""

    def observe(self) -> Observed: ...


class _PartitionedPipeline(TranscriptPipeline, Protocol):
    """A pipeline that runs cases whose events name a ``part``."""

    def batch(self, payloads: list[bytes], *, at: int, parts: list[str] | None = None) -> None: ...


class TranscriptMismatch(AssertionError):
    """What a pipeline did differs from a step's ``expect``; :attr:`what` names the expectation."""

    def __init__(self, where: str, what: str, detail: str) -> None:
        self.where, self.what = where, what
        super().__init__(f"{where}: {what}: {detail}")


def _same(got: Any, want: Any, where: str, what: str) -> None:
    if got != want:
        raise TranscriptMismatch(where, what, f"got {got!r}, expected {want!r}")


def check(seen: Observed, expect: dict[str, Any], where: str) -> None:
    """Compare ``seen`` with a step's ``expect``; raise :class:`TranscriptMismatch` at the first difference."""
    if "watermark" in expect:
        _same(seen.watermark, None if expect["watermark"] is None else t(expect["watermark"]), where, "watermark")
    content = read_sink(seen.sink, seen.event_type)
    _check_hours(content, expect.get("hours", {}), where)
    if "complete" in expect:
        _check_complete(seen, content, expect["complete"], where)
    for key in ("records", "late_records"):
        _check_marker_counts(content, key, expect.get(key, {}), where)
    if "deadletter" in expect:
        _check_deadletter(read_deadletter(seen.sink, seen.event_type), expect["deadletter"], where)


def _check_hours(content: dict[int, HourContent], hours: dict[str, Any], where: str) -> None:
    """``expect.hours``: each hour's timely and late ids."""
    for h, kinds in hours.items():
        hc = content.get(hour(h))
        if hc is None:
            raise TranscriptMismatch(where, f"hour {h}", "no folder")
        _same(sorted(hc.timely), sorted(kinds.get("timely", [])), where, f"timely ids of hour {h}")
        _same(sorted(hc.late), sorted(kinds.get("late", [])), where, f"late ids of hour {h}")


def _check_complete(seen: Observed, content: dict[int, HourContent], complete: list[str], where: str) -> None:
    """``expect.complete``: exactly these hours have a marker, each true to its folder."""
    marked = sorted(h for h, hc in content.items() if hc.marker is not None)
    _same(marked, sorted(hour(h) for h in complete), where, f"hours with {MARKER_NAME}")
    for h in marked:
        check_manifest_matches_folder(seen.sink, seen.event_type, h)


def _check_marker_counts(content: dict[int, HourContent], key: str, counts: dict[str, int], where: str) -> None:
    """``expect.records`` or ``expect.late_records`` (``key``): the counts the hours' markers give."""
    for h, n in counts.items():
        hc = content.get(hour(h))
        if hc is None or hc.marker is None:
            raise TranscriptMismatch(where, f"{key} of hour {h}", "the hour has no marker")
        _same(getattr(hc.marker, key), n, where, f"{key} of hour {h}")


def _check_deadletter(dl: list[dict[str, Any]], expect: dict[str, Any], where: str) -> None:
    """``expect.deadletter``: by reason, the ids of the dead letters (or their count), each with its payload."""
    for reason, want in expect.items():
        got = [r for r in dl if r["reason"] == reason]
        if isinstance(want, int):
            _same(len(got), want, where, f"dead-letter count of {reason}")
        else:
            ids = sorted(json.loads(r["payload"])["id"] for r in got)
            _same(ids, sorted(want), where, f"dead-letter ids with reason {reason}")
        for r in got:
            assert r["payload"], "the original bytes are kept"


def run_case(case: Case, pipeline: TranscriptPipeline) -> None:
    """Run ``case``'s steps on ``pipeline``, checking each step's ``expect`` after it."""
    if not case.runs_here(pipeline.name):
        raise ValueError(f"{case.id} does not run on {pipeline.name} (runs_on {list(case.runs_on)})")
    for i, step in enumerate(case.steps):
        if "batch" in step:
            payloads = [payload(ev) for ev in step["batch"]]
            if any("part" in ev for ev in step["batch"]):
                # only a pipeline that takes parts runs such a case (the protocol's docstring)
                cast(_PartitionedPipeline, pipeline).batch(payloads, at=t(step["at"]),
                                                           parts=[str(ev.get("part", "0")) for ev in step["batch"]])
            else:
                pipeline.batch(payloads, at=t(step["at"]))
        elif "idle" in step:
            pipeline.idle(t(step["idle"]))
        elif "drain" in step:
            pipeline.drain()
        elif "restart" in step:
            pipeline.restart()
        elif "replay" in step:
            pipeline.replay(int(step["replay"]))
        else:
            raise ValueError(f"{case.id}: unknown step {step}")
        check(pipeline.observe(), step.get("expect", {}), f"step {i + 1}")
