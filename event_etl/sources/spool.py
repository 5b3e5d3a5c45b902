"""Spool segments: Pub/Sub messages made durable before Spark is told about them.

A segment is a file of whole ``PullResponse`` messages exactly as Pub/Sub returned them
(serialized protocol buffers, each behind a 4-byte length), written under a temporary
name, synced and renamed: it appears whole or not at all.  Keeping the responses as they
came costs the puller no work per message, and carries everything an executor needs
(message id, publish time, attributes, data) and what the driver needs to acknowledge
them (the ack ids).

Names say who wrote them and how many messages they hold::

    <run>-<stream>-<seq>-n<count>.seg      e.g. 3fa9c1d2-02-00000017-n1000.seg

``run`` is the puller's run (a new one each time the job starts): acknowledgement ids of
an earlier run have expired, so its messages will be delivered again.

A stream that acknowledges messages once they are durable (``EVENT_ETL_PUBSUB_ACK=spooled``)
appends each pull to an *open segment* (:class:`OpenSegment`, ``<run>-<stream>-<seq>.open``)
and syncs its data before it acknowledges them: one write and one ``fdatasync`` a pull, no
file created, renamed or deleted for each.  The open segment becomes a segment (renamed to
its ``.seg`` name, which the planner offers) when it is full or old.  The messages in an
open segment left by a killed process were acknowledged, so they are its only copy: the next
run *finishes* it (:func:`finish_open_segments`: its whole frames kept, a torn last one
dropped, which was never acknowledged) instead of throwing it away.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from event_etl.storage.atomic import fsync_dir

__all__ = [
    "MAGIC",
    "SegmentName",
    "OpenSegment",
    "OPEN_SUFFIX",
    "finish_open_segments",
    "write_segment",
    "read_messages",
    "raw_messages",
    "message_runs",
    "ack_ids",
    "segment_count",
]

MAGIC = b"EESEG1\n"
_NAME_RE = re.compile(r"^([0-9a-f]{8})-(\d{2,})-(\d{8,})-n(\d+)\.seg$")
_LEN = struct.Struct("<I")


@dataclass(frozen=True)
class SegmentName:
    run: str
    stream: int
    seq: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.run}-{self.stream:02d}-{self.seq:08d}-n{self.count}.seg"

    @classmethod
    def parse(cls, name: str) -> SegmentName | None:
        m = _NAME_RE.match(name)
        return None if m is None else cls(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))


def segment_count(name: str) -> int:
    """Messages in the segment named ``name`` (0 if it is no segment name)."""
    n = SegmentName.parse(os.path.basename(name))
    return n.count if n else 0


def write_segment(directory: str | os.PathLike[str], name: SegmentName, responses: list[bytes]) -> Path:
    """Write serialized ``PullResponse`` messages as one segment, durably; returns its path."""
    d = Path(directory)
    path = d / name.name
    tmp = d / f".{name.name}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(MAGIC)
        for r in responses:
            fh.write(_LEN.pack(len(r)))
            fh.write(r)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(d)  # the rename too: a power cut must not take back a segment once it is written
    return path


OPEN_SUFFIX = ".open"
_OPEN_RE = re.compile(r"^([0-9a-f]{8})-(\d{2,})-(\d{8,})\.open$")


class OpenSegment:
    """A segment being filled, a pull at a time, each pull durable before it is acknowledged (see the module
    docstring).  Not thread-safe: its stream appends, and whoever rolls it holds the stream's lock."""

    def __init__(self, directory: str | os.PathLike[str], run: str, stream: int, seq: int) -> None:
        self.dir = Path(directory)
        self.run, self.stream, self.seq = run, stream, seq
        self.path = self.dir / f"{run}-{stream:02d}-{seq:08d}{OPEN_SUFFIX}"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        os.write(self.fd, MAGIC)
        self.count = 0
        self.bytes = 0
        self.synced_entry = False

    def append(self, response: bytes, messages: int) -> None:
        """Add one serialized ``PullResponse`` of ``messages`` messages, durably (data, and the file's entry in its
        folder the first time)."""
        os.write(self.fd, _LEN.pack(len(response)) + response)
        os.fdatasync(self.fd)
        if not self.synced_entry:
            fsync_dir(self.dir)
            self.synced_entry = True
        self.count += messages
        self.bytes += len(response)

    def close(self) -> SegmentName | None:
        """Make it a segment the planner offers (its ``.seg`` name, durable); None (and no file) if it is empty."""
        os.close(self.fd)
        if not self.count:
            self.path.unlink(missing_ok=True)
            return None
        name = SegmentName(self.run, self.stream, self.seq, self.count)
        os.replace(self.path, self.dir / name.name)
        fsync_dir(self.dir)
        return name


