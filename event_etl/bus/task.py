"""A split of a bus read once in an executor task and routed: every type's records through its own processing.

:func:`process_bus_split` reads the split's messages once (Pub/Sub's spooled messages, a Kafka partition's range),
asks the bus's :class:`~event_etl.rules.routing.Router` which type claims each, and hands each type of the task's
group its own messages, in order, through a :class:`RoutedReader`: the type then decodes, judges, dedupes and
writes them exactly as if they were a split of its own (:func:`event_etl.task.executor.process_split`), its files
named by its own batch.  A message of a type of the bus that is not in the group (a type behind the bus, or
quarantined) is left to that type's own batch; one no type claims is kept in the bus's dead letters
(``<sink>/_unclaimed/<bus id>/dt=<day>/``), in a file of its own named by the message alone (its position: Pub/Sub's
message id, Kafka's topic, partition and offset), so that whatever split holds it, however often it is read, it is
written once.  A file per split was not enough: the same message is read in other splits when a type that was behind
the bus (quarantined, or a run killed between two types' commits) catches up, its range cut otherwise than the
rounds the others read it in, and on Pub/Sub again after a redelivery (RELIABILITY.md, issue 59's campaign).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np

from event_etl.eventtypes import EventType
from event_etl.rules.routing import UNCLAIMED_DIR, UNCLAIMED_REASON, Router, Unclaimed
from event_etl.sources.read import READ_BYTES, Payload, Piece, Plan, SplitReader, _decoded_messages
from event_etl.sources.splits import Split

__all__ = ["RoutedReader", "RoutedKafkaReader", "route_split", "route_kafka_split", "unclaimed_path",
           "process_bus_split"]


class RoutedReader(SplitReader):
    """The messages of a split one type claims (already read), as that split's own reader would give them."""

    def __init__(self, base: SplitReader, items: list[Payload]) -> None:
        self.base = base
        self.items = items
        self.kind = base.kind

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        return iter(self.items)

    def fast_path(self, et: EventType) -> bool:
        return self.base.fast_path(et)

    def pieces(self, split: Split, plan: Plan) -> Iterator[Piece]:
        for chunk in _chunks(self.items):
            datas = [item[0] for item in chunk]
            joined = b"\n".join(datas)
            lines = joined if all(datas) and joined.count(b"\n") == len(datas) - 1 else None
            fc, data = _decoded_messages(plan, datas, lines)
            if fc is None:
                yield Piece.undecoded(iter(chunk))
                continue
            arrivals = np.fromiter((item[1] for item in chunk), dtype=np.int64, count=len(chunk))
            mids = [_message_id(item) for item in chunk]
            yield Piece(fc, data, arrivals, _positions(chunk), mids)

    def inputs(self, split: Split) -> list[str] | None:
        return self.base.inputs(split)

    def part(self, split: Split) -> str | None:
        return self.base.part(split)


class RoutedKafkaReader(SplitReader):
    """The records of a Kafka split one type claims, as chunks of columns (:class:`~event_etl.sources.read.KafkaChunk`):
    what :class:`~event_etl.sources.read.KafkaReader` gives a type reading a partition of its own, records of the
    other types left out."""

    kind = "kafka"

    def __init__(self, base: SplitReader, chunks: list[Any]) -> None:
        self.base = base
        self.chunks = chunks

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        for kc in self.chunks:
            yield from kc.payloads()

    def fast_path(self, et: EventType) -> bool:
        return self.base.fast_path(et)

    def pieces(self, split: Split, plan: Plan) -> Iterator[Piece]:
        for kc in self.chunks:
            fc, data = _decoded_messages(plan, kc.values, kc.data)
            if fc is not None:
                yield Piece(fc, data, kc.arrivals, kc.position, kc.mids)
            else:
                yield Piece.undecoded(kc.payloads())

    def inputs(self, split: Split) -> list[str] | None:
        return self.base.inputs(split)

    def part(self, split: Split) -> str | None:
        return self.base.part(split)


class _Headers:
    """A Kafka record's headers as the router asks for an attribute: the last header of the name, decoded as the
    record path decodes it (:func:`event_etl.sources.kafka.message_attributes`), made only for the one asked."""

    __slots__ = ("headers",)

    def __init__(self, headers: list[tuple[str, bytes | None]] | None) -> None:
        self.headers = headers

    def __bool__(self) -> bool:
        return True

    def get(self, key: str) -> str | None:
        for k, v in reversed(self.headers or []):
            if str(k) == key:
                return v.decode("utf-8", "replace") if isinstance(v, bytes) else "" if v is None else str(v)
        return None


