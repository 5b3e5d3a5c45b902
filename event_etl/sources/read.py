"""Reading a split's payloads, where they lie: one :class:`SplitReader` per kind of split.

An executor task (:func:`event_etl.task.executor.process_split`) asks the source registry for the
reader of its split's kind (:func:`event_etl.sources.registry.split_reader`) and reads through it:

- :meth:`SplitReader.payloads`: every payload, one at a time, as ``(payload, arrival_ms, where,
  offset, message)`` (the record path); ``where + str(offset)`` names its position, ``message``
  is ``(message_id, attributes)`` for Pub/Sub messages, else ``None``;
- :meth:`SplitReader.fast_path` and :meth:`SplitReader.pieces`: for the kinds whose payloads can
  be JSON lines decoded as columns (:mod:`event_etl.task.fastpath`), the payloads in
  :class:`Piece` s of about :data:`READ_BYTES`, each decoded at once by the task's plan, or left
  to the record path when the plan cannot take it;
- :meth:`SplitReader.inputs`: what the batch acknowledges once it is saved.

The kinds: ``files`` (:class:`FilesReader`, byte ranges of whole lines of newline-delimited
files), ``gen`` (:class:`GeneratorReader`, generator indexes), ``seg`` (:class:`SegmentsReader`,
Pub/Sub messages spooled in segments, :mod:`event_etl.sources.spool`) and ``spool``
(:class:`SpoolReader`, release 0.1.0's spool files) and ``kafka`` (:class:`KafkaReader`, an offset range of a Kafka
partition, :mod:`event_etl.sources.kafka`).  Modules a kind needs are imported when it
is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, overload

import numpy as np

from event_etl.errors import SourceError
from event_etl.eventtypes import EventType
from event_etl.sources.splits import Split

__all__ = ["READ_BYTES", "Payload", "Piece", "SplitReader", "FilesReader", "GeneratorReader", "SegmentsReader",
           "SpoolReader", "KafkaReader", "MessageChunk", "message_chunks", "KafkaChunk", "kafka_chunks", "OffsetIds"]

READ_BYTES = 2 << 20
"""Bytes of payloads a read takes at a time (a chunk of whole lines of a file, a run of small files' chunks, a
run of messages), which the fast path decodes at once (:data:`event_etl.task.fastpath.CHUNK_BYTES`): a task
over 226-B events took ~5 % less CPU with 2 MiB than with 1 MiB (fewer Arrow calls per record), and no less
with 4 MiB.  Output bytes do not depend on it (blocks are cut by size)."""

Payload = tuple[bytes, int, str, Any, Any]
"""``(payload, arrival_ms, where, offset, message)``: see the module docstring."""


class Plan(Protocol):
    """What a reader needs of the task's plan (:class:`event_etl.task.fastpath.FastPlan`): a chunk of JSON lines
    decoded as columns (a :class:`event_etl.task.fastpath.FastChunk`, with ``n`` lines starting at ``starts``), or
    ``None`` when it cannot take it.  A binary dialect's plan (``binary``,
    :class:`event_etl.task.fastpath.BinaryPlan`) takes the payloads themselves (:meth:`decode_payloads`): a
    message's bytes, or what a file's base64 line holds."""

    binary: bool

    def decode(self, data: bytes) -> Any: ...

    def decode_payloads(self, payloads: Sequence[bytes], starts: np.ndarray, ends: np.ndarray) -> Any: ...


def _joined(datas: Sequence[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Payloads back to back: ``(data, starts, ends)``."""
    sizes = np.fromiter(map(len, datas), dtype=np.int64, count=len(datas))
    ends = np.cumsum(sizes)
    return b"".join(datas), ends - sizes, ends


def _decoded_messages(plan: Plan, datas: Sequence[bytes], joined_lines: bytes | None) -> tuple[Any, bytes | None]:
    """A chunk of messages decoded by the plan: ``(FastChunk or None, the data its starts/ends point into)``."""
    if plan.binary:
        if not all(datas):
            return None, None  # an empty payload: the record path says so
        data, starts, ends = _joined(datas)
        return plan.decode_payloads(datas, starts, ends), data
    if joined_lines is None:
        return None, None
    fc = plan.decode(joined_lines)
    return (fc, joined_lines) if fc is not None and fc.n == len(datas) else (None, None)


