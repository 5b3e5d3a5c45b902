"""Fault campaign: a known event set, a job killed over and over, and a check of every event by id.

    .venv/bin/python integration/campaigns/campaign.py                  # directory source -> local disk
    .venv/bin/python integration/campaigns/campaign.py --source pubsub  # Pub/Sub emulator -> GCS emulator
    .venv/bin/python integration/campaigns/campaign.py --sink gcs       # directory source -> GCS emulator
    .venv/bin/python integration/campaigns/campaign.py --source pubsub --sink local
    .venv/bin/python integration/campaigns/campaign.py --source kafka   # tansu (Kafka protocol), 4 partitions -> local
    .venv/bin/python integration/campaigns/campaign.py --source kafka --kafka-scenario retention   # noida-db (issue 48)
    .venv/bin/python -m integration.campaigns.campaign --iceberg  # Parquet, an Iceberg snapshot per complete hour (51)
    .venv/bin/python -m integration.campaigns.campaign --payload protobuf   # a Protobuf producer (56), any --source
    .venv/bin/python -m integration.campaigns.campaign --source pubsub --types 100   # a fleet of 100 types (58)
    .venv/bin/python -m integration.campaigns.campaign --source pubsub --bus 3   # a bus of 3 types (59); also kafka
    options: --events N --files F --seed S --kills K --sigterms T --workdir DIR --json FILE --fetch-partitions N
             --points all|source|P1,P2 --stops all|kills --kafka-partitions P --idle-partition none|quiet
             --broker tansu|noida --types N --bus N
             --kafka-scenario none|grow|retention|transactions|all

The event set spans more than six event-time hours, ending ten minutes before the real
clock: timely, out-of-order, late, too-late, future (ahead of the real clock), duplicate
(producer retries, inside the dedupe window) and invalid events (one of each bad-input
kind); a last wave comes from a producer whose clock runs 8 minutes fast.  The job runs as
users run it (`event-etl run ... --max-files-per-batch 1` in its own process group) and is
killed with SIGKILL at least ``--kills`` times: at chosen fault points (while a data file
is written, after the files and before the ledger, while duplicates are rewritten, between
the last file of an hour and its marker, between a marker and the state, after the state)
and at random moments; stopped ``--sigterms`` times with SIGTERM (graceful stop + drain),
half of them sent to the whole process group as `systemctl stop`, `timeout` and a closed
terminal do; SIGTERMed and then SIGKILLed during the drain, as Kubernetes does when the
grace period ends; SIGKILLed inside an idle tick; and stopped for longer than the type's
idle timeout while input piles up, then restarted with that backlog.  Each time it is
restarted on the same checkpoint; a last run drains.  With ``--stops kills`` only the SIGKILLs and the
SIGTERMs run: no drain cut short, no downtime, no double kill, no kill in an idle tick (those windows are the
same for every source, and the directory campaign stops at each; ``integration/test_campaign.py`` runs the Pub/Sub
campaign so).

A watcher takes a snapshot (names and sha256) of every hour folder when its ``_COMPLETE``
appears.  At the end, by event id:

- every valid event that was not too late is in exactly one bucket file (lost, duplicated);
- a record in a ``part-`` file is in its own hour and that hour was open when its batch ran;
  a record in a ``late-`` file is in a later hour, its own hour was complete and the later
  hour open when its batch ran (from the batch id in the file name and each manifest's
  ``last_batch``);
- too-late, future and invalid events are in the dead-letter area, each with its expected
  reason and its original bytes, and nowhere else;
- every hour from the first to the last has exactly one ``_COMPLETE``; each manifest lists
  exactly its folder's ``.avro`` files with the right counts, sizes and sha256;
- no hour folder changed after its marker appeared;
- no hour was marked before the real clock passed its end, unless a drain closed it (the
  fast producer clock must not close hours);
- no event that was timely when it was sent was judged late (an hour closed early: by a
  wrong watermark, or an idle advance while input waited), except in hours a drain closed.

It prints a table of these figures and exits non-zero if any of them is wrong.

Kafka (``--source kafka``): each wave of events is produced to a topic of ``--kafka-partitions``
partitions (4) on tansu, a Kafka-protocol broker (:class:`tests.lib.servers.KafkaBroker`, memory
storage), the events dealt round robin over the partitions, one record per produce request (tansu's
reported high watermark is exact only then).  With ``--idle-partition quiet`` (the default) the last
partition gets nothing for a stretch of the waves (:data:`IDLE_WAVES`, ~12 % of them) while the
others take its share, then wakes up: runs are killed while it is idle and after it woke.  tansu
answers neither CreatePartitions nor DeleteRecords nor AlterConfigs: those run on noida-db.

``--kafka-scenario`` (noida-db, :class:`tests.lib.servers.NoidaKafka`, which reports true high watermarks and
takes records in batches), on top of the same kills:

- ``grow``: the topic starts with ``--kafka-partitions`` - 2 partitions and gains one at each of
  :data:`GROW_STEPS`: while the job is down (after a SIGKILL at a batch step) and while it runs (then a batch,
  then a SIGKILL at a random moment); the waves are dealt over every partition from then on.
- ``retention``: at each of :data:`DELETE_STEPS` the job catches up (the input held back) and is SIGKILLed with
  nothing planned unread; a backlog is released and records of it deleted unread, by ``DeleteRecords`` (half of
  the partitions, 40-100 % of what is unread) or by ``retention.ms`` lowered to 1 s (all of it), each deleted
  record read first.  A run with ``EVENT_ETL_KAFKA_ON_DATA_LOSS=fail`` must exit 1 with ``error:`` and ``fix:``
  and plan nothing past the loss; the runs after it skip, and ``LOST`` (progress lines, each batch once, and the
  checkpoint's offsets) must equal the offsets deleted unread.  The deleted records are then expected nowhere.
- ``transactions``: the waves of :data:`TX_WAVES` are each produced in one committed transaction; some are
  preceded by a transaction of ghost records (valid and malformed) that is aborted, or have one open beside them
  that is aborted after they commit, and some are held open 1-2.5 s while the job plans.  No ghost may reach the
  buckets or the dead-letter area.

``all`` runs the three together; on noida-db 0.2.3 it can fail for the broker's sake: once a deletion cuts into
an aborted transaction, noida-db serves the rest of its records to ``read_committed`` consumers (RELIABILITY.md).
``LOST`` counts offsets: on a transactional topic, deleted markers and aborted records too.

Every scenario ends with the checks above: each committed, surviving record exactly once in the hour of its
event time, no hour marked before its events were read (RELIABILITY.md, issue 48).

A fleet (``--types N``, N > 1, Pub/Sub only; issue 58 item 6): N copies of the type, ``pv_0001`` .. ``pv_N``, each
with its own topic and subscription on the emulator (its ``source`` and ``[pubsub]`` table), run as one fleet in one
Spark application (``event-etl run --all --event-types DIR --checkpoint-root CK``: its types pull in turns on the
shared pullers, their leases are renewed by one scheduler, a stop stops their sources together).  One event set as
for one type, each event given to one type (by its id, so a producer retry goes where its original went; the
invalid ones round robin): every type has its share of every wave and of every kind, and its own expected output.
The runs are killed at each of Pub/Sub's points (in a fleet ``pulled``, ``spooled`` and ``spool_acked`` fire in the
pool's threads) and at a lease's renewal (``lease_renew``: read and still the job's, the compare-and-swap not yet
written; once a batch has run), ``--points`` naming others or ``all``; SIGTERMed; SIGTERMed and then SIGKILLed during
the stop (the drains, type after type, or the sources' stop); a last run drains.  A run pauses only at the point it
is to be killed at (:data:`FLEET_PAUSES`).  Every check above is made per type (its share, its hours, its dead
letters: a record in another type's folder is "invalid in buckets"), plus: each marker's watermark past its hour's
end, and no type written by two jobs (each run writes its fault points to a log of its own, which its Spark workers
inherit: once a run wrote a data file of a type or renewed its lease, no earlier run does).  Shown, not judged: the
writes of a killed run's orphaned Spark workers (PySpark's daemon runs in a process group of its own) after its
driver died; hours the idle rule closed while their events waited unread; each SIGTERM's time to the first drain
and to the exit.  Judged besides: types quarantined or not drained, runs that failed (exit > 0), and stops that did
not end within 120 s + 12 s a type (a hang).

A bus (``--bus N``, Pub/Sub or Kafka on noida-db, local disk; issue 59 item 6): N copies of the type, ``bus_a`` ..,
that name one subscription or topic and are routed by the attribute (Kafka header) ``type``, run as a fleet
(``run --all --checkpoint-root``: one source session for the bus, its spool in ``ck/_bus/<bus id>/``).  The events are
dealt as for a fleet, but the last type is quiet from :data:`BUS_QUIET_FROM` of the waves on (its share to the
others: its last hours close by the idle rule or the drain while the bus stays busy), and every wave carries
:data:`BUS_UNCLAIMED` more messages no type claims (half without the attribute, half with a value nobody claims).
Besides the fleet's stops, one run blocks a type's sink folder (:data:`BUS_QUARANTINED`: the folder replaced by a
file until the run says the type is quarantined and the others have gone on; then back, and the type must come back,
catch up and commit) and is then SIGKILLed.  Every fleet check per type, plus: every unclaimed message kept exactly
once in ``<sink>/_unclaimed/<bus id>/`` (reason ``unclaimed``, its detail saying why), none in a type's buckets or
dead letters; the quarantine happened and ended; the quiet type's hours after its last event and what closed them.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from event_etl.eventtypes import load_event_type  # noqa: E402
from event_etl.rules.buckets import DEADLETTER_DIR, MARKER_NAME, parse_data_file_name, parse_hour_dir  # noqa: E402
from event_etl.rules.compaction import is_merged_name  # noqa: E402
from event_etl.rules.manifest import Manifest  # noqa: E402
from event_etl.rules.routing import UNCLAIMED_DIR, UNCLAIMED_REASON, bus_id  # noqa: E402
from event_etl.storage import Storage  # noqa: E402
from event_etl.storage.avroio import encode_single_object  # noqa: E402
from event_etl.timeutil import HOUR_MS, MINUTE_MS, iso, now_millis  # noqa: E402

EXE = str(Path(sys.executable).with_name("event-etl"))
FAULT_POINTS = ("write_file", "files_written", "duplicates_rewritten", "before_marker", "after_marker", "state_saved",
                "merge_write", "merged_written", "merge_recorded",  # these three: merging an hour's small files
                "offset_written")  # a round's end offsets durable, its batch not begun
# pulled, not spooled; durable, not acknowledged; during an acknowledgement; acknowledged, not offered; Spark committed
# a batch, its segments not yet deleted
PUBSUB_POINTS = ("pulled", "spooled", "acknowledging", "spool_acked", "segments_committed")
# a renewal of a type's sink lease: read and found still the job's own, the compare-and-swap not yet written (--types N)
LEASE_POINT = "lease_renew"
# --iceberg: a marker durable and read back, the policy not run; inside the commit (the snapshot built, the catalog not
# told); committed, the chain's record not saved
ICEBERG_POINTS = ("before_policy", "iceberg_commit", "iceberg_committed")
ICEBERG_PAUSES = ",before_policy=0.1,iceberg_commit=0.3,iceberg_committed=0.3"
DATA_SUFFIXES = (".avro", ".parquet")
PAUSES = ("write_file=0.02,files_written=0.15,duplicates_rewritten=0.3,before_marker=0.25,after_marker=0.25,"
          "state_saved=0.1,merge_write=0.05,merged_written=0.2,merge_recorded=0.2,drain=0.5,idle_advance=0.5,pulled=0.05,spooled=0.1,acknowledging=0.2,"
          "spool_acked=0.1,segments_committed=0.2")
# --types N (a fleet): a run pauses only at the point it is to be killed at (and less): every type passes every point,
# one type's batch end, marker and drain after another's, and pauses at all of them made a round of 20 types' batches
# take 12 s more and a hundred types' drain a minute
FLEET_PAUSES = {"write_file": 0.02, "files_written": 0.1, "duplicates_rewritten": 0.1, "before_marker": 0.1,
                "after_marker": 0.1, "state_saved": 0.1, "merge_write": 0.02, "merged_written": 0.1,
                "merge_recorded": 0.1, "drain": 0.1, "idle_advance": 0.1, "offset_written": 0.05, "pulled": 0.05,
                "spooled": 0.1, "acknowledging": 0.1, "spool_acked": 0.1, "segments_committed": 0.1, "lease_renew": 0.1}
FLEET_PREFIX = "pv_"  # --types N: the types pv_0001 .. pv_N, each a copy of page_view with its own topic
# --bus N (issue 59 item 6): the types bus_a .. bus_<N>, copies of page_view that share one subscription or topic,
# routed by the attribute (Kafka header) BUS_ATTRIBUTE; the last type is quiet (gets nothing) from BUS_QUIET_FROM of
# the waves on; BUS_UNCLAIMED of each wave's messages more carry no attribute or a value no type claims
BUS_PREFIX = "bus_"
BUS_ATTRIBUTE = "type"
BUS_UNCLAIMED_VALUE = "refunds"
BUS_QUIET_FROM = 0.35
BUS_UNCLAIMED = 0.06
BUS_QUARANTINED = 1  # --bus N: the type whose sink folder is blocked for a while (bus_b): quarantined, then back
MAX_EVENTS_PER_FILE = 40  # the campaign's type: batches of a few dozen events write small files, merged
IDLE_TIMEOUT_S = 20  # the campaign's type: longer than a run waits for input, shorter than its downtimes
# The job's lease (EVENT_ETL_LEASE_TTL): on an object store a run started after a SIGKILL waits until the dead run's
# lease has expired, ttl + ttl / 4 after its last renewal (75 s at the default 60 s: most of a Pub/Sub -> GCS run's
# time); 20 s keeps that takeover in every restart, and a renewal every 5 s is still far inside it
LEASE_TTL = "20s"
FAST_CLOCK_MS = 8 * MINUTE_MS
AHEAD = 4  # batches of input made available ahead of the job
RESERVE_PER_RUN = 4  # batches kept back for every run still planned: the input lasts as long as the kills do
IDLE_WAVES = (0.30, 0.42)  # Kafka: the share of the waves during which the last partition gets nothing
# Kafka on noida-db (--kafka-scenario, issue 48): where in the plan (its share of the runs) each step comes
KAFKA_SCENARIOS = ("grow", "retention", "transactions")
GROW_STEPS = ((0.20, "GROW_DOWN"), (0.38, "GROW_LIVE"), (0.55, "GROW_DOWN"), (0.72, "GROW_LIVE"))  # +1 each
DELETE_STEPS = ((0.30, "DELETE_RECORDS"), (0.62, "RETENTION"))
TX_WAVES = (0.15, 0.90)  # the share of the waves produced in transactions
ABORT_SHARE = 0.4  # of those waves, the share with an aborted transaction of ghosts (half of them interleaved)
HOLD_OPEN_SHARE = 0.2  # of those waves, the share whose transaction is held open 1-2.5 s before its commit
RETENTION_KEEP_MS = 7 * 24 * 3600 * 1000  # retention.ms put back after a retention step
KEY_LOST_WRONG = "LOST said (progress lines, checkpoint) minus the offsets deleted unread"
KEY_FAIL_RUNS_WRONG = "fail runs not stopped with exit 1, the error and the fix, or planned past the loss"
KEY_DELETIONS_MISSED = "deletion steps that deleted nothing unread"
VALID_KINDS = ("timely", "out_of_order", "late", "fast_clock")  # in exactly one bucket file
INVALID_KINDS = {  # kind -> expected dead-letter reason
    "malformed_json": "invalid_json", "wrong_shape": "not_an_object", "wrong_type": "schema_mismatch",
    "missing_field": "missing_field", "missing_time": "missing_time", "bad_time": "invalid_time",
    "empty": "empty_payload", "non_utf8": "invalid_utf8", "oversized": "oversized",
    "avro_unknown_fingerprint": "unknown_schema", "avro_truncated": "invalid_avro",
}


LOST_LINE = re.compile(r"\] batch (\d+)(?: \(replay\))?: [^\n]*?LOST ([\d,]+) \(")


def last_id(folder: Path) -> int | None:
    """The largest batch id among a Spark log folder's files (``offsets``, ``commits``), or None."""
    ids = [int(f.name) for f in folder.iterdir() if f.name.isdigit()] if folder.is_dir() else []
    return max(ids) if ids else None


def kafka_scenarios(args) -> set[str]:
    """``--kafka-scenario``: none, one of :data:`KAFKA_SCENARIOS`, or all."""
    chosen = getattr(args, "kafka_scenario", "none") or "none"
    return set(KAFKA_SCENARIOS) if chosen == "all" else set() if chosen == "none" else {chosen}


def kafka_broker_kind(args) -> str:
    """``--broker``: tansu or noida; by default noida with a scenario (tansu refuses what they do), else tansu."""
    kind = getattr(args, "broker", None) or ("noida" if kafka_scenarios(args) else "tansu")
    if kind == "tansu" and kafka_scenarios(args):
        raise SystemExit("--kafka-scenario needs --broker noida: tansu refuses CreatePartitions, DeleteRecords and "
                         "AlterConfigs, and reports high watermarks below what it serves")
    return kind


@dataclass
class Event:
    id: str | None
    t: int | None
    kind: str
    payload: bytes
    reason: str | None = None  # expected dead-letter reason


