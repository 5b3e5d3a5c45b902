"""The Pub/Sub fetcher's own cost: CPU seconds and wall time to spool a backlog, without Pub/Sub or Spark.

    .venv/bin/python bench/fetcher_cpu.py --messages 400000 --runs 3
    PYTHONPATH=/path/to/other/tree .venv/bin/python bench/fetcher_cpu.py ...   # the same for another checkout

A :class:`~event_etl.sources.pubsub_fetch.Fetcher` (``spooled``, the default settings but one stream) pulls from
an in-memory service that answers each pull with a prepared ``PullResponse`` of 1,000 messages of ~225 bytes, as
bytes (what :class:`~event_etl.sources.pubsub_wire.WireSubscriber` returns), and acknowledges at once.  What is
measured is the fetcher's loop, the spool's appends (each one synced: the disk under ``--workdir`` counts) and the
acknowledgement bookkeeping; the process's CPU time is the figure that a loaded machine disturbs least.  Prints
one line per run and the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from types import SimpleNamespace
from typing import Any

from google.api_core import exceptions as ex
from google.protobuf import timestamp_pb2
from google.pubsub_v1.types import PubsubMessage, PullResponse, ReceivedMessage

from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings

SUB = "projects/bench/subscriptions/fetcher-cpu"


class PreparedService:
    """Pulls answered from prepared responses, then ``DeadlineExceeded`` (an empty subscription, as the service)."""

    def __init__(self, responses: list[bytes]) -> None:
        self.responses = responses
        self.next = 0
        self.lock = threading.Lock()

    def pull(self, *, subscription: str, max_messages: int, timeout: float | None = None) -> bytes:
        with self.lock:
            i, self.next = self.next, self.next + 1
        if i >= len(self.responses):
            time.sleep(0.05)
            raise ex.DeadlineExceeded("Deadline Exceeded")
        return self.responses[i]

    def acknowledge(self, *, subscription: str, ack_ids: list[str], timeout: float | None = None) -> None:
        pass

    def modify_ack_deadline(self, **_: Any) -> None:
        pass

    def get_subscription(self, *, subscription: str, timeout: float | None = None) -> Any:
        return SimpleNamespace(name=subscription, ack_deadline_seconds=60)

    def close(self) -> None:
        pass


def responses(messages: int, per_pull: int = 1000) -> list[bytes]:
    payload = b'{"event_id":"%08d-0000-4000-8000-000000000000","event_time":"2026-11-28T12:00:00Z",' \
              b'"user_id":"u-1234","url":"https://example.com/a/page","referrer":null,"duration_ms":1234}'
    now = int(time.time() * 1000)
    ts = timestamp_pb2.Timestamp(seconds=now // 1000, nanos=(now % 1000) * 1_000_000)
    out = []
    for start in range(0, messages, per_pull):
        msgs = [ReceivedMessage(ack_id=f"ack-{k}-{'x' * 150}",
                                message=PubsubMessage(data=payload % k, message_id=str(k), publish_time=ts))
                for k in range(start, min(messages, start + per_pull))]
        out.append(PullResponse.serialize(PullResponse(received_messages=msgs)))
    return out


def run_once(messages: int, prepared: list[bytes], workdir: str) -> tuple[float, float]:
    spool = tempfile.mkdtemp(prefix="spool-", dir=workdir)
    settings = FetchSettings(streams=1, max_held_messages=messages * 2, max_held_bytes=1 << 40)
    f = Fetcher(SUB, spool, settings=settings, client_factory=lambda: PreparedService(prepared))
    cpu0, t0 = time.process_time(), time.monotonic()
    f.start()
    while f.pulled < messages and f.error is None:
        time.sleep(0.005)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    f.stop()
    if f.error is not None:
        raise SystemExit(f"the fetcher failed: {f.error.message}")
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    a = ap.parse_args()
    import event_etl

    prepared = responses(a.messages)
    walls, cpus = [], []
    for i in range(a.runs):
        wall, cpu = run_once(a.messages, prepared, a.workdir)
        walls.append(wall)
        cpus.append(cpu)
        print(f"run {i + 1}: {a.messages:,} messages in {wall:.2f} s ({a.messages / wall:,.0f} msg/s), "
              f"CPU {cpu:.2f} s ({1e5 * cpu / a.messages:.3f} s per 100,000)", flush=True)
    print(f"median: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
          f"({os.path.dirname(event_etl.__file__)}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