def _b64_lines(plan: Plan, data: bytes) -> Any:
    """A chunk of a file whose lines each hold a base64-encoded payload, decoded by a binary plan (None: a line is
    not plain base64, and the record path explains it)."""
    from event_etl.payloads.b64lines import decode_lines

    lines = decode_lines(data)
    if lines is None:
        return None
    return plan.decode_payloads(lines.payloads, lines.line_starts, lines.line_ends)


def _line_position(where: str, base: int, starts: Any) -> Callable[[int], str]:
    """``position(i)`` of line ``i`` of a chunk read at byte ``base`` of ``where``."""
    return lambda i: where + str(base + int(starts[i]))


def _joined_position(joined: _Joined, starts: Any) -> Callable[[int], str]:
    """``position(i)`` of line ``i`` of small files' chunks joined."""
    return lambda i: joined.position(int(starts[i]))


def _message_position(mids: Sequence[str]) -> Callable[[int], str]:
    """``position(i)`` of message ``i`` of a chunk: its id."""
    return lambda i: "msg:" + mids[i]


@dataclass(frozen=True)
class Piece:
    """Consecutive payloads of a split, for the fast path.

    ``decoded``: the plan's decoding of ``data`` (a :class:`event_etl.task.fastpath.FastChunk`, one
    line per payload), with ``arrival`` (one for the whole piece, or one per line), ``position(i)``
    (the position of line ``i``: ``where + offset``) and ``mids`` (Pub/Sub: the message id of each
    line, else ``None``).  ``decoded`` is ``None`` when the plan could not take the piece: then its
    payloads take the record path, one by one, from ``records``.
    """

    decoded: Any
    data: bytes | None = None
    arrival: int | np.ndarray = 0
    position: Callable[[int], str] | None = None
    mids: Sequence[str] | None = None
    records: Iterator[Payload] | None = None

    @classmethod
    def undecoded(cls, records: Iterator[Payload]) -> Piece:
        return cls(None, records=records)


class SplitReader:
    """How the payloads of one kind of split are read (see the module docstring); one subclass per kind."""

    kind = ""

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        """Every payload of the split, in order, for the record path."""
        raise NotImplementedError

    def fast_path(self, et: EventType) -> bool:
        """Whether the payloads of such a split can take the fast path for type ``et`` (:meth:`pieces`)."""
        return False

    def pieces(self, split: Split, plan: Plan) -> Iterator[Piece]:
        """The payloads of the split, in order, in pieces decoded by ``plan`` (a
        :class:`event_etl.task.fastpath.FastPlan`) where it can; only where :meth:`fast_path` holds."""
        raise SourceError(f"a {self.kind} split has no fast path")

    def inputs(self, split: Split) -> list[str] | None:
        """The inputs to acknowledge once the batch is saved, or ``None`` (nothing to acknowledge)."""
        return None

    def part(self, split: Split) -> str | None:
        """The partition of the source the split reads, for the watermark per partition
        (:func:`event_etl.rules.watermark.parts_watermark`), or ``None``: a source without partitions."""
        return None


class FilesReader(SplitReader):
    """``files``: byte ranges of whole lines of newline-delimited files, each with its arrival."""

    kind = "files"

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        for uri, start, end, arrival in split.ranges():
            yield from _file_lines(uri, start, end, arrival)

    def fast_path(self, et: EventType) -> bool:
        return True

    def pieces(self, split: Split, plan: Plan) -> Iterator[Piece]:
        if plan.binary:
            yield from self._binary_pieces(split, plan)
            return
        for run in _chunk_runs(split):
            if len(run) > 1:  # several small files' chunks: decoded at once when every line of them is valid
                joined = _Joined.of(run)
                fc = plan.decode(joined.data)
                if fc is not None:
                    yield Piece(fc, joined.data, joined.arrivals(fc.starts), _joined_position(joined, fc.starts))
                    continue
            for data, base, arrival, where in run:  # as they come: a chunk with an invalid line takes the record path
                fc = plan.decode(data)
                if fc is not None:
                    yield Piece(fc, data, arrival, _line_position(where, base, fc.starts))
                else:
                    yield Piece.undecoded(_chunk_lines(data, base, arrival, where))

    @staticmethod
    def _binary_pieces(split: Split, plan: Plan) -> Iterator[Piece]:
        """A binary dialect's lines (one base64 payload each), a file's chunk at a time."""
        for data, base, arrival, where in _split_chunks(split):
            fc = _b64_lines(plan, data)
            if fc is not None:
                yield Piece(fc, data, arrival, _line_position(where, base, fc.starts))
            else:
                yield Piece.undecoded(_chunk_lines(data, base, arrival, where))


