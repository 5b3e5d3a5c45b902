"""Spool segments: Pub/Sub messages made durable before Spark is told about them.

A segment is a file of whole ``PullResponse`` messages exactly as Pub/Sub returned them
(serialized protocol buffers), one *frame* each.  Keeping the responses as they came costs
the puller no work per message, and carries everything an executor needs (message id,
publish time, attributes, data) and what the driver needs to acknowledge them (the ack ids).

**Format 2** (``EESEG2``, written since 0.6.0): the magic line, then frames of

    length u32 LE | crc32c u32 LE | oldest publish time i64 LE (ms) | length bytes of PullResponse

The CRC-32C (Castagnoli, as Kafka's record batches carry) covers the length, the oldest
publish time and the response, so a frame torn by a power cut, zero-filled by a file system
that kept the file's size but not its data, or rotted on disk, is told from a good one.
The oldest publish time of each frame lets ``event-etl status`` say how far back a seek
must go to bring back everything the spool holds, without decoding a message.  **Format 1**
(``EESEG1``, releases before 0.6.0): ``length u32 LE | response``, no check; still read
(and an open one still finished), never written.

Names say who wrote them and how many messages they hold::

    <run>-<stream>-<seq>-n<count>.seg      e.g. 3fa9c1d2-02-00000017-n1000.seg

``run`` is the puller's run (a new one each time the job starts): acknowledgement ids of
an earlier run have expired, so its messages will be delivered again.

**The write-ahead log.**  A stream that acknowledges messages once they are durable
(``EVENT_ETL_PUBSUB_ACK=spooled``) appends each pull to an *open segment*
(:class:`OpenSegment`, ``<run>-<stream>-<seq>.open``) and syncs it before it acknowledges
them: from then until its batch commits the spool is the only copy of those messages, so
it is held to a write-ahead log's rules:

- **All or nothing.**  An append writes every byte of its frame and syncs it, or fails and
  leaves the segment as it was before it (truncated back to its last whole frame, synced):
  a short write (a disk filling up) or a failed sync is never taken for a durable append,
  and the caller acknowledges nothing (:class:`AppendFailed`).
- **One writer per segment.**  Finishing a segment that was left open (:func:`finish_open_segments`)
  first *fences* it: renames ``.open`` to ``.fenced``.  A writer checks, after each append is
  durable and before it lets the pull be acknowledged, that its file is still its open segment
  (:class:`SegmentFenced` otherwise).  So whatever a writer acknowledged was durable before
  the fence, and is in the finished segment; what it appended after was never acknowledged
  (it is delivered again), and lies past the segment's count, where no reader looks.
- **Recovery keeps the longest valid prefix.**  A finished segment holds the whole frames that
  pass their check, up to the first that does not: a bad frame at the end of an open segment
  (it reaches the end of the file, or nothing but zeros follows it) was never synced, so
  never acknowledged, and is cut off with a line in the log.  A bad frame anywhere else, or in
  a closed segment, is damage (bit rot, a failing disk): the job stops with an error naming
  the segment, the frame and the way out (:class:`SpoolDamaged`), never a silent skip.

A closed segment is renamed to its ``.seg`` name, which the planner offers, when it is full
or old.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from event_etl.errors import SourceError
from event_etl.storage.atomic import fsync_dir

__all__ = [
    "MAGIC",
    "MAGIC_V1",
    "SegmentName",
    "OpenSegment",
    "OPEN_SUFFIX",
    "FENCED_SUFFIX",
    "AppendFailed",
    "SegmentFenced",
    "SpoolDamaged",
    "finish_open_segments",
    "write_segment",
    "read_messages",
    "raw_messages",
    "message_runs",
    "ack_ids",
    "segment_count",
    "frame",
    "oldest_of",
    "oldest_publish_ms",
    "publish_range",
    "describe",
    "NO_TIME",
    "RUNBOOK_SEEK",
]

log = logging.getLogger(__name__)

MAGIC = b"EESEG2\n"
"""Format 2: frames with a CRC-32C and their oldest publish time (see the module docstring)."""
MAGIC_V1 = b"EESEG1\n"
"""Format 1 (before 0.3.0): frames with a length only; read, never written."""
_NAME_RE = re.compile(r"^([0-9a-f]{8})-(\d{2,})-(\d{8,})-n(\d+)\.seg$")
_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<IIq")  # length, crc32c, oldest publish time (ms)
_CHECKED = struct.Struct("<Iq")  # what the CRC covers before the response: length, oldest publish time
NO_TIME = -(2**63)
"""A frame's oldest publish time when its response holds no message (never written by the fetcher)."""
RUNBOOK_SEEK = ("stop the job; with the segment still in the spool, note the time `event-etl status` prints ('a seek "
                "must go back to'); then move the segment out of the spool (keep it: it may be read by hand), seek "
                "the subscription back to that time and start the job again (docs/runbook.md, 'A damaged spool "
                "segment'): Pub/Sub delivers those messages again and the dedupe window drops what was already "
                "written")


