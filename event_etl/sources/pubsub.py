"""``pubsub:projects/P/subscriptions/S``: a Pub/Sub subscription as a streaming source.

Messages cross three durable steps, so that nothing is lost and a replayed batch sees
exactly the same messages:

1. **Pull and spool**, continuously and in parallel, off the trigger's path: the job's
   :class:`~event_etl.sources.pubsub_fetch.Fetcher` writes what it pulls to spool segments
   in the checkpoint (``etl/source/pubsub/segments/``, :mod:`event_etl.sources.spool`),
   durably, and keeps extending their ack deadlines.
2. **Offer.**  When the engine asks for the latest offset, the planner here logs the segments
   that appeared since (``etl/source/pubsub/log/``) and offers them, up to the batch cap:
   an offset is a position in that log, so a replay reads the same segments.
3. **Acknowledge after the batch is saved.**  The controller hands the fetcher the
   segments a batch read once its files, markers and state are durable; their messages
   are acknowledged in bulk then.  Spark's commit of the batch deletes the segments.

A crash before the acknowledgement makes Pub/Sub deliver the messages again; they are
then dropped by message id (see :mod:`event_etl.task.dedupe`).  Segments written but never
offered are offered after a restart.  Spool files of release 0.1.0 (``<n>.avro``, one per
batch, pulled inside ``latestOffset``) left in a checkpoint are read first, as that
release would have.

Offsets are ``{"spool": n, "seg": k}``: ``n`` counts release 0.1.0's spool files,
``k`` logged segments.  With ``--once`` the planner waits for the fetcher to find the
subscription empty (``DRAINED``) before it lets the query end.

Like Google's own clients, the source honours ``PUBSUB_EMULATOR_HOST`` and then needs
no credentials; otherwise it uses Application Default Credentials.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import fastavro

from event_etl import faults
from event_etl.errors import SourceError
from event_etl.sources.splits import Split
from event_etl.sources.spool import ERROR_FILE, Spool, segment_count

__all__ = ["PubSubPlanner", "SPOOL_SCHEMA", "read_spool", "parse_subscription", "subscriber_client",
           "publisher_client", "check_subscription", "ERROR_FILE", "permanent_error"]

log = logging.getLogger(__name__)

_SUB_RE = re.compile(
    r"^projects/([a-z][a-z0-9-]{4,28}[a-z0-9]|[a-zA-Z][\w.-]{2,})/subscriptions/([a-zA-Z][\w.~+%-]{2,254})$"
)
ONCE_FILL_SECONDS = 2.0
"""``--once``: how long a batch waits for its source to hold a batch's worth (``--max-events-per-batch``) before it
takes what there is (the subscription found empty ends the wait)."""
SPLIT_MESSAGES = 100_000

SPOOL_SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "SpooledMessage", "namespace": "event_etl",
    "fields": [
        {"name": "message_id", "type": "string"},
        {"name": "publish_time", "type": "long", "doc": "ms since the epoch"},
        {"name": "attributes", "type": {"type": "map", "values": "string"}},
        {"name": "data", "type": "bytes"},
        {"name": "ordering_key", "type": "string", "default": ""},
        {"name": "delivery_attempt", "type": "int", "default": 0},
    ],
})


def parse_subscription(path: str) -> tuple[str, str]:
    """``projects/P/subscriptions/S`` -> ``(P, S)``; ``ValueError`` with the expected form otherwise."""
    m = _SUB_RE.match(path.strip())
    if not m:
        raise ValueError(f"{path!r} is not a subscription path: write projects/PROJECT/subscriptions/NAME")
    return m.group(1), m.group(2)


def subscriber_client() -> Any:
    from google.cloud.pubsub_v1 import SubscriberClient

    return SubscriberClient()


def publisher_client(**kwargs: Any) -> Any:
    from google.cloud.pubsub_v1 import PublisherClient

    return PublisherClient(**kwargs)


_TRANSIENT: tuple[type[Exception], ...] | None = None


def _transient_errors() -> tuple[type[Exception], ...]:
    global _TRANSIENT
    if _TRANSIENT is None:
        from google.api_core import exceptions as ex

        _TRANSIENT = (ex.ServiceUnavailable, ex.DeadlineExceeded, ex.InternalServerError, ex.Aborted,
                      ex.ResourceExhausted, ex.Unknown, ex.RetryError)
    return _TRANSIENT


def permanent_error(subscription: str, err: Exception) -> SourceError:
    """The clear message for an error that retrying cannot fix."""
    from google.api_core import exceptions as ex

    emulator = os.environ.get("PUBSUB_EMULATOR_HOST")
    where = f" on the emulator at {emulator}" if emulator else ""
    if isinstance(err, ex.NotFound):
        return SourceError(f"subscription {subscription} does not exist{where}",
                           fix="create it (and its topic) with `event-etl setup EVENT_TYPE`, or fix --source")
    if isinstance(err, (ex.PermissionDenied, ex.Unauthenticated)):
        return SourceError(f"no permission to pull from {subscription}: {getattr(err, 'message', err)}",
                           fix="grant roles/pubsub.subscriber to the job's credentials "
                               "(Application Default Credentials: `gcloud auth application-default login` "
                               "or a service account), or set PUBSUB_EMULATOR_HOST for the emulator")
    return SourceError(f"pulling from {subscription} failed: {err}", fix="check the subscription and the network")


def check_subscription(subscription: str) -> None:
    """Fail fast (before Spark starts) if the subscription is missing or not readable."""
    from google.api_core import exceptions as ex

    client = subscriber_client()
    try:
        client.get_subscription(subscription=subscription, timeout=30)
    except _transient_errors() as err:
        raise SourceError(f"cannot reach Pub/Sub to check {subscription}: {err}",
                          fix="check the network (or that the emulator at PUBSUB_EMULATOR_HOST runs)") from err
    except ex.GoogleAPICallError as err:
        raise permanent_error(subscription, err) from err
    finally:
        client.close()


def read_spool(path: str, start: int, end: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Messages ``start``..``end - 1`` of a spool file."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - opened apart: a missing file is its own error; closed below
    except OSError as err:
        raise SourceError(
            f"spool file {path} is missing: {err}",
            fix="the checkpoint's etl/source/pubsub/spool must stay until its batch is committed",
        ) from err
    with fh:
        for i, m in enumerate(fastavro.reader(fh)):
            if i >= end:
                break
            if i >= start:
                yield i, cast("dict[str, Any]", m)  # the spool's schema: a record


class PubSubPlanner:
    """Plans micro-batches over the spool a :class:`~event_etl.sources.pubsub_fetch.Fetcher` fills
    (runs in the driver, asked by the engine's lane: :mod:`event_etl.job.engine`).  It reads the spool
    through :class:`~event_etl.sources.spool.Spool`: the segments found, the discovery log whose positions
    its offsets are, and release 0.1.0's spool files."""

    def __init__(self, subscription: str, spool_dir: str, *, max_messages: int, clock: Callable[[], int],
                 tasks_per_batch: int = 2, once_wait: float = 900.0) -> None:
        self.subscription = subscription
        self.spool = Spool(spool_dir)
        self.log = self.spool.log  # loaded here: a log that does not load is an error at once
        self.max_messages = max_messages
        self.clock = clock
        self.tasks_per_batch = max(1, tasks_per_batch)
        self.once = False
        self.once_wait = once_wait  # --once: how long to wait for the fetcher to find the subscription empty

    def _discover(self) -> None:
        self.log.discover(self.spool.closed())

    def _check_error(self) -> None:
        err = self.spool.error()
        if err is not None:
            raise err

    # -- the streaming-source protocol ------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        legacy = self.spool.legacy()
        return {"spool": legacy[0] if legacy else 0, "seg": self.log.base}

    def prepare_available_now(self) -> None:
        self.once = True

    def latest_offset(self, start: dict[str, Any], max_rows: int | None) -> dict[str, Any]:
        self._check_error()
        n, k = int(start.get("spool", 0)), self.log.position(start)
        legacy = [x for x in self.spool.legacy() if x >= n]
        if legacy:  # spooled by release 0.1.0 before it stopped, never given to Spark: they come first
            return {"spool": max(legacy) + 1, "seg": k}
        cap = min(self.max_messages, max_rows or self.max_messages)
        self._discover()
        if self.once:
            self._wait_for_once(k, cap)
        end, taken, log = k, 0, self.log
        while end < log.end:
            c = segment_count(log.entries[end - log.base])
            if taken and taken + c > cap:
                break
            taken += c
            end += 1
        self.log.offer(end)  # before Spark logs an offset past it
        return {"spool": n, "seg": end}

    def _wait_for_once(self, k: int, cap: int) -> None:
        """``--once``: wait until the spool holds something past ``k`` or the fetcher found the subscription empty;
        then, while a backlog streams in, a moment more for a batch's worth (``cap`` messages) rather than a trickle
        (each batch costs a Spark job; thousands of small ones would take the cores the pulling needs)."""
        if self.log.end <= k:
            deadline = time.monotonic() + self.once_wait
            while self.log.end <= k and not self.spool.drained():
                self._check_error()
                if time.monotonic() > deadline:
                    raise SourceError(f"--once: nothing came from {self.subscription} for {self.once_wait:.0f}s "
                                      "and the puller did not report it empty",
                                      fix="check the job's log; run again, the checkpoint loses nothing")
                time.sleep(0.1)
                self._discover()
            self._discover()  # segments flushed just before the subscription was found empty
        until = time.monotonic() + ONCE_FILL_SECONDS
        while (sum(segment_count(e) for e in self.log.entries[k - self.log.base:]) < cap and time.monotonic() < until
               and not self.spool.drained()):
            self._check_error()
            time.sleep(0.1)
            self._discover()

    def backlog(self, start: dict[str, Any]) -> dict[str, int]:
        k = self.log.position(start)
        return {"messages": sum(segment_count(e) for e in self.log.names(k))}

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        out: list[Split] = []
        for n in range(int(start.get("spool", 0)), int(end.get("spool", 0))):
            path = self.spool.legacy_file(n)
            if not path.exists():
                raise SourceError(f"spool file {path} of a batch not yet committed is missing",
                                  fix="the checkpoint was changed by hand; restore it or start a new one")
            count = self._legacy_count(path)
            pieces = max(-(-count // SPLIT_MESSAGES), min(self.tasks_per_batch, max(1, count // 5000)))
            bounds = [count * i // pieces for i in range(pieces + 1)]
            for lo, hi in zip(bounds, bounds[1:]):
                if hi > lo:
                    out.append(Split(len(out), "spool", str(path), lo, hi, 0))
        a = self.log.position(start)
        b = int(end["seg"]) if "seg" in end else a
        ranges = []
        for name in self.log.names(a, b):
            path = self.spool.path(name)
            if not path.exists():
                raise SourceError(f"spool segment {path} of a batch not yet committed is missing",
                                  fix="the checkpoint was changed by hand; restore it or start a new one")
            ranges.append((str(path), segment_count(name)))
        total = sum(c for _, c in ranges)
        if total:
            pieces = max(-(-total // SPLIT_MESSAGES), min(self.tasks_per_batch, max(1, total // 5000)))
            for part in _cut(ranges, pieces):
                out.append(Split(len(out), "seg", "", 0, sum(b - a for _, a, b in part), 0,
                                 json.dumps([[p, a, b, 0] for p, a, b in part])))
        return out

    @staticmethod
    def _legacy_count(path: Path) -> int:
        with open(path, "rb") as fh:
            return int(fastavro.reader(fh).metadata.get("event_etl.count", "0"))

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed every batch up to ``end``: their spool is no longer needed."""
        self.spool.delete_legacy_before(int(end.get("spool", 0)))
        k = self.log.position(end)
        faults.point("segments_committed", str(k))  # Spark committed the batches; their segments not yet deleted
        self.log.forget(k)

    def stop(self) -> None:
        pass


def _cut(ranges: list[tuple[str, int]], pieces: int) -> list[list[tuple[str, int, int]]]:
    """Cut segments ``[(path, count)]`` into ``pieces`` runs of about equal message counts (pure)."""
    total = sum(c for _, c in ranges)
    bounds = [total * i // pieces for i in range(pieces + 1)]
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(pieces)]
    offset = 0
    for path, count in ranges:
        for piece in range(pieces):
            lo, hi = max(bounds[piece], offset), min(bounds[piece + 1], offset + count)
            if hi > lo:
                out[piece].append((path, lo - offset, hi - offset))
        offset += count
    return [p for p in out if p]


def read_error(spool_dir: str | os.PathLike[str]) -> SourceError | None:
    """The error the source left for the driver, if any (:meth:`Spool.error`): the fetcher's in this process first
    (known in memory even when a full disk kept the file from being written), then the file a fetcher elsewhere
    left."""
    return Spool(spool_dir, create=False).error()