def route_kafka_split(split: Split, router: Router, names: set[str]
                      ) -> tuple[dict[str, list[Any]], list[tuple[Payload, str]]]:
    """A Kafka split read as columns (:func:`~event_etl.sources.read.kafka_chunks`) and routed: each of ``names``'
    records as chunks of its own, in order, and the records no type claims with why.  The same records, ids and
    positions as :func:`route_split` over the split's payloads, without making every record's attributes (a dict a
    record, most of the cost of a routed record); a route by ``kafka.*`` attributes makes them."""
    from event_etl.sources.kafka import message_attributes, record_fields
    from event_etl.sources.read import kafka_chunks

    topic, partition = split.uri, int(json.loads(split.meta)["partition"])
    by_header = router.by == "attribute" and not router.key.startswith("kafka.")
    claimed: dict[str, list[Any]] = {n: [] for n in names}
    held: dict[str, _Held] = {}
    unclaimed: list[tuple[Payload, str]] = []
    for kc in kafka_chunks(topic, partition, split.start, split.end):
        owners: dict[str, list[int]] = {}
        offsets, times, values, keys, headers = kc.offsets, kc.times, kc.values, kc.keys, kc.headers
        for i, value in enumerate(values):
            if by_header:
                attributes: Any = _Headers(headers[i])
            elif router.by == "attribute":
                attributes = message_attributes(topic, partition, int(offsets[i]), int(times[i]), keys[i],
                                                headers[i])
            else:
                attributes = None
            name = router.route(value, attributes, topic)
            if isinstance(name, Unclaimed):
                unclaimed.append((record_fields(topic, partition, int(offsets[i]), int(times[i]), value, keys[i],
                                                headers[i]), name.detail))
            elif name in claimed:
                owners.setdefault(name, []).append(i)
        for name, rows in owners.items():
            if len(rows) == len(values):  # the whole chunk is one type's (a topic of a pattern: always)
                _flush(held, name, claimed, topic, partition)
                claimed[name].append(kc)
                continue
            at = np.array(rows, dtype=np.int64)
            part = held.setdefault(name, _Held())
            part.add(offsets[at], times[at], [values[i] for i in rows], [keys[i] for i in rows],
                     [headers[i] for i in rows])
            if part.size >= READ_BYTES:  # a type's records gathered into chunks of about the size a topic gives
                _flush(held, name, claimed, topic, partition)
    for name in list(held):
        _flush(held, name, claimed, topic, partition)
    return claimed, unclaimed


class _Held:
    """A type's records of a Kafka split, routed and not yet made a chunk (columns gathered over several chunks)."""

    __slots__ = ("offsets", "times", "values", "keys", "headers", "size")

    def __init__(self) -> None:
        self.offsets: list[Any] = []
        self.times: list[Any] = []
        self.values: list[bytes] = []
        self.keys: list[bytes | None] = []
        self.headers: list[Any] = []
        self.size = 0

    def add(self, offsets: Any, times: Any, values: list[bytes], keys: list[bytes | None], headers: list[Any]) -> None:
        self.offsets.append(offsets)
        self.times.append(times)
        self.values += values
        self.keys += keys
        self.headers += headers
        self.size += sum(map(len, values)) + len(values)


def _flush(held: dict[str, _Held], name: str, claimed: dict[str, list[Any]], topic: str, partition: int) -> None:
    from event_etl.sources.read import KafkaChunk

    part = held.pop(name, None)
    if part is not None and part.values:
        claimed[name].append(KafkaChunk(topic, partition, np.concatenate(part.offsets), np.concatenate(part.times),
                                        part.values, part.keys, part.headers))


def _message_id(item: Payload) -> str:
    msg = item[4]
    return str(msg[0]) if msg is not None else f"{item[2]}{item[3]}"


def _positions(chunk: Sequence[Payload]) -> Any:
    return lambda i: chunk[i][2] + str(chunk[i][3])


def _chunks(items: list[Payload]) -> Iterator[list[Payload]]:
    cur: list[Payload] = []
    size = 0
    for item in items:
        cur.append(item)
        size += len(item[0]) + 1
        if size >= READ_BYTES:
            yield cur
            cur, size = [], 0
    if cur:
        yield cur


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a split is read and routed.  Every message read is a tuple
    and a dict (its attributes, Kafka's headers) kept until the types have processed them: each allocation past
    the collector's threshold made it walk all of them again (13 of a 1,000,000-record bus's 46 s of task time,
    bench/RESULTS.md "bus-backlog").  They hold no cycles; reference counting frees them as before."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def route_split(items: Iterator[Payload], router: Router, names: set[str], topic: str | None = None
                ) -> tuple[dict[str, list[Payload]], list[tuple[Payload, str]]]:
    """Each of ``names``' messages of a split, in order, and the messages no type claims with why (pure).
    ``topic``: the Kafka topic the split reads (a bus over a topic pattern routes by it)."""
    claimed: dict[str, list[Payload]] = {n: [] for n in names}
    unclaimed: list[tuple[Payload, str]] = []
    for item in items:
        msg = item[4]
        attributes: Mapping[str, str] | None = msg[1] if msg is not None else None
        name = router.route(item[0], attributes, topic)
        if isinstance(name, Unclaimed):
            unclaimed.append((item, name.detail))
        elif name in claimed:
            claimed[name].append(item)
    return claimed, unclaimed


