"""Dropping duplicates: redeliveries (same message id) and producer retries (same id field).

Every record a task writes is reported to the driver as a small row of numbers: the
64-bit hash of each of its keys (``i:<id field value>`` and, for Pub/Sub, ``m:<message
id>@<publish time>``: a redelivery has both the same, while an emulator that restarts
counts message ids from 1 again), its event time, and where it was written (file and record index).  The driver
keeps the keys of the records written within the *dedupe window* (event times no older
than the window behind the event clock, the largest event time seen minus the
out-of-orderness bound: default 10 minutes of event time; a drain or an idle advance of the
watermark does not age keys out) and, after each
batch, finds the records whose key was seen before: in an earlier batch, or earlier in
the same batch (order: shard, file, record).  Those are removed from their files before
the hour can be marked, and counted as ``duplicate``.  Duplicates are rare, so the
common batch pays only for the hashes; the state is bounded by the window.

Decisions are recorded with the batch before any file is rewritten, and a replayed
batch skips the same records when it writes, so it produces the same files.

Keys are 64-bit xxHash values: two different ids collide with probability about
n²/2⁶⁵ (1e-5 for ten million keys in the window).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import xxhash

__all__ = ["KEY_DTYPE", "key_hash", "DedupeState", "find_duplicates", "rows_of"]

# One row per key of a written record.  A record with two keys has two rows.
KEY_DTYPE = np.dtype([("key", "<u8"), ("time", "<i8"), ("shard", "<u4"), ("file", "<u4"), ("rec", "<u4")])


def key_hash(kind: str, value: object) -> int:
    """The 64-bit key of an id (``kind`` ``i``) or a message id (``kind`` ``m``)."""
    return xxhash.xxh3_64_intdigest(f"{kind}:{value}".encode("utf-8", "surrogatepass"))


def id_key_hashes(values: list) -> np.ndarray:
    """:func:`key_hash` ``("i", v)`` of each value (``uint64``), for many ids at once."""
    h = xxhash.xxh3_64_intdigest
    if all(type(v) is str for v in values):
        return np.fromiter((h(("i:" + v).encode("utf-8", "surrogatepass")) for v in values), dtype=np.uint64,
                           count=len(values))
    return np.fromiter((key_hash("i", v) for v in values), dtype=np.uint64, count=len(values))


def rows_of(blobs: Iterable[bytes]) -> np.ndarray:
    """The key rows reported by a batch's tasks, as one array."""
    parts = [np.frombuffer(b, dtype=KEY_DTYPE) for b in blobs if b]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=KEY_DTYPE)