class SpoolDamaged(SourceError):
    """A spool segment holds a frame that fails its check where no torn write can be (see the module docstring)."""


class AppendFailed(OSError):
    """An append did not become durable; the segment is as it was before it, and nothing may be acknowledged.
    ``full``: the disk (or a quota, or a file size limit) had no room for it.  Raised by a close too, whose rename
    found no room (``doing="closing"``): the segment is still open, and may be closed again."""

    def __init__(self, path: Path, cause: OSError, *, full: bool, doing: str = "appending to") -> None:
        super().__init__(cause.errno, f"{doing} {path} failed: {cause.strerror or cause}")
        self.path, self.cause, self.full = path, cause, full


class SegmentFenced(RuntimeError):
    """Someone finished this open segment (a retried task, a restarted job): its writer may acknowledge nothing more."""


_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _crc(data: bytes, value: int = 0) -> int:
    import google_crc32c

    return int(google_crc32c.extend(value, data))


def frame(response: bytes, oldest_ms: int) -> bytes:
    """One format-2 frame of a serialized ``PullResponse`` whose oldest message was published at ``oldest_ms``."""
    checked = _CHECKED.pack(len(response), oldest_ms)
    return _HEAD.pack(len(response), _crc(response, _crc(checked)), oldest_ms) + response


def oldest_of(response: Any) -> int:
    """The oldest publish time (ms) of a ``PullResponse``'s messages (:data:`NO_TIME` if it has none)."""
    best = None
    for rm in response.received_messages:
        pt = rm.message.publish_time
        ms = pt.seconds * 1000 + pt.nanos // 1_000_000
        if best is None or ms < best:
            best = ms
    return NO_TIME if best is None else best


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


def write_segment(directory: str | os.PathLike[str], name: SegmentName, responses: list[bytes],
                  oldest: list[int] | None = None) -> Path:
    """Write serialized ``PullResponse`` messages as one segment, durably; returns its path.  ``oldest``: each
    response's oldest publish time (ms); read from the responses when not given."""
    d = Path(directory)
    path = d / name.name
    tmp = d / f".{name.name}.tmp"
    if oldest is None:
        oldest = [oldest_of(_parse(r)) for r in responses]
    with open(tmp, "wb") as fh:
        fh.write(MAGIC)
        for r, o in zip(responses, oldest):
            fh.write(frame(r, o))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(d)  # the rename too: a power cut must not take back a segment once it is written
    return path


OPEN_SUFFIX = ".open"
FENCED_SUFFIX = ".fenced"
_OPEN_RE = re.compile(r"^([0-9a-f]{8})-(\d{2,})-(\d{8,})\.(open|fenced)$")


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written: a short write (a disk filling up, a signal) goes on from where it
    stopped, and an error is raised."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - a write of a non-empty buffer returns at least 1 or raises
            raise OSError(errno.EIO, "write wrote nothing")
        view = view[n:]