class GeneratorReader(SplitReader):
    """``gen``: generator indexes ``start``..``end``, the generator's parameters in ``meta``."""

    kind = "gen"

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        from event_etl.sources.generator import Generator, GeneratorParams

        gen = Generator(et, GeneratorParams.from_json(json.loads(split.meta)))
        for g in gen.range(split.start, split.end):
            yield g.payload, g.arrival, "gen:", g.index, None


class SegmentsReader(SplitReader):
    """``seg``: ranges of Pub/Sub messages spooled in segments (:mod:`event_etl.sources.spool`); a message arrives
    at its publish time.  The fast path takes them for a type that reads its event time from the payload (not from
    an attribute)."""

    kind = "seg"

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        from event_etl.sources.spool import read_messages

        for path, start, end, _ in split.ranges():
            for _, mid, published, attributes, data in read_messages(path, start, end):
                yield data, published, "msg:", mid, (mid, attributes)

    def fast_path(self, et: EventType) -> bool:
        return not et.message_attributes_only

    def pieces(self, split: Split, plan: Plan) -> Iterator[Piece]:
        for mc in message_chunks(split):
            fc, data = _decoded_messages(plan, mc.datas, mc.data)
            if fc is not None:
                yield Piece(fc, data, mc.arrivals, _message_position(mc.mids), mc.mids)
            else:
                yield Piece.undecoded(mc.payloads())

    def inputs(self, split: Split) -> list[str] | None:
        """The segments it read: acknowledged once the batch is saved."""
        return sorted({os.path.basename(r[0]) for r in split.ranges()})


class SpoolReader(SplitReader):
    """``spool``: release 0.1.0's spool files of Pub/Sub messages."""

    kind = "spool"

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        from event_etl.sources.pubsub import read_spool

        for _i, m in read_spool(split.uri, split.start, split.end):
            yield m["data"], m["publish_time"], "msg:", m["message_id"], (m["message_id"], m["attributes"])

    def inputs(self, split: Split) -> list[str] | None:
        """Its spool file: pulled by an earlier run, so it will come again."""
        return [os.path.basename(split.uri)]


class KafkaReader(SplitReader):
    """``kafka``: offsets ``start``..``end`` of one partition (``meta``: ``{"partition": p, ...}``) of the topic
    ``uri``, read from the cluster (:func:`event_etl.sources.kafka.read_messages`; the task reads the settings
    itself: no secret travels in a split).  A record arrives at its Kafka timestamp; it is a message as a Pub/Sub
    one is: ``(topic/partition/offset, attributes)``, so ``time_attribute`` may name a header or
    ``kafka.timestamp``, and a record read twice is dropped by its message id.

    The fast path takes the records of a type that reads its event time from the payload, in chunks of about
    ``READ_BYTES`` of values joined by newlines (:class:`KafkaChunk`), as :class:`SegmentsReader` takes Pub/Sub
    messages; a chunk with a value the plan cannot take (not one valid JSON line) takes the record path, with
    each record's headers and key as attributes."""

    kind = "kafka"

    def payloads(self, split: Split, et: EventType) -> Iterator[Payload]:
        from event_etl.sources.kafka import read_range

        yield from read_range(split.uri, self._partition(split), split.start, split.end)

    def fast_path(self, et: EventType) -> bool:
        return not et.message_attributes_only

    def pieces(self, split: Split, plan: Plan) -> Iterator[Piece]:
        for kc in kafka_chunks(split.uri, self._partition(split), split.start, split.end):
            fc, data = _decoded_messages(plan, kc.values, kc.data)
            if fc is not None:
                yield Piece(fc, data, kc.arrivals, kc.position, kc.mids)
            else:
                yield Piece.undecoded(kc.payloads())

    def part(self, split: Split) -> str | None:
        """The split's partition number: each partition has a watermark of its own."""
        return str(self._partition(split))

    @staticmethod
    def _partition(split: Split) -> int:
        return int(json.loads(split.meta)["partition"])


