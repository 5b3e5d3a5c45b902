"""Merging an hour's small Avro files into full ones, block by block (the I/O of :mod:`event_etl.rules.compaction`).

(Parquet files, of a type of ``format = "parquet"``, are merged by :mod:`event_etl.storage.parquetio`.)

Records are not decoded: the members' blocks are copied as they are stored (still compressed), in order,
into new container files of the same schema and codec, each closed when it holds ``max_events`` records.  The one
block that straddles a file's end is cut between two records (found by skipping over them
with the schema), so every merged file but the last holds exactly ``max_events`` records.
The output is a pure function of the members' bytes and the output names (the sync marker
of each file comes from its name, as for every data file), so a merge redone after a kill
writes the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, cast

import fastavro
from fastavro.types import Schema
from fastavro.write import Writer

from event_etl.storage.avroio import sync_marker_for
from event_etl.util.thirdparty import avro_sync_marker

__all__ = ["merge_containers", "MergeError"]


class MergeError(ValueError):
    """The members cannot be merged as they are (another schema or codec, an unreadable file)."""


class _RecordBlock(Protocol):
    """What :func:`_cut` and ``Writer.write_block`` read of a block: its uncompressed bytes and record count.

    fastavro's ``read.Block`` has both, but its stub leaves ``bytes_`` out (and calls it ``bytes``: it is a
    ``BytesIO``); :class:`_Block` has both too."""

    bytes_: io.BytesIO
    num_records: int


class _Block:
    """What ``Writer.write_block`` reads: a block's uncompressed bytes and its record count."""

    __slots__ = ("bytes_", "num_records")

    def __init__(self, data: bytes, n: int) -> None:
        self.bytes_ = io.BytesIO(data)
        self.num_records = n


def _blocks(data: bytes, name: str
            ) -> tuple[tuple[str | None, str], bytes, Schema, fastavro.block_reader]:
    """``((schema text, codec), header bytes without the sync marker, writer schema, block reader)``."""
    try:
        reader = fastavro.block_reader(io.BytesIO(data))
        header = (reader.metadata.get("avro.schema"), reader.metadata.get("avro.codec", "null"))
        sync = avro_sync_marker(reader)
        end = data.find(sync)  # the header is magic, metadata, then the file's sync marker
        if end < 0:
            raise ValueError("no sync marker after the header")
        return header, data[:end], reader.writer_schema, reader
    except Exception as err:  # named with the file
        raise MergeError(f"{name}: not a readable Avro container file ({err})") from err


def _cut(block: _RecordBlock, schema: Schema, k: int) -> tuple[bytes, bytes]:
    """A block's uncompressed bytes cut after its first ``k`` records."""
    buf = block.bytes_
    buf.seek(0)
    for _ in range(k):
        fastavro.schemaless_reader(buf, schema, None)
    at = buf.tell()
    data = buf.getvalue()
    return data[:at], data[at:]


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag varint ``long`` at ``pos`` and the position after it."""
    shift = acc = 0
    while True:
        if pos >= len(data):
            raise ValueError("a block header runs past the end of the file")
        b = data[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if not b & 0x80:
            return (acc >> 1) ^ -(acc & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("a block header's varint is too long")


def _long(n: int) -> bytes:
    """``n`` as Avro's zig-zag varint ``long``."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _raw_blocks(data: bytes, start: int, sync: bytes) -> Iterable[tuple[int, bytes]]:
    """The blocks of a container file from ``start`` (after its header) as they are stored: ``(records,
    compressed bytes)``, each checked to end with the file's sync marker."""
    pos, size = start, len(data)
    while pos < size:
        n, pos = _read_long(data, pos)
        length, pos = _read_long(data, pos)
        end = pos + length
        if n < 0 or length < 0 or data[end:end + 16] != sync:
            raise ValueError(f"the block at byte {pos} does not end with the file's sync marker")
        yield n, data[pos:end]
        pos = end + 16


def _stored(block: _RecordBlock, schema: Schema, codec: str) -> bytes:
    """A block's records as they are stored in a file of ``codec``: compressed by fastavro's own writer (so a cut
    block is stored as the writer of a data file would store it)."""
    sync = sync_marker_for("event_etl-cut-block")  # 16 bytes no header holds by chance, as every file's own
    buf = io.BytesIO()
    writer = Writer(buf, schema, codec=codec, sync_marker=sync, compression_level=1 if codec == "deflate" else None)
    writer.write_block(block)
    writer.flush()
    data = buf.getvalue()
    start = data.find(sync) + 16
    ((_, stored),) = _raw_blocks(data, start, sync)
    return stored