class OpenSegment:
    """A segment being filled, a pull at a time, each pull durable before it is acknowledged (see the module
    docstring).  Not thread-safe: its stream appends, and whoever rolls it holds the stream's lock."""

    def __init__(self, directory: str | os.PathLike[str], run: str, stream: int, seq: int) -> None:
        self.dir = Path(directory)
        self.run, self.stream, self.seq = run, stream, seq
        self.path = self.dir / f"{run}-{stream:02d}-{seq:08d}{OPEN_SUFFIX}"
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except OSError as err:
            if err.errno in _FULL:  # no room for the file itself (no free inode, no block for the folder)
                raise AppendFailed(self.path, err, full=True) from err
            raise
        st = os.fstat(self.fd)
        self.ident = (st.st_dev, st.st_ino)
        self.count = 0
        self.bytes = 0
        self.size = 0  # bytes of the file that are whole, synced frames (and the magic line)
        self.synced_entry = False
        self.oldest: int | None = None  # the oldest publish time (ms) of its messages
        self.broken: OSError | None = None  # an append failed and the segment could not be put back as it was
        try:
            self._append(MAGIC)
        except AppendFailed:
            self._abandon()
            raise
        self.size = len(MAGIC)

    def _abandon(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)

    def owned(self) -> bool:
        """Whether its file is still this writer's open segment (nobody fenced it to finish it)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def _append(self, data: bytes) -> None:
        """Write ``data`` at the end and sync it, all or nothing: on failure, truncate back to :attr:`size`."""
        try:
            _write_all(self.fd, data)
            os.fdatasync(self.fd)
            if not self.synced_entry:
                fsync_dir(self.dir)
                self.synced_entry = True
        except OSError as err:
            try:  # as it was before: a shrink needs no room, and the sync makes the shorter file the durable one
                os.ftruncate(self.fd, self.size)
                os.fdatasync(self.fd)
            except OSError as again:
                self.broken = again  # its tail is torn: the recovery's check cuts it off, never an acknowledged frame
            raise AppendFailed(self.path, err, full=err.errno in _FULL) from err

    def append(self, response: bytes, messages: int, oldest_ms: int = NO_TIME) -> None:
        """Add one serialized ``PullResponse`` of ``messages`` messages (the oldest published at ``oldest_ms``),
        durably: the data, and the file's entry in its folder the first time.

        Raises :class:`AppendFailed` if it is not durable (the segment is left as it was: acknowledge nothing), and
        :class:`SegmentFenced` if someone finished the segment meanwhile (acknowledge nothing either: what was
        acknowledged before is in the finished segment)."""
        if self.broken is not None:
            raise AppendFailed(self.path, self.broken, full=False)
        if not self.owned():
            raise SegmentFenced(f"{self.path.name} was finished by another writer")
        data = frame(response, oldest_ms)
        self._append(data)
        if not self.owned():  # fenced while we wrote: the finisher may not have read this frame
            raise SegmentFenced(f"{self.path.name} was finished by another writer")
        self.size += len(data)
        self.count += messages
        self.bytes += len(response)
        if oldest_ms != NO_TIME and (self.oldest is None or oldest_ms < self.oldest):
            self.oldest = oldest_ms

    def close(self) -> SegmentName | None:
        """Make it a segment the planner offers (its ``.seg`` name, durable); None (and no file) if it is empty.
        Raises :class:`SegmentFenced` if another writer finished it (its acknowledged frames are in theirs), and
        :class:`AppendFailed` if it is broken (the next start finishes it: see :func:`finish_open_segments`).

        A rename that finds no room (``ENOSPC``, ``EDQUOT``: a folder that needs another block for the longer name)
        raises :class:`AppendFailed` with ``full`` and changes nothing: the segment is still open, and is closed by
        a later call.  A folder sync that finds no room after the rename is left to the next one: the planner
        syncs the folder before it offers a segment it finds, and the next segment's first append before anything
        more is acknowledged (a power cut meanwhile gives the file back its open name, which the next start
        finishes under the same name)."""
        if self.broken is not None:
            os.close(self.fd)
            raise AppendFailed(self.path, self.broken, full=False)
        if not self.count:
            os.close(self.fd)
            if self.owned():
                self.path.unlink(missing_ok=True)
            return None
        name = SegmentName(self.run, self.stream, self.seq, self.count)
        if not self.owned():
            os.close(self.fd)
            raise SegmentFenced(f"{self.path.name} was finished by another writer")
        try:
            os.replace(self.path, self.dir / name.name)
        except OSError as err:
            if err.errno in _FULL:  # nothing changed: still open, its fd too
                raise AppendFailed(self.path, err, full=True, doing="closing") from err
            os.close(self.fd)
            if isinstance(err, FileNotFoundError):  # fenced between the look and the rename
                raise SegmentFenced(f"{self.path.name} was finished by another writer") from None
            raise
        os.close(self.fd)
        try:
            fsync_dir(self.dir)
        except OSError as err:
            if err.errno not in _FULL:
                raise
            log.warning("syncing %s after %s was closed found no room (%s): the next sync of the folder makes its "
                        "name durable", self.dir, name.name, err.strerror)
        return name


@dataclass
class _Scan:
    """What a look through a segment's frames found."""

    good: int  # bytes of the longest prefix of whole, valid frames (magic line included)
    count: int  # messages in it
    frames: int  # frames in it
    bad: str | None = None  # why the frame after it is not valid (None: the file ends there)
    tail: bool = True  # the bad frame is a torn tail (nothing after it but zeros), not damage