@dataclass
class EventSet:
    batches: list[tuple[int, list[Event]]] = field(default_factory=list)  # (arrival ms, events)

    @property
    def events(self) -> list[Event]:
        return [e for _, evs in self.batches for e in evs]


def span_of(files: int) -> int:
    """Event time the set spans: at least 6.5 hours, and about five batches per hour (kills at markers come often)."""
    return max(6 * HOUR_MS + 30 * MINUTE_MS, files * HOUR_MS // 5)


def make_events(et, *, events: int, files: int, seed: int, start: int, future_from: int | None = None) -> EventSet:
    """The known event set: ``files`` arrivals over :func:`span_of` event time from ``start``.

    ``future_from``: the instant "future" events are ahead of (the publish time, for Pub/Sub,
    where every message arrives when it is published); default: each batch's arrival."""
    rng = random.Random(seed)
    schema = et.parsed_schema()
    span = span_of(files)
    per = max(20, events // files)
    out = EventSet()
    recent: list[Event] = []
    invalid_cycle = list(INVALID_KINDS)

    def rec(eid: str, t: int) -> dict:
        return {"event_id": eid, "event_time": t, "anonymous_id": f"a{rng.randint(1, 10**6)}",
                "session_id": f"s{rng.randint(1, 10**6)}", "product_id": f"sku-{rng.randint(1, 9999)}",
                "page_url": "https://shop.example.com/p/1", "device_type": rng.choice(["DESKTOP", "MOBILE", "TABLET"])}

    def valid(kind: str, t: int, reason: str | None = None) -> Event:
        eid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return Event(eid, t, kind, json.dumps(rec(eid, t)).encode(), reason)

    for k in range(files):
        arrival = start + (k + 1) * span // files
        slice_start = start + k * span // files
        evs: list[Event] = []
        for i in range(per):
            a_i = slice_start + (arrival - slice_start) * i // per
            u = rng.random()
            window = [e for e in recent[-60:] if e.t >= a_i - 8 * MINUTE_MS]
            if u < 0.03 and window:  # a producer retry of a recent event, inside the 10-minute dedupe window
                orig = rng.choice(window)
                evs.append(Event(orig.id, orig.t, "duplicate", orig.payload))
            elif u < 0.06:
                evs.append(valid("late", arrival - arrival % HOUR_MS - rng.randint(30, 90) * MINUTE_MS))
            elif u < 0.07:
                # more than allowed_lateness (24 h) behind the whole event set's first hour: too late however far
                # behind the job runs (a day and a half behind its own batch was not, when a batch after a downtime
                # took waves 10 hours of event time ahead of the watermark it was judged against: the Pub/Sub
                # campaign in CI on 2026-11-29, its too_late events written late, as the rules say)
                evs.append(valid("too_late", arrival - span - rng.randint(26, 30) * HOUR_MS, "too_late"))
            elif u < 0.08:
                evs.append(valid("future", max(arrival, future_from or 0) + rng.randint(60, 180) * MINUTE_MS, "future"))
            elif u < 0.10 or (k == 0 and i < len(invalid_cycle)):
                kind = invalid_cycle[(k * per + i) % len(invalid_cycle)]
                payload = invalid_payload(kind, rec, schema, et, a_i, rng)
                evs.append(Event(None, None, kind, payload, INVALID_KINDS[kind]))
            elif u < 0.15:
                evs.append(valid("out_of_order", a_i - rng.randint(60, 110) * 1000))
            else:
                e = valid("timely", a_i - rng.randint(0, 60) * 1000)
                evs.append(e)
                recent.append(e)
        out.batches.append((arrival, evs))
    # the last wave: a producer whose clock runs 8 minutes fast (stamped when it is released, see Campaign)
    fast = []
    for _ in range(max(5, per // 4)):
        eid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        fast.append(Event(eid, None, "fast_clock", b""))
    out.batches.append((out.batches[-1][0], fast))
    return out


def stamp_fast_clock(events: list[Event], now: int, rng: random.Random) -> None:
    """Stamp the fast producer's events at release: up to 8 minutes ahead of the real clock."""
    for e in events:
        e.t = now + FAST_CLOCK_MS - rng.randint(0, 60) * 1000
        e.payload = json.dumps({"event_id": e.id, "event_time": e.t, "anonymous_id": "a-fast", "session_id": "s-fast",
                                "product_id": "sku-1", "page_url": "https://shop.example.com/p/1",
                                "device_type": "MOBILE"}).encode()


def invalid_payload(kind: str, rec, schema, et, t: int, rng: random.Random) -> bytes:
    r = rec("bad", t)
    if kind == "malformed_json":
        return json.dumps(r).encode()[:-9]
    if kind == "wrong_shape":
        return json.dumps([r]).encode()
    if kind == "wrong_type":
        r["device_type"] = 42
        return json.dumps(r).encode()
    if kind == "missing_field":
        del r["session_id"]
        return json.dumps(r).encode()
    if kind == "missing_time":
        del r["event_time"]
        return json.dumps(r).encode()
    if kind == "bad_time":
        r["event_time"] = "yesterday at noon"
        return json.dumps(r).encode()
    if kind == "empty":
        return b""
    if kind == "non_utf8":
        return b'{"event_id": "\xff\xfe\xfd"}'
    if kind == "oversized":
        r["page_url"] = "https://shop.example.com/" + "x" * (et.max_payload_bytes + 10)
        return json.dumps(r).encode()
    soe = encode_single_object(schema, et.fingerprint, r)
    if kind == "avro_unknown_fingerprint":
        return base64.b64encode(soe[:2] + bytes(8) + soe[10:])
    if kind == "avro_truncated":
        return base64.b64encode(soe[: len(soe) // 2])
    raise ValueError(kind)


PROTOBUF_INVALID = {  # a JSON invalid kind -> what a Protobuf producer's bad payload is instead, and its reason
    "malformed_json": ("cut short", "invalid_protobuf"), "wrong_shape": ("random bytes", "invalid_protobuf"),
    "wrong_type": ("an enum number without a symbol", "schema_mismatch"),
    "missing_field": ("a known field of another wire type", "invalid_protobuf"),
    "missing_time": ("no event time", "missing_time"), "bad_time": ("a timestamp past year 9999", "schema_mismatch"),
    "empty": ("empty", "empty_payload"), "non_utf8": ("a string that is not UTF-8", "invalid_protobuf"),
    "oversized": ("oversized", "oversized"), "avro_unknown_fingerprint": ("a message of another type",
                                                                         "invalid_protobuf"),
    "avro_truncated": ("cut short", "invalid_protobuf"),
}


class ProtobufProducer:
    """``--payload protobuf`` (issue 56): the campaign's events as a Protobuf producer sends them (the page view
    message of :data:`tests.lib.dialects.PAGE_VIEW_PROTO`): each valid event its message, each invalid kind a bad
    payload of its own (:data:`PROTOBUF_INVALID`); a folder source's lines are base64."""

    def __init__(self, types: Path, *, lines: bool) -> None:
        from tests.lib.dialects import PAGE_VIEW_PROTO, compile_proto, message_class

        d = types / "page_view"
        compile_proto(d / "proto", {"page_view.proto": PAGE_VIEW_PROTO}, out=str(d / "schema.desc"))
        (d / "schema.avsc").unlink()  # its schema: the one derived from the message
        shutil.rmtree(d / "schemas", ignore_errors=True)
        self.cls = message_class(d / "schema.desc", "shop.events.ProductPageViewed")
        self.ts = message_class(d / "schema.desc", "google.protobuf.Timestamp")
        self.lines = lines

    @staticmethod
    def settings() -> str:
        return ('payload = "protobuf"\nprotobuf_message = "shop.events.ProductPageViewed"\n'
                'protobuf_timestamps = "millis"\n')

    def _wire(self, raw: bytes) -> bytes:
        return base64.b64encode(raw) if self.lines and raw else raw

    def message(self, rec: dict) -> bytes:
        from tests.lib.dialects import page_view_message

        return page_view_message(self.cls, rec).SerializeToString()

    def convert(self, events: list[Event], max_bytes: int) -> None:
        """Each event's payload (a JSON record, or a JSON invalid kind) as the Protobuf producer sends it."""
        for e in events:
            if e.reason is not None and e.kind in PROTOBUF_INVALID:
                e.reason = PROTOBUF_INVALID[e.kind][1]
                e.payload = self._wire(self._invalid(e.kind, max_bytes))
            elif e.payload:
                e.payload = self._wire(self.message(json.loads(e.payload)))

    def _invalid(self, kind: str, max_bytes: int) -> bytes:
        rec = {"event_id": str(uuid.uuid4()), "event_time": now_millis(), "anonymous_id": "a", "session_id": "s",
               "product_id": "p", "page_url": "u", "device_type": "MOBILE"}
        good = self.message(rec)
        what = PROTOBUF_INVALID[kind][0]
        far = b"\x08" + _varint(2**38)  # Timestamp.seconds past year 9999
        return {"cut short": good[:-3], "random bytes": b"\xff" * 11,
                "an enum number without a symbol": good + b"\x60\x2a",
                "a known field of another wire type": b"\x08\x01" + good,
                "no event time": self.message({**rec, "event_time": None}),
                "a timestamp past year 9999": good + b"\x12" + _varint(len(far)) + far,
                "empty": b"", "a string that is not UTF-8": good + b"\x22\x02\xff\xfe",
                "oversized": good + b"\x5a" + _varint(max_bytes + 10) + b"x" * (max_bytes + 10),
                "a message of another type": self.ts(seconds=1_800_000_000, nanos=5).SerializeToString()}[what]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


class Watcher(threading.Thread):
    """Snapshots every hour folder when its marker appears."""

    def __init__(self, storage: Storage, event_type: str) -> None:
        super().__init__(daemon=True)
        self.storage, self.et = storage, event_type
        self.snapshots: dict[str, dict[str, str]] = {}
        self.stop_event = threading.Event()

    def folders(self) -> list[str]:
        out = []
        for day in self.storage.list_dirs(self.et):
            if day.startswith("dt="):
                out += [f"{self.et}/{day}/{h}" for h in self.storage.list_dirs(f"{self.et}/{day}")]
        return out

    def snapshot(self, rel: str) -> dict[str, str]:
        return {n: hashlib.sha256(self.storage.read(f"{rel}/{n}")).hexdigest() for n in self.storage.list_files(rel)
                if not n.startswith(".")}

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            try:
                for rel in self.folders():
                    if rel not in self.snapshots and MARKER_NAME in self.storage.list_files(rel):
                        self.snapshots[rel] = self.snapshot(rel)
            except Exception:  # noqa: BLE001 - the sink may be mid-write or down; try again
                continue


def fleet_names(n: int) -> list[str]:
    """``--types N``: the fleet's event types, ``pv_0001`` .. ``pv_N``."""
    return [f"{FLEET_PREFIX}{i:04d}" for i in range(1, n + 1)]


def bus_names(n: int) -> list[str]:
    """``--bus N``: the bus's event types, ``bus_a`` .. (at most 26)."""
    return [f"{BUS_PREFIX}{chr(ord('a') + i)}" for i in range(n)]


class FaultLog:
    """``--types N``: the fault points every run reached, each run's in a file of its own (its ``EVENT_ETL_FAULT_LOG``,
    which its Spark workers inherit), read as the files grow: a fleet's points come by the thousand a minute, and a
    line names its run whatever process wrote it (a Python worker's pid says nothing of its job)."""

    def __init__(self) -> None:
        self.files: list[tuple[int, Path]] = []
        self.offsets: dict[Path, int] = {}
        self.seen: list[tuple[str, int]] = []  # (point, pid), as faults_seen() gives them
        self.entries: list[tuple[str, int, float, str, int]] = []  # (point, pid, monotonic time, detail, run)
        self.counts: Counter = Counter()  # (point, pid) -> lines
        self.lock = threading.Lock()

    def add(self, run: int, path: Path) -> None:
        with self.lock:
            self.files.append((run, path))

    def read(self) -> list[tuple[str, int]]:
        with self.lock:
            for run, path in self.files:
                try:
                    with open(path, "rb") as fh:
                        fh.seek(self.offsets.get(path, 0))
                        data = fh.read()
                except FileNotFoundError:
                    continue
                end = data.rfind(b"\n") + 1  # whole lines only: the rest is still being written
                self.offsets[path] = self.offsets.get(path, 0) + end
                for line in data[:end].decode("utf-8", "replace").splitlines():
                    parts = line.split(" ", 3)
                    if len(parts) >= 3:
                        name, pid, t = parts[0], int(parts[1]), float(parts[2])
                        self.seen.append((name, pid))
                        self.counts[(name, pid)] += 1
                        self.entries.append((name, pid, t, parts[3] if len(parts) > 3 else "", run))
            return self.seen


class SinkIndex:
    """``--types N``: the whole sink in one listing per look (a hundred types' folders listed one by one would be
    thousands of requests to the GCS emulator), and what each Avro file holds (a data file's event ids, a dead-letter
    file's records), read once per name and size.

    A listing is made at most every three times as long as the last one took (at least a second): the emulator lists
    a bucket of a few thousand objects in 1-2 s, and listed back to back (the watcher every 0.5 s, the accounting
    every second) it answered the job's lease renewals ten times slower (p90 282 ms, 744 ms at most, against 52 and
    94), so that a hundred types' renewals fell behind their leases and the types were quarantined (RELIABILITY.md).
    Its own file system client: a listing fills gcsfs's cache of folders, from which a read in another thread of the
    same client could be answered "not found"."""

    def __init__(self, url: str) -> None:
        self.st = Storage(url, skip_instance_cache=True)
        self._ids: dict[tuple[str, int], list[str]] = {}
        self._dls: dict[tuple[str, int], int] = {}
        self._last: dict[str, int] | None = None
        self._next = 0.0  # monotonic: no new listing before then
        self.lock = threading.Lock()

    def listing(self, fresh: bool = False) -> dict[str, int]:
        """``{relative path: size}`` of every object or file in the sink (the last listing if it is recent, unless
        ``fresh``)."""
        with self.lock:
            if not fresh and self._last is not None and time.monotonic() < self._next:
                return self._last
            began = time.monotonic()
            self._last = self._list()
            self._next = time.monotonic() + max(1.0, 3 * (time.monotonic() - began))
            return self._last

    def _list(self) -> dict[str, int]:
        st = self.st
        if st.local:
            out = {}
            for folder, _, names in os.walk(st.root):
                rel_dir = os.path.relpath(folder, st.root)
                for n in names:
                    try:
                        out[n if rel_dir == "." else f"{rel_dir}/{n}"] = os.path.getsize(os.path.join(folder, n))
                    except FileNotFoundError:
                        continue
            return out
        st.fs.invalidate_cache()
        root = st.root.rstrip("/") + "/"
        found = st.fs.find(root, detail=True)
        return {path[len(root):]: int(info.get("size") or 0) for path, info in found.items()
                if path.startswith(root) and info.get("type") != "directory"}

    def accounted(self) -> int:
        """Distinct event ids in the types' hour folders plus dead-letter records, a bus's unclaimed ones too
        (:meth:`Campaign.accounted`)."""
        ids: set[str] = set()
        dls = 0
        for rel, size in self.listing().items():
            parts = rel.split("/")
            if not rel.endswith(".avro") or parts[-1].startswith(".") or len(parts) < 3:
                continue
            key = (rel, size)
            if parts[1] == DEADLETTER_DIR or parts[0] == UNCLAIMED_DIR:  # a type's dead letters, a bus's unclaimed
                if key not in self._dls:
                    import fastavro

                    self._dls[key] = sum(1 for _ in fastavro.reader(io.BytesIO(self.st.read(rel))))
                dls += self._dls[key]
            elif parts[1].startswith("dt="):
                if key not in self._ids:
                    self._ids[key] = _event_ids(rel, self.st.read(rel))
                ids.update(self._ids[key])
        return len(ids) + dls


def _merge_into(src: Path, dst: Path) -> None:
    """Move what a folder holds into another (a writer made it again while it was being swapped), then remove it."""
    for root, _, files in os.walk(src):
        for f in files:
            target = dst / Path(root).relative_to(src) / f
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(root) / f, target)
    shutil.rmtree(src, ignore_errors=True)


def _block(folder: Path, away: Path) -> None:
    """``folder`` moved to ``away`` and a file put in its place: nothing can be written under it, even by root."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():
        os.rename(folder, away)
    else:
        away.mkdir()
    while True:
        try:
            os.close(os.open(folder, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return
        except FileExistsError:
            _merge_into(folder, away)


def _unblock(folder: Path, away: Path) -> None:
    """:func:`_block` undone: the file removed and the folder put back."""
    os.unlink(folder)
    while True:
        try:
            os.rename(away, folder)
            return
        except OSError:  # a writer made the folder again in between: what it wrote goes with the rest
            _merge_into(folder, away)


class FleetWatcher(Watcher):
    """``--types N``: :class:`Watcher` over every type's hour folders, finding new markers in one listing of the
    sink per look (:class:`SinkIndex`)."""

    def __init__(self, storage: Storage, index: SinkIndex) -> None:
        super().__init__(storage, "")
        self.index = index

    def folders(self, fresh: bool = True) -> list[str]:
        return sorted({rel.rsplit("/", 1)[0] for rel in self.index.listing(fresh=fresh)
                       if rel.endswith("/" + MARKER_NAME) and "/dt=" in rel and DEADLETTER_DIR not in rel})

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            try:
                for rel in self.folders(fresh=False):
                    if rel not in self.snapshots:
                        self.snapshots[rel] = self.snapshot(rel)
            except Exception:  # noqa: BLE001 - the sink may be mid-write or down; try again
                continue


def _event_ids(name: str, data: bytes) -> list[str]:
    """The ``event_id`` of every record of a data file, Avro or Parquet (``--iceberg``)."""
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        return [str(i) for i in pq.read_table(io.BytesIO(data), columns=["event_id"]).column("event_id").to_pylist()]
    import fastavro

    return [str(r["event_id"]) for r in fastavro.reader(io.BytesIO(data))]


class LineageTail(threading.Thread):
    """``--policies``: reads the OpenLineage events the job's ``openlineage`` policy appends to its file, as they come,
    and notes for each whether its hour's marker was in the sink at that moment (a notice must never come first)."""

    def __init__(self, path: Path, storage: Storage) -> None:
        super().__init__(daemon=True)
        self.path, self.storage = path, storage
        self.events: list[tuple[str, bool]] = []  # (hour folder, marker there when the event was seen)
        self.stop_event = threading.Event()
        self._offset = 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # whole lines only: the rest is still being written
        self._offset += end
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            name = json.loads(line)["outputs"][0]["name"]
            rel = "page_view/" + name.split("/page_view/", 1)[1].strip("/")
            self.events.append((rel, MARKER_NAME in self.storage.list_files(rel)))

    def run(self) -> None:
        while not self.stop_event.wait(0.05):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the sink may be mid-write; try again
                continue


class Campaign:
    def __init__(self, args) -> None:
        self.args = args
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="event_etl-campaign-"))
        if self.work.exists() and args.workdir:
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.et = load_event_type(ROOT / "event_types" / "page_view")
        self.rng = random.Random(args.seed)
        self.fault_log = self.work / "faults.log"
        self.servers: list = []
        self.env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_FAULT_LOG": str(self.fault_log),
                    "EVENT_ETL_FAULT_PAUSE": PAUSES, "EVENT_ETL_LEASE_TTL": LEASE_TTL}
        if getattr(args, "fetch_partitions", 0):
            self.env["EVENT_ETL_PUBSUB_FETCH_PARTITIONS"] = str(args.fetch_partitions)
        self.kills = Counter()
        self.kafka_kills = Counter()  # Kafka: stops that hit, by where the idle partition was (kafka_phase)
        self.runs = 0
        self.current: subprocess.Popen | None = None
        self.runs_left = args.kills + args.sigterms
        # --stops all: also a drain cut short, a downtime, a double kill and a kill in an idle tick
        self.every_stop = getattr(args, "stops", "all") == "all"
        self.reserve = RESERVE_PER_RUN  # batches kept back for each run still planned (fewer for a long plan)
        self.event_types_dir: str | None = None
        self.release_lock = threading.Lock()
        self._last_committed = (0, time.monotonic())
        # Kafka on noida-db (issue 48): the scenarios, what they did, and what they expect
        self.scenarios = kafka_scenarios(args)
        self.broker_kind = kafka_broker_kind(args)
        self.hold = threading.Event()  # set: the feeder releases nothing (a scenario step needs the input still)
        self.deleted: Counter = Counter()  # payloads of the records deleted unread (one per copy)
        self.deletions: list[dict] = []  # one per deletion: how, partitions, offsets and records deleted, fail run
        self.growth: list[str] = []  # partitions added: "2->3 while down (wave 30)", ...
        self.aborted: list[Event] = []  # records produced in aborted transactions: never in the sink
        self.tx = Counter()  # transactions: committed, aborted, held open, interleaved; stops while one was open
        self.tx_open = False
        # --types N (N > 1): a fleet of Pub/Sub types in one application (issue 58 item 6)
        # --bus N (N > 1): N types of one Pub/Sub subscription or Kafka topic, routed by an attribute (issue 59 item 6):
        # a fleet in everything else (one application, its checks per type)
        self.bus = (getattr(args, "bus", 0) or 0) > 1
        self.names = bus_names(args.bus) if self.bus else fleet_names(getattr(args, "types", 1) or 1)
        self.fleet = len(self.names) > 1
        self.unclaimed_waves: list[list[Event]] = []  # --bus N: each wave's messages no type claims
        self.quarantines: list[tuple[int, str, str]] = []  # --bus N: (run, type, what happened) of a blocked sink
        self.spans: list[tuple[int, int, float, float, int | None]] = []  # each run: (run, pid, start, end, exit code)
        self.released_at: dict[int, int] = {}  # wave -> when it was published or moved in (ms)
        self.stop_kills: Counter = Counter()  # --types N: where a SIGKILL after a SIGTERM landed (drain, stop)
        self.stop_timeouts: list[str] = []  # runs that did not end within the time a stop may take: SIGKILLed
        # the time a stop may take: a fleet's drain stops its types' pulling one after the other, each Fetcher.stop
        # waiting up to 10 s for its stream's turn in the shared pool (RELIABILITY.md, issue 58 item 6)
        self.stop_wait = 120 + 12 * (len(self.names) - 1)
        self.stop_times: list[str] = []  # --types N: each SIGTERM: to the first type's drain, to the exit
        if self.fleet:
            self.env["EVENT_ETL_FAULT_PAUSE"] = ""  # a run's own: run_env()
            self.flog = FaultLog()

    # -- the source and the sink -----------------------------------------------------------
    def prepare(self) -> None:
        if self.bus:
            self.prepare_bus()
            return
        if self.fleet:
            self.prepare_fleet()
            return
        # The type, copied: an idle timeout a campaign can wait out, and for Pub/Sub (which delivers
        # out of order while the campaign publishes several batches ahead, and redelivers what a killed
        # run held once its 60-s ack deadline ran out: hours of the campaign's fast event clock later) a
        # dedupe window that spans that reordering (a day of event time, not the default 10 min).
        types = self.work / "types"
        shutil.copytree(ROOT / "event_types" / "page_view", types / "page_view")
        toml = types / "page_view" / "etl.toml"
        extra = f'idle_timeout = "{IDLE_TIMEOUT_S}s"\n'
        if self.args.source == "pubsub":
            extra += 'dedupe_window = "24h"\n'
        # small files merge: a few dozen events a batch, files of MAX_EVENTS_PER_FILE
        extra += f"max_events_per_file = {MAX_EVENTS_PER_FILE}\n"
        text = toml.read_text().replace('idle_timeout = "5m"\n', "").replace("max_events_per_file = 500000\n", "")
        if getattr(self.args, "policies", False):  # an OpenLineage event per complete hour, into a file
            text += '\n[[commit_policy]]\nkind = "openlineage"\nnamespace = "campaign"\n'
            self.lineage_log = self.work / "lineage.jsonl"
            config = self.work / "openlineage.yml"
            config.write_text(f"transport:\n  type: file\n  log_file_path: {self.lineage_log}\n  append: true\n")
            self.env["OPENLINEAGE_CONFIG"] = str(config)
            self.env.pop("OPENLINEAGE_URL", None)
        if getattr(self.args, "iceberg", False):  # Parquet files, and an Iceberg snapshot per complete hour
            extra += 'format = "parquet"\n'
            text += (f'\n[[commit_policy]]\nkind = "iceberg"\ncatalog = "campaign"\n'
                     f'catalog_uri = "sqlite:///{self.work}/catalog.db"\nwarehouse = "file://{self.work}/warehouse"\n')
            self.env["EVENT_ETL_FAULT_PAUSE"] += ICEBERG_PAUSES
        self.protobuf = None
        if getattr(self.args, "payload", "json") == "protobuf":
            self.protobuf = ProtobufProducer(types, lines=self.args.source == "dir")
            extra += self.protobuf.settings()
        toml.write_text(extra + text)  # top-level keys: before any table
        self.et = load_event_type(types / "page_view")
        self.event_types_dir = str(types)
        now = now_millis()
        # Event time ends a little before now: every event arrives (is listed, or published) after its
        # event time, as in production; "future" events are ahead of the real clock.
        start = now - span_of(self.args.files) - 10 * MINUTE_MS
        self.events = make_events(self.et, events=self.args.events, files=self.args.files, seed=self.args.seed,
                                  start=start, future_from=now + HOUR_MS)
        if self.protobuf is not None:
            self.protobuf.convert(self.events.events, self.et.max_payload_bytes)
        sink = getattr(self.args, "sink", None) or ("gcs" if self.args.source == "pubsub" else "local")
        if sink == "gcs":
            self.start_gcs()
            self.sink = "gs://campaign/data"
        else:
            self.sink = str(self.work / "sink")
        if self.args.source == "dir":
            src, pending = self.work / "in", self.work / "pending"
            src.mkdir()
            pending.mkdir()
            self.pending = [pending / f"events-{k:04d}.jsonl" for k in range(len(self.events.batches))]
            self.source = f"dir:{src}"
        elif self.args.source == "kafka":
            self.start_kafka()
            self.pending = list(range(len(self.events.batches)))
            self.source = f"kafka:{self.topic}"
        else:
            self.start_pubsub()
            from google.cloud import pubsub_v1

            self.publisher = pubsub_v1.PublisherClient()
            self.pending = list(range(len(self.events.batches)))
            self.source = f"pubsub:{self.subscription}"
        self.checkpoint = str(self.work / "ck")

    def start_gcs(self) -> None:
        from tests.lib.servers import GcsEmulator

        gcs = GcsEmulator(self.work / "gcs").start()
        self.servers.append(gcs)
        gcs.create_bucket("campaign")
        self.env.update({"STORAGE_EMULATOR_HOST": gcs.url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"})
        os.environ.update({k: self.env[k] for k in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")})

    def start_pubsub(self) -> None:
        from tests.lib.servers import PubSubEmulator

        ps = PubSubEmulator(self.work / "pubsub").start(timeout=90)
        self.servers.append(ps)
        # empty pulls run out with DeadlineExceeded, as on the real service (the emulator answers at once)
        self.env.update({"PUBSUB_EMULATOR_HOST": ps.host, "EVENT_ETL_PUBSUB_ACK_DEADLINE": "10",
                         "EVENT_ETL_FAULT_EMPTY_PULLS": "deadline", "EVENT_ETL_PUBSUB_PULL_TIMEOUT": "2"})
        os.environ["PUBSUB_EMULATOR_HOST"] = ps.host
        self.topic = "projects/campaign/topics/page-view"
        self.subscription = "projects/campaign/subscriptions/page-view-etl"
        r = subprocess.run([EXE, "setup", "page_view", "--topic", self.topic, "--subscription", self.subscription,
                            "--ack-deadline", "10"], env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode:
            raise SystemExit(f"setup failed: {r.stdout}{r.stderr}")

    def _page_view_copies(self, values: Callable[[str], dict[str, str]], extra: str = "") -> None:
        """A copy of page_view for each of :attr:`names` (the campaign's settings, as for one type; ``values(name)``
        replaces keys of its etl.toml, each present once, ``extra`` adds lines), then one event set as for one
        type (:attr:`events`), read by the first copy's settings."""
        types = self.work / "types"
        base = ROOT / "event_types" / "page_view"
        text = (base / "etl.toml").read_text().replace('idle_timeout = "5m"\n', "").replace(
            "max_events_per_file = 500000\n", "")
        head = (f'idle_timeout = "{IDLE_TIMEOUT_S}s"\ndedupe_window = "24h"\n'
                f"max_events_per_file = {MAX_EVENTS_PER_FILE}\n{extra}")
        for n in self.names:
            shutil.copytree(base, types / n)
            body = text
            for key, value in values(n).items():
                body, k = re.subn(rf"(?m)^{key} = .*$", f'{key} = "{value}"', body)
                assert k == 1, f"{key} not once in page_view's etl.toml"
            (types / n / "etl.toml").write_text(head + body)
        self.event_types_dir = str(types)
        self.et = load_event_type(types / self.names[0])
        self.protobuf = None
        now = now_millis()
        start = now - span_of(self.args.files) - 10 * MINUTE_MS
        self.events = make_events(self.et, events=self.args.events, files=self.args.files, seed=self.args.seed,
                                  start=start, future_from=now + HOUR_MS)

    # -- a fleet of Pub/Sub types (--types N) -------------------------------------------------
    def prepare_fleet(self) -> None:
        """``--types N``: N copies of page_view (the campaign's settings, as for one Pub/Sub type), each with its own
        topic and subscription (its ``source`` and ``[pubsub]`` table); one event set as for one type, each event
        given to one type (by its id: a producer retry goes where its original went), so that every type has its
        own share of every wave and of every kind; expected per type."""
        self.topics = {n: f"projects/campaign/topics/{n}" for n in self.names}
        self.subscriptions = {n: f"projects/campaign/subscriptions/{n}-etl" for n in self.names}
        self._page_view_copies(lambda n: {"source": f"pubsub:{self.subscriptions[n]}", "topic": self.topics[n],
                                          "subscription": self.subscriptions[n]})
        # each event to one type: by its id (a retry with its original), an invalid one (no id) round robin
        self.shares: list[dict[str, list[Event]]] = []
        self.type_events: dict[str, list[Event]] = {n: [] for n in self.names}
        dealt = 0
        for _, evs in self.events.batches:
            share: dict[str, list[Event]] = defaultdict(list)
            for e in evs:
                if e.id is not None:
                    name = self.names[zlib.crc32(e.id.encode()) % len(self.names)]
                else:
                    name, dealt = self.names[dealt % len(self.names)], dealt + 1
                share[name].append(e)
                self.type_events[name].append(e)
            self.shares.append(dict(share))
        sink = getattr(self.args, "sink", None) or "gcs"
        if sink == "gcs":
            self.start_gcs()
            self.sink = "gs://campaign/data"
        else:
            self.sink = str(self.work / "sink")
        self.index = SinkIndex(self.sink)
        self.start_pubsub_fleet()
        from google.cloud import pubsub_v1

        self.publisher = pubsub_v1.PublisherClient()
        self.pending = list(range(len(self.events.batches)))
        self.source = None
        self.checkpoint = str(self.work / "ck")  # the fleet's --checkpoint-root: ck/<type>

    def start_pubsub_fleet(self) -> None:
        """The emulator, as for one type, and a topic and a subscription per type (as ``event-etl setup`` makes
        them: a subprocess each would take minutes for a hundred)."""
        from concurrent.futures import ThreadPoolExecutor

        from tests.lib.servers import PubSubEmulator

        ps = PubSubEmulator(self.work / "pubsub").start(timeout=90)
        self.servers.append(ps)
        self.env.update({"PUBSUB_EMULATOR_HOST": ps.host, "EVENT_ETL_PUBSUB_ACK_DEADLINE": "10",
                         "EVENT_ETL_FAULT_EMPTY_PULLS": "deadline", "EVENT_ETL_PUBSUB_PULL_TIMEOUT": "2"})
        os.environ["PUBSUB_EMULATOR_HOST"] = ps.host
        from google.cloud import pubsub_v1

        pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()

        def one(name: str) -> None:
            pub.create_topic(name=self.topics[name])
            sub.create_subscription(name=self.subscriptions[name], topic=self.topics[name], ack_deadline_seconds=10)

        try:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(one, self.names))
        finally:
            sub.close()

    # -- a bus of types (--bus N) ----------------------------------------------------------------
    def prepare_bus(self) -> None:
        """``--bus N``: N copies of page_view (the campaign's settings, as for a fleet) that name one source, a Pub/Sub
        subscription or a Kafka topic, routed by the attribute (Kafka header) ``type``, each claiming its name.  One
        event set as for one type, each event given to one type (by its id: a producer retry goes where its original
        went; the invalid ones round robin), but the last type is quiet from :data:`BUS_QUIET_FROM` of the waves on
        (hours of event time): its share goes to the others.  Each wave also carries :data:`BUS_UNCLAIMED` more
        messages (valid records of ids of their own) that no type claims: half without the attribute, half with a
        value nobody claims; each must be kept once in ``<sink>/_unclaimed/<bus id>/``, and nowhere else."""
        if self.args.source == "pubsub":
            self.topic = "projects/campaign/topics/bus"
            self.subscription = "projects/campaign/subscriptions/bus-etl"
            self.source = f"pubsub:{self.subscription}"
        else:
            self.topic = "page-view"  # start_kafka's
            self.source = f"kafka:{self.topic}"
        pubsub = {"topic": self.topic, "subscription": self.subscription} if self.args.source == "pubsub" else {}
        self._page_view_copies(lambda n: {"source": self.source, **pubsub},
                               extra=f'route_attribute = "{BUS_ATTRIBUTE}"\n')
        waves = len(self.events.batches)
        self.quiet_type, self.quiet_from = self.names[-1], max(1, int(waves * BUS_QUIET_FROM))
        self.shares = []
        self.type_events = {n: [] for n in self.names}
        owner: dict[str, str] = {}
        dealt = 0
        rng = random.Random(self.args.seed + 59)
        for k, (_, evs) in enumerate(self.events.batches):
            live = self.names if k < self.quiet_from else self.names[:-1]
            share: dict[str, list[Event]] = defaultdict(list)
            for e in evs:
                if e.id is not None:
                    name = owner.setdefault(e.id, live[zlib.crc32(e.id.encode()) % len(live)])
                else:
                    name, dealt = live[dealt % len(live)], dealt + 1
                share[name].append(e)
                self.type_events[name].append(e)
            self.shares.append(dict(share))
            unclaimed = []
            for i in range(max(1, round(len(evs) * BUS_UNCLAIMED))):
                eid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                t = self.events.batches[k][0] - rng.randint(0, 120) * 1000
                payload = json.dumps({"event_id": eid, "event_time": t, "anonymous_id": "a-unclaimed",
                                      "session_id": "s-unclaimed", "product_id": "sku-0",
                                      "page_url": "https://shop.example.com/refund/1", "device_type": "MOBILE"})
                # half without the attribute, half with a value no type claims
                unclaimed.append(Event(eid, t, "no_attribute" if (k + i) % 2 == 0 else "unclaimed_value",
                                       payload.encode(), UNCLAIMED_REASON))
            self.unclaimed_waves.append(unclaimed)
        self.sink = str(self.work / "sink")  # local: a type's folder is blocked for a while (quarantine_one)
        self.index = SinkIndex(self.sink)
        self.env["EVENT_ETL_FLEET_BACKOFF"] = "2"  # a quarantined type tried again soon
        if self.args.source == "pubsub":
            from tests.lib.servers import PubSubEmulator

            ps = PubSubEmulator(self.work / "pubsub").start(timeout=90)
            self.servers.append(ps)
            self.env.update({"PUBSUB_EMULATOR_HOST": ps.host, "EVENT_ETL_PUBSUB_ACK_DEADLINE": "10",
                             "EVENT_ETL_FAULT_EMPTY_PULLS": "deadline", "EVENT_ETL_PUBSUB_PULL_TIMEOUT": "2"})
            os.environ["PUBSUB_EMULATOR_HOST"] = ps.host
            from google.cloud import pubsub_v1

            sub = pubsub_v1.SubscriberClient()
            try:
                pubsub_v1.PublisherClient().create_topic(name=self.topic)
                sub.create_subscription(name=self.subscription, topic=self.topic, ack_deadline_seconds=10)
            finally:
                sub.close()
            self.publisher = pubsub_v1.PublisherClient()
        else:
            self.start_kafka()
            assert self.topic == "page-view"
        self.pending = list(range(waves))
        self.checkpoint = str(self.work / "ck")  # --checkpoint-root: ck/<type>, the bus's spool in ck/_bus/<id>

    def bus_wave(self, k: int) -> list[tuple[bytes, str | None]]:
        """Wave ``k`` of a bus, in the order it is sent: each message and its attribute (header) ``type``, or None;
        the unclaimed ones spread among the others."""
        out = [(e.payload, n) for n, share in self.shares[k].items() for e in share]
        self.rng.shuffle(out)
        for j, e in enumerate(self.unclaimed_waves[k]):
            out.insert((j * 7919) % (len(out) + 1), (e.payload, None if e.kind == "no_attribute" else
                                                     BUS_UNCLAIMED_VALUE))
        return out

    def release_bus(self, k: int) -> None:
        """Wave ``k`` to the bus's topic: Pub/Sub messages with their attribute; Kafka records with their header,
        dealt round robin over the partitions (but the idle one, in its idle waves)."""
        msgs = self.bus_wave(k)
        if self.args.source == "pubsub":
            futures = [self.publisher.publish(self.topic, payload, **({BUS_ATTRIBUTE: attr} if attr else
                                                                      {} if payload else {"note": "empty"}))
                       for payload, attr in msgs]
            for f in futures:
                f.result(timeout=60)
            return
        records = self._deal(k, [payload for payload, _ in msgs])
        for (p, payload), (_, attr) in zip(records, msgs, strict=True):
            headers = [(BUS_ATTRIBUTE, attr.encode())] if attr else None
            self.producer.produce(self.topic, value=payload, partition=p, headers=headers)
            self.producer.poll(0)
        left = self.producer.flush(60)
        if left:
            raise RuntimeError(f"{left} records of wave {k} not delivered to the broker")
        self.produced.update(p for p, _ in records)

    def read_unclaimed(self) -> list[dict]:
        """Every record of the bus's dead letters (``<sink>/_unclaimed/<bus id>/dt=*/*.avro``)."""
        import fastavro

        out: list[dict] = []
        for f in sorted((Path(self.sink) / UNCLAIMED_DIR / bus_id(self.source)).glob("dt=*/*.avro")):
            out.extend(fastavro.reader(io.BytesIO(f.read_bytes())))
        return out

    def bus_rows(self, per: dict[str, dict]) -> tuple[dict, dict]:
        """What only a bus has: every unclaimed message kept exactly once in the bus's dead letters (reason
        ``unclaimed``, its detail saying why), none in a type's buckets or dead letters; the quiet type's hours after
        its last event (closed by the idle rule or a drain); the quarantine of a type whose sink folder was blocked."""
        kept = self.read_unclaimed()
        expected = Counter(e.payload for wave in self.unclaimed_waves for e in wave)
        got = Counter(bytes(r["payload"]) for r in kept)
        ids = {e.id for wave in self.unclaimed_waves for e in wave}
        in_buckets = []
        for n in self.names:
            content, _ = self.read_sink(n)
            in_buckets += [f"{n}: {i}" for h in content.values() for i, _, _ in h["records"] if i in ids]
            in_buckets += [f"{n} dead letters" for d in self.read_deadletters(n) if d.payload in expected]
        wrong_reason = [(r["reason"], r["detail"]) for r in kept if r["reason"] != UNCLAIMED_REASON
                        or not ("no attribute" in r["detail"] or repr(BUS_UNCLAIMED_VALUE) in r["detail"])]
        q = self.quiet_type
        content, _ = self.read_sink(q)
        last_event = max((e.t for e in self.type_events[q] if e.kind in VALID_KINDS and e.t is not None), default=0)
        after = {h: e["marker"].extra.get("closed_by") if e["marker"] else None for h, e in content.items()
                 if h >= last_event - last_event % HOUR_MS}
        quiet_last = self.released_at.get(self.quiet_from - 1)
        # the quiet type's idle advances while the bus stayed busy: an idle line of it with another type's batch of
        # records both before and after it in its run's log (a bus's delivery to the others no longer restarts its
        # idle timer: a1292ee)
        busy = re.compile(r"^\[(?!" + re.escape(q) + r"\])\w+\] batch \d+(?: \(replay\))?: in [1-9]")
        idle_lines = idle_busy = 0
        for f in sorted(self.work.glob("run-*.log")):
            lines = f.read_text(errors="replace").splitlines()
            marks = [i for i, line in enumerate(lines) if busy.match(line)]
            for i, line in enumerate(lines):
                if line.startswith(f"[{q}] idle: watermark"):
                    idle_lines += 1
                    idle_busy += bool(marks and marks[0] < i < marks[-1])
        rows = {
            "bus (one source, routed by attribute/header 'type')": f"{bus_id(self.source)}: {self.source}",
            "unclaimed messages sent (no attribute / a value no type claims)": "{} ({} / {})".format(
                sum(expected.values()), sum(1 for w in self.unclaimed_waves for e in w if e.kind == "no_attribute"),
                sum(1 for w in self.unclaimed_waves for e in w if e.kind == "unclaimed_value")),
            "unclaimed kept (files)": f"{len(kept)} ({len(list((Path(self.sink) / UNCLAIMED_DIR).rglob('*.avro')))})",
            KEY_UNCLAIMED_LOST: sum((expected - got).values()),
            KEY_UNCLAIMED_DUP: sum((got - expected).values()),
            KEY_UNCLAIMED_ELSEWHERE: len(in_buckets) + len(wrong_reason),
            "quiet type: last wave with its events (of all) / its hours from its last event's: closed by": (
                f"{q}: {self.quiet_from} of {len(self.events.batches)} / "
                f"{dict(Counter(str(v) for v in after.values()))}"),
            "quiet type: idle advances (lines), of them while the others' batches went on": (
                f"{idle_lines} ({idle_busy})"),
            "quiet type: its last wave published before the campaign's end (s)": (
                f"{(now_millis() - quiet_last) / 1000:.0f}" if quiet_last else "-"),
            "types quarantined on purpose (sink folder blocked): run, type, what happened": (
                "; ".join(f"run {r}: {n} {what}" for r, n, what in self.quarantines) or "none"),
        }
        details = {"unclaimed missing": [p[:80] for p in (expected - got)][:5],
                   "unclaimed extra": [p[:80] for p in (got - expected)][:5],
                   "unclaimed elsewhere": (in_buckets + [str(w) for w in wrong_reason])[:10]}
        return rows, details

    def run_env(self, point: str | None = None, **extra: str) -> dict[str, str]:
        """A run's environment; ``--types N``: its own fault log (:class:`FaultLog`), and a pause only at ``point``,
        where it is to be killed (:data:`FLEET_PAUSES`)."""
        env = {**self.env, **extra}
        if self.fleet:
            path = self.work / f"faults-{self.runs:02d}.log"
            self.flog.add(self.runs, path)
            env["EVENT_ETL_FAULT_LOG"] = str(path)
            if "EVENT_ETL_FAULT_PAUSE" not in extra:
                env["EVENT_ETL_FAULT_PAUSE"] = f"{point}={FLEET_PAUSES[point]}" if point in FLEET_PAUSES else ""
        return env

    def stop_took(self, how: str, termed: float) -> None:
        """``--types N``: how long a SIGTERM took to reach the first type's drain, and the process to end."""
        self.faults_seen()
        first = min((t for name, pid, t, _, run in self.flog.entries if run == self.runs and name == "drain"),
                    default=None)
        self.stop_times.append(f"run {self.runs} {how}: " + (f"{first - termed:.0f}s" if first is not None else "none")
                               + f" / {time.monotonic() - termed:.0f}s")

    def batches_done(self) -> int:
        """Batches committed: one type's; a fleet's, of every type (a round of any type's)."""
        if not self.fleet:
            return self.committed()
        ids = [last_id(Path(self.checkpoint) / n / "spark" / "commits") for n in self.names]
        return sum(0 if i is None else i + 1 for i in ids)

    def ended(self, proc: subprocess.Popen, started: float) -> None:
        """A run is over (its process reaped): when, and its exit code."""
        self.spans.append((self.runs, proc.pid, started, time.monotonic(), proc.poll()))

    def start_kafka(self) -> None:
        from confluent_kafka import Producer

        from tests.lib.servers import KafkaBroker, NoidaKafka

        noida = self.broker_kind == "noida"
        broker = (NoidaKafka(self.work / "noida") if noida else KafkaBroker(self.work / "kafka")).start()
        self.servers.append(broker)
        self.broker = broker
        self.env["EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
        self.topic = "page-view"
        self.partitions = getattr(self.args, "kafka_partitions", 4)
        if "grow" in self.scenarios:  # it ends with --kafka-partitions + 2, one added at each GROW step
            self.partitions = max(1, self.partitions - (len(GROW_STEPS) - 2))
        broker.create_topic(self.topic, self.partitions)
        if noida:
            # records in batches, as producers send them: noida-db reports true high watermarks
            self.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 4})
            self.env["EVENT_ETL_KAFKA_ON_DATA_LOSS"] = "fail"  # the job's default; "skip" once a fail run stopped
        else:
            # one record per produce request: tansu reports as a partition's high watermark the base offset of its
            # last record batch + 1, and the job never plans past it
            self.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0,
                                      "batch.num.messages": 1})
        self.dealt = 0  # records dealt round robin so far (every partition's count within one of the others')
        self.produced = Counter()  # records per partition
        waves = len(self.events.batches)
        quiet = getattr(self.args, "idle_partition", "quiet") == "quiet" and self.partitions > 1
        self.idle_partition = self.partitions - 1
        self.idle_waves = range(int(waves * IDLE_WAVES[0]), int(waves * IDLE_WAVES[1])) if quiet else range(0)
        self.tx_waves = range(0)
        if "transactions" in self.scenarios:
            # two transactional producers: the waves' (committed) and the ghosts' (aborted), whose transactions
            # are sometimes open at the same time on the same partitions
            self.tx_waves = range(int(waves * TX_WAVES[0]), int(waves * TX_WAVES[1]))
            self.tx_rng = random.Random(self.args.seed + 48)
            self.tx_producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "campaign-waves",
                                         "linger.ms": 5, "log_level": 4})
            self.ghost_producer = Producer({"bootstrap.servers": broker.bootstrap,
                                            "transactional.id": "campaign-ghosts", "linger.ms": 5, "log_level": 4})
            for prod in (self.tx_producer, self.ghost_producer):
                prod.init_transactions(60)

    def producers(self) -> list:
        return [p for p in (getattr(self, n, None) for n in ("producer", "tx_producer", "ghost_producer"))
                if p is not None]

    def close_kafka_clients(self) -> None:
        """Producers flushed and dropped, the watermark client closed: before the broker stops."""
        for name in ("producer", "tx_producer", "ghost_producer"):
            prod = getattr(self, name, None)
            if prod is not None:
                try:
                    prod.flush(5)
                except Exception:  # noqa: BLE001 - the broker may be gone: nothing left to deliver
                    pass
                setattr(self, name, None)
        consumer, self._marks_consumer = getattr(self, "_marks_consumer", None), None
        if consumer is not None:
            consumer.close()

    def _deal(self, k: int, payloads: list[bytes]) -> list[tuple[int, bytes]]:
        """Round robin over the live partitions (all, but the idle one in its idle waves)."""
        live = [p for p in range(self.partitions) if not (k in self.idle_waves and p == self.idle_partition)]
        out = []
        for payload in payloads:
            out.append((live[self.dealt % len(live)], payload))
            self.dealt += 1
        return out

    def _produce_wave(self, k: int, evs: list[Event]) -> None:
        """Wave ``k`` to the topic, dealt round robin over the partitions (but the idle one, in its idle waves); in
        a committed transaction in :data:`TX_WAVES` (``--kafka-scenario transactions``)."""
        records = self._deal(k, [e.payload for e in evs])
        if k in self.tx_waves:
            self._produce_transaction(k, records)
        else:
            for p, payload in records:
                self.producer.produce(self.topic, value=payload, partition=p)
                self.producer.poll(0)
            left = self.producer.flush(60)
            if left:
                raise RuntimeError(f"{left} records of wave {k} not delivered to the broker")
        self.produced.update(p for p, _ in records)

    def _ghosts(self, k: int, n: int) -> list[tuple[int, bytes]]:
        """``n`` records for an aborted transaction: valid events of wave ``k``'s time (and, every other time, a
        malformed one, which would be dead-lettered if it were read), dealt over the live partitions."""
        t0 = self.events.batches[k][0]
        evs = []
        for _ in range(n):
            eid = str(uuid.UUID(int=self.tx_rng.getrandbits(128), version=4))
            t = t0 - self.tx_rng.randint(0, 120) * 1000
            evs.append(Event(eid, t, "aborted", json.dumps({
                "event_id": eid, "event_time": t, "anonymous_id": "a-ghost", "session_id": "s-ghost",
                "product_id": "sku-0", "page_url": "https://shop.example.com/p/0", "device_type": "DESKTOP"}).encode()))
        if len(self.aborted) % 2 == 0:
            bad = b'{"ghost": %d, "event_time": ' % len(self.aborted)
            evs.append(Event(None, None, "aborted", bad, "invalid_json"))
        self.aborted += evs
        return self._deal(k, [e.payload for e in evs])

    def _produce_transaction(self, k: int, records: list[tuple[int, bytes]]) -> None:
        """The wave in one committed transaction; before it, after it or open across it, sometimes a transaction
        of ghost records that is aborted (its records reach the broker first: an abort before they were sent would
        only drop them in the producer); sometimes the wave's transaction is held open a second or two while the
        job plans."""
        from confluent_kafka import KafkaException

        rng, tx, ghost = self.tx_rng, self.tx_producer, self.ghost_producer

        def send(prod, recs):
            for p, payload in recs:
                prod.produce(self.topic, value=payload, partition=p)
                prod.poll(0)
            if prod.flush(60):
                raise RuntimeError(f"records of wave {k} not delivered to the broker")

        def abort_ghosts():
            ghost.begin_transaction()
            send(ghost, self._ghosts(k, rng.randint(4, 12)))
            ghost.abort_transaction(60)
            self.tx["aborted"] += 1

        u = rng.random()
        try:
            if u < ABORT_SHARE / 2:
                abort_ghosts()
            interleaved = ABORT_SHARE / 2 <= u < ABORT_SHARE
            if interleaved:  # the ghosts' transaction open first, the wave's committed while it is open
                ghost.begin_transaction()
                send(ghost, self._ghosts(k, rng.randint(4, 12)))
                self.tx["interleaved"] += 1
            tx.begin_transaction()
            send(tx, records)
            if rng.random() < HOLD_OPEN_SHARE:
                self.tx_open = True
                self.tx["held open"] += 1
                time.sleep(rng.uniform(1.0, 2.5))
            tx.commit_transaction(60)
            self.tx["committed"] += 1
            if interleaved:
                ghost.abort_transaction(60)
                self.tx["aborted"] += 1
        except KafkaException as err:
            raise RuntimeError(f"a transaction of wave {k} failed: {err}") from err
        finally:
            self.tx_open = False

    def kafka_rows(self) -> dict:
        """Kafka: the broker, the partitions, the idle one's waves and where the stops fell (figures shown, not
        judged); with noida-db, what each scenario did (:meth:`scenario_rows`)."""
        if self.args.source != "kafka":
            return {}
        where = " / ".join(str(self.kafka_kills[k]) for k in ("before", "idle", "woken", "after"))
        waves = self.idle_waves
        idle = (f"Kafka: partition {self.idle_partition} idle for waves {waves.start}..{waves.stop - 1} of "
                f"{len(self.events.batches)}; stops that hit before / while idle / just after waking / after"
                if waves else "Kafka: no idle partition")
        return {"Kafka broker (scenarios)": f"{self.broker_kind} ({', '.join(sorted(self.scenarios)) or 'none'})",
                "Kafka partitions (records each)": f"{self.partitions} ({dict(sorted(self.produced.items()))})",
                idle: where if waves else "", **self.scenario_rows()}

    def kafka_phase(self) -> str | None:
        """Kafka: where the idle partition is (by the waves released so far), for the kill counts."""
        if self.args.source != "kafka" or not self.idle_waves:
            return None
        released = len(self.events.batches) - len(self.pending)
        if released <= self.idle_waves.start:
            return "before"
        if released <= self.idle_waves.stop:
            return "idle"
        return "woken" if released <= self.idle_waves.stop + 2 * AHEAD else "after"

    # -- Kafka on noida-db: the scenarios' steps (--kafka-scenario) ----------------------------
    def last_offset(self) -> dict | None:
        """The end offset of the last batch the job planned (its checkpoint's offset log), or None."""
        from event_etl.sources.kafka_offsets import logged_offset

        spark = Path(self.checkpoint) / "spark"
        n = last_id(spark / "offsets")
        return logged_offset(spark, n) if n is not None else None

    def planned_ends(self) -> dict[int, int]:
        """Each partition's next offset after the last planned batch: what lies below is read or will be replayed
        (a batch replays the ranges it was planned with), what lies at or above it is unread."""
        return {int(p): int(n) for p, n in ((self.last_offset() or {}).get("partitions") or {}).items()}

    def marks(self, p: int) -> tuple[int, int]:
        """Partition ``p``'s low and high watermarks (the last stable offset while a transaction is open), as a
        ``read_committed`` client is told them."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        if getattr(self, "_marks_consumer", None) is None:
            self._marks_consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "campaign-marks"})
        tp = TopicPartition(self.topic, p)
        try:
            return self._marks_consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        except KafkaException:  # a partition added since this client read the metadata
            self._marks_consumer.list_topics(self.topic, timeout=10)
            return self._marks_consumer.get_watermark_offsets(tp, timeout=10, cached=False)

    def read_records(self, p: int, lo: int, hi: int) -> list[bytes]:
        """The values of partition ``p``'s records at offsets ``[lo, hi)`` (committed ones: no transaction markers,
        nothing of an aborted transaction): what a deletion of that range deletes."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        c = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "campaign-peek",
                      "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "error"})
        out: list[bytes] = []
        try:
            c.assign([TopicPartition(self.topic, p, lo)])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for m in c.consume(500, 1.0):
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(f"reading partition {p} [{lo}, {hi}): {err.str()}")
                        if m.offset() >= hi:
                            return out
                        continue
                    if m.offset() >= hi:
                        return out
                    out.append(m.value() or b"")
                    if m.offset() == hi - 1:
                        return out
            raise RuntimeError(f"reading partition {p} [{lo}, {hi}): timed out with {len(out)} records")
        finally:
            c.close()

    def _wait_caught_up(self, proc, timeout: float = 150) -> bool:
        """Until the running job has planned and committed everything the topic holds (the input held back)."""
        spark = Path(self.checkpoint) / "spark"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                planned = last_id(spark / "offsets")
                if (planned is not None and planned == last_id(spark / "commits") and not self.release_lock.locked()
                        and not self.tx_open):
                    ends = self.planned_ends()
                    if all(ends.get(p, 0) >= self.marks(p)[1] for p in range(self.partitions)):
                        return True
            except Exception:  # noqa: BLE001 - a log being written, the broker busy: look again
                pass
            time.sleep(0.5)
        return False

    def grow(self, live: bool) -> None:
        """A partition added to the topic (CreatePartitions), then a wave released that reaches it."""
        with self.release_lock:
            before = self.partitions
            self.broker.add_partitions(self.topic, before + 1)
            self.partitions = before + 1
            for prod in self.producers():  # they learn of it now, not at their next metadata refresh
                deadline = time.monotonic() + 30
                while len(prod.list_topics(self.topic, timeout=10).topics[self.topic].partitions) < self.partitions:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"a producer does not see partition {before} of {self.topic}")
                    time.sleep(0.2)
            released = len(self.events.batches) - len(self.pending)
            self.growth.append(f"{before}->{before + 1} {'while it ran' if live else 'while down'} "
                               f"(after wave {released})")
            if self.args.verbose:
                print(f"  partition {before} added {'while it runs' if live else 'while it is down'}", flush=True)
        self.backlog_released(1)

    def delete_unread(self, how: str) -> None:
        """While the job is down, having committed every batch it planned: a backlog released, then records it has
        not read deleted, by ``DeleteRecords`` (in half of the partitions, from 40 % to all of what it has not
        read) or ``retention.ms`` (lowered to 1 s, then put back: everything the topic holds); each deleted record
        read first (what it was).  Then a run with ``EVENT_ETL_KAFKA_ON_DATA_LOSS=fail`` must stop with the error
        and the fix, and plan nothing past the loss; the runs after it skip (``skip``: LOST counted)."""
        self.backlog_released(2 * AHEAD)
        released = len(self.events.batches) - len(self.pending)
        rec: dict = {"how": how, "after wave": released, "partitions": {}, "offsets": 0, "records": 0}
        self.deletions.append(rec)
        with self.release_lock:
            spark = Path(self.checkpoint) / "spark"
            if last_id(spark / "offsets") != last_id(spark / "commits"):
                rec["missed"] = "a planned batch was not committed: the deletion would take what it replays"
                return
            ends = self.planned_ends()
            marks = {p: self.marks(p) for p in range(self.partitions)}
            unread = {p: (max(ends.get(p, low), low), high) for p, (low, high) in marks.items()
                      if high > max(ends.get(p, low), low)}
            if how == "DeleteRecords":  # only partitions the job's offsets know (see RELIABILITY.md)
                known = sorted(p for p in unread if p in ends)
                chosen = sorted(self.rng.sample(known, max(1, len(known) // 2))) if known else []
                unread = {p: (lo, lo + max(1, round((hi - lo) * self.rng.uniform(0.4, 1.0))))
                          for p, (lo, hi) in unread.items() if p in chosen}
            for p, (lo, hi) in sorted(unread.items()):
                values = self.read_records(p, lo, hi)
                self.deleted.update(values)
                rec["partitions"][p] = {"offsets": [lo, hi], "records": len(values), "planned": p in ends}
                rec["offsets"] += hi - lo
                rec["records"] += len(values)
            if not unread:
                rec["missed"] = "nothing unread to delete"
                return
            if how == "DeleteRecords":
                for p, (_, hi) in unread.items():
                    self.broker.delete_records(self.topic, p, hi)
            else:
                self.broker.set_retention(self.topic, 1000)
            deadline = time.monotonic() + 60
            while any(self.marks(p)[0] < hi for p, (_, hi) in unread.items()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{how} did not delete {unread}: {[self.marks(p) for p in unread]}")
                time.sleep(0.5)
            if how == "retention.ms":
                self.broker.set_retention(self.topic, RETENTION_KEEP_MS)
        self.fail_run(rec)

    def fail_run(self, rec: dict) -> None:
        """A run with ``EVENT_ETL_KAFKA_ON_DATA_LOSS=fail`` after records were deleted unread: exit 1, the error
        and the fix said, no offset planned past the loss; from then on the runs skip."""
        self.runs += 1
        before = self.planned_ends()
        path = self.work / f"run-{self.runs:02d}-fail.log"
        with open(path, "w") as log:
            proc = self.current = subprocess.Popen(
                self.command(), env={**self.env, "EVENT_ETL_KAFKA_ON_DATA_LOSS": "fail", "EVENT_ETL_FAULT_PAUSE": ""},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=240)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        text = path.read_text(errors="replace")
        said = all(x in text for x in ("error:", "deleted by the topic's retention before this job read them",
                                       "fix:", "EVENT_ETL_KAFKA_ON_DATA_LOSS=skip"))
        after = self.planned_ends()
        past = sorted(p for p in rec["partitions"] if after.get(p, 0) > before.get(p, 0))
        rec["fail run"] = {"exit": rc, "error and fix said": said, "planned past the loss": past}
        rec["fail run ok"] = rc == 1 and said and not past
        self.env["EVENT_ETL_KAFKA_ON_DATA_LOSS"] = "skip"
        if self.args.verbose:
            print(f"  run {self.runs:2d}: {rec['how']} deleted {rec['records']} records ({rec['offsets']} offsets) "
                  f"unread; the fail run exited {rc}, error and fix {'said' if said else 'NOT said'}", flush=True)

    def lost_said(self) -> tuple[int, int]:
        """LOST as the job said it: in its progress lines (each batch once: a replay says it again) and in its
        checkpoint's last offset (accumulated)."""
        by_batch: dict[int, int] = {}
        for f in sorted(self.work.glob("run-*.log")):
            for m in LOST_LINE.finditer(f.read_text(errors="replace")):
                by_batch[int(m[1])] = int(m[2].replace(",", ""))
        return sum(by_batch.values()), sum(int(n) for n in ((self.last_offset() or {}).get("lost") or {}).values())

    def scenario_rows(self) -> dict:
        """What the noida-db scenarios did; the keys of :data:`FAILURE_KEYS` among them are judged."""
        rows: dict = {}
        if "grow" in self.scenarios:
            rows["Kafka: partitions added, one at a time"] = "; ".join(self.growth) or "none"
        if "retention" in self.scenarios:
            for k, d in enumerate(self.deletions, 1):
                parts = ", ".join(f"{p}: {v['records']} records at offsets {v['offsets'][0]}..{v['offsets'][1] - 1}"
                                  for p, v in d["partitions"].items())
                fr = d.get("fail run")
                rows[f"Kafka: deletion {k}, {d['how']} after wave {d['after wave']}"] = (
                    f"MISSED: {d['missed']}" if d.get("missed") else
                    f"{d['records']} records ({d['offsets']} offsets) unread, partition {parts}; fail run: exit "
                    f"{fr['exit']}, error and fix {'said' if fr['error and fix said'] else 'NOT said'}, "
                    + (f"PLANNED PAST THE LOSS on {fr['planned past the loss']}" if fr["planned past the loss"]
                       else "nothing planned past the loss"))
            offsets = sum(d["offsets"] for d in self.deletions)
            progress, ckpt = self.lost_said()
            rows["Kafka: records deleted unread (offsets)"] = (
                f"{sum(d['records'] for d in self.deletions)} ({offsets})")
            rows["Kafka: LOST said in progress lines (each batch once) / in the checkpoint's offsets"] = (
                f"{progress} / {ckpt}")
            rows[KEY_LOST_WRONG] = abs(progress - offsets) + abs(ckpt - offsets)
            rows[KEY_FAIL_RUNS_WRONG] = sum(1 for d in self.deletions if not d.get("missed")
                                            and not d.get("fail run ok"))
            rows[KEY_DELETIONS_MISSED] = sum(1 for d in self.deletions if d.get("missed"))
        if "transactions" in self.scenarios:
            t = self.tx
            rows["Kafka: waves in transactions"] = f"{self.tx_waves.start}..{self.tx_waves.stop - 1}"
            rows["Kafka: transactions committed / aborted (of them open beside a committed one) / held open "
                 "1-2.5 s"] = f"{t['committed']} / {t['aborted']} ({t['interleaved']}) / {t['held open']}"
            rows["Kafka: records of aborted transactions (of them malformed)"] = (
                f"{len(self.aborted)} ({sum(1 for e in self.aborted if e.id is None)})")
            rows["Kafka: stops while a transaction was open"] = t["stops while a transaction was open"]
        return rows

    def release_input(self, everything: bool = False) -> None:
        """Make the next batches of input available: files moved into the folder, or waves published.

        A few batches ahead of the job, but never so many that the runs still planned would
        find no input left to be killed in."""
        if self.hold.is_set() and not everything:
            return
        released = len(self.events.batches) - len(self.pending)
        cap = len(self.events.batches) - self.reserve * self.runs_left
        committed = self.committed()
        now = time.monotonic()
        if committed != self._last_committed[0]:
            self._last_committed = (committed, now)
        # A Pub/Sub batch takes whatever the puller gathered, often several waves: when the job has
        # committed nothing for a few seconds while it runs, it waits for input, so one more wave goes out.
        # Not while it starts (its JVM, a dead run's lease to wait out): the waves would pile up, and Pub/Sub
        # delivers a pile in any order (a too-late event of a late wave judged by the watermark of an early one).
        stalled = (self.current is not None and self.current.poll() is None and now - self._last_committed[1] > 3
                   and self._leased(self.current.pid))
        while self.pending and (everything or (released < committed + AHEAD and released < cap)):
            self._release_one(released)
            released += 1
        if stalled and self.pending and released < cap:
            self._release_one(released)
            self._last_committed = (committed, now)

    def _leased(self, pid: int) -> bool:
        """Has the run of process ``pid`` taken the lease (its fault point ``leased``), so that it reads input?"""
        if self.fleet:  # every type's lease (a fleet takes them one after the other before Spark starts)
            self.faults_seen()
            return self.flog.counts[("leased", pid)] >= len(self.names)
        return ("leased", pid) in self.faults_seen()

    def _release_one(self, k: int) -> None:
        with self.release_lock:
            # the next wave, whatever the caller counted: the feeder's thread and a run's step (a downtime's backlog, a
            # bus's quarantine) may release at the same time
            k = len(self.events.batches) - len(self.pending)
            if not self.pending:
                return
            item = self.pending.pop(0)
            evs = self.events.batches[k][1]
            if evs and evs[0].kind == "fast_clock":
                stamp_fast_clock(evs, now_millis(), self.rng)
                if self.protobuf is not None:
                    self.protobuf.convert(evs, self.et.max_payload_bytes)
            if self.args.source == "dir":
                tmp = item.with_name("." + item.name)
                tmp.write_bytes(b"\n".join(e.payload for e in evs) + b"\n")
                tmp.rename(self.work / "in" / item.name)  # it arrives when the job lists it
            elif self.bus:  # every type's share and the unclaimed ones to the one topic, each with its attribute
                self.release_bus(k)
            elif self.args.source == "kafka":
                self._produce_wave(k, evs)
            elif self.fleet:  # each type's share of the wave to its own topic
                futures = [self.publisher.publish(self.topics[n], e.payload, **({} if e.payload else {"note": "empty"}))
                           for n, share in self.shares[k].items() for e in share]
                for f in futures:
                    f.result(timeout=60)
            else:
                futures = [self.publisher.publish(self.topic, e.payload, **({} if e.payload else {"note": "empty"}))
                           for e in evs]
                for f in futures:
                    f.result(timeout=60)
            self.released_at[k] = now_millis()

    def _feed(self, stop: threading.Event) -> None:
        while not stop.wait(0.3):
            try:
                self.release_input()
            except Exception:  # noqa: BLE001 - e.g. a commit file being written; next round
                continue

    # -- running and killing ---------------------------------------------------------------
    def command(self, *extra: str) -> list[str]:
        if self.fleet:  # every type of the folder as one fleet; each reads its own subscription (its `source`)
            return [EXE, "run", "--all", "--event-types", str(self.event_types_dir), "--sink", self.sink,
                    "--checkpoint-root", self.checkpoint, "--max-files-per-batch", "1", "--max-events-per-batch",
                    "400", "--trigger-interval", "500ms", "--master", "local[2]", "--drain-on-stop", *extra]
        types = ["--event-types", self.event_types_dir] if self.event_types_dir else []
        return [EXE, "run", "page_view", *types, "--source", self.source, "--sink", self.sink,
                "--checkpoint", self.checkpoint, "--max-files-per-batch", "1", "--max-events-per-batch", "400",
                "--trigger-interval", "500ms", "--master", "local[2]", "--drain-on-stop",  # SIGTERM: stop and drain
                *([] if self.broker_kind == "noida" else ["--quiet"]), *extra]  # noida: LOST read from progress

    def faults_seen(self) -> list[tuple[str, int]]:
        if self.fleet:
            return self.flog.read()
        if not self.fault_log.exists():
            return []
        out = []
        for line in self.fault_log.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                out.append((parts[0], int(parts[1])))
        return out

    def committed(self) -> int:
        if self.fleet:  # batches per type: every wave goes to every type (most get a few of its events)
            ids = [last_id(Path(self.checkpoint) / n / "spark" / "commits") for n in self.names]
            return sum(0 if i is None else i + 1 for i in ids) // len(self.names)
        d = Path(self.checkpoint) / "spark" / "commits"
        return len(list(d.glob("[0-9]*"))) if d.is_dir() else 0

    def _wait_point(self, proc, point: str, since: int, occurrence: int = 1, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if len([p for p, _ in self.faults_seen()[since:] if p == point]) >= occurrence:
                return True
            time.sleep(0.02)
        return False

    def one_fault(self, how: str, point: str | None) -> bool:
        """Start the job, wait for the fault point (or a random moment), stop it ``how``.  False if it was missed.

        ``how``: ``SIGKILL`` (the whole process group, as when a machine or container dies);
        ``SIGTERM`` (the event-etl process only, as Kubernetes and ``systemctl stop`` with
        KillMode=mixed deliver it) or ``SIGTERM_GROUP`` (every process of the job, as
        ``systemctl stop``, ``timeout`` and a closed terminal do): both drain; ``TERM_THEN_KILL``
        (SIGTERM, and SIGKILL up to two seconds into the drain: a grace period that ran out);
        ``DOWNTIME`` (SIGKILL, then down for longer than the idle timeout while input piles up);
        ``IDLE`` (SIGKILL inside an idle tick, once all input is in); ``REPLAY`` (SIGKILL at ``point``, then
        SIGKILL again while the next run replays the batch it left: a kill during the replay that follows a kill).
        """
        if how == "REPLAY":
            first = self.one_fault("SIGKILL", point)
            return self.one_fault("REPLAY_KILL", "files_written") and first
        if how == "GROW_DOWN":  # SIGKILL, then a partition added while it is down
            hit = self.one_fault("SIGKILL", point)
            self.grow(live=False)
            return hit
        if how in ("DELETE_RECORDS", "RETENTION"):
            # The job catches up with the input held back and is SIGKILLed with nothing planned unread: a deletion
            # takes a partition's whole prefix, and a batch planned over deleted records cannot be replayed (the
            # reader refuses: RELIABILITY.md).  Then, while it is down, a backlog, and records of it deleted.
            self.hold.set()
            try:
                hit = self.one_fault("CAUGHT_UP", None)
                self.delete_unread("DeleteRecords" if how == "DELETE_RECORDS" else "retention.ms")
            finally:
                self.hold.clear()
            return hit
        self.runs += 1
        t_start = time.monotonic()
        before = len(self.faults_seen())
        committed = self.committed()
        log = open(self.work / f"run-{self.runs:02d}.log", "w")
        pause_at = {"TERM_THEN_KILL": "drain", "IDLE": "idle_advance"}.get(how, point)
        proc = self.current = subprocess.Popen(self.command(), env=self.run_env(pause_at), stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        hit = False
        if how == "IDLE":
            # every event in and processed first; then the source is quiet and the next tick advances
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if self.accounted() >= self.expected_accounted():
                        break
                except Exception:  # noqa: BLE001 - mid-write; look again
                    pass
                time.sleep(1)
            hit = self._wait_point(proc, "idle_advance", len(self.faults_seen()), timeout=IDLE_TIMEOUT_S * 3)
        elif how == "CAUGHT_UP":
            hit = self._wait_caught_up(proc)
        elif how == "GROW_LIVE":  # a partition added while it runs, then a batch, then SIGKILL at a random moment
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None and self.committed() < committed + 1:
                time.sleep(0.2)
            if proc.poll() is None:
                self.grow(live=True)
                grown = self.committed()
                while time.monotonic() < deadline + 60 and proc.poll() is None and self.committed() < grown + 1:
                    time.sleep(0.2)
                time.sleep(self.rng.uniform(0.0, 2.0))
            hit = proc.poll() is None
        elif how == "QUARANTINE":  # a type's sink folder blocked until it is quarantined, then back; SIGKILL later
            hit = self.quarantine_one(proc)
        elif point is None:
            deadline = time.monotonic() + 180
            done = self.batches_done() if self.fleet else committed
            while time.monotonic() < deadline and proc.poll() is None and self.batches_done() < done + 1:
                time.sleep(0.2)
            time.sleep(self.rng.uniform(0.0, 2.0))
            hit = proc.poll() is None
        elif point == LEASE_POINT and self.fleet:
            # a renewal while the fleet runs batches (its first renewals come while Spark starts): one batch first
            deadline = time.monotonic() + 180
            done = self.batches_done()
            while time.monotonic() < deadline and proc.poll() is None and self.batches_done() < done + 1:
                time.sleep(0.1)
            hit = self._wait_point(proc, point, len(self.faults_seen()))
        else:
            occurrence = 1 if "marker" in point or how == "REPLAY_KILL" else self.rng.randint(1, 2)
            hit = self._wait_point(proc, point, before, occurrence)
        if proc.poll() is None:
            if self.tx_open:
                self.tx["stops while a transaction was open"] += 1
            if how in ("SIGKILL", "DOWNTIME", "IDLE", "REPLAY_KILL", "GROW_LIVE", "CAUGHT_UP", "QUARANTINE"):
                os.killpg(proc.pid, signal.SIGKILL)
            termed = time.monotonic()
            if how == "SIGTERM":
                os.kill(proc.pid, signal.SIGTERM)
            elif how == "SIGTERM_GROUP":
                os.killpg(proc.pid, signal.SIGTERM)
            elif how == "TERM_THEN_KILL":
                at = len(self.faults_seen())
                (os.killpg if self.rng.random() < 0.5 else os.kill)(proc.pid, signal.SIGTERM)
                hit = self._wait_point(proc, "drain", at, timeout=self.stop_wait)
                if hit:
                    # a fleet drains type after type, then stops every source at once: the kill lands in either
                    time.sleep(self.rng.uniform(0.0, 3.0 if self.fleet else 1.0))
                hit = hit and proc.poll() is None  # the kill lands inside the drain, or it missed
                if proc.poll() is None:
                    if self.fleet and hit:
                        drained = sum(1 for p, pid in self.faults_seen()[at:] if p == "drain" and pid == proc.pid)
                        self.stop_kills[f"in the drain ({drained} of {len(self.names)} types begun)"
                                        if drained < len(self.names) else "after every drain began (the stop)"] += 1
                    os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=self.stop_wait)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.stop_timeouts.append(f"run {self.runs}: {how} at {point or 'random'}")
            if self.fleet and how in ("SIGTERM", "SIGTERM_GROUP", "TERM_THEN_KILL"):
                self.stop_took(how, termed)
            if hit:
                self.kills[(how, point or {"IDLE": "idle_advance", "CAUGHT_UP": "caught_up"}.get(how, "random"))] += 1
                phase = self.kafka_phase()
                if phase is not None:
                    self.kafka_kills[phase] += 1
        else:
            hit = False
        self.ended(proc, t_start)
        log.close()
        if how == "DOWNTIME" and hit:
            # down for longer than the idle timeout while input piles up: the restart finds a backlog
            self.backlog_released(2 * AHEAD)
            time.sleep(IDLE_TIMEOUT_S + 5)
        if self.args.verbose:
            print(f"  run {self.runs:2d}: {how:<14} at {point or 'random':<20} "
                  f"{'hit' if hit else 'missed'} after {time.monotonic() - t_start:5.1f}s", flush=True)
        return hit

    def quarantine_one(self, proc: subprocess.Popen) -> bool:
        """``--bus N``: once a batch has run, the sink folder of a type of the bus (:data:`BUS_QUARANTINED`) is
        replaced by a file (its data files, markers and lease cannot be written, even by root) until the run says the
        type is quarantined, two more waves are sent, and the others have committed a round more (20 s at most); then
        the folder is back, and the type must come back too (its status ``running`` again once
        its backoff ran out; the batch it failed is replayed first, then it catches up with the bus).  True if the run
        is still alive for its SIGKILL."""
        name = self.names[BUS_QUARANTINED]
        folder, away = Path(self.sink) / name, Path(self.sink) / f".{name}.away"
        log = self.work / f"run-{self.runs:02d}.log"
        deadline = time.monotonic() + 180
        done = self.batches_done()
        while time.monotonic() < deadline and proc.poll() is None and self.batches_done() < done + len(self.names):
            time.sleep(0.2)
        if proc.poll() is not None:
            return False
        _block(folder, away)
        what = "not quarantined"
        try:
            until = time.monotonic() + 120
            while time.monotonic() < until and proc.poll() is None:
                if f"[{name}] quarantined (" in log.read_text(errors="replace"):
                    what = "quarantined, not back"
                    break
                time.sleep(0.3)
            others = self.batches_done()
            if what != "not quarantined":  # input for the others while it is away (past what is kept back for later)
                for _ in range(2):
                    if self.pending:
                        self._release_one(len(self.events.batches) - len(self.pending))
            until = time.monotonic() + 20
            while what != "not quarantined" and time.monotonic() < until and proc.poll() is None and (
                    self.batches_done() < others + len(self.names) - 1):
                time.sleep(0.3)
            went_on = self.batches_done() - others
        finally:
            _unblock(folder, away)
        if what != "not quarantined":
            what = f"quarantined (the others' batches meanwhile: {went_on}), not back"
            status = Path(self.checkpoint) / name / "etl" / "status.json"
            unblocked = now_millis()
            until = time.monotonic() + 120  # its backoff (doubled at each failure while blocked) run out, reopened
            while time.monotonic() < until and proc.poll() is None:
                try:
                    st = json.loads(status.read_text())
                except (OSError, ValueError):
                    st = {}
                if st.get("state") == "running" and st.get("updated_at", "") >= iso(unblocked):
                    what = what.replace("not back", "back")
                    break
                time.sleep(0.3)
        self.quarantines.append((self.runs, name, what))
        if self.args.verbose:
            print(f"  run {self.runs:2d}: {name}'s sink folder blocked, then back: {what}", flush=True)
        time.sleep(self.rng.uniform(0.0, 2.0))
        return proc.poll() is None

    def backlog_released(self, n: int) -> None:
        released = len(self.events.batches) - len(self.pending)
        cap = len(self.events.batches) - self.reserve * self.runs_left
        for _ in range(n):
            if released >= cap or not self.pending:
                return
            self._release_one(released)
            released += 1

    def finish(self) -> subprocess.CompletedProcess:
        """A last live run until every event is accounted for, then SIGTERM (stop and drain)."""
        self.runs += 1
        log = open(self.work / f"run-{self.runs:02d}-final.log", "w")
        before = len(self.faults_seen())
        t_start = time.monotonic()
        proc = self.current = subprocess.Popen(self.command(), env=self.run_env(EVENT_ETL_FAULT_PAUSE=""),
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        expected = self.expected_accounted()
        n = len(self.names) if self.fleet else 1  # a fleet: a lease per type, a drain per type
        deadline = time.monotonic() + 300 + 3 * (n - 1)
        # SIGTERM only once the job obeys it: its handlers are in before it takes the lease (after a SIGKILL, on an
        # object store, that means waiting out the dead run's lease); sent earlier, SIGTERM ends the process as it
        # ends any program, with no drain
        self._wait_point(proc, "leased", before, occurrence=n, timeout=240 + (n - 1))
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(3)
            try:
                if self.accounted() >= expected:
                    break
            except Exception:  # noqa: BLE001 - mid-write; look again
                continue
        termed = time.monotonic()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        if not self.fleet:
            proc.wait(timeout=180)
        else:  # a fleet's stop that outlasts every type's stop timeout is a hang: killed, and said
            try:
                proc.wait(timeout=max(180, self.stop_wait))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.stop_timeouts.append(f"run {self.runs}: the last run's SIGTERM (drain)")
            self.stop_took("SIGTERM (the last run)", termed)
        self.ended(proc, t_start)
        log.close()
        if self.fleet and self.args.verbose:
            print(f"  run {self.runs:2d}: the last run, SIGTERM (drain) once every event is in after "
                  f"{termed - t_start:.1f}s, exit {proc.returncode} after {time.monotonic() - t_start:5.1f}s",
                  flush=True)
        return proc.returncode

    def accounted(self) -> int:
        """Records in buckets + dead-letter records: compared with :meth:`expected_accounted`."""
        if self.fleet:  # every type's, in one listing (distinct ids: a merge's members and output are one)
            return self.index.accounted()
        content, _ = self.read_sink()
        placed = sum(len(h["records"]) for h in content.values())
        return placed + len(self.read_deadletters())

    def surviving(self, sent: list[Event] | None = None) -> list[Event]:
        """The event set (or ``sent``: a fleet's type's share) less the records deleted unread (Kafka,
        ``--kafka-scenario retention``): one event per deleted record (a producer retry's copy has its original's
        bytes)."""
        gone = Counter(self.deleted)
        out = []
        for e in self.events.events if sent is None else sent:
            if gone[e.payload] > 0:
                gone[e.payload] -= 1
                continue
            out.append(e)
        return out

    def expected_accounted(self) -> int:
        """What the sink must hold in the end: each valid event once (however many copies were sent and survived)
        and each dead-letter record, of the events that survived."""
        evs = self.surviving()
        return len({e.id for e in evs if e.kind in VALID_KINDS or e.kind == "duplicate"}) + sum(
            1 for e in evs if e.reason) + sum(len(w) for w in self.unclaimed_waves)  # a bus's: kept once each

    # -- reading the result ----------------------------------------------------------------
    def read_sink(self, event_type: str = "page_view"):
        st = Storage(self.sink)
        content = {}
        for day in st.list_dirs(event_type):
            if not day.startswith("dt="):
                continue
            for h in st.list_dirs(f"{event_type}/{day}"):
                rel = f"{event_type}/{day}/{h}"
                files = st.list_files(rel)
                entry = {"rel": rel, "files": files, "marker": None, "records": [], "data": {}}
                for name in sorted(files):
                    if name == MARKER_NAME:
                        entry["marker"] = Manifest.from_bytes(st.read(f"{rel}/{name}"))
                    elif name.endswith(DATA_SUFFIXES):
                        data = st.read(f"{rel}/{name}")
                        entry["data"][name] = data
                        meta = parse_data_file_name(name)
                        for i in _event_ids(name, data):
                            entry["records"].append((i, meta.batch_id, meta.late))
                content[parse_hour_dir(rel)[1]] = entry
        return content, st

    def read_deadletters(self, event_type: str = "page_view") -> list:
        from event_etl.storage.deadletter import iter_deadletters

        return list(iter_deadletters(Storage(self.sink), event_type))

    def leftovers(self) -> list[str]:
        """Temporary files a killed run left and no later run finished or removed: in a local sink, and in the
        checkpoint (a GCS sink writes each object in one upload: nothing is left there)."""
        roots = [Path(self.checkpoint)] + ([] if self.sink.startswith("gs://") else [Path(self.sink)])
        return sorted(str(p) for r in roots for p in r.rglob(".*.tmp"))

    def check(self, watcher: Watcher, event_type: str = "page_view", sent: list[Event] | None = None,
              leftovers: list[str] | None = None) -> dict:
        """The figures of ``event_type`` (a fleet's: of its share of the events, ``sent``)."""
        content, st = self.read_sink(event_type)
        leftovers = self.leftovers() if leftovers is None else leftovers
        dls = self.read_deadletters(event_type)
        sent = self.events.events if sent is None else sent
        events = self.surviving(sent)  # the events sent, less the records deleted unread
        alive = {e.id for e in events if e.id}
        valid = {e.id: e for e in sent if e.kind in VALID_KINDS and e.id in alive}
        deleted_ids = {e.id for e in sent if e.id and e.id not in alive}
        aborted_ids = {e.id for e in self.aborted if e.id}
        placed = Counter(i for h in content.values() for i, _, _ in h["records"])
        lost = sorted(set(valid) - set(placed))
        deleted_in_buckets = sorted(set(placed) & deleted_ids)
        aborted_payloads = {e.payload for e in self.aborted}
        aborted_found = sorted(set(placed) & aborted_ids) + [d.payload[:60] for d in dls
                                                             if d.payload in aborted_payloads]
        duplicated = sorted(i for i, n in placed.items() if n > 1)
        where = {}
        for entry in content.values():
            for name, data in entry["data"].items():
                if duplicated:
                    import fastavro

                    for r in fastavro.reader(io.BytesIO(data)):
                        if str(r["event_id"]) in duplicated[:5]:
                            where.setdefault(str(r["event_id"]), []).append(f"{entry['rel']}/{name}")
        not_valid_in_buckets = sorted(set(placed) - set(valid) - deleted_ids - aborted_ids)
        # placement by the hour that was open when the record's batch ran
        marker_batch = {h: e["marker"].extra.get("last_batch") for h, e in content.items() if e["marker"]}
        first_marked = min(marker_batch) if marker_batch else None

        def complete_before(hour: int, batch: int) -> bool:
            """Was ``hour`` complete when ``batch`` began?  Hours before the job's first one always were."""
            if hour in marker_batch:
                return marker_batch[hour] < batch
            return first_marked is not None and hour < first_marked

        misplaced = []
        for h, entry in content.items():
            for i, b, late in entry["records"]:
                e = valid.get(i)
                if e is None:
                    continue
                own = e.t - e.t % HOUR_MS
                if not late:
                    ok = h == own and not complete_before(h, b)
                else:
                    ok = own < h and complete_before(own, b) and not complete_before(h, b)
                if not ok:
                    misplaced.append((i, iso(h), b, late))
        # dead letters: reasons and original bytes
        expected_dl = Counter((e.reason, e.payload) for e in events if e.reason)
        got_dl = Counter((d.reason, d.payload) for d in dls)
        dl_missing = sum((expected_dl - got_dl).values())
        dl_extra = sum((got_dl - expected_dl).values())
        kinds = {e.id: e.kind for e in sent if e.id}
        dl_detail = {"missing": [(r, p[:80].decode("utf-8", "replace")) for r, p in (expected_dl - got_dl)][:10],
                     "extra": [(r, p[:80].decode("utf-8", "replace")) for r, p in (got_dl - expected_dl)][:10],
                     "not valid but in buckets": [(i, kinds.get(i)) for i in not_valid_in_buckets][:10]}
        # markers
        hours = sorted(content)
        all_hours = list(range(hours[0], hours[-1] + HOUR_MS, HOUR_MS)) if hours else []
        unmarked = [iso(h) for h in all_hours if h not in content or content[h]["marker"] is None]
        bad_manifests = []
        for h, entry in content.items():
            m = entry["marker"]
            if m is None:
                continue
            names = sorted(n for n in entry["files"] if n.endswith(DATA_SUFFIXES))
            good = [f.name for f in m.files] == names and all(
                f.bytes == len(entry["data"][f.name]) and f.sha256 == hashlib.sha256(entry["data"][f.name]).hexdigest()
                for f in m.files) and m.records == len(entry["records"]) and m.late_records == sum(
                1 for r in entry["records"] if r[2])
            if not good:
                bad_manifests.append(iso(h))
        # few files per complete hour: at most ceil(records / max_events_per_file) + 2
        too_many_files = [
            (iso(h), len([n for n in entry["files"] if n.endswith(DATA_SUFFIXES)]), len(entry["records"]))
            for h, entry in content.items() if entry["marker"] is not None
            and len([n for n in entry["files"] if n.endswith(DATA_SUFFIXES)])
            > -(-len(entry["records"]) // MAX_EVENTS_PER_FILE) + 2]
        # markers never written twice: create-only; folders never changed after their marker
        changed = [rel for rel, snap in watcher.snapshots.items()
                   if rel.startswith(f"{event_type}/") and watcher.snapshot(rel) != snap]
        # no hour closed before the real clock passed its end (the fast producer clock), but by a drain
        closed_by = {h: e["marker"].extra.get("closed_by") for h, e in content.items() if e["marker"]}
        early = [iso(h) for h, e in content.items() if e["marker"] and closed_by[h] != "drain"
                 and e["marker"].completed_at < h + HOUR_MS]
        # no event that was timely when sent judged late, but in hours a drain closed
        judged_late = sorted(i for entry in content.values() for i, _, late in entry["records"]
                             if late and valid.get(i) is not None and valid[i].kind in ("timely", "out_of_order")
                             and closed_by.get(valid[i].t - valid[i].t % HOUR_MS) != "drain")
        bad_inputs = Counter(e.kind for e in sent if e.reason and e.kind in INVALID_KINDS)
        idle_early = self.idle_early(content, valid, closed_by) if self.fleet else []
        # a marker's watermark (what completed it) past its hour's end (a fleet's figure; a drain moves the
        # watermark to the end of the last hour holding data)
        wm_early = [iso(h) for h, e in content.items() if e["marker"] and e["marker"].watermark < h + HOUR_MS]
        return {
            "events sent": len(sent),
            "valid events (unique)": len(valid),
            "duplicates sent (producer retries)": sum(1 for e in sent if e.kind == "duplicate"),
            "late sent": sum(1 for e in sent if e.kind == "late"),
            "too late / future sent": sum(1 for e in sent if e.kind in ("too_late", "future")),
            "bad inputs sent (kinds)": f"{sum(bad_inputs.values())} ({len(bad_inputs)} kinds)",
            "event-time hours": len(all_hours),
            "job runs": self.runs,
            "SIGKILL": sum(n for (s, _), n in self.kills.items()
                           if s in ("SIGKILL", "DOWNTIME", "IDLE", "REPLAY_KILL", "GROW_LIVE", "CAUGHT_UP",
                                    "QUARANTINE")),
            "SIGKILL during the replay after a SIGKILL": sum(n for (s, _), n in self.kills.items()
                                                             if s == "REPLAY_KILL"),
            "SIGTERM": sum(n for (s, _), n in self.kills.items() if s in ("SIGTERM", "SIGTERM_GROUP")),
            "SIGTERM to the process group": sum(n for (s, _), n in self.kills.items() if s == "SIGTERM_GROUP"),
            "SIGKILL during a SIGTERM drain": sum(n for (s, _), n in self.kills.items() if s == "TERM_THEN_KILL"),
            "SIGKILL inside an idle tick": sum(n for (s, _), n in self.kills.items() if s == "IDLE"),
            "restarts with a backlog after a downtime > idle_timeout": sum(
                n for (s, _), n in self.kills.items() if s == "DOWNTIME"),
            "kills by point": dict(sorted(Counter(f"{s}@{p}" for (s, p) in self.kills.elements()).items())),
            "lost": len(lost),
            "duplicated": len(duplicated),
            "invalid/too-late/future in buckets": len(not_valid_in_buckets),
            "misplaced (hour not open when it arrived)": len(misplaced),
            "dead-letter records missing": dl_missing,
            "dead-letter records extra": dl_extra,
            "hours without exactly one _COMPLETE": len(unmarked),
            "manifests not matching their folder": len(bad_manifests),
            "hours changed after their marker (premature markers)": len(changed),
            "complete hours with more than ceil(records / max_events_per_file) + 2 files": len(too_many_files),
            "data files in complete hours (of them merged)": "{} ({})".format(
                sum(1 for e in content.values() if e["marker"] for n in e["files"] if n.endswith(DATA_SUFFIXES)),
                sum(1 for e in content.values() if e["marker"] for n in e["files"] if is_merged_name(n))),
            "hours marked before the real clock passed their end": len(early),
            "temporary files left": len(leftovers),
            # Pub/Sub delivers the waves the campaign publishes ahead in any order: there a timely event may be
            # late for real, and the figure is shown, not judged.  Files arrive in order.
            ("timely events judged late (an hour closed early)" if self.args.source in ("dir", "kafka") else
             "timely events judged late (Pub/Sub reorders waves: shown, not judged)"): len(judged_late),
            **self.kafka_rows(),
            **({KEY_WM_EARLY: len(wm_early), KEY_IDLE_EARLY: len(idle_early)} if self.fleet else {}),
            **({"deleted records in the sink": len(deleted_in_buckets)} if "retention" in self.scenarios else {}),
            **({"aborted records in the sink or dead letters": len(aborted_found)}
               if "transactions" in self.scenarios else {}),
            "hours closed by watermark / idle / drain": "{} / {} / {}".format(
                *(sum(1 for v in closed_by.values() if v == k) for k in ("watermark", "idle", "drain"))),
            "_details": {"lost": lost[:10], "duplicated": duplicated[:10], "duplicated where": where,
                         "misplaced": misplaced[:10],
                         "unmarked": unmarked[:10], "bad_manifests": bad_manifests[:10], "changed": changed[:10],
                         "early": early[:10], "too many files": too_many_files[:10], "judged_late": judged_late[:10],
                         "temporary files left": leftovers[:10], "deleted in the sink": deleted_in_buckets[:10],
                         "aborted found": aborted_found[:10], "Kafka deletions": self.deletions,
                         "dead letters": dl_detail,
                         **({"idle markers before their events were read": idle_early[:10],
                             "markers whose watermark is not past their hour": wm_early[:10]} if self.fleet else {})},
        }

    def check_iceberg(self) -> dict:
        """``--iceberg``: the hours the policy's record says are done each have exactly one snapshot, from their
        marker's bytes, none committed before its marker was written; then the hours a stop left pending are
        committed as the next start would, and the table's rows must equal the manifests'."""
        from event_etl.job.policies import CompleteHour
        from event_etl.job.policy_iceberg import IcebergPolicy
        from event_etl.timeutil import parse_hour

        st = Storage(self.sink)
        record = json.loads((Path(self.checkpoint) / "etl" / "policies" / "iceberg.json").read_text())
        done = record.get("done_through")
        markers = {}
        for rel in st.list_dirs("page_view"):
            for h in (st.list_dirs(f"page_view/{rel}") if rel.startswith("dt=") else ()):
                folder = f"page_view/{rel}/{h}"
                if MARKER_NAME in st.list_files(folder):
                    data = st.read(f"{folder}/{MARKER_NAME}")
                    mtime = os.stat(st.path(f"{folder}/{MARKER_NAME}")).st_mtime * 1000
                    markers[parse_hour_dir(folder)[1]] = (folder, data, mtime)
        policy = IcebergPolicy(dict(self.et.commit_policies[-1]), self.et, st)
        table = policy.table()
        early = [s for s in (table.snapshots() if table else [])
                 if s.timestamp_ms < markers[parse_hour(s.summary.additional_properties["event_etl.hour"])][2] - 1]
        pending = [h for h in sorted(markers) if done is None or h > int(done)]
        for h in pending:  # what the next start does
            folder, data, _ = markers[h]
            policy.run(CompleteHour("page_view", h, data, st.display(f"{folder}/{MARKER_NAME}"), st.display(folder),
                                    Manifest.from_bytes(data)))
        table = policy.table()
        props = [s.summary.additional_properties for s in (table.snapshots() if table else [])]
        by_hour = Counter((parse_hour(p["event_etl.hour"]), p["event_etl.marker_sha256"]) for p in props)
        wrong = [iso(h) for h, (_, data, _) in markers.items() if Manifest.from_bytes(data).files
                 and by_hour[(h, hashlib.sha256(data).hexdigest())] != 1]
        wrong += [iso(h) for h, _ in by_hour if h not in markers]
        rows = table.scan(selected_fields=("event_id",)).to_arrow().num_rows if table else 0
        records = sum(Manifest.from_bytes(data).records for _, data, _ in markers.values())
        self._iceberg_details = {"not exactly once": wrong, "early": [s.snapshot_id for s in early]}
        return {"iceberg: snapshots (of them committed after the last stop, pending then)":
                f"{len(props)} ({len(pending)})",
                "iceberg: complete hours not committed exactly once": len(wrong),
                "iceberg: snapshots before their marker": len(early),
                "iceberg: rows (manifests' records)": f"{rows} ({records})",
                "iceberg: rows not equal to the manifests'": abs(rows - records)}

    # -- a fleet's figures (--types N) ------------------------------------------------------
    def idle_early(self, content: dict, valid: dict, closed_by: dict) -> list:
        """Events written late into a later hour although their own hour was closed by the idle rule at least a
        second after they were published: an idle advance while they waited in the subscription (a type whose
        turns on the shared pullers come too rarely reports a quiet source while its messages are unread)."""
        wave = {id(e): k for k, (_, evs) in enumerate(self.events.batches) for e in evs}
        out = []
        for entry in content.values():
            for i, _, late in entry["records"]:
                e = valid.get(i)
                if not late or e is None:
                    continue
                own = e.t - e.t % HOUR_MS
                m = content.get(own, {}).get("marker")
                published = self.released_at.get(wave.get(id(e), -1))
                if (m is not None and closed_by.get(own) == "idle" and published is not None
                        and published < m.completed_at - 1000):
                    out.append((i, iso(own), f"published {(m.completed_at - published) / 1000:.1f}s before the marker"))
        return out

    def check_fleet(self, watcher: Watcher) -> dict:
        """``--types N``: every check of :meth:`check` per type (its share of the events, its hours, its dead
        letters), summed over the types; then what only a fleet has (:meth:`fleet_rows`)."""
        leftovers = self.leftovers()
        per = {n: self.check(watcher, n, self.type_events[n], leftovers=[]) for n in self.names}
        first = per[self.names[0]]
        out: dict = {("event types (one bus: one subscription or topic)" if self.bus else
                      "event types (one fleet, each its own topic and subscription)"): len(self.names)}
        for k, v in first.items():
            if k.startswith("_"):
                continue
            vals = [per[n][k] for n in self.names]
            out[k] = v if k in RUN_KEYS else sum(vals) if all(isinstance(x, int) for x in vals) else sum_figures(vals)
        bad_inputs = Counter(e.kind for e in self.events.events if e.reason and e.kind in INVALID_KINDS)
        out["bad inputs sent (kinds)"] = f"{sum(bad_inputs.values())} ({len(bad_inputs)} kinds)"
        hours = sorted(per[n]["event-time hours"] for n in self.names)
        out["event-time hours"] = f"{sum(hours)} in all types (per type {hours[0]}..{hours[-1]})"
        valid = sorted(per[n]["valid events (unique)"] for n in self.names)
        out["valid events per type (min / median / max)"] = f"{valid[0]} / {valid[len(valid) // 2]} / {valid[-1]}"
        out["temporary files left"] = len(leftovers)
        failing = [n for n in self.names if failures(per[n])]
        out["types failing a check (of them)"] = f"{len(failing)} of {len(self.names)}"
        rows, details = self.fleet_rows()
        out.update(rows)
        if self.bus:
            more, more_details = self.bus_rows(per)
            out.update(more)
            details.update(more_details)
            out[KEY_QUARANTINE_MISSED] = sum(1 for _, _, what in self.quarantines if not what.endswith(", back"))
        out["_details"] = {"failing types": {n: failures(per[n]) for n in failing[:20]},
                           "failing types' details": {n: per[n]["_details"] for n in failing[:3]},
                           "temporary files left": leftovers[:10], **details}
        return out

    def fleet_rows(self) -> tuple[dict, dict]:
        """What only a fleet has: no type written by two jobs (by its data files' writes and its lease's renewals,
        each run's in its own fault log: once a run wrote or renewed a type, no earlier run does, its orphaned
        workers included; those orphans' writes are shown), the stops, the restarts' waits, the quarantines, drains
        that failed, runs that failed."""
        self.faults_seen()
        spans = {run: (start, end) for run, _, start, end, _ in self.spans}
        after_end: list[str] = []  # a run's points after its driver was reaped: its orphaned Spark workers'
        late = [0.0, 0]  # the longest an orphan wrote after its driver died; how many after the next run started
        by_type: dict[str, list[tuple[float, int]]] = defaultdict(list)
        holders: dict[tuple[str, int], set] = defaultdict(set)
        for name, _, t, detail, run in self.flog.entries:
            if run in spans and t > spans[run][1]:
                after_end.append(f"run {run}: {name} {detail} ({t - spans[run][1]:.3f}s after its driver ended)")
                late[0] = max(late[0], t - spans[run][1])
                late[1] += 1 if run + 1 in spans and t >= spans[run + 1][0] else 0
            typ = None
            if name == "write_file":
                typ = detail.split("/", 1)[0]
            elif name == LEASE_POINT and " " in detail:
                typ, holder = detail.split(" ", 1)
                holders[(typ, run)].add(holder)
            if typ is not None:
                by_type[typ].append((t, run))
        two: list[str] = []
        for typ, evs in sorted(by_type.items()):
            top = 0
            for t, run in sorted(evs):
                if run < top:
                    two.append(f"{typ}: run {run} wrote or renewed at {t:.3f}, after run {top} had")
                    break
                top = max(top, run)
        renewed = Counter(run for (_, run) in holders)
        logs = {f.name: f.read_text(errors="replace") for f in sorted(self.work.glob("run-*.log"))}
        meant = {(f"run-{run:02d}.log", name) for run, name, _ in self.quarantines}  # --bus N: its sink blocked
        quarantined = {m for f, text in logs.items() for m in re.findall(r"\[(\w+)\] quarantined \(", text)
                       if (f, m) not in meant}
        not_drained = {m for text in logs.values() for m in re.findall(r"\[(\w+)\] not drained:", text)}
        waits = {f: len(re.findall(r"to stop writing: its lease runs out then", text)) for f, text in logs.items()}
        failed = [f"run {run}: exit {rc}" for run, _, _, _, rc in self.spans if rc is not None and rc > 0]
        lines = [line for text in logs.values() for line in text.splitlines()
                 if re.search(r"\] quarantined \(|\] not drained:", line)]
        rows = {
            "write_file / lease_renew points logged (types)": "{} / {} ({})".format(
                sum(1 for e in self.flog.entries if e[0] == "write_file"),
                sum(1 for e in self.flog.entries if e[0] == LEASE_POINT), len(by_type)),
            "runs that renewed leases: types renewed each (min..max)": (
                f"{len(renewed)}: {min(renewed.values())}..{max(renewed.values())}" if renewed else "0"),
            "SIGKILL after a SIGTERM: where it landed": dict(self.stop_kills) or "-",
            "restarts that waited out a dead run's lease (types waiting, by run)": (
                {f: n for f, n in waits.items() if n} or "none"),
            KEY_TWO_JOBS: len(two),
            KEY_AFTER_END: f"{len(after_end)} ({late[1]}); the latest {late[0]:.2f} s after",
            "a type's lease held by two holders in one run": sum(1 for hs in holders.values() if len(hs) > 1),
            KEY_QUARANTINED: len(quarantined),
            KEY_NOT_DRAINED: len(not_drained),
            KEY_RUNS_FAILED: len(failed),
            KEY_STOP_HUNG: len(self.stop_timeouts),
            "SIGTERM to the first type's drain / to the exit, by run": "; ".join(self.stop_times) or "-",
        }
        details = {"written by two jobs": two[:10], "after their run ended": after_end[:10],
                   "quarantined or not drained": lines[:10], "runs failed": failed,
                   "stops that did not end in time": self.stop_timeouts}
        return rows, details

    # -- the campaign ----------------------------------------------------------------------
    def plan(self) -> list[tuple[str, str | None]]:
        if self.fleet:
            return self.fleet_plan()
        points = FAULT_POINTS + (PUBSUB_POINTS if self.args.source == "pubsub" else ()) + (
            ICEBERG_POINTS if getattr(self.args, "iceberg", False) else ())
        # "source": a SIGKILL at each of the source's own points only (the batch protocol's points are the same for
        # every source: the directory campaign kills at each), the rest of --kills at random points
        # (Kafka has no points of its own: with "source", every SIGKILL is at a random point of the batch protocol)
        own = getattr(self.args, "points", "all") == "source" and self.args.source in ("pubsub", "kafka")
        each = (PUBSUB_POINTS if self.args.source == "pubsub" else ()) if own else points
        kills = [("SIGKILL", p) for p in each]
        while len(kills) < self.args.kills:
            kills.append(("SIGKILL", self.rng.choice([*points, None, None])))
        # half of the SIGTERMs to the whole process group, half to the event-etl process
        kills += [("SIGTERM_GROUP" if k % 2 == 0 else "SIGTERM", self.rng.choice([None, "write_file", "before_marker"]))
                  for k in range(self.args.sigterms)]
        if self.every_stop:  # the stops whose windows every source shares (--stops all)
            kills += [("TERM_THEN_KILL", None), ("DOWNTIME", None), ("REPLAY", "files_written")]
        self.rng.shuffle(kills)
        # Kafka on noida-db: the scenarios' steps at their places in the plan (the input is released as the runs
        # go: a place in the plan is a place in the waves)
        steps = [*(GROW_STEPS if "grow" in self.scenarios else ()),
                 *(DELETE_STEPS if "retention" in self.scenarios else ())]
        n = len(kills)
        for share, how in sorted(steps, reverse=True):
            point = self.rng.choice([*FAULT_POINTS, None]) if how == "GROW_DOWN" else None
            kills.insert(round(n * share), (how, point))
        return kills

    def fleet_plan(self) -> list[tuple[str, str | None]]:
        """``--types N``: a SIGKILL at each of Pub/Sub's points (fired in the pool's puller threads, the
        acknowledgements and the planner) and at a lease's renewal (``--points source``; ``all``: at the batch
        protocol's too; or the points named, comma-separated), the rest of ``--kills`` at random points or moments;
        the SIGTERMs (half to the group); a SIGKILL during the stop that follows a SIGTERM (a fleet drains type after
        type, then stops its sources at once); with ``--stops all`` also a downtime and a double kill."""
        chosen = getattr(self.args, "points", "all")
        # a bus on Kafka: no points of the source's own (a bus's Pub/Sub has the fleet's)
        own = (*PUBSUB_POINTS, LEASE_POINT) if self.args.source == "pubsub" else (LEASE_POINT,)
        every = (*FAULT_POINTS, *own)
        named = tuple(chosen.split(","))
        each, pool = {"all": (every, every), "source": (own, every)}.get(chosen, (named, named))
        kills: list[tuple[str, str | None]] = [("SIGKILL", p) for p in each]
        while len(kills) < self.args.kills:
            kills.append(("SIGKILL", self.rng.choice([*pool, None, None])))
        kills += [("SIGTERM_GROUP" if k % 2 == 0 else "SIGTERM", self.rng.choice([None, "write_file", "before_marker"]))
                  for k in range(self.args.sigterms)]
        kills.append(("TERM_THEN_KILL", None))
        if self.every_stop:
            kills += [("DOWNTIME", None), ("REPLAY", "files_written")]
        self.rng.shuffle(kills)
        if self.bus:  # a type quarantined (its sink folder blocked), in the first third: its backlog then comes in
            kills.insert(max(1, len(kills) // 3), ("QUARANTINE", None))
        return kills

    def run(self) -> dict:
        """The campaign; the process's environment as it was before, after it (the campaign points
        ``PUBSUB_EMULATOR_HOST`` and ``STORAGE_EMULATOR_HOST`` at servers of its own, which it stops: a pytest worker
        that ran it must not send its next tests' clients to them)."""
        saved = dict(os.environ)
        try:
            return self._run()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def _run(self) -> dict:
        t0 = time.monotonic()
        self.prepare()
        if self.fleet and self.args.verbose:
            print(f"  {len(self.names)} types, their topics and subscriptions made in {time.monotonic() - t0:.1f}s",
                  flush=True)
        watcher = (FleetWatcher(Storage(self.sink), self.index) if self.fleet
                   else Watcher(Storage(self.sink), "page_view"))
        watcher.start()
        lineage = LineageTail(self.lineage_log, Storage(self.sink)) if getattr(self.args, "policies", False) else None
        if lineage is not None:
            lineage.start()
        feeding = threading.Event()
        feeder = threading.Thread(target=self._feed, args=(feeding,), daemon=True)
        self.release_input()
        feeder.start()
        try:
            plan = self.plan()
            # a plan longer than the input allows for (the Kafka scenarios' steps) keeps fewer batches back per run
            self.reserve = max(1, min(RESERVE_PER_RUN, (len(self.events.batches) - 2 * AHEAD) // (len(plan) + 1)))
            for k, (how, point) in enumerate(plan):
                self.runs_left = len(plan) - k - 1
                self.one_fault(how, point)
            self.runs_left = 0
            feeding.set()
            feeder.join(timeout=30)
            self.release_input(everything=True)
            if self.every_stop:
                self.one_fault("IDLE", None)  # every event in, the source quiet: killed inside an idle tick
            rc = self.finish()
            watcher.stop_event.set()
            watcher.join(timeout=10)
            if lineage is not None:
                lineage.stop_event.set()
                lineage.join(timeout=10)
                lineage.poll()
            for rel in watcher.folders():  # markers written at the very end
                if rel not in watcher.snapshots and MARKER_NAME in watcher.storage.list_files(rel):
                    watcher.snapshots[rel] = watcher.snapshot(rel)
            result = self.check_fleet(watcher) if self.fleet else self.check(watcher)
            if lineage is not None:  # every marked hour notified at least once, none before its marker
                marked = set(watcher.snapshots)
                notified = Counter(rel for rel, _ in lineage.events)
                result["policy: complete hours never notified"] = len(marked - set(notified))
                result["policy: notices before their marker"] = sum(1 for _, seen in lineage.events if not seen)
                result["policy: notices (of them repeated after a kill)"] = (
                    f"{len(lineage.events)} ({sum(n - 1 for n in notified.values())})")
                result["_details"]["never notified"] = sorted(marked - set(notified))
            if getattr(self.args, "iceberg", False):
                result.update(self.check_iceberg())
            result["final run exit code"] = rc
            result["seconds"] = round(time.monotonic() - t0, 1)
            return result
        finally:
            if self.current is not None and self.current.poll() is None:  # never leave a job behind
                os.killpg(self.current.pid, signal.SIGKILL)
                self.current.wait()
            self.close_kafka_clients()
            for s in self.servers:
                s.stop()


KEY_WM_EARLY = "markers whose watermark is not past their hour's end (premature)"
KEY_IDLE_EARLY = "hours closed by the idle rule while their events waited unread (published >= 1 s before)"
KEY_TWO_JOBS = "types written by two jobs (a run's write or renewal after a later run's)"
# PySpark's worker daemon puts itself and its workers in a process group of their own (pyspark/daemon.py: setpgid),
# and event_etl's daemon keeps them deaf to the SIGHUP it sends them when its JVM goes: a SIGKILL of the job's group
# leaves a worker in a task writing until it next speaks to the dead JVM (the lease's fence stops it once another run
# holds the type).  Shown, not judged: KEY_TWO_JOBS judges whether such a write came after a later run's
KEY_AFTER_END = ("writes by a run's Spark workers after its driver was killed (orphans), of them after the next run "
                 "started")
KEY_QUARANTINED = "types quarantined (a type's source, batch or tick failed)"
KEY_NOT_DRAINED = "types not drained"
KEY_RUNS_FAILED = "runs that failed or were refused (exit code > 0)"
KEY_STOP_HUNG = "runs not ended 120 s + 12 s a type after their SIGTERM (a hang: then SIGKILLed)"
KEY_UNCLAIMED_LOST = "unclaimed messages not kept (lost)"
KEY_UNCLAIMED_DUP = "unclaimed messages kept more than once (duplicated)"
KEY_UNCLAIMED_ELSEWHERE = "unclaimed messages in a type's buckets or dead letters, or with a wrong reason or detail"
KEY_QUARANTINE_MISSED = "blocked sink folders that did not quarantine their type, or after which it did not come back"
# --types N: figures of the runs, the same for every type (not summed over the types)
RUN_KEYS = ("job runs", "SIGKILL", "SIGKILL during the replay after a SIGKILL", "SIGTERM",
            "SIGTERM to the process group", "SIGKILL during a SIGTERM drain", "SIGKILL inside an idle tick",
            "restarts with a backlog after a downtime > idle_timeout", "kills by point")


def sum_figures(values: list) -> str:
    """Figures such as ``"12 (5)"`` or ``"3 / 0 / 1"`` of every type, added number by number."""
    nums = [[int(x) for x in re.findall(r"\d+", str(v))] for v in values]
    if len({len(n) for n in nums}) != 1:
        return "; ".join(str(v) for v in values[:5])
    totals = iter([sum(col) for col in zip(*nums, strict=True)])
    return re.sub(r"\d+", lambda _m: str(next(totals)), str(values[0]))


FAILURE_KEYS = ("lost", "duplicated", "invalid/too-late/future in buckets", "misplaced (hour not open when it arrived)",
                "dead-letter records missing", "dead-letter records extra", "hours without exactly one _COMPLETE",
                "manifests not matching their folder", "hours changed after their marker (premature markers)",
                "hours marked before the real clock passed their end",
                "complete hours with more than ceil(records / max_events_per_file) + 2 files",
                "timely events judged late (an hour closed early)", "final run exit code", "temporary files left",
                "policy: complete hours never notified", "policy: notices before their marker",
                "iceberg: complete hours not committed exactly once", "iceberg: snapshots before their marker",
                "iceberg: rows not equal to the manifests'",
                "deleted records in the sink", "aborted records in the sink or dead letters", KEY_LOST_WRONG,
                KEY_FAIL_RUNS_WRONG, KEY_DELETIONS_MISSED, KEY_WM_EARLY, KEY_TWO_JOBS, KEY_QUARANTINED,
                KEY_NOT_DRAINED, KEY_RUNS_FAILED, KEY_STOP_HUNG, KEY_UNCLAIMED_LOST, KEY_UNCLAIMED_DUP,
                KEY_UNCLAIMED_ELSEWHERE, KEY_QUARANTINE_MISSED)


def failures(result: dict) -> list[str]:
    return [k for k in FAILURE_KEYS if result.get(k)]


def print_table(result: dict, args) -> None:
    partitions = getattr(args, "fetch_partitions", 0)
    kafka = getattr(args, "kafka_partitions", 4) if args.source == "kafka" else 0
    print(f"\nfault campaign: source {args.source}, {args.events} events, {args.files} batches, seed {args.seed}"
          + (f", {partitions} fetch partitions" if partitions else "")
          + (", Protobuf payloads" if getattr(args, "payload", "json") == "protobuf" else "")
          + (", SIGKILLs and SIGTERMs only (--stops kills)" if getattr(args, "stops", "all") == "kills" else "")
          + (f", a fleet of {args.types} types (one application), kills at {args.points}"
             if (getattr(args, "types", 1) or 1) > 1 else "")
          + (f", a bus of {args.bus} types (one {'subscription' if args.source == 'pubsub' else 'topic'}), kills at "
             f"{args.points}" if (getattr(args, "bus", 0) or 0) > 1 else "")
          + (f", {kafka} Kafka partitions, broker {kafka_broker_kind(args)}, scenario "
             f"{getattr(args, 'kafka_scenario', 'none') or 'none'}" if kafka else ""))
    width = max(len(k) for k in result if not k.startswith("_"))
    for k, v in result.items():
        if not k.startswith("_"):
            print(f"  {k:<{width}}  {v}")
    bad = failures(result)
    print("  RESULT: " + ("OK: 0 lost, 0 duplicated, 0 premature or changed markers" if not bad else f"FAILED: {bad}"))
    if bad:
        print("  details:", json.dumps(result["_details"], default=str)[:2000])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", choices=("dir", "pubsub", "kafka"), default="dir")
    ap.add_argument("--payload", choices=("json", "protobuf"), default="json",
                    help="what the producer sends: JSON (the default) or Protobuf messages (issue 56)")
    ap.add_argument("--sink", choices=("local", "gcs"), default=None,
                    help="local disk or the GCS emulator (default: gcs for pubsub, local for dir and kafka)")
    ap.add_argument("--events", type=int, default=6000)
    ap.add_argument("--files", type=int, default=96, help="batches of input (files, or waves of messages)")
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--kills", type=int, default=10, help="SIGKILLs (at least one per fault point)")
    ap.add_argument("--points", default="all",
                    help="a SIGKILL at every fault point (all), or only at the source's own (source: Pub/Sub's; "
                         "Kafka has none: every SIGKILL at a random point; the batch protocol's points, the same for "
                         "every source, are each killed by the directory campaign); with --types N also the points "
                         "named, comma-separated (a fleet's own: Pub/Sub's and lease_renew)")
    ap.add_argument("--types", type=int, default=1,
                    help="Pub/Sub: N event types (copies of page_view, each its own topic, subscription and share of "
                         "the events) run as one fleet (run --all), killed and checked per type (issue 58)")
    ap.add_argument("--bus", type=int, default=0,
                    help="Pub/Sub or Kafka (noida-db): N event types (copies of page_view, bus_a ..) that share one "
                         "subscription or topic, routed by the attribute (header) 'type', with messages no type "
                         "claims, the last type quiet for most of the waves, one quarantined for a while (its sink "
                         "folder blocked): killed and checked per type, the unclaimed checked once each (issue 59)")
    ap.add_argument("--sigterms", type=int, default=2)
    ap.add_argument("--stops", choices=("all", "kills"), default="all",
                    help="every kind of stop (all), or only the SIGKILLs and SIGTERMs (kills): no drain cut short by "
                         "a SIGKILL, no downtime longer than the idle timeout, no double kill, no kill in an idle "
                         "tick; those windows are the same for every source, and the directory campaign has each")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--verbose", action="store_true", help="a line per run")
    ap.add_argument("--policies", action="store_true",
                    help="an openlineage commit policy on the type (file transport): every complete hour notified "
                    "at least once, none before its marker")
    ap.add_argument("--iceberg", action="store_true",
                    help="the type in Parquet with an iceberg commit policy (SQL catalog on SQLite): every complete "
                    "hour one snapshot, none before its marker, the table's rows equal to the manifests'; SIGKILLs "
                    "also at the policy's points (inside the commit)")
    ap.add_argument("--fetch-partitions", type=int, default=0,
                    help="Pub/Sub: pull in N executor tasks (EVENT_ETL_PUBSUB_FETCH_PARTITIONS); 0: in the driver")
    ap.add_argument("--kafka-partitions", type=int, default=4, help="Kafka: partitions of the topic (default 4)")
    ap.add_argument("--idle-partition", choices=("quiet", "none"), default="quiet",
                    help="Kafka: the last partition gets nothing for a stretch of the waves, then wakes (quiet), or "
                         "every partition gets its share throughout (none)")
    ap.add_argument("--broker", choices=("tansu", "noida"), default=None,
                    help="Kafka: the broker (default: noida with a --kafka-scenario, else tansu)")
    ap.add_argument("--kafka-scenario", choices=("none", *KAFKA_SCENARIOS, "all"), default="none",
                    help="Kafka on noida-db: partitions added while down and while running (grow), records deleted "
                         "unread by DeleteRecords and by retention.ms, each first with fail then skip (retention), "
                         "waves in transactions with aborted ones among them (transactions), or all three")
    args = ap.parse_args(argv)
    named = set(FAULT_POINTS) | set(PUBSUB_POINTS) | {LEASE_POINT}
    if args.points not in ("all", "source") and (max(args.types, args.bus) <= 1
                                                 or not set(args.points.split(",")) <= named):
        ap.error(f"--points: all, source, or (with --types N or --bus N) points of {sorted(named)}, comma-separated")
    if args.bus > 1 and (args.types > 1 or args.source == "dir" or args.policies or args.iceberg
                         or args.payload != "json" or args.fetch_partitions or args.sink == "gcs"
                         or args.kafka_scenario != "none" or args.broker == "tansu" or args.bus > 26):
        ap.error("--bus N (2..26) runs a bus of Pub/Sub or Kafka (noida-db) types to local disk: --source pubsub or "
                 "kafka, without --types, --policies, --iceberg, --payload protobuf, --fetch-partitions, --sink gcs or "
                 "a --kafka-scenario")
    if args.bus > 1 and args.source == "kafka":
        args.broker = "noida"  # headers, and true high watermarks
    if args.types > 1 and (args.source != "pubsub" or args.policies or args.iceberg or args.payload != "json"
                           or args.fetch_partitions):
        ap.error("--types N runs a fleet of Pub/Sub types: --source pubsub, without --policies, --iceberg, "
                 "--payload protobuf or --fetch-partitions")
    if args.iceberg and (args.sink == "gcs" or (args.sink is None and args.source == "pubsub")):
        ap.error("--iceberg is for a local sink (--sink local)")
    if args.source != "kafka" and (args.kafka_scenario != "none" or args.broker):
        ap.error("--broker and --kafka-scenario are for --source kafka")
    result = Campaign(args).run()
    print_table(result, args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 1 if failures(result) else 0


if __name__ == "__main__":
    sys.exit(main())
