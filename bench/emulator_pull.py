"""How fast Google's Pub/Sub emulator serves pulls while messages are held unacknowledged (issue 22).

    .venv/bin/python bench/emulator_pull.py --messages 200000 --modes ack,lag1,hold,cap20000,cap50000

A job acknowledges a message only after the batch holding it is durable, so it always holds
messages it has pulled and not yet acknowledged; the bare loop of ``bench/pubsub.py``
acknowledges each pull at once.  This script measures what that difference costs on the
emulator alone (no Spark, no event_etl): ``--messages`` are published to a topic with one
subscription per mode, then each subscription is drained by one synchronous pull loop
(``max_messages=1000``; the emulator returns at most 100), one mode after the other:

- ``ack``: acknowledge every pull at once (the bare loop);
- ``hold``: acknowledge nothing (everything pulled stays outstanding);
- ``capN``: keep the newest N outstanding, acknowledging older ones in requests of 2,500
  (a job whose batches hold N messages);
- ``lagN``: acknowledge each pull's messages after the N-th pull that follows it, so that only the
  last N pulls (at most N x 100 messages) are outstanding when the emulator serves a pull
  (``lag1``: the smallest hold a job that acknowledges after saving can have while it pulls on).

Each line also gives the rate over the first and the last fifth of the drain: while the
subscription's backlog is still large and when it is nearly drained.  The emulator serves a
pull in time that grows with the backlog not yet delivered as soon as one message is
outstanding (in version 0.8.20, ``MessageBacklog.updateExpiredAckDeadlines``, which every pull
calls first, returns at once only when nothing is outstanding; otherwise it walks every
outstanding message and copies the whole set of undelivered ones into a new set): then the
first fifth runs much slower than the last.  The bare loop never has a message outstanding
when it pulls.

It starts the emulator as ``bench/pubsub.py`` does (:class:`bench.pubsub.Emulator`, a free port of
127.0.0.1, its process group stopped at the end).
Prints one line per mode; nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pubsub import PROJECT, Emulator, create


def drain(sub, path: str, mode: str, total: int) -> tuple[int, float, list[float]]:
    """Pull ``path`` until it is empty, acknowledging as ``mode`` says.

    Returns (messages, seconds, the time at which each fifth of ``total`` was reached)."""
    cap = int(mode[3:]) if mode.startswith("cap") else None
    lag = int(mode[3:]) if mode.startswith("lag") else None
    got, held, pulls = 0, [], []
    marks: list[float] = []
    start = time.monotonic()
    while got < total:
        resp = sub.pull(subscription=path, max_messages=1000, timeout=30)
        ids = [m.ack_id for m in resp.received_messages]
        if not ids:
            break
        got += len(ids)
        while len(marks) < 5 and got >= total * (len(marks) + 1) // 5:
            marks.append(time.monotonic() - start)
        if mode == "ack":
            sub.acknowledge(subscription=path, ack_ids=ids)
        elif cap is not None:
            held.extend(ids)
            if len(held) > cap:
                old, held = held[:len(held) - cap], held[len(held) - cap:]
                for i in range(0, len(old), 2500):
                    sub.acknowledge(subscription=path, ack_ids=old[i:i + 2500])
        elif lag is not None:
            pulls.append(ids)
            if len(pulls) > lag:
                sub.acknowledge(subscription=path, ack_ids=pulls.pop(0))
    for ids in pulls:  # lagN: what is still held once the subscription is drained
        sub.acknowledge(subscription=path, ack_ids=ids)
    return got, time.monotonic() - start, marks


def fifths(marks: list[float], total: int) -> str:
    """The rate over the first and over the last fifth of a drain."""
    if len(marks) < 5:
        return ""
    first, last = marks[0], marks[4] - marks[3]
    fifth = total / 5
    return f"; first fifth {fifth / first:,.0f} msg/s, last fifth {fifth / last:,.0f} msg/s"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--modes", default="ack,lag1,hold,cap20000,cap50000")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("ack", "hold") and not (m[:3] in ("cap", "lag") and m[3:].isdigit()):
            ap.error(f"unknown mode {m!r}: use ack, hold, capN (e.g. cap20000) or lagN (e.g. lag1)")
    with tempfile.TemporaryDirectory(prefix="event_etl-emulator-pull-") as work:
        emu = Emulator(Path(work)).start()
        os.environ["PUBSUB_EMULATOR_HOST"] = emu.host
        try:
            from google.cloud import pubsub_v1
            from google.pubsub_v1.types import PubsubMessage

            pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
            topic = pub.topic_path(PROJECT, "emulator-pull")
            paths = {m: sub.subscription_path(PROJECT, f"pull-{m}") for m in modes}
            create(topic, list(paths.values()))
            for _ in range(0, args.messages, 1000):
                pub.api.publish(topic=topic, messages=[PubsubMessage(data=b"x" * 225)] * 1000)
            print(f"published {args.messages:,} messages of 225 bytes; load average {os.getloadavg()[0]:.2f}")
            for m in modes:
                got, secs, marks = drain(sub, paths[m], m, args.messages)
                print(f"{m:>10}: {got:,} in {secs:.1f} s = {got / secs:,.0f} msg/s{fifths(marks, args.messages)}",
                      flush=True)
        finally:
            emu.stop()


if __name__ == "__main__":
    main()