def _parse(data: bytes) -> Any:
    from google.pubsub_v1.types import PullResponse

    return PullResponse.pb().FromString(data)


def _parse_frame(data: bytes) -> Any | None:
    """A frame's ``PullResponse``, or None if its bytes do not parse as one (format 1 has no check: a torn frame)."""
    from google.protobuf.message import DecodeError

    try:
        return _parse(data)
    except DecodeError:
        return None


def _scan(data: bytes) -> _Scan:
    """The longest prefix of whole, valid frames of a segment's bytes (either format)."""
    if data.startswith(MAGIC):
        v2 = True
    elif data.startswith(MAGIC_V1):
        v2 = False
    else:
        # a magic line cut short (killed while it was written) holds nothing, as an empty or zero-filled file
        torn = not data.strip(b"\0") or MAGIC.startswith(data) or MAGIC_V1.startswith(data)
        return _Scan(0, 0, 0, "its first bytes are not a spool segment's", tail=torn)
    head = _HEAD if v2 else _LEN
    pos, count, frames = len(MAGIC), 0, 0
    while pos < len(data):
        bad, n = _bad_frame(data, pos, v2)
        if bad is None:
            response = _parse_frame(data[pos + head.size:pos + head.size + n])
            if response is None:  # format 1 has no check: a frame that does not parse is bad
                bad = "it does not parse as a PullResponse"
            else:
                msgs = len(response.received_messages)
        if bad is not None:
            # torn: the frame reaches the end of the file, or nothing but zeros follows its start or its header
            tail = (pos + head.size + n >= len(data) or not data[pos:].strip(b"\0")
                    or not data[pos + head.size:].strip(b"\0"))
            return _Scan(pos, count, frames, bad, tail)
        count += msgs
        frames += 1
        pos += head.size + n
    return _Scan(pos, count, frames)


