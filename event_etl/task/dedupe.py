"""Dropping duplicates: redeliveries (same message id) and producer retries (same id field).

Every record a task writes is reported to the driver as a small row of numbers: the
64-bit hash of each of its keys, its time, where it was written (file and record index)
and the key's kind:

- an **id key** (``i:<id field value>``): a producer retry carries the same id.  It is
  stamped with the record's event time and forgotten by the *event clock* (the largest
  event time seen, each counted at most up to its arrival, minus the out-of-orderness
  bound): producer retries are close in event time.  For a partitioned source (Kafka) the
  clock is the slowest live partition's: partitions are read by count, each at its own pace
  in event time, so a retry on a partition behind the others comes after the fastest has
  passed its original (a partition quiet for ``idle_timeout`` stops holding keys back).
- a **message key** (``m:<message id>@<publish time>``, Pub/Sub): a redelivery has both
  the same (an emulator that restarts counts message ids from 1 again, hence the publish
  time).  It is stamped with the publish time and forgotten by the *arrival clock* (the
  latest publish time seen): redeliveries are close in publish time, whatever their event
  time — in a backfill of events of weeks ago published now, the event clock never
  forgets a message key, the arrival clock does.  Message keys of a batch whose messages
  could not be acknowledged (the job died between saving its state and acknowledging, or
  the messages were pulled by an earlier run whose acknowledgement ids expired) are
  different: Pub/Sub *will* deliver those messages again, possibly after newer ones
  (a backlog after a downtime comes back out of order), so their keys are kept until each
  has been seen again, or for ``retention`` (Pub/Sub's message retention, 7 days) of the
  arrival clock.

The driver keeps the keys of the records written within the *dedupe window* (default 10
minutes of each clock) and, after each batch, finds the records whose key was seen
before: in an earlier batch, or earlier in the same batch (order: shard, file, record).
Those are removed from their files before the hour can be marked, and counted as
``duplicate``.  Decisions are recorded with the batch before any file is rewritten, and a
replayed batch skips the same records when it writes, so it produces the same files.

**Memory and cost per batch.**  The state holds 8 bytes per key: sorted runs of hashes,
one per slice of time (an eighth of the window) and kind, so that forgetting is dropping
whole runs, and a batch's keys are merged into the run of their slice only (not into the
whole state).  Lookups are a binary search in each run.  The latest batch is kept apart:
a replay of it must not find its own keys.  At 20,000 messages/s with two keys each, a
10-minute window is ~24 million keys, ~190 MB.

Keys are 64-bit xxHash values: two different ids collide with probability about
n²/2⁶⁵ (1e-5 for ten million keys in the window).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import xxhash

__all__ = ["KEY_DTYPE", "STORED_DTYPE", "LEGACY_KEY_DTYPE", "ID_KEY", "MESSAGE_KEY", "key_hash", "DedupeState",
           "find_duplicates", "may_hold_duplicates", "rows_of", "stored_of", "DEFAULT_RETENTION_MS"]

ID_KEY, MESSAGE_KEY = 0, 1

# One row per key of a written record, as tasks report them.  A record with two keys has two rows.
KEY_DTYPE = np.dtype([("key", "<u8"), ("time", "<i8"), ("shard", "<u4"), ("file", "<u4"), ("rec", "<u4"),
                      ("kind", "u1")])
# What a checkpoint keeps of a batch's keys (etl/dedupe/<batch>.k2).
STORED_DTYPE = np.dtype([("key", "<u8"), ("time", "<i8"), ("kind", "u1")])
# Checkpoint format 1 (etl/dedupe/<batch>.keys): rows without a kind, all forgotten by the event clock.
LEGACY_KEY_DTYPE = np.dtype([("key", "<u8"), ("time", "<i8"), ("shard", "<u4"), ("file", "<u4"), ("rec", "<u4")])

DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
_EMPTY = np.zeros(0, dtype=np.uint64)


def key_hash(kind: str, value: object) -> int:
    """The 64-bit key of an id (``kind`` ``i``) or a message id (``kind`` ``m``)."""
    return xxhash.xxh3_64_intdigest(f"{kind}:{value}".encode("utf-8", "surrogatepass"))


def id_key_hashes(values: list[object]) -> np.ndarray:
    """:func:`key_hash` ``("i", v)`` of each value (``uint64``), for many ids at once."""
    h = xxhash.xxh3_64_intdigest
    if all(type(v) is str for v in values):
        return np.fromiter((h(f"i:{v}".encode("utf-8", "surrogatepass")) for v in values), dtype=np.uint64,
                           count=len(values))
    return np.fromiter((key_hash("i", v) for v in values), dtype=np.uint64, count=len(values))


def rows_of(blobs: Iterable[bytes]) -> np.ndarray:
    """The key rows reported by a batch's tasks, as one array."""
    blobs = [b for b in blobs if b]
    out = np.empty(sum(len(b) for b in blobs) // KEY_DTYPE.itemsize, dtype=KEY_DTYPE)
    raw, at = out.view(np.uint8), 0  # byte copies: numpy copies this packed dtype field by field, ~4x slower
    for b in blobs:
        raw[at:at + len(b)] = np.frombuffer(b, dtype=np.uint8)
        at += len(b)
    return out


def _columns(blobs: Iterable[bytes], dtype: np.dtype) -> np.ndarray:
    """The fields of ``dtype`` (a subset of ``KEY_DTYPE``'s) of every reported key row, as one array.

    Copies only those fields: cheaper than :func:`rows_of` followed by a selection, which first takes a
    copy of every row (a batch of millions of keys spends more on that copy's fresh pages than on the copy)."""
    names = dtype.names
    if names is None:
        raise TypeError(f"{dtype} is not a structured dtype: it has no fields to copy")
    views = [np.frombuffer(b, dtype=KEY_DTYPE) for b in blobs if b]
    out = np.empty(sum(len(v) for v in views), dtype=dtype)
    at = 0
    for v in views:
        part = out[at:at + len(v)]
        for name in names:
            part[name] = v[name]
        at += len(v)
    return out


def stored_of(blobs: Iterable[bytes]) -> np.ndarray:
    """:func:`stored` of the key rows of ``blobs`` (as tasks report them), without :func:`rows_of` first."""
    return _columns(blobs, STORED_DTYPE)


def may_hold_duplicates(blobs: Iterable[bytes], seen: np.ndarray | Callable[[np.ndarray], np.ndarray]) -> bool:
    """Whether the key rows of ``blobs`` hold a key twice, or one in ``seen`` (as :func:`find_duplicates`).

    False settles it: the batch has no duplicate.  True: :func:`find_duplicates` says which records."""
    return _repeated_or_known(sort_keys(_columns(blobs, np.dtype([("key", "<u8")]))["key"]), seen)


PARALLEL_SORT_KEYS = 1 << 20


def sort_keys(keys: np.ndarray) -> np.ndarray:
    """``np.sort(keys)``.  From :data:`PARALLEL_SORT_KEYS` keys on, the two halves are sorted at once (numpy lets
    go of the GIL) and then merged: the driver settles a batch's keys after its tasks, when the cores are
    otherwise idle (3 M keys on 2 cores: ~0.18 s -> ~0.12 s)."""
    if len(keys) < PARALLEL_SORT_KEYS:
        return np.sort(keys)
    half = len(keys) // 2
    with ThreadPoolExecutor(1) as pool:
        upper = pool.submit(np.sort, keys[half:])
        out = np.concatenate([np.sort(keys[:half]), upper.result()])
    out.sort(kind="stable")  # two sorted runs: merged (numpy's stable sort is a timsort), not sorted again
    return out


def _repeated_or_known(keys: np.ndarray, seen: np.ndarray | Callable[[np.ndarray], np.ndarray]) -> bool:
    """Whether the sorted ``keys`` hold one twice or one of ``seen`` (see :func:`find_duplicates`)."""
    return bool(len(keys)) and bool((keys[1:] == keys[:-1]).any() or _known(seen)(keys).any())


def _known(seen: np.ndarray | Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    return (lambda k: _in_sorted(k, seen)) if isinstance(seen, np.ndarray) else seen


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    if len(keys) < 2:
        return np.asarray(keys, dtype=np.uint64)
    s = np.sort(keys)
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s if keep.all() else s[keep]


def _in_sorted(keys: np.ndarray, run: np.ndarray) -> np.ndarray:
    """Mask of ``keys`` found in the sorted array ``run``."""
    if not len(run) or not len(keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.searchsorted(run, keys)
    np.minimum(at, len(run) - 1, out=at)
    found: np.ndarray = run[at] == keys  # numpy's stubs type an array comparison as Any
    return found


def find_duplicates(rows: np.ndarray, seen: np.ndarray | Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Rows (of ``KEY_DTYPE``) whose record is a duplicate, as a boolean mask over ``rows``.

    A record is a duplicate if any of its keys was seen before (``seen``: a sorted ``uint64``
    array, or a function giving the mask of known keys) or belongs to an earlier record of the
    same batch (by shard, file, record).  All rows of a duplicate record are marked.  Pure.
    """
    n = len(rows)
    if n == 0:
        return np.zeros(0, dtype=bool)
    known = _known(seen)
    # The common case, a batch without duplicates, is settled by one sort and lookups into what was seen.
    if not _repeated_or_known(sort_keys(rows["key"]), seen):
        return np.zeros(n, dtype=bool)
    order = np.lexsort((rows["rec"], rows["file"], rows["shard"]))
    ordered = rows[order]
    dup = known(ordered["key"])
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


def _record_ids(rows: np.ndarray) -> np.ndarray:
    return (rows["shard"].astype(np.uint64) << np.uint64(44)) | (rows["file"].astype(np.uint64) << np.uint64(28)) | \
        rows["rec"].astype(np.uint64)


def stored(rows: np.ndarray) -> np.ndarray:
    """What the checkpoint keeps of a batch's key rows."""
    out = np.empty(len(rows), dtype=STORED_DTYPE)
    out["key"], out["time"], out["kind"] = rows["key"], rows["time"], rows["kind"]
    return out


def legacy_rows(rows: np.ndarray) -> np.ndarray:
    """A batch's keys in checkpoint format 1's layout (``.keys``), which release 0.1.0 reads after a rollback."""
    out = np.zeros(len(rows), dtype=LEGACY_KEY_DTYPE)
    out["key"], out["time"] = rows["key"], rows["time"]
    return out


@dataclass
class _Batch:
    """What is known of one batch's keys: how long they must be kept."""

    imax: int | None  # latest time of its id keys
    mmax: int | None  # latest time of its message keys
    acked: bool  # its messages were acknowledged (message keys follow the arrival clock)


@dataclass
class DedupeState:
    """The keys written within the window, in runs by kind and slice of time.  See the module docstring."""

    window_ms: int
    retention_ms: int = DEFAULT_RETENTION_MS
    runs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (kind, slice) -> sorted keys
    unacked: dict[int, tuple[np.ndarray, int]] = field(default_factory=dict)  # batch -> (sorted keys, latest time)
    latest: tuple[int, np.ndarray] | None = None  # the latest batch's stored rows, kept apart
    batches: dict[int, _Batch] = field(default_factory=dict)
    arrival_clock: int | None = None

    @classmethod
    def empty(cls, window_ms: int, retention_ms: int = DEFAULT_RETENTION_MS) -> DedupeState:
        return cls(window_ms, retention_ms)

    @property
    def slice_ms(self) -> int:
        return max(1, self.window_ms // 8)

    @classmethod
    def from_batches(cls, window_ms: int, batches: Iterable[tuple[int, np.ndarray, bool]], event_clock: int | None,
                     retention_ms: int = DEFAULT_RETENTION_MS) -> DedupeState:
        """The state of the stored batches ``(batch id, STORED_DTYPE rows, acknowledged)``, oldest first."""
        st = cls.empty(window_ms, retention_ms)
        for batch_id, rows, acked in sorted(batches, key=lambda b: b[0]):
            st.add(batch_id, rows, acked=acked)
        st.evict(event_clock)
        return st

    # -- adding --------------------------------------------------------------------------------
    def add(self, batch_id: int, rows: np.ndarray, *, acked: bool = True) -> None:
        """Remember a batch's keys (``KEY_DTYPE`` or ``STORED_DTYPE`` rows).  A batch added again replaces itself."""
        rows = stored(rows) if rows.dtype != STORED_DTYPE else rows
        if self.latest is not None and self.latest[0] != batch_id:
            self._fold(*self.latest)
        self.latest = (batch_id, rows)
        ik, mk = rows["kind"] == ID_KEY, rows["kind"] == MESSAGE_KEY
        self.batches[batch_id] = _Batch(int(rows["time"][ik].max()) if ik.any() else None,
                                        int(rows["time"][mk].max()) if mk.any() else None, acked)
        if mk.any():
            top = int(rows["time"][mk].max())
            self.arrival_clock = top if self.arrival_clock is None else max(self.arrival_clock, top)

    def mark_acked(self, batch_id: int, acked: bool) -> None:
        if batch_id in self.batches:
            self.batches[batch_id].acked = acked

    def _fold(self, batch_id: int, rows: np.ndarray) -> None:
        """Merge a batch that is no longer the latest into the runs of its slices."""
        meta = self.batches.get(batch_id)
        kinds = rows["kind"]
        if meta is not None and not meta.acked:
            m = kinds == MESSAGE_KEY
            if m.any():
                self.unacked[batch_id] = (_sorted_unique(rows["key"][m]), int(rows["time"][m].max()))
            rows = rows[~m]
            kinds = rows["kind"]
        if not len(rows):
            return
        slices = rows["time"] // self.slice_ms
        for kind in np.unique(kinds).tolist():
            for sl in np.unique(slices[kinds == kind]).tolist():
                sel = (kinds == kind) & (slices == sl)
                key = (int(kind), int(sl))
                old = self.runs.get(key)
                new = rows["key"][sel]
                self.runs[key] = _sorted_unique(new if old is None else np.concatenate([old, new]))

    # -- looking up ----------------------------------------------------------------------------
    def known_before(self, batch_id: int) -> Callable[[np.ndarray], np.ndarray]:
        """The mask function of keys written by batches before ``batch_id`` (a replay does not see itself)."""
        arrays = list(self.runs.values()) + [k for k, _ in self.unacked.values()]
        if self.latest is not None and self.latest[0] < batch_id:
            arrays.append(_sorted_unique(self.latest[1]["key"]))

        def known(keys: np.ndarray) -> np.ndarray:
            out = np.zeros(len(keys), dtype=bool)
            for run in arrays:
                out |= _in_sorted(keys, run)
            return out

        return known

    def seen_before(self, batch_id: int) -> np.ndarray:
        """The sorted keys of the batches before ``batch_id`` (for inspection and tests; lookups use
        :meth:`known_before`)."""
        arrays = list(self.runs.values()) + [k for k, _ in self.unacked.values()]
        if self.latest is not None and self.latest[0] < batch_id:
            arrays.append(self.latest[1]["key"])
        return _sorted_unique(np.concatenate(arrays)) if arrays else _EMPTY

    @property
    def keys(self) -> np.ndarray:
        return self.seen_before(2**62)

    def seen_again(self, keys: np.ndarray) -> None:
        """Keys of unacknowledged batches found again: their redelivery came, was dropped, and is acknowledged
        with the batch that dropped it.  Pub/Sub may still deliver such a message once more soon after, as it
        may any acknowledged one: the key is kept for the window from now (the arrival clock), not for the
        retention."""
        if not self.unacked or not len(keys) or self.arrival_clock is None:
            return
        found = _sorted_unique(keys)
        moved = []
        for b, (run, top) in list(self.unacked.items()):
            hit = _in_sorted(run, found)
            if hit.any():
                moved.append(run[hit])
                self.unacked[b] = (run[~hit], top)
        if moved:
            key = (MESSAGE_KEY, self.arrival_clock // self.slice_ms)
            old = self.runs.get(key)
            self.runs[key] = _sorted_unique(np.concatenate(moved + ([old] if old is not None else [])))

    # -- forgetting ----------------------------------------------------------------------------
    def evict(self, event_clock: int | None) -> list[int]:
        """Forget what is older than the window on its clock; returns the batches whose stored keys may go."""
        id_limit = None if event_clock is None else event_clock - self.window_ms
        message_limit = None if self.arrival_clock is None else self.arrival_clock - self.window_ms
        limits = {ID_KEY: id_limit, MESSAGE_KEY: message_limit}
        for (kind, sl) in list(self.runs):
            limit = limits.get(kind)
            if limit is not None and (sl + 1) * self.slice_ms <= limit:
                del self.runs[(kind, sl)]
        horizon = None if self.arrival_clock is None else self.arrival_clock - self.retention_ms
        for b, (run, top) in list(self.unacked.items()):
            if not len(run) or (horizon is not None and top < horizon):
                del self.unacked[b]
        gone = []
        for b, meta in list(self.batches.items()):
            if self.latest is not None and b == self.latest[0]:
                continue
            i_done = meta.imax is None or (id_limit is not None and meta.imax < id_limit)
            if meta.acked:
                m_done = meta.mmax is None or (message_limit is not None and meta.mmax < message_limit)
            else:
                m_done = b not in self.unacked
            if i_done and m_done:
                del self.batches[b]
                gone.append(b)
        return gone

    @property
    def size(self) -> int:
        """Keys held (8 bytes each)."""
        n = sum(len(r) for r in self.runs.values()) + sum(len(k) for k, _ in self.unacked.values())
        return n + (len(self.latest[1]) if self.latest is not None else 0)