def finish_open_segments(directory: str | os.PathLike[str],
                         keep: Callable[[str, int, int], bool] | None = None) -> list[str]:
    """Finish the open segments a killed process left in ``directory`` (``keep(run, stream, seq)``: only those;
    default all): their whole frames become a segment, a torn last frame (never synced, so never acknowledged) is
    cut off, and an open segment with no whole frame is deleted.  Returns the segments made."""
    from google.pubsub_v1.types import PullResponse

    made = []
    d = Path(directory)
    for path in sorted(d.glob(f"*{OPEN_SUFFIX}")):
        m = _OPEN_RE.match(path.name)
        if m is None or (keep is not None and not keep(m.group(1), int(m.group(2)), int(m.group(3)))):
            continue
        data = path.read_bytes()
        pos, count, good = len(MAGIC), 0, len(MAGIC) if data.startswith(MAGIC) else 0
        while good and pos + _LEN.size <= len(data):
            (n,) = _LEN.unpack_from(data, pos)
            if pos + _LEN.size + n > len(data):
                break  # torn: the pull was never acknowledged, it comes again
            count += len(PullResponse.pb().FromString(data[pos + _LEN.size:pos + _LEN.size + n]).received_messages)
            pos += _LEN.size + n
            good = pos
        if not count:
            path.unlink()
            continue
        if good < len(data):
            with open(path, "r+b") as fh:
                fh.truncate(good)
                os.fsync(fh.fileno())
        name = SegmentName(m.group(1), int(m.group(2)), int(m.group(3)), count)
        os.replace(path, d / name.name)
        made.append(name.name)
    if made:
        fsync_dir(d)
    return made


def _responses(path: str | os.PathLike[str]):
    from google.pubsub_v1.types import PullResponse

    with open(path, "rb") as fh:
        data = fh.read()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path} is not a spool segment")
    pos = len(MAGIC)
    while pos < len(data):
        (n,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        yield PullResponse.pb().FromString(data[pos:pos + n])
        pos += n


def raw_messages(path: str | os.PathLike[str], start: int = 0, end: int | None = None) -> Iterator[Any]:
    """The ``PubsubMessage`` protocol buffers of messages ``start``..``end - 1``, in order."""
    for msgs in message_runs(path, start, end):
        yield from msgs


def message_runs(path: str | os.PathLike[str], start: int = 0, end: int | None = None) -> Iterator[list[Any]]:
    """The ``PubsubMessage`` protocol buffers of messages ``start``..``end - 1``, a list per pull response."""
    i = 0
    for resp in _responses(path):
        received = resp.received_messages
        n = len(received)
        if end is not None and i >= end:
            return
        if i + n <= start:
            i += n
            continue
        lo, hi = max(0, start - i), n if end is None else min(n, end - i)
        yield [rm.message for rm in (received if lo == 0 and hi == n else received[lo:hi])]
        i += n


def read_messages(path: str | os.PathLike[str], start: int = 0, end: int | None = None
                  ) -> Iterator[tuple[int, str, int, dict[str, str], bytes]]:
    """``(index, message id, publish time ms, attributes, data)`` of messages ``start``..``end - 1``."""
    for i, m in enumerate(raw_messages(path, start, end), start):
        pt = m.publish_time
        yield i, m.message_id, pt.seconds * 1000 + pt.nanos // 1_000_000, dict(m.attributes), m.data


def ack_ids(path: str | os.PathLike[str]) -> list[str]:
    """The acknowledgement ids of a segment's messages."""
    return [rm.ack_id for resp in _responses(path) for rm in resp.received_messages]


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a segment holds, for people: its name's parts and its size."""
    p = Path(path)
    n = SegmentName.parse(p.name)
    return {"name": p.name, "bytes": p.stat().st_size, **({"run": n.run, "stream": n.stream, "seq": n.seq,
                                                           "messages": n.count} if n else {})}
