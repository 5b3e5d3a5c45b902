"""The load generator behind ``event-etl publish``: generated events published to Pub/Sub.

The same generator as the ``generate:`` source (same shares of out-of-order, late, too-late,
future, invalid and duplicate events), paced at ``rate`` messages per second in real time
(event time follows the wall clock: speedup 1).  It can write how many valid events it
published per event hour, for ``event-etl audit``.

Stopping (:mod:`event_etl.job.stopping`, which is why this module sits above the job layer): a
first SIGINT, SIGTERM or SIGHUP stops publishing new messages, waits until those already handed
to the client are acknowledged, and returns counts of exactly what was published (so the count
file still matches the topic); a second SIGINT or SIGTERM gives up on the acknowledgements at once.

The type's topic and subscription (their names, creating them) are :mod:`event_etl.sources.publisher`'s.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from event_etl.errors import SourceError, UsageError
from event_etl.eventtypes import EventType
from event_etl.job.stopping import Interrupted, StopSignals, signal_name
from event_etl.sources.generator import Generated, Generator, parse_generator_params
from event_etl.timeutil import HOUR_MS, iso, now_millis

__all__ = ["publish_generated", "write_count_file"]


def publish_generated(
    et: EventType,
    topic: str,
    *,
    rate: float,
    duration: float,
    params: str = "",
    clock: Callable[[], int] = now_millis,
    progress: Callable[[int, int], None] | None = None,
    stops: StopSignals | None = None,
) -> dict[str, Any]:
    """Publish ``rate * duration`` generated events, paced in real time.  Returns counts (total, by intent, by hour).

    ``params``: the generator's (``generate:``'s) options, its ``seed`` among them; its rate, speedup and start are
    ``rate``, 1 and now.  ``stops``: a first signal ends the publishing early (``stopped_by`` in the result), a
    second raises :class:`~event_etl.job.stopping.Interrupted`."""
    from google.cloud.pubsub_v1.types import BatchSettings

    from event_etl.sources.pubsub import publisher_client

    if rate <= 0 or duration <= 0:
        raise UsageError("--rate and --duration must be positive", fix="e.g. --rate 2000 --duration 60")
    start = clock()
    try:
        p = parse_generator_params(params, start)
    except ValueError as err:
        raise UsageError(f"--params: {err}", fix="e.g. --params late=0.02,invalid=0.01") from err
    p = replace(p, rate=float(rate), speedup=1.0, start=start)
    gen = Generator(et, p)
    total = int(rate * duration)
    client = publisher_client(batch_settings=BatchSettings(max_messages=500, max_latency=0.05))
    futures: list[Any] = []
    intents: Counter[str] = Counter()
    by_hour: Counter[str] = Counter()
    seen_ids: set[str] = set()
    t0 = time.monotonic()
    for i in range(total):
        if stops is not None and stops.requested:
            break
        due = t0 + i / rate
        lag = due - time.monotonic()
        if lag > 0:
            time.sleep(lag)
        g = gen.one(i)
        attrs = {"event_type": et.name}
        if et.time_attribute and g.event_time is not None:
            attrs[et.time_attribute] = str(g.event_time)
        futures.append(client.publish(topic, gen.wire(g.payload), **attrs))
        intents[g.intent] += 1
        _count_valid(g, seen_ids, by_hour)
        if progress and (i + 1) % max(1, int(rate)) == 0:
            progress(i + 1, total)
    failures = _unpublished(futures, stops)
    sent = len(futures)
    if failures:
        raise SourceError(f"{failures} of {sent} messages could not be published to {topic}",
                          fix="check the topic exists (`event-etl setup`) and the network")
    stopped_by = None
    if stops is not None and stops.first is not None:
        stopped_by = signal_name(stops.first)
    return {"event_type": et.name, "topic": topic, "published": sent, "seconds": time.monotonic() - t0,
            "intents": dict(intents), "counts": dict(sorted(by_hour.items())), "stopped_by": stopped_by}


def _count_valid(g: Generated, seen_ids: set[str], by_hour: Counter[str]) -> None:
    """Count a valid event (timely, out of order or late) in its event hour, once whatever the producer's retries."""
    if (g.intent in ("timely", "out_of_order", "late") and g.event_id is not None and g.event_time is not None
            and g.event_id not in seen_ids):
        seen_ids.add(g.event_id)
        hour = iso(g.event_time - g.event_time % HOUR_MS)
        if hour is not None:  # always: the iso time of an int
            by_hour[hour] += 1


def _unpublished(futures: list[Any], stops: StopSignals | None) -> int:
    """Wait for Pub/Sub to acknowledge each publish (up to 60 s each); how many failed.  A second signal raises
    :class:`~event_etl.job.stopping.Interrupted`."""
    failures = 0
    for f in futures:
        deadline = time.monotonic() + 60
        while stops is not None and not f.done() and time.monotonic() < deadline:
            if stops.escalation is not None:
                raise Interrupted(stops.escalation, f"interrupted ({signal_name(stops.escalation)} again): stopped "
                                  f"waiting for Pub/Sub to acknowledge {len(futures):,} messages; some may be lost")
            time.sleep(0.05)
        try:
            f.result(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - counted and reported
            failures += 1
    return failures


def write_count_file(path: str, result: dict[str, Any]) -> None:
    """The count file ``event-etl audit`` reads: valid events per event hour (producer retries counted once)."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"event_type": result["event_type"], "counts": result["counts"],
                   "published": result["published"], "intents": result["intents"]}, fh, indent=1, sort_keys=True)