def _bad_frame(data: bytes, pos: int, v2: bool) -> tuple[str | None, int]:
    """Why the frame at ``pos`` is not whole and valid (None if it is), and the length its header gives."""
    head = _HEAD if v2 else _LEN
    if pos + head.size > len(data):
        return "its header is cut short", len(data)
    if v2:
        n, crc, oldest = _HEAD.unpack_from(data, pos)
    else:
        (n,) = _LEN.unpack_from(data, pos)
    body = data[pos + head.size:pos + head.size + n]
    if len(body) < n:
        return f"it is cut short ({len(body)} of {n} bytes)", n
    if v2 and _crc(body, _crc(_CHECKED.pack(n, oldest))) != crc:
        return "its CRC-32C does not match", n
    return None, n


def _damaged(path: Path, scan: _Scan) -> SpoolDamaged:
    return SpoolDamaged(
        f"spool segment {path} is damaged: frame {scan.frames + 1} (at byte {scan.good}) {scan.bad}, and it is not "
        f"the end of an append that was never synced ({scan.count} messages in the {scan.frames} frames before it "
        "are whole); its messages were acknowledged to Pub/Sub, so the spool is their only copy",
        fix=RUNBOOK_SEEK)


def finish_open_segments(directory: str | os.PathLike[str],
                         keep: Callable[[str, int, int], bool] | None = None) -> list[str]:
    """Finish the open segments left in ``directory`` (``keep(run, stream, seq)``: only those; default all).

    Each is first fenced (renamed ``.fenced``: a writer still running acknowledges nothing from then on), then its
    longest prefix of whole, valid frames becomes a segment; a bad last frame (never synced, so never acknowledged)
    is cut off with a line in the log, and an open segment with no whole frame is deleted.  A bad frame that is not
    the last raises :class:`SpoolDamaged`, leaving the file as ``.fenced``.  Returns the segments made."""
    made = []
    d = Path(directory)
    for path in sorted(d.iterdir()):
        m = _OPEN_RE.match(path.name)
        if m is None or (keep is not None and not keep(m.group(1), int(m.group(2)), int(m.group(3)))):
            continue
        fenced = path
        if m.group(4) == "open":
            fenced = path.with_name(path.name[:-len(OPEN_SUFFIX)] + FENCED_SUFFIX)
            try:
                os.replace(path, fenced)  # from here on its writer (if it still runs) acknowledges nothing
            except FileNotFoundError:
                continue  # its writer closed it meanwhile
        scan = _scan(fenced.read_bytes())
        if scan.bad is not None and not scan.tail:
            raise _damaged(fenced, scan)
        if scan.bad is not None and scan.good:
            log.warning("spool segment %s: frame %d (at byte %d) %s and ends the file: an append that was never "
                        "synced, so never acknowledged; cut off (its messages are delivered again)",
                        path.name, scan.frames + 1, scan.good, scan.bad)
        if not scan.count:
            fenced.unlink()
            continue
        if scan.good < fenced.stat().st_size:
            with open(fenced, "r+b") as fh:
                fh.truncate(scan.good)
                os.fsync(fh.fileno())
        name = SegmentName(m.group(1), int(m.group(2)), int(m.group(3)), scan.count)
        os.replace(fenced, d / name.name)
        made.append(name.name)
    if made:
        fsync_dir(d)
    return made


