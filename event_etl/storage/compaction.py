"""Merging an hour's small Avro files into full ones, block by block (the I/O of :mod:`event_etl.rules.compaction`).

Records are not decoded: the members' blocks are copied, in order, into new container files
of the same schema and codec, each closed when it holds ``max_events`` records.  The one
block that straddles a file's end is cut between two records (found by skipping over them
with the schema), so every merged file but the last holds exactly ``max_events`` records.
The output is a pure function of the members' bytes and the output names (the sync marker
of each file comes from its name, as for every data file), so a merge redone after a kill
writes the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypedDict, cast

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


class _Output(TypedDict):
    """The merged file being filled: its writer (None once closed), buffer, record count, name and sync marker."""

    writer: Writer | None
    buf: io.BytesIO | None
    n: int
    name: str | None
    sync: bytes


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
    except Exception as err:  # noqa: BLE001 - named with the file
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


def merge_containers(members: Sequence[tuple[str, bytes]], max_events: int, name_of: Callable[[int], str]
                     ) -> list[tuple[str, bytes, int]]:
    """Merge the container files ``members`` (``(name, bytes)``, in order) into files of ``max_events`` records.

    ``name_of(seq)`` names the ``seq``-th output.  Returns ``[(name, bytes, records)]``.  Raises
    :class:`MergeError` when the members do not share one schema and codec."""
    if not members:
        return []
    first_header: tuple[str | None, str] | None = None
    schema: Schema | None = None
    head = b""
    out: list[tuple[str, bytes, int]] = []
    state: _Output = {"writer": None, "buf": None, "n": 0, "name": None, "sync": b""}

    def open_next(codec: str) -> None:
        assert schema is not None  # set from the first member before the first file opens
        name = name_of(len(out))
        buf = io.BytesIO()
        writer = Writer(buf, schema, codec=codec, sync_marker=sync_marker_for(name),
                        compression_level=1 if codec == "deflate" else None)
        state.update({"buf": buf, "n": 0, "name": name, "writer": writer, "sync": sync_marker_for(name)})

    def close() -> None:
        if state["writer"] is not None and state["n"]:
            state["writer"].flush()
            # the members' header as it is (fastavro would write the schema's text its own way), then this
            # file's sync marker and blocks
            assert state["buf"] is not None and state["name"] is not None  # open_next set them with the writer
            data = state["buf"].getvalue()
            out.append((state["name"], head + data[data.find(state["sync"]):], state["n"]))
        state["writer"] = None

    for mname, data in members:
        header, member_head, writer_schema, reader = _blocks(data, mname)
        if first_header is None:
            first_header, head, schema = header, member_head, writer_schema
            open_next(header[1])
        elif header != first_header:
            raise MergeError(f"{mname} has another schema or codec than {members[0][0]}")
        assert schema is not None  # the first member's, from the first iteration on
        block: _RecordBlock
        try:
            for block in cast(Iterable[_RecordBlock], reader):  # fastavro's Blocks: see _RecordBlock
                n = block.num_records
                while n:
                    room = max_events - state["n"]
                    assert state["writer"] is not None  # open_next ran before the loop and after every close
                    if n <= room:
                        state["writer"].write_block(block)
                        state["n"] += n
                        n = 0
                    else:
                        first, rest = _cut(block, schema, room)
                        if room:
                            state["writer"].write_block(_Block(first, room))
                            state["n"] += room
                        block = _Block(rest, n - room)
                        n -= room
                    if state["n"] >= max_events:
                        close()
                        open_next(first_header[1])
        except MergeError:
            raise
        except Exception as err:  # noqa: BLE001 - named with the file
            raise MergeError(f"{mname}: cannot be read to the end ({err})") from err
    close()
    return out