def merge_containers(members: Sequence[tuple[str, bytes]], max_events: int, name_of: Callable[[int], str]
                     ) -> list[tuple[str, bytes, int]]:
    """Merge the data files ``members`` (``(name, bytes)``, in order) into files of ``max_events`` records.

    ``name_of(seq)`` names the ``seq``-th output.  Returns ``[(name, bytes, records)]``.  Raises
    :class:`MergeError` when the members do not share one format, schema and codec.

    Avro container files: a block that fits is copied as it is stored (compressed), never decompressed; only the
    block that straddles a file's end is decompressed, cut between two records and each part stored again.  A
    merged file is the members' header, its own sync marker and the blocks.  Parquet files (a type of ``format =
    "parquet"``): their rows are read and written again (:func:`event_etl.storage.parquetio.merge_parquet`)."""
    if not members:
        return []
    parquet = [data[:4] == _PARQUET_MAGIC for _, data in members]
    if any(parquet):
        if not all(parquet):
            raise MergeError(f"{members[parquet.index(not parquet[0])][0]} has another format than {members[0][0]}")
        from event_etl.storage.parquetio import merge_parquet

        return merge_parquet(members, max_events, name_of, MergeError)
    return _AvroMerge(max_events, name_of).run(members)


_PARQUET_MAGIC = b"PAR1"  # parquetio.PARQUET_MAGIC, without importing pyarrow for an Avro type's merges


class _AvroMerge:
    """Avro container files merged block by block into files of ``max_events`` records (:func:`merge_containers`)."""

    def __init__(self, max_events: int, name_of: Callable[[int], str]) -> None:
        self.max_events, self.name_of = max_events, name_of
        self.first_header: tuple[str | None, str] | None = None
        self.schema: Schema | None = None
        self.head = b""
        self.out: list[tuple[str, bytes, int]] = []
        self.parts: list[bytes] = []
        self.filled = 0
        self.sync_out = b""

    def run(self, members: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes, int]]:
        for mname, data in members:
            header, member_head, writer_schema, reader = _blocks(data, mname)
            if self.first_header is None:
                self.first_header, self.head, self.schema = header, member_head, writer_schema
                self._open_next()
            elif header != self.first_header:
                raise MergeError(f"{mname} has another schema or codec than {members[0][0]}")
            try:
                self._member(mname, data, len(member_head) + 16, header[1], avro_sync_marker(reader))
            except MergeError:
                raise
            except Exception as err:  # named with the file
                raise MergeError(f"{mname}: cannot be read to the end ({err})") from err
        self._close()
        return self.out

    def _member(self, mname: str, data: bytes, start: int, codec: str, sync: bytes) -> None:
        """One member's blocks, in order: copied as stored, or cut where one straddles a file's end."""
        for index, (n, stored) in enumerate(_raw_blocks(data, start, sync)):
            if n <= self.max_events - self.filled:
                self._add(n, stored)
            else:  # the block straddles the file's end: decompressed and cut between two records
                block: _RecordBlock = next(b for i, b in enumerate(cast(Iterable[_RecordBlock], _blocks(
                    data, mname)[3])) if i == index)
                self._cut_block(block, n, codec)
            self._roll_if_full()

    def _cut_block(self, block: _RecordBlock, n: int, codec: str) -> None:
        schema = self.schema
        assert schema is not None  # the first member's, set before any block
        while n:
            room = self.max_events - self.filled
            if n <= room:
                self._add(n, _stored(block, schema, codec))
                n = 0
            else:
                first, rest = _cut(block, schema, room)
                if room:
                    self._add(room, _stored(_Block(first, room), schema, codec))
                block = _Block(rest, n - room)
                n -= room
            self._roll_if_full()

    def _open_next(self) -> None:
        self.sync_out = sync_marker_for(self.name_of(len(self.out)))
        self.parts, self.filled = [self.head, self.sync_out], 0

    def _add(self, n: int, stored: bytes) -> None:
        self.parts.extend((_long(n), _long(len(stored)), stored, self.sync_out))
        self.filled += n

    def _close(self) -> None:
        if self.filled:
            self.out.append((self.name_of(len(self.out)), b"".join(self.parts), self.filled))

    def _roll_if_full(self) -> None:
        if self.filled >= self.max_events:
            self._close()
            self._open_next()