def _responses(path: str | os.PathLike[str], frames: int | None = None) -> Iterator[Any]:
    """A segment's ``PullResponse`` messages (the first ``frames`` of them, if given), each frame checked (format
    2) before it is parsed: a bad one raises :class:`SpoolDamaged`."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(MAGIC):
        v2 = True
    elif data.startswith(MAGIC_V1):
        v2 = False
    else:
        raise SpoolDamaged(f"{path} is not a spool segment (it does not start with {MAGIC!r} or {MAGIC_V1!r})",
                           fix=RUNBOOK_SEEK)
    head = _HEAD if v2 else _LEN
    pos, done = len(MAGIC), 0
    while pos < len(data) and (frames is None or done < frames):
        bad, n = _bad_frame(data, pos, v2)
        if bad is not None:
            raise SpoolDamaged(f"spool segment {path} is damaged: frame {done + 1} (at byte {pos}) {bad}",
                               fix=RUNBOOK_SEEK)
        yield _parse(data[pos + head.size:pos + head.size + n])
        done += 1
        pos += head.size + n


def _counted(path: str | os.PathLike[str], end: int | None) -> Iterator[Any]:
    """The responses of a segment up to message ``end`` (default: the count in its name): frames past it (a fenced
    writer's, never acknowledged) are never read, nor checked."""
    if end is None:
        end = segment_count(os.fspath(path)) or None
    it = _responses(path)
    i = 0
    while end is None or i < end:
        resp = next(it, None)
        if resp is None:
            return
        yield resp
        i += len(resp.received_messages)


def raw_messages(path: str | os.PathLike[str], start: int = 0, end: int | None = None) -> Iterator[Any]:
    """The ``PubsubMessage`` protocol buffers of messages ``start``..``end - 1``, in order."""
    for msgs in message_runs(path, start, end):
        yield from msgs


def message_runs(path: str | os.PathLike[str], start: int = 0, end: int | None = None) -> Iterator[list[Any]]:
    """The ``PubsubMessage`` protocol buffers of messages ``start``..``end - 1``, a list per pull response."""
    i = 0
    for resp in _counted(path, end):
        received = resp.received_messages
        n = len(received)
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
    """The acknowledgement ids of a segment's messages (up to the count in its name)."""
    return [rm.ack_id for resp in _counted(path, None) for rm in resp.received_messages]


def publish_range(path: str | os.PathLike[str]) -> int | None:
    """The oldest publish time (ms) of the messages of one segment or open segment, from its frames' headers (a
    format-1 segment is decoded); None if it holds none.  A torn tail is not looked at."""
    best: int | None = None
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(MAGIC))
            if magic == MAGIC:
                size = os.fstat(fh.fileno()).st_size
                pos = len(MAGIC)
                while pos + _HEAD.size <= size:
                    fh.seek(pos)
                    n, _check, oldest = _HEAD.unpack(fh.read(_HEAD.size))
                    if pos + _HEAD.size + n > size:
                        break
                    if oldest != NO_TIME and (best is None or oldest < best):
                        best = oldest
                    pos += _HEAD.size + n
                return best
            if magic != MAGIC_V1:
                return None
            data = magic + fh.read()
    except FileNotFoundError:
        return None
    pos = len(MAGIC_V1)
    while pos + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, pos)
        if pos + _LEN.size + n > len(data):
            break
        response = _parse_frame(data[pos + _LEN.size:pos + _LEN.size + n])
        if response is None:  # a torn format-1 tail
            break
        o = oldest_of(response)
        if o != NO_TIME and (best is None or o < best):
            best = o
        pos += _LEN.size + n
    return best


def holds_messages(name: str) -> bool:
    """Whether a file named ``name`` in the segments' folder holds messages: a segment, open or fenced one."""
    return bool(_NAME_RE.match(name) or _OPEN_RE.match(name))


def oldest_publish_ms(directory: str | os.PathLike[str]) -> int | None:
    """The oldest publish time (ms) of any message the spool folder ``directory`` holds (segments not yet deleted by
    a commit, open and fenced segments), or None if it holds none: a seek of the subscription to that time brings
    back every message the spool holds (docs/runbook.md)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    best: int | None = None
    for p in d.iterdir():
        if not (_NAME_RE.match(p.name) or _OPEN_RE.match(p.name)):
            continue
        o = publish_range(p)
        if o is not None and (best is None or o < best):
            best = o
    return best


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a segment holds, for people: its name's parts and its size."""
    p = Path(path)
    n = SegmentName.parse(p.name)
    return {"name": p.name, "bytes": p.stat().st_size, **({"run": n.run, "stream": n.stream, "seq": n.seq,
                                                           "messages": n.count} if n else {})}