def _file_chunks(uri: str, start: int, end: int) -> Iterator[tuple[bytes, int]]:
    """Bytes ``start``..``end`` of a file as ``(data, offset)`` chunks of whole lines (the range holds whole lines).

    Every chunk but the last ends with a newline; the last one may not (a file's last line).
    """
    try:
        fh = open(uri, "rb")  # noqa: SIM115 - opened apart: a missing file is its own error; closed below
    except OSError as err:
        raise SourceError(
            f"cannot read {uri}: {err}", fix="input files must stay until their batch is committed"
        ) from err
    with fh:
        fh.seek(start)
        offset = start
        rest = b""
        remaining = end - start
        while remaining > 0:
            chunk = fh.read(min(READ_BYTES, remaining))
            if not chunk:
                raise SourceError(
                    f"{uri} is shorter than when it was found ({end - remaining} < {end} bytes)",
                    fix="do not truncate or rewrite input files; write new files instead",
                )
            remaining -= len(chunk)
            data = rest + chunk if rest else chunk
            cut = data.rfind(b"\n") + 1
            if cut:
                yield (data[:cut] if cut < len(data) else data), offset
                offset += cut
            rest = data[cut:] if cut < len(data) else b""
        if rest:
            yield rest, offset


def _chunk_lines(data: bytes, offset: int, arrival: int, name: str) -> Iterator[tuple[bytes, int, str, int, None]]:
    """The lines of a chunk (without their ``\\n`` or ``\\r\\n``), as :meth:`SplitReader.payloads` yields them."""
    pos, n = 0, len(data)
    while pos < n:
        j = data.find(b"\n", pos)
        if j < 0:
            j = n
        line = data[pos:j]
        if line[-1:] == b"\r":
            line = line[:-1]
        yield line, arrival, name, offset + pos, None
        pos = j + 1


def _file_lines(uri: str, start: int, end: int, arrival: int) -> Iterator[tuple[bytes, int, str, int, None]]:
    """Lines of bytes ``start``..``end`` of a file, read in chunks (the range holds whole lines)."""
    name = os.path.basename(uri) + "@"
    for data, offset in _file_chunks(uri, start, end):
        yield from _chunk_lines(data, offset, arrival, name)


_NO_ARRIVALS = np.empty(0, dtype=np.int64)


class MessageChunk:
    """Consecutive Pub/Sub messages of a split, about ``READ_BYTES`` of payloads, for the fast path.

    ``data`` is their payloads joined by newlines, or ``None`` when a payload holds a newline
    itself (the lines would not be the messages): then only the record path can take them."""

    __slots__ = ("datas", "mids", "published", "messages", "size", "data", "arrivals")

    def __init__(self) -> None:
        self.datas: list[bytes] = []
        self.mids: list[str] = []
        self.published: list[int] = []
        self.messages: list[Any] = []
        self.size = 0
        self.data: bytes | None = None
        self.arrivals: np.ndarray = _NO_ARRIVALS  # set by close()

    def close(self) -> MessageChunk:
        data = b"\n".join(self.datas)
        self.data = data if data.count(b"\n") == len(self.datas) - 1 and all(self.datas) else None
        self.arrivals = np.array(self.published, dtype=np.int64)
        return self

    def payloads(self) -> Iterator[tuple[bytes, int, str, str, Any]]:
        """The messages as :meth:`SplitReader.payloads` yields them (for the record path)."""
        for data, mid, published, m in zip(self.datas, self.mids, self.published, self.messages):
            yield data, published, "msg:", mid, (mid, dict(m.attributes))


