"""Dead letters sent back through the live job's source: ``event-etl deadletter TYPE --replay-to TARGET``.

The live job takes them as any new input, through its own rules (timely into their hour, late into the open hour,
too late to the dead letters again): a replay never writes to the sink itself and never runs a second job.
Targets:

- ``dir:PATH``: a file ``replay-<id>.jsonl`` in the folder the live ``dir:`` job reads, one payload a line, written
  under a hidden name (``.replay-<id>.jsonl.part``) and renamed, so the job finds it whole, as a new file;
- ``pubsub`` (the type's topic, ``[pubsub] topic`` in etl.toml) or ``pubsub:projects/P/topics/T``: each payload
  published as it was, with the attributes ``event_etl_replay`` (the replay's id) and ``event_etl_replay_of``
  (where the payload first came from);
- ``kafka:TOPIC`` (the cluster of ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS``): each payload produced as the value, with
  the key and headers of its original record (read back from the topic and partition its dead letter names, while
  retention keeps it) and the headers ``event_etl_replay`` and ``event_etl_replay_of``.

The dead letters keep each record's payload, not its Pub/Sub attributes: a type whose event time is a Pub/Sub
attribute (``time_attribute``) cannot take its dead letters back through Pub/Sub.

Each replay is recorded next to the dead letters, ``<type>/_deadletter/_replays/<id>.json``, naming the dead
letters it sends (their keys, :mod:`event_etl.rules.replay`) before it sends them; a later replay leaves out
every dead letter an earlier one named (``again`` sends them once more).  The record says ``sending`` until
everything was handed over, then ``sent``: a replay cut short is named by the next one.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from event_etl.errors import UsageError
from event_etl.rules.buckets import DEADLETTER_DIR, validate_event_type_name
from event_etl.rules.replay import Selection, select, split_future, split_too_late
from event_etl.storage import Storage
from event_etl.storage.deadletter import DeadLetter, iter_deadletters
from event_etl.timeutil import iso, to_datetime

__all__ = ["REPLAYS_DIR", "REPLAY_ATTRIBUTE", "REPLAY_OF_ATTRIBUTE", "Entry", "Target", "Criteria", "LiveType",
           "ReplayPlan", "load_entries", "load_unclaimed", "replay_records", "parse_target", "plan_replay",
           "run_replay"]

REPLAYS_DIR = "_replays"
REPLAY_ATTRIBUTE = "event_etl_replay"
"""The Pub/Sub attribute (Kafka header) naming the replay that sent a message."""
REPLAY_OF_ATTRIBUTE = "event_etl_replay_of"
"""The Pub/Sub attribute (Kafka header) saying where the payload first came from (its dead letter's ``source``)."""
RECORD_FORMAT = 1


@dataclass(frozen=True)
class Entry:
    """A dead letter and its key (``dt=DAY/FILE#N``)."""

    key: str
    letter: DeadLetter

    @property
    def reason(self) -> str:
        return self.letter.reason

    @property
    def event_time(self) -> int | None:
        return self.letter.event_time


def load_entries(storage: Storage, event_type: str) -> list[Entry]:
    """Every dead letter of ``event_type``, oldest day and batch first, each with its key."""
    out, n, last = [], 0, None
    for dl in iter_deadletters(storage, event_type):
        n = n + 1 if dl.file == last else 0
        last = dl.file
        out.append(Entry(f"{dl.file}#{n}", dl))
    return out


def load_unclaimed(storage: Storage, bus: str, claims: Callable[[DeadLetter], bool]) -> list[Entry]:
    """The messages bus ``bus`` kept unclaimed that ``claims`` (a type's route as it is now) takes, oldest first, each
    with its key (``dt=DAY/FILE#N``, counted over all of the file's records)."""
    from event_etl.storage.deadletter import iter_unclaimed

    out, n, last = [], 0, None
    for dl in iter_unclaimed(storage, bus):
        n = n + 1 if dl.file == last else 0
        last = dl.file
        if claims(dl):
            out.append(Entry(f"{dl.file}#{n}", dl))
    return out


def _replays_dir(event_type: str, bus: str | None = None) -> str:
    if bus is not None:  # a bus's unclaimed messages: their replays are the bus's, whichever type claimed them
        from event_etl.rules.routing import UNCLAIMED_DIR

        return f"{UNCLAIMED_DIR}/{bus}/{REPLAYS_DIR}"
    validate_event_type_name(event_type)
    return f"{event_type}/{DEADLETTER_DIR}/{REPLAYS_DIR}"


def replay_records(storage: Storage, event_type: str, bus: str | None = None) -> list[dict[str, Any]]:
    """The replays of ``event_type`` (of bus ``bus``'s unclaimed messages) recorded so far, oldest first."""
    base = _replays_dir(event_type, bus)
    return [json.loads(storage.read(f"{base}/{name}"))
            for name in sorted(storage.list_files(base)) if name.endswith(".json")]


@dataclass(frozen=True)
class Target:
    """Where a replay sends: ``kind`` dir, pubsub or kafka; ``where`` the folder or the topic."""

    kind: str
    where: str

    @property
    def url(self) -> str:
        return f"{self.kind}:{self.where}"


TARGET_FIX = ("--replay-to dir:PATH (the folder the live dir: job reads), pubsub (the type's topic), "
              "pubsub:projects/P/topics/T, or kafka:TOPIC")


def parse_target(text: str, pubsub_topic: str | None = None) -> Target:
    """A ``--replay-to`` value; ``pubsub_topic``: the type's topic (``[pubsub] topic``), for a bare ``pubsub``."""
    kind, sep, rest = text.partition(":")
    rest = rest.strip()
    if kind == "dir" and sep and rest:
        if not os.path.isdir(rest):
            raise UsageError(f"--replay-to {text}: {rest} is not a folder",
                             fix="give the folder the live job reads (its --source dir:PATH)")
        return Target("dir", os.path.abspath(rest))
    if kind == "pubsub":
        topic = rest or pubsub_topic
        if not topic:
            raise UsageError("--replay-to pubsub: the event type has no Pub/Sub topic",
                             fix="name it: --replay-to pubsub:projects/PROJECT/topics/TOPIC, or add [pubsub] topic "
                                 "to the type's etl.toml")
        if not topic.startswith("projects/") or "/topics/" not in topic:
            raise UsageError(f"--replay-to {text}: {topic!r} is not a topic path", fix=TARGET_FIX)
        return Target("pubsub", topic)
    if kind == "kafka" and sep and rest and not rest.startswith("//"):
        return Target("kafka", rest)
    raise UsageError(f"--replay-to {text}: not a replay target", fix=TARGET_FIX)


@dataclass
class ReplayPlan:
    """What a replay would do: ``send`` (in order); ``too_late`` (too late again) and ``future`` (future again), each
    left out unless asked; ``not_a_line`` (a ``dir:`` target cannot carry a payload holding a newline)."""

    replay_id: str
    target: Target
    selection: Selection[Entry]
    send: list[Entry] = field(default_factory=list)
    too_late: list[Entry] = field(default_factory=list)
    too_late_sent: bool = False
    future: list[Entry] = field(default_factory=list)
    """Event time still more than the type's ``max_future_skew`` ahead of now: ``future`` again, left out unless
    asked (``future_sent``)."""
    future_sent: bool = False
    not_a_line: list[Entry] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    """Earlier replays recorded as ``sending``: cut short, some of their dead letters may not have been sent."""
    notes: list[str] = field(default_factory=list)
    """What the sending found to say (Kafka: records whose key and headers could not be read back)."""
    binary: bool = False
    """The type's payloads are binary (Protobuf, Confluent frames, Avro datums: its ``payload`` is not ``json``):
    a folder's line holds one base64-encoded, a message its bytes (:func:`wire_payload`)."""

    def wire(self, e: Entry) -> bytes:
        """What the target carries of the dead letter ``e`` (:func:`wire_payload`)."""
        return wire_payload(e.letter.payload, e.letter.source, self.target.kind, binary=self.binary)


def wire_payload(payload: bytes, source: str, target_kind: str, *, binary: bool) -> bytes:
    """A dead letter's payload as ``target_kind`` (``dir``, ``pubsub``, ``kafka``) carries it.  A binary dialect's
    payload that came from a folder (or the generator) is its base64 line, one that came in a message its bytes:
    decoded for a message, encoded for a folder.  A line that is not plain base64 goes as it is (it is dead-lettered
    again as what it was)."""
    if not binary:
        return payload
    from_message = source.startswith(("msg:", "kafka:"))
    if target_kind == "dir":
        return payload if not from_message else base64.b64encode(payload)
    if from_message:
        return payload
    from event_etl.payloads.b64lines import B64Error, b64decode_line

    try:
        return b64decode_line(payload.strip())
    except B64Error:
        return payload


@dataclass(frozen=True)
class Criteria:
    """Which dead letters a replay asks for (the options of ``deadletter --replay-to``): of any of ``reasons`` (none
    given: every reason), whose event time's hour is in ``[since, until)`` (hour starts; either may be None: open),
    at most ``limit`` of them (None: all), as :func:`~event_etl.rules.replay.select` takes them; those an earlier
    replay sent too with ``again``, those too late again for the live job with ``too_late``, and those whose event
    time is still too far ahead (``future`` again) with ``future``."""

    reasons: Sequence[str] = ()
    since: int | None = None
    until: int | None = None
    limit: int | None = None
    again: bool = False
    too_late: bool = False
    future: bool = False


@dataclass(frozen=True)
class LiveType:
    """The event type as its live job will read what a replay sends: the job's ``watermark`` (None: none, or
    unknown) and the type's ``allowed_lateness`` (together: what is too late again), its ``max_future_skew`` (what
    is ``future`` again; None: not looked at) and whether its payloads are ``binary`` (its ``payload`` is not
    ``json``: see :func:`wire_payload`)."""

    watermark: int | None = None
    allowed_lateness: int = 0
    max_future_skew: int | None = None
    binary: bool = False


def plan_replay(entries: Sequence[Entry], records: Sequence[dict[str, Any]], target: Target, *, now: int,
                criteria: Criteria, live: LiveType | None = None) -> ReplayPlan:
    """The replay of the dead letters ``entries`` matching ``criteria``, given the earlier ``records`` and, at
    ``now``, the type as its ``live`` job reads it (default: no watermark, no lateness, the future not looked at,
    JSON payloads): those too late for its watermark are too late again, and, with its ``max_future_skew``, those
    whose event time is still too far ahead of now are ``future`` again."""
    c, live = criteria, live or LiveType()
    binary = live.binary
    sent = {k for r in records for k in r.get("entries", [])}
    sel = select(entries, reasons=c.reasons, since=c.since, until=c.until, limit=c.limit, sent=sent, again=c.again)
    ok, late = split_too_late(sel.chosen, live.watermark, live.allowed_lateness)
    ok, ahead = split_future(ok, now, live.max_future_skew) if live.max_future_skew is not None else (ok, [])
    left_out = {e.key for e in [*([] if c.too_late else late), *([] if c.future else ahead)]}
    chosen = [e for e in sel.chosen if e.key not in left_out]
    not_a_line = [e for e in chosen if target.kind == "dir"
                  and b"\n" in wire_payload(e.letter.payload, e.letter.source, target.kind, binary=binary)]
    bad = {e.key for e in not_a_line}
    stamp = to_datetime(now).strftime("%Y%m%dT%H%M%S") + f"{now % 1000:03d}Z"  # ids sort as they were made
    return ReplayPlan(
        replay_id=f"{stamp}-{uuid.uuid4().hex[:6]}", target=target, selection=sel,
        send=[e for e in chosen if e.key not in bad], too_late=late, too_late_sent=c.too_late,
        future=ahead, future_sent=c.future,
        not_a_line=not_a_line, unfinished=[r["replay"] for r in records if r.get("state") == "sending"],
        binary=binary,
    )


def _record_bytes(rec: dict[str, Any]) -> bytes:
    return (json.dumps(rec, indent=1) + "\n").encode()


def run_replay(storage: Storage, event_type: str, plan: ReplayPlan, *, now: int,
               clock: Callable[[], int] | None = None, bus: str | None = None) -> dict[str, Any]:
    """Record the replay (``sending``; of bus ``bus``'s unclaimed messages: beside them), send its dead letters,
    record it ``sent``.  Returns the record."""
    rel = posixpath.join(_replays_dir(event_type, bus), f"{plan.replay_id}.json")
    rec: dict[str, Any] = {
        "format": RECORD_FORMAT, "replay": plan.replay_id, "event_type": event_type, "target": plan.target.url,
        "created_at": iso(now), "state": "sending", "count": len(plan.send),
        "reasons": dict(sorted(_count(e.reason for e in plan.send).items())),
        "too_late_sent": len(plan.too_late) if plan.too_late_sent else 0,
        "future_sent": len(plan.future) if plan.future_sent else 0,
        "entries": [e.key for e in plan.send],
    }
    if not storage.create_only(rel, _record_bytes(rec)):
        raise UsageError(f"a replay {plan.replay_id} is recorded already", fix="run the command again")
    sender = {"dir": _send_dir, "pubsub": _send_pubsub, "kafka": _send_kafka}[plan.target.kind]
    rec["sent_to"] = sender(plan)
    rec["state"] = "sent"
    if plan.notes:
        rec["notes"] = plan.notes
    rec["sent_at"] = iso((clock or (lambda: now))())
    storage.write_atomic(rel, _record_bytes(rec))
    return rec


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _send_dir(plan: ReplayPlan) -> str:
    from event_etl.storage.atomic import fsync_dir

    name = f"replay-{plan.replay_id}.jsonl"
    final = os.path.join(plan.target.where, name)
    part = os.path.join(plan.target.where, f".{name}.part")  # a dir: job ignores names starting with "."
    with open(part, "wb") as fh:
        for e in plan.send:
            fh.write(plan.wire(e).rstrip(b"\r") + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, final)
    fsync_dir(plan.target.where)
    return final


def _original_attributes(letter: DeadLetter) -> dict[str, str]:
    """A message a bus kept unclaimed goes back with the attributes it came with (its route among them: a bus
    routes it again); other dead letters keep no attributes."""
    from event_etl.rules.routing import UNCLAIMED_REASON, detail_attributes

    if letter.reason != UNCLAIMED_REASON:
        return {}
    return {k: v for k, v in detail_attributes(letter.detail).items()
            if k not in (REPLAY_ATTRIBUTE, REPLAY_OF_ATTRIBUTE)}


def _send_pubsub(plan: ReplayPlan) -> str:
    from event_etl.sources.pubsub import publisher_client

    client = publisher_client()
    futures = [client.publish(plan.target.where, plan.wire(e), **_original_attributes(e.letter),
                              **{REPLAY_ATTRIBUTE: plan.replay_id, REPLAY_OF_ATTRIBUTE: e.letter.source})
               for e in plan.send]
    for f in futures:
        f.result(timeout=120)
    return plan.target.where


def _send_kafka(plan: ReplayPlan) -> str:
    from confluent_kafka import Producer

    from event_etl.sources.kafka import kafka_config

    originals, missing = kafka_originals([e.letter.source for e in plan.send])
    if missing:
        plan.notes.append(f"{missing:,} sent without their original key and headers: their records are no longer in "
                          "Kafka (retention), or the cluster did not answer")
    prod = Producer(kafka_config())
    failed: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    ours = (REPLAY_ATTRIBUTE, REPLAY_OF_ATTRIBUTE)
    for e in plan.send:
        key, original = originals.get(e.letter.source, (None, []))
        headers: list[tuple[str, str | bytes | None]] = [h for h in original if h[0] not in ours]
        headers += [(REPLAY_ATTRIBUTE, plan.replay_id.encode()), (REPLAY_OF_ATTRIBUTE, e.letter.source.encode())]
        prod.produce(plan.target.where, value=plan.wire(e), key=key, on_delivery=delivered, headers=headers)
        prod.poll(0)
    left = prod.flush(60)
    if left or failed:
        from event_etl.errors import SourceError

        raise SourceError(f"{left or len(failed)} records not delivered to Kafka topic {plan.target.where}"
                          + (f": {failed[0]}" if failed else ""),
                          fix="check EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS and the topic; the replay is recorded as "
                              "sending: run the command again with --again and the same selection")
    return plan.target.where


KAFKA_POSITION = re.compile(r"kafka:(?P<topic>[^/]+)/(?P<partition>\d+)@(?P<offset>\d+)")
"""A dead letter's ``source`` when it came from Kafka (:func:`event_etl.sources.kafka.record_payload`)."""


_Originals = dict[str, tuple[bytes | None, list[tuple[str, bytes | None]]]]
"""A Kafka record's ``kafka:TOPIC/PARTITION@OFFSET`` -> its key and headers."""


def kafka_originals(sources: Sequence[str], *, gap: int = 1000, timeout: float = 10.0) -> tuple[_Originals, int]:
    """The key and headers of the Kafka records ``sources`` name (``kafka:TOPIC/PARTITION@OFFSET``), read back from
    the cluster: ``{source: (key, headers)}``, and how many could not be read (retention deleted them, the cluster
    did not answer).  Offsets of a partition less than ``gap`` apart are read as one range."""
    wanted: dict[tuple[str, int], set[int]] = {}
    for src in sources:
        m = KAFKA_POSITION.fullmatch(src)
        if m:
            wanted.setdefault((m["topic"], int(m["partition"])), set()).add(int(m["offset"]))
    out: _Originals = {}
    missing = 0
    for (topic, partition), offsets in sorted(wanted.items()):
        for run in _runs(sorted(offsets), gap):
            missing += len(run) - _read_run(topic, partition, run, timeout, out)
    return out, missing


def _runs(ordered: list[int], gap: int) -> list[list[int]]:
    """Sorted offsets cut where two are ``gap`` or more apart."""
    runs: list[list[int]] = [[ordered[0]]]
    for off in ordered[1:]:
        if off - runs[-1][-1] < gap:
            runs[-1].append(off)
        else:
            runs.append([off])
    return runs


def _read_run(topic: str, partition: int, run: list[int], timeout: float, out: _Originals) -> int:
    """Read the records of ``run`` (sorted offsets of one partition) into ``out``; how many were found."""
    from event_etl.errors import SourceError
    from event_etl.sources.kafka import read_messages

    want = set(run)
    found = 0
    try:
        for msgs in read_messages(topic, partition, run[0], run[-1] + 1, timeout=timeout):
            for msg in msgs:
                if msg.offset() in want:
                    out[f"kafka:{topic}/{partition}@{msg.offset()}"] = (msg.key(), list(msg.headers() or []))
                    found += 1
    except SourceError:
        pass
    except Exception as err:  # a KafkaException: the cluster did not answer; sent without
        if type(err).__module__.split(".")[0] != "confluent_kafka":
            raise
    return found
