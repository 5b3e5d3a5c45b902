"""A split's data files as an executor task fills them: Avro containers of pre-encoded records, rolled over.

A task encodes each record as it comes (one datum at a time, or a column of them on the fast
path) and appends the bytes to the open file of the record's (hour, late) group,
:class:`RollingFiles`.  A group's current file, an :class:`OpenAvroFile`, closes a block at
:data:`BLOCK_BYTES` and rolls over to the next file at ``max_records`` positions; every file
is named by :func:`event_etl.rules.buckets.data_file_name` and gets the sync marker of its name
(:func:`event_etl.storage.avroio.sync_marker_for`), so a replay of the batch makes the same
bytes under the same names.  Storing the files is the task's business (it writes each once).

A type of ``format = "parquet"`` (:class:`ParquetOutput`) fills its files the same way, as
uncompressed Avro containers of the same records rolled over at the same points, and each is
turned into a Parquet file as it closes (:mod:`event_etl.storage.parquetio`): the record path and
the fast path, which make the same Avro bytes, make the same Parquet bytes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from fastavro import schemaless_writer
from fastavro.types import Schema
from fastavro.write import Writer

from event_etl.rules.buckets import data_file_name
from event_etl.storage.avroio import sync_marker_for
from event_etl.timeutil import HOUR_MS

__all__ = ["BLOCK_BYTES", "EncodedBlock", "OpenAvroFile", "ParquetOutput", "RollingFiles", "SplitFiles"]

BLOCK_BYTES = 64 * 1024
"""A block is closed after the record that brings its uncompressed bytes to this size."""


class EncodedBlock:
    """What ``fastavro.write.Writer.write_block`` reads: encoded datums and their count."""

    __slots__ = ("bytes_", "num_records")

    def __init__(self, buf: io.BytesIO, n: int) -> None:
        self.bytes_ = buf
        self.num_records = n


@dataclass(frozen=True)
class ParquetOutput:
    """How a type of ``format = "parquet"`` writes its files: the Avro schema without its time logical types (the
    header of the records the record path encodes: :func:`~event_etl.storage.parquetio.plain_schema`), its Arrow
    mapping and its ``codec``."""

    plain: Schema
    converter: Any  # parquetio.AvroArrow (pyarrow is imported only by a type that writes Parquet)
    codec: str

    @classmethod
    def of(cls, avro_schema: dict[str, Any], codec: str) -> ParquetOutput:
        from fastavro import parse_schema

        from event_etl.storage.parquetio import AvroArrow, plain_schema

        return cls(parse_schema(plain_schema(avro_schema)), AvroArrow(avro_schema, with_avro_schema=True), codec)

    def encode(self, pieces: list[Any]) -> bytes:
        """A Parquet file of ``pieces`` in order: Arrow tables of fast-path columns, or ``(encoded datums, count)``
        of records the record path encoded (decoded once here).  Either way the same values make the same table,
        so the same file."""
        import pyarrow as pa

        from event_etl.storage.parquetio import encode_parquet

        target = self.converter.schema
        tables = []
        for piece in pieces:
            if isinstance(piece, tuple):
                tables.append(self._decoded(*piece))
            else:
                arrays = [piece.column(f.name).cast(f.type) for f in target]
                tables.append(pa.Table.from_arrays(arrays, schema=target))
        table = pa.concat_tables(tables).combine_chunks() if tables else target.empty_table()
        return encode_parquet(table, self.codec)

    def _decoded(self, datums: bytes, n: int) -> Any:
        from fastavro import reader

        out = io.BytesIO()
        w = Writer(out, self.plain, codec="null", sync_marker=sync_marker_for("parquet-piece"))
        w.write_block(EncodedBlock(io.BytesIO(datums), n))
        w.flush()
        out.seek(0)
        return self.converter.table(reader(out))


class OpenAvroFile:
    """One Avro container file being filled with pre-encoded records, in memory.

    ``block`` holds the encoded datums of the block being filled (``in_block`` of them);
    ``records`` counts the file's records so far.  With ``parquet``, a Parquet file is filled
    instead: its ``pieces`` (see :meth:`ParquetOutput.encode`), the blocks of encoded datums and
    the tables of columns :meth:`add_columns` gives, in order; :meth:`close` gives the Parquet file."""

    def __init__(self, name: str, schema: Schema, codec: str, parquet: ParquetOutput | None = None) -> None:
        self.name = name
        self.out = io.BytesIO()
        self.parquet = parquet
        self.pieces: list[Any] = []
        if parquet is None:
            self.writer = Writer(self.out, schema, codec=codec, sync_marker=sync_marker_for(name),
                                 compression_level=1 if codec == "deflate" else None)
        self.block = io.BytesIO()
        self.in_block = 0
        self.records = 0

    def flush_block(self) -> None:
        """Close the block being filled, if it holds anything."""
        if self.in_block:
            if self.parquet is not None:
                self.pieces.append((self.block.getvalue(), self.in_block))
            else:
                self.writer.write_block(EncodedBlock(self.block, self.in_block))
            self.block = io.BytesIO()
            self.in_block = 0

    def add_columns(self, table: Any) -> None:
        """Records as a table of columns (a Parquet file's only), after those added before."""
        self.flush_block()
        self.pieces.append(table)
        self.records += table.num_rows

    def close(self) -> bytes:
        """The whole file's bytes."""
        self.flush_block()
        if self.parquet is not None:
            return self.parquet.encode(self.pieces)
        self.writer.flush()
        return self.out.getvalue()


@dataclass(frozen=True)
class SplitFiles:
    """What the files of every (hour, late) group of one split share: their names' parts (the split's ``batch_id``
    and ``shard``, the ``writer``), how they are filled (``schema``, ``codec``, ``max_records`` positions a file,
    ``parquet`` for a Parquet type), and the positions an earlier attempt of the batch found to be duplicates
    (``drop``: file name -> positions)."""

    batch_id: int
    shard: int
    writer: str
    schema: Schema
    codec: str
    max_records: int
    drop: Mapping[str, Iterable[int]]
    parquet: ParquetOutput | None = None


class RollingFiles:
    """The files of one (hour, late) group of a split, filled in order, rolled over every ``max_records`` positions
    (the split's :class:`SplitFiles`).

    ``index`` is the group's order of opening in its split: with ``seq``, the number of its
    current file, it makes :attr:`file_key` (what dedupe key rows point at).  ``pos`` counts the
    records offered to the current file, written or not: a record that an earlier attempt found
    to be a duplicate (``drop``: file name -> positions) is skipped, and files roll over at the
    same positions as in that attempt, so they come out the same.
    """

    def __init__(self, index: int, hour: int, late: bool, files: SplitFiles) -> None:
        self.index, self.hour, self.late = index, hour, late
        self.parquet = files.parquet
        self.batch_id, self.shard, self.writer = files.batch_id, files.shard, files.writer
        self.schema, self.codec, self.max_records, self.drop = files.schema, files.codec, files.max_records, files.drop
        self.seq = 0
        self.pos = 0
        self.max_t: int | None = None
        # late files only: how many of each file's records belong to each event hour (name -> hour -> records),
        # so the manifest can say which hours its late records came from
        self.event_hours: dict[str, dict[int, int]] = {}
        self.done: list[tuple[str, bytes, int, int]] = []  # name, bytes, records, file key
        self.current = self._new()

    def _new(self) -> OpenAvroFile:
        name = data_file_name(self.hour, self.batch_id, self.shard, self.seq, late=self.late, writer=self.writer,
                              fmt="avro" if self.parquet is None else "parquet")
        self.skip = frozenset(self.drop.get(name, ()))
        return OpenAvroFile(name, self.schema, self.codec, self.parquet)

    @property
    def file_key(self) -> int:
        return self.index * 10000 + self.seq

    def add(self, rec: dict[str, Any], t: int) -> str | Literal[-1] | None:
        """Encode ``rec`` into the current file.

        Returns ``None`` when it was written (its position is then ``self.last``), ``-1``
        when it is a known duplicate that was skipped, or an error message when fastavro
        cannot encode it.
        """
        f = self.current
        pos = self.pos
        if pos in self.skip:
            self._advance()
            return -1
        buf = f.block
        at = buf.tell()
        try:
            schemaless_writer(buf, self.schema, rec)
        except (ValueError, TypeError, AttributeError, OverflowError, KeyError) as err:
            buf.seek(at)
            buf.truncate()
            return f"cannot encode: {err}"[:300]
        self.last = (self.file_key, pos)
        f.in_block += 1
        f.records += 1
        if self.late:
            hours = self.event_hours.setdefault(f.name, {})
            h = t - t % HOUR_MS
            hours[h] = hours.get(h, 0) + 1
        if self.max_t is None or t > self.max_t:
            self.max_t = t
        if buf.tell() >= BLOCK_BYTES:
            f.flush_block()
        self._advance()
        return None

    def _advance(self) -> None:
        self.pos += 1
        if self.pos >= self.max_records:
            self._roll()

    def _roll(self) -> None:
        f = self.current
        if f.records:
            self.done.append((f.name, f.close(), f.records, self.file_key))
        self.seq += 1
        self.pos = 0
        self.current = self._new()

    def add_encoded(self, offs: np.ndarray, data: memoryview, times: np.ndarray, *, columns: Any = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Append records already Avro-encoded, in order, as :meth:`add` would one by one.

        Record ``i`` is ``data[offs[i]:offs[i + 1]]`` (the offsets and data of an Arrow binary array,
        :func:`event_etl.task.fastpath.rows_buffer`), its event time ``times[i]``.  The files, their
        blocks and their roll-over points come out exactly as from :meth:`add`.  Returns
        ``(written, file_keys, positions)`` per record (``written`` is False for a known duplicate
        that was skipped).  ``columns``: the same records as a table of columns, which a Parquet file
        takes instead of the encoded rows.
        """
        if self.parquet is None:
            columns = None
        n = len(times)
        written = np.ones(n, dtype=bool)
        fks = np.empty(n, dtype=np.int64)
        poss = np.empty(n, dtype=np.int64)
        per_file = self.max_records
        i = 0
        while i < n:
            f = self.current
            take = min(per_file - self.pos, n - i)
            fks[i:i + take] = self.file_key
            poss[i:i + take] = np.arange(self.pos, self.pos + take)
            if self.skip:
                for j in range(i, i + take):
                    if self.pos in self.skip:
                        written[j] = False
                    else:
                        self._write_run(f, offs, data, j, j + 1, columns)
                    self._advance()
            else:
                self._write_run(f, offs, data, i, i + take, columns)
                self.pos += take
                if self.pos >= per_file:
                    self._roll()
            if self.late:
                self._count_hours(f.name, times[i:i + take][written[i:i + take]])
            i += take
        if written.any():
            top = int(times[written].max())
            if self.max_t is None or top > self.max_t:
                self.max_t = top
        return written, fks, poss

    def _count_hours(self, name: str, times: np.ndarray) -> None:
        if not len(times):
            return
        hours, counts = np.unique(times - times % HOUR_MS, return_counts=True)
        mine = self.event_hours.setdefault(name, {})
        for h, c in zip(hours.tolist(), counts.tolist()):
            mine[h] = mine.get(h, 0) + c

    @staticmethod
    def _write_run(f: OpenAvroFile, offs: np.ndarray, data: memoryview, a: int, b: int, columns: Any = None) -> None:
        """Records ``a``..``b`` into ``f``, a block closed after the record that brings it to :data:`BLOCK_BYTES`
        (or, given their ``columns``, those rows of them)."""
        if columns is not None:
            f.add_columns(columns.slice(a, b - a))
            return
        j = a
        while j < b:
            target = offs[j] + (BLOCK_BYTES - f.block.tell())
            k = j + int(np.searchsorted(offs[j + 1:b + 1], target, side="left"))
            stop = min(k, b - 1) + 1
            f.block.write(data[offs[j]:offs[stop]])
            f.in_block += stop - j
            f.records += stop - j
            if k < b:
                f.flush_block()
            j = stop

    def finish(self) -> list[tuple[str, bytes, int, int]]:
        """Close the current file: every file of the group, ``(name, bytes, records, file key)``, in order."""
        if self.current.records:
            self.done.append((self.current.name, self.current.close(), self.current.records, self.file_key))
        return self.done
