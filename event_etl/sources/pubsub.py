"""``pubsub:projects/P/subscriptions/S``: a Pub/Sub subscription as a streaming source.

Messages cross three durable steps, so that nothing is lost and a replayed batch sees
exactly the same messages:

1. **Pull and spool.**  When Spark asks for the latest offset, the planner pulls up to
   the batch cap and writes the messages (id, publish time, attributes, data) to a spool
   file in the checkpoint (``etl/source/pubsub/spool/<n>.avro``), durably, *before* it
   returns the offset ``{"spool": n + 1}``.  A replay reads the spool file, never Pub/Sub.
2. **Extend.**  Until they are acknowledged, a background thread keeps extending the ack
   deadline of every pulled message, however long its batch takes.
3. **Acknowledge after commit.**  Spark calls ``commit(end)`` only after the batch is
   committed (files written, hours marked, state saved); only then are the batch's
   messages acknowledged and their spool files deleted.

A crash before the acknowledgement makes Pub/Sub deliver the messages again; they are
then dropped by message id (see :mod:`event_etl.dedupe`).  Spool files written but never
given to Spark are read as the next batch after a restart.

Transient errors (UNAVAILABLE, DEADLINE_EXCEEDED, ...) are retried with exponential
backoff for up to ``outage_timeout``; a permanent error (no such subscription, no
permission) stops the job with a message that names the subscription and the fix.
With ``--once`` the source stops when a pull finds nothing more to deliver.

Like Google's own clients, the source honours ``PUBSUB_EMULATOR_HOST`` and then needs
no credentials; otherwise it uses Application Default Credentials.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import fastavro

from event_etl.checkpoint import write_json_atomic
from event_etl.errors import SourceError
from event_etl.sources.splits import Split

__all__ = ["PubSubPlanner", "SPOOL_SCHEMA", "read_spool", "parse_subscription", "subscriber_client",
           "publisher_client", "check_subscription", "ERROR_FILE"]

log = logging.getLogger(__name__)

_SUB_RE = re.compile(r"^projects/([a-z][a-z0-9-]{4,28}[a-z0-9]|[a-zA-Z][\w.-]{2,})/subscriptions/([a-zA-Z][\w.~+%-]{2,254})$")
ERROR_FILE = "error.json"
SPLIT_MESSAGES = 100_000
PULL_MAX = 1000

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


def subscriber_client():
    from google.cloud import pubsub_v1

    return pubsub_v1.SubscriberClient()


def publisher_client(**kwargs):
    from google.cloud import pubsub_v1

    return pubsub_v1.PublisherClient(**kwargs)


_TRANSIENT = None


def _transient_errors() -> tuple[type, ...]:
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
        fh = open(path, "rb")
    except OSError as err:
        raise SourceError(f"spool file {path} is missing: {err}",
                          fix="the checkpoint's etl/source/pubsub/spool must stay until its batch is committed") from err
    with fh:
        for i, m in enumerate(fastavro.reader(fh)):
            if i >= end:
                break
            if i >= start:
                yield i, m


class PubSubPlanner:
    """Plans micro-batches over a subscription (runs in Spark's driver-side source process)."""

    def __init__(self, subscription: str, spool_dir: str, *, max_messages: int, clock: Callable[[], int],
                 tasks_per_batch: int = 2, ack_deadline: int = 60, outage_timeout: float = 120.0,
                 pull_timeout: float = 5.0, pull_budget: float = 2.0, drain_quiet: float = 3.0, client=None) -> None:
        self.subscription = subscription
        self.dir = Path(spool_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_messages = max_messages
        self.clock = clock
        self.tasks_per_batch = max(1, tasks_per_batch)
        self.ack_deadline = ack_deadline
        self.outage_timeout = outage_timeout
        self.pull_timeout = pull_timeout
        self.pull_budget = pull_budget  # a batch waits at most this long for more messages
        self.drain_quiet = drain_quiet  # --once: the subscription must stay empty this long
        self._client = client
        self.once = False
        self.drained = False
        self.unacked: dict[int, list[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._extender: threading.Thread | None = None
        (self.dir / ERROR_FILE).unlink(missing_ok=True)

    # -- plumbing --------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            self._client = subscriber_client()
        return self._client

    def _spool_files(self) -> list[Path]:
        return sorted(p for p in self.dir.glob("*.avro") if p.stem.isdigit())

    def _spool_path(self, n: int) -> Path:
        return self.dir / f"{n:012d}.avro"

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run a Pub/Sub call, retrying transient errors with backoff; permanent errors become SourceError."""
        from google.api_core import exceptions as ex

        deadline = time.monotonic() + self.outage_timeout
        delay = 0.5
        while True:
            try:
                return fn()
            except _transient_errors() as err:
                if time.monotonic() + delay > deadline:
                    self._fail(SourceError(
                        f"Pub/Sub was unreachable for {self.outage_timeout:.0f}s while trying to {what} "
                        f"({self.subscription}): {err}",
                        fix="check the network (or the emulator); the job can be restarted on the same "
                            "checkpoint and loses nothing Pub/Sub still holds"))
                log.warning("Pub/Sub %s failed (%s); retrying in %.1fs", what, type(err).__name__, delay)
                self._report_outage()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
            except ex.GoogleAPICallError as err:
                self._fail(permanent_error(self.subscription, err))

    def _report_outage(self) -> None:
        """An outage is not silence: the controller must not let the watermark follow the clock meanwhile."""
        from event_etl.rules.watermark import SourceActivity
        from event_etl.sources.activity import report_activity

        report_activity(self.dir, SourceActivity(self.clock(), 0, True, None))

    def _fail(self, err: SourceError) -> None:
        """Leave the error where the driver finds it (Spark would only show a Python traceback), then raise."""
        write_json_atomic(self.dir / ERROR_FILE, {"message": err.message, "fix": err.fix})
        raise err

    # -- the streaming-source protocol ------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        files = self._spool_files()
        return {"spool": int(files[0].stem) if files else 0}

    def prepare_available_now(self) -> None:
        self.once = True

    def latest_offset(self, start: dict[str, Any], max_rows: int | None) -> dict[str, Any]:
        n = int(start["spool"])
        existing = [int(p.stem) for p in self._spool_files() if int(p.stem) >= n]
        if existing:  # spooled before a crash but never given to Spark: they come first
            return {"spool": max(existing) + 1}
        if self.drained:
            return {"spool": n}
        cap = min(self.max_messages, max_rows or self.max_messages)
        msgs, ack_ids = self._pull(cap)
        if not msgs and self.once:
            # A pull may come back empty while messages are on their way: only a subscription that
            # stays empty for a while counts as drained.
            quiet_until = time.monotonic() + self.drain_quiet
            while not msgs and time.monotonic() < quiet_until:
                time.sleep(0.2)
                msgs, ack_ids = self._pull(cap)
            if not msgs:
                self.drained = True
        if not msgs:
            return {"spool": n}
        self._extend(ack_ids)  # at once: the subscription's own deadline may be shorter than a batch
        self._write_spool(n, msgs)
        with self._lock:
            self.unacked[n] = ack_ids
        self._ensure_extender()
        return {"spool": n + 1}

    def _pull(self, cap: int) -> tuple[list[dict[str, Any]], list[str]]:
        from google.pubsub_v1.types import PullResponse

        msgs: list[dict[str, Any]] = []
        ack_ids: list[str] = []
        budget = time.monotonic() + self.pull_budget
        while len(msgs) < cap and (not msgs or time.monotonic() < budget):
            want = min(PULL_MAX, cap - len(msgs))
            resp = self._call("pull", lambda: self.client.pull(
                subscription=self.subscription, max_messages=want, timeout=self.pull_timeout))
            raw = PullResponse.pb(resp)
            if not raw.received_messages:
                break
            for rm in raw.received_messages:
                m = rm.message
                ack_ids.append(rm.ack_id)
                msgs.append({
                    "message_id": m.message_id,
                    "publish_time": m.publish_time.seconds * 1000 + m.publish_time.nanos // 1_000_000,
                    "attributes": dict(m.attributes),
                    "data": m.data,
                    "ordering_key": m.ordering_key,
                    "delivery_attempt": rm.delivery_attempt,
                })
        return msgs, ack_ids

    def _write_spool(self, n: int, msgs: list[dict[str, Any]]) -> None:
        buf = io.BytesIO()
        fastavro.writer(buf, SPOOL_SCHEMA, msgs, codec="deflate", metadata={"event_etl.count": str(len(msgs))},
                        codec_compression_level=1)
        path = self._spool_path(n)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @staticmethod
    def _count(path: Path) -> int:
        with open(path, "rb") as fh:
            return int(fastavro.reader(fh).metadata.get("event_etl.count", "0"))

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        out: list[Split] = []
        for n in range(int(start["spool"]), int(end["spool"])):
            path = self._spool_path(n)
            if not path.exists():
                raise SourceError(f"spool file {path} of a batch not yet committed is missing",
                                  fix="the checkpoint was changed by hand; restore it or start a new one")
            count = self._count(path)
            pieces = max(-(-count // SPLIT_MESSAGES), min(self.tasks_per_batch, max(1, count // 5000)))
            bounds = [count * k // pieces for k in range(pieces + 1)]
            for lo, hi in zip(bounds, bounds[1:]):
                if hi > lo:
                    out.append(Split(len(out), "spool", str(path), lo, hi, 0))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        last = int(end["spool"])
        with self._lock:
            done = sorted(n for n in self.unacked if n < last)
            batches = [(n, self.unacked[n]) for n in done]
        for n, ack_ids in batches:
            for i in range(0, len(ack_ids), 2500):
                chunk = ack_ids[i:i + 2500]
                self._call("acknowledge", lambda: self.client.acknowledge(subscription=self.subscription, ack_ids=chunk))
            with self._lock:
                self.unacked.pop(n, None)
        for p in self._spool_files():
            if int(p.stem) < last:
                p.unlink(missing_ok=True)

    # -- ack deadlines ---------------------------------------------------------------------
    def _ensure_extender(self) -> None:
        if self._extender is None or not self._extender.is_alive():
            self._extender = threading.Thread(target=self._extend_loop, name="pubsub-ack-extender", daemon=True)
            self._extender.start()

    def _extend_loop(self) -> None:
        period = max(1.0, self.ack_deadline / 4)
        while not self._stop.wait(period):
            with self._lock:
                ids = [a for v in self.unacked.values() for a in v]
            self._extend(ids)

    def _extend(self, ids: list[str]) -> None:
        for i in range(0, len(ids), 2500):
            try:
                self.client.modify_ack_deadline(subscription=self.subscription, ack_ids=ids[i:i + 2500],
                                                ack_deadline_seconds=self.ack_deadline, timeout=30)
            except Exception as err:  # noqa: BLE001 - a missed extension means a redelivery, which dedupe absorbs
                log.warning("extending ack deadlines failed: %s", err)

    def stop(self) -> None:
        self._stop.set()


def read_error(spool_dir: str | os.PathLike[str]) -> SourceError | None:
    """The error the source left for the driver, if any."""
    p = Path(spool_dir) / ERROR_FILE
    if not p.exists():
        return None
    d = json.loads(p.read_text())
    return SourceError(d["message"], fix=d.get("fix"))
