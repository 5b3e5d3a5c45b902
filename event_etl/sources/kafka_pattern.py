"""``kafka:re:PATTERN``: every topic of the cluster whose name matches ``PATTERN`` (a Python regular expression,
matched whole), read as one source (Grab's CDC: a topic per table, ``debz-schema-A.schema_A.table_B``).

Its offset is each topic's offset, as :class:`~event_etl.sources.kafka.KafkaPlanner` makes it, by topic name:
``{"pattern": P, "topics": {topic: {"topic", "topic_id", "partitions", ...}}}``.  A topic that appears later is
planned from its oldest records (its partitions all new: their ``begin`` is in the end offset, so that a replay
reads the same range).  A topic that matches no more (deleted) is an error, as for one topic.  Splits are each
topic's, numbered in topic order; a split's ``uri`` is its topic, which the types of a bus over a pattern are routed
by (:mod:`event_etl.rules.routing`: each type claims topic names, by default its own name).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from event_etl.errors import SourceError
from event_etl.sources.kafka import REQUEST_TIMEOUT_S, KafkaPlanner, release_clients, shared_clients
from event_etl.sources.splits import Split

__all__ = ["PatternPlanner", "matching_topics"]


def matching_topics(names: list[str], pattern: str) -> list[str]:
    """The topic names ``pattern`` matches whole, sorted, Kafka's internal topics left out (pure)."""
    rx = re.compile(pattern)
    return sorted(n for n in names if rx.fullmatch(n) and not n.startswith("__"))


class PatternPlanner:
    """Plans batches over every topic a pattern matches (in the driver): a :class:`KafkaPlanner` per topic."""

    def __init__(self, pattern: str, *, event_type: str | None = None, clock: Callable[[], int] | None = None
                 ) -> None:
        self.pattern = pattern
        self.event_type = event_type
        self.clock = clock
        self.planners: dict[str, KafkaPlanner] = {}
        self.target: list[str] | None = None  # --once: the topics there when it started
        self._key: Any = None
        self._admin: Any = None

    def _topics(self) -> list[str]:
        if self.target is not None:
            return self.target
        if self._key is None:
            self._key, self._admin, _ = shared_clients()
        try:
            names = list(self._admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics)
        except Exception as err:  # librdkafka's errors, whatever their class: one message with the fix
            raise SourceError(f"cannot list the Kafka topics that match {self.pattern!r}: {err}",
                              fix="check EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS and that the cluster answers") from err
        return matching_topics(names, self.pattern)

    def _planner(self, topic: str) -> KafkaPlanner:
        if topic not in self.planners:
            self.planners[topic] = KafkaPlanner(topic, event_type=self.event_type, clock=self.clock)
        return self.planners[topic]

    def _fresh(self, topic: str) -> dict[str, Any]:
        """A start for a topic the offset does not know yet: all its partitions new (read from their oldest)."""
        first = self._planner(topic).initial_offset()
        return {"topic": topic, "topic_id": first["topic_id"], "partitions": {}}

    # -- the streaming-source protocol ------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        return {"pattern": self.pattern,
                "topics": {t: self._planner(t).initial_offset() for t in self._topics()}}

    def prepare_available_now(self) -> None:
        topics = self._topics()
        for t in topics:
            self._planner(t).prepare_available_now()
        self.target = topics

    def latest_offset(self, start: dict[str, Any], cap: int | None) -> dict[str, Any]:
        self._check_start(start)
        known: dict[str, Any] = dict(start["topics"])
        topics = sorted(set(self._topics()) | set(known))
        share = None if cap is None else max(1, cap // max(1, len(topics)))
        ends: dict[str, Any] = {}
        for t in topics:
            begin = known.get(t) or self._fresh(t)
            ends[t] = self._planner(t).latest_offset(begin, share)
        if all(t in known and ends[t] is known[t] for t in topics):
            return start  # nothing new anywhere: the very same offset
        return {"pattern": self.pattern, "topics": ends}

    def _check_start(self, start: dict[str, Any]) -> None:
        if start.get("pattern") != self.pattern:
            raise SourceError(f"the checkpoint's Kafka offsets are of {start.get('pattern') or start.get('topic')!r}, "
                              f"not the pattern {self.pattern!r}", fix="use the --checkpoint of this --source, or a "
                              "new one")

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        out: list[Split] = []
        known = start.get("topics", {})
        for t in sorted(end["topics"]):
            begin = known.get(t) or {"topic": t, "topic_id": end["topics"][t]["topic_id"], "partitions": {}}
            for s in self._planner(t).splits(begin, end["topics"][t]):
                out.append(Split(len(out), s.kind, s.uri, s.start, s.end, s.arrival, s.meta))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        for t, offset in end.get("topics", {}).items():
            self._planner(t).commit(offset)

    def reported_latest(self) -> dict[str, Any] | None:
        topics = {t: p.reported_latest() for t, p in self.planners.items()}
        known = {t: o for t, o in topics.items() if o is not None}
        return {"pattern": self.pattern, "topics": known} if known else None

    def backlog(self, start: dict[str, Any]) -> dict[str, int]:
        known = start.get("topics", {})
        return {"records": sum(p.backlog(known.get(t, {"partitions": {}}))["records"]
                               for t, p in self.planners.items())}

    def stop(self) -> None:
        for p in self.planners.values():
            p.stop()
        key, self._key, self._admin = self._key, None, None
        if key is not None:
            release_clients(key)
