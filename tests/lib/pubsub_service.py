"""The Pub/Sub service as the real one serves it, in memory, and a fetcher on it (the emulator is integration/'s).

- :class:`RealServiceLike`: a subscription where the emulator differs from the real service: a pull on an empty
  subscription runs out with ``DeadlineExceeded`` instead of returning an empty list, and a message not acknowledged
  within its deadline is delivered again; :class:`CappedService` returns at most ``cap`` messages a pull;
- :func:`fetcher`: the real :class:`~event_etl.sources.pubsub_fetch.Fetcher` on such a service, spooling under
  ``tmp_path/spool``; :func:`segments`: the closed segments it wrote;
- :func:`response`: a serialized ``PullResponse``, as a segment's frames hold it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from google.api_core import exceptions as ex
from google.protobuf import timestamp_pb2
from google.pubsub_v1.types import PubsubMessage, PullResponse, ReceivedMessage

from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from tests.lib.harness import t

__all__ = ["SUB", "CappedService", "RealServiceLike", "fetcher", "response", "segments"]


class RealServiceLike:
    """A subscription as the real Pub/Sub service serves it, in memory.

    - ``pull`` returns up to ``max_messages`` outstanding messages; on an empty subscription it
      waits and raises ``DeadlineExceeded`` (the emulator returns an empty list at once);
    - a message pulled and not acknowledged within its deadline is delivered again;
    - ``outage``: every call raises ``ServiceUnavailable`` (or, with ``blackhole``, runs out).
    """

    def __init__(self, wait: float = 0.05) -> None:
        self.lock = threading.Lock()
        self.queue: list[tuple[str, bytes, int]] = []
        self.leased: dict[str, tuple[str, bytes, int, float]] = {}
        self.acked: set[str] = set()
        self.calls: Counter = Counter()
        self.ack_sizes: list[int] = []
        self.deadline_s = 60.0
        self.wait = wait
        self.outage = False
        self.blackhole = False
        self.subscription_deadline = 10  # what get_subscription says (the lease a pull grants)
        self.n = 0

    def publish(self, data: bytes, published: int) -> str:
        with self.lock:
            self.n += 1
            mid = str(self.n)
            self.queue.append((mid, data, published))
            return mid

    def _check(self):
        if self.blackhole:
            raise ex.DeadlineExceeded("no answer")
        if self.outage:
            raise ex.ServiceUnavailable("unavailable")

    def pull(self, subscription, max_messages, timeout=None):
        self.calls["pull"] += 1
        self._check()
        now = time.monotonic()
        with self.lock:
            for ack, (mid, data, pub, until) in list(self.leased.items()):
                if until < now:  # deadline passed: delivered again
                    del self.leased[ack]
                    self.queue.insert(0, (mid, data, pub))
            take, self.queue = self.queue[:max_messages], self.queue[max_messages:]
            out = []
            for mid, data, pub in take:
                ack = f"ack-{mid}-{self.calls['pull']}"
                self.leased[ack] = (mid, data, pub, now + self.deadline_s)
                ts = timestamp_pb2.Timestamp(seconds=pub // 1000, nanos=(pub % 1000) * 1_000_000)
                out.append(
                    ReceivedMessage(ack_id=ack, message=PubsubMessage(data=data, message_id=mid, publish_time=ts))
                )
        if not out:
            time.sleep(self.wait)
            raise ex.DeadlineExceeded("Deadline Exceeded")
        return PullResponse(received_messages=out)

    def acknowledge(self, subscription, ack_ids, timeout=None):
        self.calls["acknowledge"] += 1
        self._check()
        self.ack_sizes.append(len(ack_ids))
        with self.lock:
            for a in ack_ids:
                if a in self.leased:
                    self.acked.add(self.leased.pop(a)[0])

    def modify_ack_deadline(self, subscription, ack_ids, ack_deadline_seconds, timeout=None):
        self.calls["modify_ack_deadline"] += 1
        self._check()
        with self.lock:
            for a in ack_ids:
                if a in self.leased:
                    mid, data, pub, _ = self.leased[a]
                    self.leased[a] = (mid, data, pub, time.monotonic() + ack_deadline_seconds)

    def get_subscription(self, subscription, timeout=None):
        from types import SimpleNamespace

        self.calls["get_subscription"] += 1
        self._check()
        return SimpleNamespace(name=subscription, ack_deadline_seconds=self.subscription_deadline)


SUB = "projects/test-project/subscriptions/clicks"


def fetcher(tmp_path, service, **settings):
    base = dict(streams=2, segment_messages=500, segment_age=0.1, ack_deadline=60, outage_timeout=5.0,
                pull_timeout=0.2, once_quiet=0.5)
    base.update(settings)
    once = base.pop("once", False)
    return Fetcher(SUB, tmp_path / "spool", settings=FetchSettings(**base), once=once, client_factory=lambda: service)


def segments(tmp_path):
    return sorted((tmp_path / "spool" / "segments").glob("*.seg"))


class CappedService(RealServiceLike):
    """The real service, returning at most ``cap`` messages a pull (as the emulator returns at most 100)."""

    def __init__(self, cap: int = 100, **kw) -> None:
        super().__init__(**kw)
        self.cap = cap

    def pull(self, subscription, max_messages, timeout=None):
        return super().pull(subscription, min(max_messages, self.cap), timeout)


def response(first: int, n: int, *, size: int = 10, published: int | None = None) -> bytes:
    """A serialized PullResponse of messages ``first``..``first + n - 1`` with ``size``-byte payloads."""
    msgs = []
    for i in range(first, first + n):
        pub = published if published is not None else t("13:00") + i
        ts = timestamp_pb2.Timestamp(seconds=pub // 1000, nanos=(pub % 1000) * 1_000_000)
        msgs.append(ReceivedMessage(ack_id=f"ack-{i}", message=PubsubMessage(
            data=(b"%08d" % i).ljust(size, b"x"), message_id=str(i), publish_time=ts)))
    return PullResponse.serialize(PullResponse(received_messages=msgs))