def find_duplicates(rows: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Rows (of ``KEY_DTYPE``) whose record is a duplicate, as a boolean mask over ``rows``.

    A record is a duplicate if any of its keys is in ``seen`` (sorted ``uint64``) or
    belongs to an earlier record of the same batch (by shard, file, record).  All rows of
    a duplicate record are marked.  Pure function.
    """
    n = len(rows)
    if n == 0:
        return np.zeros(0, dtype=bool)
    # The common case, a batch without duplicates, is settled by one sort and lookups into ``seen``.
    keys = sorted_keys(rows)
    if not (keys[1:] == keys[:-1]).any() and not _any_in(keys, seen):
        return np.zeros(n, dtype=bool)
    order = np.lexsort((rows["rec"], rows["file"], rows["shard"]))
    ordered = rows[order]
    dup = np.isin(ordered["key"], seen) if len(seen) else np.zeros(n, dtype=bool)
    # earlier in this batch: only the first occurrence of a key (in record order) is kept
    _, first = np.unique(ordered["key"], return_index=True)
    later = np.ones(n, dtype=bool)
    later[first] = False
    dup |= later
    # spread to every row of a duplicate record
    rec_id = _record_ids(ordered)
    bad = np.unique(rec_id[dup])
    marked = np.isin(rec_id, bad)
    out = np.zeros(n, dtype=bool)
    out[order] = marked
    return out


_LAST_SORTED: list = [None, None]


def sorted_keys(rows: np.ndarray) -> np.ndarray:
    """``np.sort(rows["key"])``, remembered for the last array asked (the driver asks twice a batch)."""
    if _LAST_SORTED[0] is not rows:
        _LAST_SORTED[:] = [rows, np.sort(rows["key"])]
    return _LAST_SORTED[1]


def _any_in(keys: np.ndarray, seen: np.ndarray) -> bool:
    """Whether any of ``keys`` is in ``seen`` (both sorted)."""
    if not len(seen) or not len(keys):
        return False
    at = np.searchsorted(seen, keys)
    np.minimum(at, len(seen) - 1, out=at)
    return bool((seen[at] == keys).any())


def _merge_sorted(parts: list[np.ndarray]) -> np.ndarray:
    """The distinct values of several sorted arrays, sorted."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros(0, dtype=np.uint64)
    if len(parts) == 1:
        merged = parts[0]
    else:
        merged = np.concatenate(parts)
        merged.sort(kind="stable")  # timsort: merging sorted runs is linear
    if len(merged) > 1:
        keep = np.empty(len(merged), dtype=bool)
        keep[0] = True
        np.not_equal(merged[1:], merged[:-1], out=keep[1:])
        if not keep.all():
            merged = merged[keep]
    return merged


def _record_ids(rows: np.ndarray) -> np.ndarray:
    return (rows["shard"].astype(np.uint64) << np.uint64(44)) | (rows["file"].astype(np.uint64) << np.uint64(28)) | \
        rows["rec"].astype(np.uint64)


@dataclass
class DedupeState:
    """The keys written within the window, by batch, so that old batches can be forgotten."""

    window_ms: int
    keys: np.ndarray  # sorted uint64
    by_batch: dict[int, np.ndarray]  # batch id -> KEY_DTYPE rows of records kept
    _sorted: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False, compare=False)
    """batch id -> (its rows, their keys sorted): each batch's keys are sorted once."""

    @classmethod
    def empty(cls, window_ms: int) -> "DedupeState":
        return cls(window_ms, np.zeros(0, dtype=np.uint64), {})

    @classmethod
    def from_batches(cls, window_ms: int, batches: Iterable[tuple[int, np.ndarray]], watermark: int | None) -> "DedupeState":
        st = cls.empty(window_ms)
        for batch_id, rows in batches:
            st.by_batch[batch_id] = rows
        st._rebuild()
        st.evict(watermark)
        return st

    def seen_before(self, batch_id: int) -> np.ndarray:
        """Sorted keys of the batches before ``batch_id`` (a replayed batch does not see itself)."""
        later = [b for b in self.by_batch if b >= batch_id]
        if not later:
            return self.keys
        return _merge_sorted([self._sorted_keys(b) for b in self.by_batch if b < batch_id])

    def _sorted_keys(self, batch_id: int) -> np.ndarray:
        rows = self.by_batch[batch_id]
        hit = self._sorted.get(batch_id)
        if hit is None or hit[0] is not rows:
            hit = self._sorted[batch_id] = (rows, sorted_keys(rows))
        return hit[1]

    def add(self, batch_id: int, rows: np.ndarray) -> None:
        replaced = batch_id in self.by_batch
        self.by_batch[batch_id] = rows
        if replaced:
            self._rebuild()
        else:
            self.keys = _merge_sorted([self.keys, self._sorted_keys(batch_id)])

    def evict(self, clock: int | None) -> list[int]:
        """Forget rows older than ``clock - window``; returns the batch ids now empty."""
        gone = []
        if clock is not None:
            limit = clock - self.window_ms
            changed = False
            for b, rows in list(self.by_batch.items()):
                old = rows["time"] < limit
                if not old.any():
                    continue
                changed = True
                keep = rows[~old]
                if len(keep):
                    self.by_batch[b] = keep
                else:
                    del self.by_batch[b]
                    gone.append(b)
            if not changed:
                return gone
        self._rebuild()
        return gone

    def _rebuild(self) -> None:
        for b in list(self._sorted):
            if b not in self.by_batch:
                del self._sorted[b]
        self.keys = _merge_sorted([self._sorted_keys(b) for b in self.by_batch])

    @property
    def size(self) -> int:
        return int(len(self.keys))