def unclaimed_detail(why: str, item: Payload) -> str:
    """A kept message's detail: why no type claims it, and its attributes (Kafka: its headers), which a dead-letter
    record has no field for and a replay must send again (:func:`event_etl.rules.routing.detail_attributes`)."""
    from event_etl.rules.routing import with_attributes

    msg = item[4]
    attributes = {k: v for k, v in (msg[1] if msg is not None else {}).items() if not k.startswith("kafka.")}
    return with_attributes(why, attributes)


def unclaimed_path(bus: str, position: str, arrival: int) -> str:
    """The bus's dead-letter file of one unclaimed message, relative to the sink: named by the message's position
    alone (``msg:<id>`` on Pub/Sub: a redelivery too; a Kafka record's topic, partition and offset), dated by its
    arrival (UTC; Pub/Sub's publish time, a Kafka record's timestamp: the same at every read)."""
    digest = hashlib.sha256(json.dumps([bus, position]).encode()).hexdigest()[:20]
    day = datetime.fromtimestamp(arrival // 1000, tz=UTC).strftime("%Y-%m-%d")
    return f"{UNCLAIMED_DIR}/{bus}/dt={day}/u-{digest}.avro"


RoutedResult = tuple[str, dict[str, Any] | None, bytes | None, BaseException | None]
"""What :func:`process_bus_split` yields: ``(name, report, keys, error)``."""


def process_bus_split(split: Split, contexts: Mapping[str, Any], router: Router, bus: str, storage_of: Any, *,
                      process: Any, store_unclaimed: Any, columnar: bool = True) -> Iterator[RoutedResult]:
    """Read ``split`` once and process each type of ``contexts`` (``{name: BatchContext}``) over its own messages;
    yields ``(name, report, keys, error)`` per type (a failure of one type's processing is that type's alone), and
    last ``("", {"unclaimed": n, "path": rel}, None, None)`` for what no type claimed (``n``: the messages kept now,
    not those an earlier read of them kept; ``rel``: the first one's file; ``storage_of(sink)``: the
    task's open storage of a sink; ``process``: :func:`event_etl.task.executor.process_split`, ``store_unclaimed``:
    :func:`event_etl.task.executor.store_unclaimed`; ``columnar``: a Kafka split read and routed as columns,
    :func:`route_kafka_split`, rather than record by record)."""
    from event_etl.sources.registry import split_reader
    from event_etl.storage.deadletter import Rejected

    base = split_reader(split.kind)
    first = next(iter(contexts.values()))
    topic = split.uri if split.kind == "kafka" else None
    readers: dict[str, SplitReader]
    with _collector_paused():  # a split's messages held at once: no cycles among them for the collector to find
        if split.kind == "kafka" and columnar:
            chunks, unclaimed = route_kafka_split(split, router, set(contexts))
            readers = {name: RoutedKafkaReader(base, chunks[name]) for name in contexts}
        else:
            claimed, unclaimed = route_split(base.payloads(split, first.event_type), router, set(contexts), topic)
            readers = {name: RoutedReader(base, claimed[name]) for name in contexts}
    for name, ctx in contexts.items():
        try:
            report, keys = process(split, ctx, storage_of(ctx.sink), reader=readers[name])
        except Exception as err:  # noqa: BLE001 - this type's failure; the others' go on
            yield name, None, None, err
            continue
        yield name, report, keys, None
    rejects = [Rejected(UNCLAIMED_REASON, unclaimed_detail(detail, item), item[0], item[2] + str(item[3]), item[1],
                        None) for item, detail in unclaimed]
    first_rel, kept = None, 0
    storage = storage_of(first.sink) if rejects else None
    for r in rejects:
        assert storage is not None
        rel = unclaimed_path(bus, r.position, r.arrival)
        first_rel = first_rel or rel
        if not storage.exists(rel):  # counted once: a read again of a message kept already leaves it
            kept += 1
        store_unclaimed([r], rel, bus, first, storage)  # written once: the same bytes at every read
    yield "", {"unclaimed": kept, "path": first_rel}, None, None