def message_chunks(split: Split) -> Iterator[MessageChunk]:
    """The messages of a segments split, in order, in chunks of about ``READ_BYTES`` of payloads."""
    from itertools import accumulate

    from event_etl.sources.spool import message_runs

    limit = READ_BYTES
    cur = MessageChunk()
    for path, start, end, _ in split.ranges():
        for msgs in message_runs(path, start, end):
            while msgs:
                datas = [m.data for m in msgs]
                room = limit - cur.size
                sizes = list(accumulate(len(d) + 1 for d in datas))
                take = len(msgs) if sizes[-1] < room else next(k for k, v in enumerate(sizes) if v >= room) + 1
                part = msgs[:take] if take < len(msgs) else msgs
                cur.datas.extend(datas[:take] if take < len(msgs) else datas)
                cur.mids.extend([m.message_id for m in part])
                cur.published.extend([p.seconds * 1000 + p.nanos // 1_000_000 for p in (m.publish_time for m in part)])
                cur.messages.extend(part)
                cur.size += sizes[take - 1]
                if cur.size >= limit:
                    yield cur.close()
                    cur = MessageChunk()
                msgs = msgs[take:]
    if cur.datas:
        yield cur.close()


class OffsetIds(Sequence[str]):
    """The message ids ``topic/partition/offset`` of a chunk's records (``prefix`` + each offset), made when asked:
    the executor hashes the written records' keys from ``prefix`` and ``offsets`` as columns
    (:func:`event_etl.task.fastpath.offset_message_keys`)."""

    __slots__ = ("prefix", "offsets")

    def __init__(self, prefix: str, offsets: Sequence[int]) -> None:  # a list, or an int64 array
        self.prefix, self.offsets = prefix, offsets

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return f"{self.prefix}{int(self.offsets[i])}"

    def __len__(self) -> int:
        return len(self.offsets)


class KafkaChunk:
    """Consecutive records of a Kafka partition, about ``READ_BYTES`` of values, for the fast path: ``data`` their
    values joined by newlines (``None`` when a value is empty or holds a newline), ``arrivals`` their timestamps,
    ``mids`` their message ids and ``position(i)`` where record ``i`` is (``kafka:topic/partition@offset``), as the
    record path names them.  ``offsets`` and ``times`` are ``int64`` arrays; ``keys`` and ``headers`` are kept for
    the record path (a chunk the plan cannot take), not the ``Message`` objects."""

    __slots__ = ("topic", "partition", "offsets", "times", "values", "keys", "headers", "data", "arrivals", "mids")

    def __init__(self, topic: str, partition: int, offsets: np.ndarray, times: np.ndarray, values: list[bytes],
                 keys: list[bytes | None], headers: list[Any]) -> None:
        self.topic, self.partition = topic, partition
        self.offsets, self.times, self.values, self.keys, self.headers = offsets, times, values, keys, headers
        data = b"\n".join(values)
        self.data = data if data.count(b"\n") == len(values) - 1 and all(values) else None
        self.arrivals = times
        self.mids = OffsetIds(f"{topic}/{partition}/", cast(Sequence[int], offsets))

    def position(self, i: int) -> str:
        return f"kafka:{self.topic}/{self.partition}@{int(self.offsets[i])}"

    def payloads(self) -> Iterator[Payload]:
        """The records as :meth:`SplitReader.payloads` yields them (for the record path)."""
        from event_etl.sources.kafka import record_fields

        for off, ts, value, key, headers in zip(self.offsets.tolist(), self.times.tolist(), self.values, self.keys,
                                                self.headers):
            yield record_fields(self.topic, self.partition, off, ts, value, key, headers)


def kafka_chunks(topic: str, partition: int, start: int, end: int) -> Iterator[KafkaChunk]:
    """The records of offsets ``[start, end)`` of a partition, in order, in chunks of about ``READ_BYTES`` of
    values (:func:`event_etl.sources.kafka.read_runs`, each run read as columns by
    :func:`event_etl.sources.kafka.record_columns`)."""
    from event_etl.sources.kafka import RecordRun, read_runs, record_columns

    limit = READ_BYTES
    held: list[tuple[RecordRun, int, int]] = []  # pieces of runs waiting for the chunk they fill
    size = 0

    def chunk(pieces: list[tuple[RecordRun, int, int]]) -> KafkaChunk:
        if len(pieces) == 1:
            r, a, b = pieces[0]
            whole = a == 0 and b == len(r)
            return KafkaChunk(topic, partition, r.offsets[a:b], r.times[a:b], r.values if whole else r.values[a:b],
                              r.keys if whole else r.keys[a:b], r.headers if whole else r.headers[a:b])
        values: list[bytes] = []
        keys: list[bytes | None] = []
        headers: list[Any] = []
        for r, a, b in pieces:
            values += r.values[a:b]
            keys += r.keys[a:b]
            headers += r.headers[a:b]
        return KafkaChunk(topic, partition, np.concatenate([r.offsets[a:b] for r, a, b in pieces]),
                          np.concatenate([r.times[a:b] for r, a, b in pieces]), values, keys, headers)

    for run in read_runs(topic, partition, start, end, take=record_columns(topic, partition)):
        n = len(run)
        ends = np.cumsum(np.fromiter(map(len, run.values), dtype=np.int64, count=n) + 1) + size
        at = 0
        while at < n:
            cut = int(np.searchsorted(ends, limit, side="left")) + 1  # through the record that fills the chunk
            if cut <= at:
                cut = at + 1
            if cut > n:  # the run's rest fits: it waits for the next run
                held.append((run, at, n))
                size = int(ends[-1])
                break
            yield chunk([*held, (run, at, cut)])
            held = []
            ends = ends - int(ends[cut - 1])
            size = 0
            at = cut
    if held:
        yield chunk(held)


def _split_chunks(split: Split) -> Iterator[tuple[bytes, int, int, str]]:
    """``(data, offset, arrival, where)`` for every chunk of a files split."""
    for uri, start, end, arrival in split.ranges():
        where = os.path.basename(uri) + "@"
        for data, base in _file_chunks(uri, start, end):
            yield data, base, arrival, where


def _chunk_runs(split: Split) -> Iterator[list[tuple[bytes, int, int, str]]]:
    """The chunks of a files split, ``(data, offset, arrival, where)``, in runs of consecutive ones that together
    hold at most a chunk's worth of bytes (``READ_BYTES``): a split of many small files is decoded a run at a
    time, since each decode has a fixed cost (some thirty Arrow calls) that would dwarf a small file's lines."""
    run: list[tuple[bytes, int, int, str]] = []
    size = 0
    for piece in _split_chunks(split):
        if run and size + len(piece[0]) + 1 > READ_BYTES:
            yield run
            run, size = [], 0
        run.append(piece)
        size += len(piece[0]) + 1
    if run:
        yield run


@dataclass(frozen=True)
class _Joined:
    """A run of chunks joined into one buffer, each chunk's lines ending with a newline."""

    data: bytes
    starts: np.ndarray  # where each chunk begins in ``data``
    pieces: list[tuple[bytes, int, int, str]]

    @classmethod
    def of(cls, run: list[tuple[bytes, int, int, str]]) -> _Joined:
        parts, starts, at = [], [], 0
        for data, _, _, _ in run:
            starts.append(at)
            parts.append(data)
            at += len(data)
            if not data.endswith(b"\n"):  # a file's last line may lack its newline
                parts.append(b"\n")
                at += 1
        return cls(b"".join(parts), np.array(starts, dtype=np.int64), run)

    def arrivals(self, line_starts: np.ndarray) -> np.ndarray:
        """The arrival of each line (its file's)."""
        which = np.searchsorted(self.starts, line_starts, side="right") - 1
        return np.array([a for _, _, a, _ in self.pieces], dtype=np.int64)[which]

    def position(self, at: int) -> str:
        """The position (``where + offset`` in its file) of the line starting at ``at`` in the joined buffer."""
        k = int(np.searchsorted(self.starts, at, side="right")) - 1
        _, base, _, where = self.pieces[k]
        return where + str(base + at - int(self.starts[k]))
