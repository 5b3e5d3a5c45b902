"""``kafka:TOPIC``: the records of a Kafka topic, read in offset ranges by the executors.

The cluster is ``EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS``; SASL, SSL and the rest of librdkafka's settings come
from the properties file ``EVENT_ETL_KAFKA_PROPERTIES`` names (:meth:`event_etl.settings.Settings.kafka_config`),
never from ``--source`` and never from a split: each process reads them itself.

An offset is JSON::

    {"topic": T, "topic_id": ID, "partitions": {"0": next offset, ...},
     "lost": {"0": records retention deleted unread, accumulated}, "begin": {"3": where this batch starts}}

``lost`` and ``begin`` appear only when not empty.  ``begin`` says where a batch starts reading a partition
other than at its start offset: a partition new since the start offset (at its low watermark) or, with
``EVENT_ETL_KAFKA_ON_DATA_LOSS=skip``, a partition whose unread records retention deleted (at its low
watermark).  So :meth:`KafkaPlanner.splits` is a function of the batch's start and end offsets alone, and a
replayed batch reads the same ranges.

The planner asks the cluster for the topic's id, partitions and watermarks each time the engine asks for the
latest offset, and never plans past a partition's reported high watermark (what lies beyond is planned the next
time).  A batch holds at most ``cap`` records (``--max-events-per-batch``), spread fairly over the partitions
(:func:`fair_shares`).  A deleted topic, or one deleted and recreated (its id changed), stops the job with the fix:
never a silent restart from offset zero.

The watermark is kept per partition (issue 40): a split's report names its partition
(:meth:`event_etl.sources.read.KafkaReader.part`), and the driver keeps each partition's largest counted time
(:func:`event_etl.rules.watermark.parts_watermark`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from event_etl.errors import SourceError
from event_etl.sources.face import PlannedSession
from event_etl.sources.splits import Split

__all__ = ["KafkaPlanner", "KafkaSession", "MAX_SPLIT_RECORDS", "plan_partition", "fair_shares",
           "cut_range", "kafka_config",
           "consumer_group", "describe_topic", "check_topic", "read_range", "read_messages", "record_times",
           "record_payload", "message_attributes", "READ_TIMEOUT_S", "CONSUME_RECORDS", "read_runs", "RecordRun",
           "record_columns", "record_fields", "READER_DEFAULTS"]

log = logging.getLogger("event_etl.sources.kafka")

MAX_SPLIT_RECORDS = 125_000
"""A partition's range in a batch is cut into splits of at most this many offsets (one task each): a batch of
500,000 records (``--max-events-per-batch``'s default) over 4 partitions is one task a partition.  Each task makes,
assigns and closes a consumer, and its close waits for librdkafka's threads (on noida-db, which answers a fetch
with the rest of the partition, until they have taken in what the next split reads again); 100,000 made two tasks
of 62,500 a partition there.  The Kafka source is new in 0.3.0: no release cut a batch at 100,000."""

REQUEST_TIMEOUT_S = 15.0
"""How long a metadata or watermark request to the cluster may take."""

_FIX_CONNECT = ("check EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS (host:port of the cluster) and, for SASL or SSL, the "
                "properties file EVENT_ETL_KAFKA_PROPERTIES names")


def kafka_config(**extra: Any) -> dict[str, Any]:
    """librdkafka's configuration for a client of event_etl: the settings' cluster and properties file, then
    ``extra`` (underscores in its keys become dots)."""
    from event_etl.settings import current_settings

    conf: dict[str, Any] = dict(current_settings().kafka_config())
    if "bootstrap.servers" not in conf:
        raise SourceError("the Kafka source has no cluster: EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS is not set",
                          fix="set EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS=host:port (on the executors too)")
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


class _Clients:
    """The process's Kafka clients for planning, one of each per cluster configuration (issue 58: a thousand Kafka
    types of an application share them, not a librdkafka client with its threads each): an admin client (topics,
    the groups' committed offsets) and a consumer that reads watermarks (it joins no group: planning reads no
    records).  Counted by the planners using them, closed when the last one stops."""

    lock = threading.Lock()
    admins: dict[tuple[tuple[str, str], ...], Any] = {}
    readers: dict[tuple[tuple[str, str], ...], Any] = {}
    users: dict[tuple[tuple[str, str], ...], int] = {}


def _key(conf: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in conf.items()))


def shared_clients() -> tuple[tuple[tuple[str, str], ...], Any, Any]:
    """``(key, admin, reader)`` of the settings' cluster, made on first use; the caller gives them back with
    :func:`release_clients` (``key``)."""
    conf = kafka_config()
    key = _key(conf)
    with _Clients.lock:
        if key not in _Clients.admins:
            from confluent_kafka import Consumer
            from confluent_kafka.admin import AdminClient

            _Clients.admins[key] = AdminClient(conf)
            _Clients.readers[key] = Consumer({**conf, "group.id": "event_etl.planner", "enable.auto.commit": False,
                                              "enable.partition.eof": False})
        _Clients.users[key] = _Clients.users.get(key, 0) + 1
        return key, _Clients.admins[key], _Clients.readers[key]


def release_clients(key: tuple[tuple[str, str], ...]) -> None:
    """A planner is done with the cluster's clients: the last one closes them."""
    with _Clients.lock:
        left = _Clients.users.get(key, 0) - 1
        if left > 0:
            _Clients.users[key] = left
            return
        _Clients.users.pop(key, None)
        _Clients.admins.pop(key, None)
        reader = _Clients.readers.pop(key, None)
    if reader is not None:
        try:
            reader.close()
        except Exception:  # noqa: BLE001 - closing a client that failed: nothing left to do
            pass


def consumer_group(event_type: str | None, topic: str) -> str:
    """The consumer group the job commits its progress to (for Kafka's tools; the checkpoint is what counts)."""
    return f"event_etl.{event_type or topic}"


def plan_partition(start: int, low: int, high: int, on_loss: str, *, topic: str = "", partition: int = 0
                   ) -> tuple[int, int]:
    """Where a batch begins reading a partition whose next offset is ``start`` and whose records are
    ``[low, high)`` now: ``(begin, lost)``, ``lost`` records that retention deleted before the job read them.

    ``start < low``: with ``on_loss == "fail"`` a :class:`SourceError` says how many records of which partition
    were lost; with ``"skip"`` the batch begins at ``low``.  ``start > high`` (a reported high watermark lagging
    behind what was read): nothing to read now, never backwards."""
    if start >= low:
        return start, 0
    lost = low - start
    if on_loss != "skip":
        raise SourceError(
            f"{lost} records of Kafka topic {topic} partition {partition} (offsets {start} to {low - 1}) were "
            "deleted by the topic's retention before this job read them",
            fix="raise the topic's retention (retention.ms, retention.bytes) or let the job keep up; to go on "
            "without them, set EVENT_ETL_KAFKA_ON_DATA_LOSS=skip (the job then counts what it lost)")
    return low, lost


def fair_shares(available: dict[int, int], cap: int | None) -> dict[int, int]:
    """How many records each partition gives a batch of at most ``cap`` records: all when they fit, else each as
    many as the others (water-filling: a partition with less gives all it has, the rest share what is left; a
    remainder goes to the lowest partition numbers).  A pure function: the same answer for the same input."""
    total = sum(max(0, n) for n in available.values())
    if cap is None or total <= cap:
        return {p: max(0, n) for p, n in available.items()}
    take = {p: 0 for p in available}
    left = max(0, cap)
    open_ = sorted(p for p, n in available.items() if n > 0)
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:
            for p in open_[:left]:
                take[p] += 1
            break
        for p in list(open_):
            give = min(each, available[p] - take[p])
            take[p] += give
            left -= give
            if take[p] >= available[p]:
                open_.remove(p)
    return take


def cut_range(begin: int, end: int, most: int = MAX_SPLIT_RECORDS) -> list[tuple[int, int]]:
    """``[begin, end)`` cut into consecutive ranges of at most ``most`` offsets, about equal."""
    n = end - begin
    if n <= 0:
        return []
    pieces = -(-n // most)
    bounds = [begin + n * k // pieces for k in range(pieces)] + [end]
    return list(zip(bounds, bounds[1:]))


def _is_unknown_topic(err: BaseException) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        code = err.args[0].code()
        return code in (KafkaError.UNKNOWN_TOPIC_OR_PART, getattr(KafkaError, "UNKNOWN_TOPIC_ID", -10_000))
    return False


def _is_unknown_partition(err: BaseException) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    return (isinstance(err, KafkaException) and bool(err.args) and isinstance(err.args[0], KafkaError)
            and err.args[0].code() in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART))


def describe_topic(admin: Any, topic: str) -> tuple[str, list[int]] | None:
    """The topic's id and partition numbers, or None when the cluster has no such topic."""
    from confluent_kafka import KafkaException, TopicCollection

    try:
        futures = admin.describe_topics(TopicCollection([topic]), request_timeout=REQUEST_TIMEOUT_S)
        desc = futures[topic].result(timeout=REQUEST_TIMEOUT_S + 5)
    except KafkaException as err:
        if _is_unknown_topic(err):
            return None
        raise SourceError(f"cannot describe Kafka topic {topic}: {err}", fix=_FIX_CONNECT) from err
    except TimeoutError as err:
        raise SourceError(f"the Kafka cluster did not answer within {REQUEST_TIMEOUT_S:.0f}s (describing topic "
                          f"{topic})", fix=_FIX_CONNECT) from err
    return str(desc.topic_id), sorted(int(p.id) for p in desc.partitions)


def check_topic(topic: str) -> None:
    """Before a job starts: the topic exists (a :class:`SourceError` with the fix otherwise)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_config())
    if describe_topic(admin, topic) is None:
        raise SourceError(f"Kafka topic {topic} does not exist on the cluster",
                          fix="create it (kafka-topics --create --topic ...), or check --source kafka:TOPIC and "
                          "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS")


class KafkaPlanner:
    """Plans micro-batches over a Kafka topic's partitions (in the driver; see the module docstring)."""

    def __init__(self, topic: str, *, event_type: str | None = None, on_loss: str | None = None,
                 clock: Callable[[], int] | None = None, split_records: int = MAX_SPLIT_RECORDS) -> None:
        from event_etl.settings import current_settings

        self.topic = topic
        self.group = consumer_group(event_type, topic)
        self.on_loss = on_loss if on_loss is not None else current_settings().kafka_on_data_loss
        self.clock = clock
        self.split_records = split_records
        self._admin: Any = None
        self._consumer: Any = None
        self._key: tuple[tuple[str, str], ...] | None = None  # the shared clients it uses (see shared_clients)
        self.target: dict[int, int] | None = None  # --once: the high watermarks when it started
        self._highs: dict[int, int] = {}  # the last watermarks seen (for backlog and reported_latest)
        self._topic_id: str | None = None
        self.lost: dict[int, int] = {}
        """Records retention deleted unread, by partition, that the last planned batch skipped (``skip``)."""

    # -- clients ----------------------------------------------------------------------------
    def _clients(self) -> None:
        if self._key is None:
            self._key, self._admin, self._consumer = shared_clients()

    def _admin_client(self) -> Any:
        self._clients()
        return self._admin

    def _consumer_client(self) -> Any:
        self._clients()
        return self._consumer

    def _metadata(self, expect_id: str | None) -> list[int]:
        found = describe_topic(self._admin_client(), self.topic)
        if found is None:
            raise SourceError(
                f"Kafka topic {self.topic} is gone (deleted?)",
                fix="recreate it and start with a new --checkpoint to read it from its beginning, or restore it; "
                "the job never restarts a topic from offset zero on its own")
        topic_id, partitions = found
        if expect_id is not None and topic_id != expect_id:
            raise SourceError(
                f"Kafka topic {self.topic} was deleted and created again (its id is {topic_id}, this checkpoint's "
                f"offsets belong to {expect_id})",
                fix="start with a new --checkpoint to read the new topic from its beginning (what the job wrote "
                "stays in the sink), or point --source at the topic the checkpoint read")
        self._topic_id = topic_id
        return partitions

    def _watermarks(self, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        from confluent_kafka import KafkaException, TopicPartition

        consumer = self._consumer_client()
        out = {}
        refreshed = False
        for p in partitions:
            try:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                               timeout=REQUEST_TIMEOUT_S, cached=False)
                except KafkaException as err:
                    if not _is_unknown_partition(err) or refreshed:
                        raise
                    # a partition added since this client last read the topic's metadata (the admin client saw
                    # it): read the metadata again, then ask once more
                    consumer.list_topics(self.topic, timeout=REQUEST_TIMEOUT_S)
                    refreshed = True
                    low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                               timeout=REQUEST_TIMEOUT_S, cached=False)
            except KafkaException as err:
                if _is_unknown_partition(err):
                    log.info("Kafka topic %s partition %d is not known to this client yet: planned next time",
                             self.topic, p)
                    continue
                raise SourceError(f"cannot read the offsets of Kafka topic {self.topic} partition {p}: {err}",
                                  fix=_FIX_CONNECT) from err
            out[p] = (int(low), int(high))
        self._highs = {p: h for p, (_, h) in out.items()}
        return out

    # -- the streaming-source protocol ------------------------------------------------------
    def initial_offset(self) -> dict[str, Any]:
        partitions = self._metadata(None)
        marks = self._watermarks(partitions)
        return {"topic": self.topic, "topic_id": self._topic_id,
                "partitions": {str(p): marks[p][0] for p in partitions if p in marks}}

    def prepare_available_now(self) -> None:
        partitions = self._metadata(None)
        self.target = {p: h for p, (_, h) in self._watermarks(partitions).items()}

    def latest_offset(self, start: dict[str, Any], cap: int | None) -> dict[str, Any]:
        self._check_start(start)
        known = {int(p): int(n) for p, n in start["partitions"].items()}
        partitions, marks = self._partition_marks(start["topic_id"], known)
        begin, available = self._begin(partitions, known, marks)
        take = fair_shares(available, cap)
        ends = {p: (begin.get(p, known.get(p, 0)) + take[p]) for p in partitions}
        if not self.lost and all(p in known and ends[p] == known[p] for p in partitions):
            return start  # nothing new: the very same offset
        lost_all = {int(p): int(n) for p, n in start.get("lost", {}).items()}
        for p, n in self.lost.items():
            lost_all[p] = lost_all.get(p, 0) + n
        end: dict[str, Any] = {"topic": self.topic, "topic_id": start["topic_id"],
                               "partitions": {str(p): ends[p] for p in partitions}}
        if lost_all:
            end["lost"] = {str(p): n for p, n in sorted(lost_all.items())}
        if begin:
            end["begin"] = {str(p): n for p, n in sorted(begin.items())}
        return end

    def _partition_marks(self, topic_id: str | None,
                         known: dict[int, int]) -> tuple[list[int], dict[int, tuple[int, int]]]:
        """The partitions to plan (those the start offset ``known`` and those this client sees) and their low and
        high watermarks; a lost partition is an error (the topic was recreated)."""
        partitions = self._metadata(topic_id)
        gone = sorted(set(known) - set(partitions))
        if gone:
            raise SourceError(f"Kafka topic {self.topic} has lost partitions {gone} (it has {len(partitions)})",
                              fix="a topic's partitions are never removed: it was recreated; start with a new "
                              "--checkpoint")
        marks = self._watermarks(partitions)
        # a partition this client cannot see yet (just added) is planned next time; one the start offset knows
        # cannot be left out of the end offset: it keeps its start
        partitions = [p for p in partitions if p in marks or p in known]
        for p in partitions:
            if p not in marks:
                marks[p] = (known[p], known[p])
        return partitions, marks

    def _begin(self, partitions: list[int], known: dict[int, int],
               marks: dict[int, tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
        """Where each partition's range begins when not at its start offset (retention deleted records unread, or
        a partition new since), and how many records each has available; records lost go to :attr:`lost`."""
        begin: dict[int, int] = {}
        available: dict[int, int] = {}
        self.lost = {}
        for p in partitions:
            low, high = marks[p]
            if self.target is not None:
                high = min(high, self.target.get(p, low))  # --once: what was there when it started
            if p in known:
                b, lost = plan_partition(known[p], low, high, self.on_loss, topic=self.topic, partition=p)
                if lost:
                    self.lost[p] = lost
                    log.warning("Kafka topic %s partition %d: %d records deleted by retention before they were "
                                "read; skipped (EVENT_ETL_KAFKA_ON_DATA_LOSS=skip)", self.topic, p, lost)
                if b != known[p]:
                    begin[p] = b
            else:
                b = low  # a partition new since the start offset: from its oldest record
                begin[p] = b
            available[p] = max(0, high - b)
        return begin, available

    def _check_start(self, start: dict[str, Any]) -> None:
        if start.get("topic") != self.topic or "topic_id" not in start:
            raise SourceError(f"the checkpoint's Kafka offsets are of topic {start.get('topic')!r}, not {self.topic}",
                              fix="use the --checkpoint of this --source, or a new one")

    def reported_latest(self) -> dict[str, Any] | None:
        if not self._highs or self._topic_id is None:
            return None
        highs = self._highs if self.target is None else {p: min(h, self.target.get(p, h))
                                                         for p, h in self._highs.items()}
        return {"topic": self.topic, "topic_id": self._topic_id,
                "partitions": {str(p): h for p, h in sorted(highs.items())}}

    def backlog(self, start: dict[str, Any]) -> dict[str, int]:
        """Records beyond ``start`` as of the last watermarks seen (no request of its own)."""
        known = {int(p): int(n) for p, n in start.get("partitions", {}).items()}
        latest = self.reported_latest()
        if latest is None:
            return {"records": 0}
        return {"records": sum(max(0, int(h) - known.get(int(p), 0)) for p, h in latest["partitions"].items())}

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        """The batch's partition ranges, cut at ``split_records`` offsets: a function of the two offsets alone."""
        known = {int(p): int(n) for p, n in start["partitions"].items()}
        begin = {int(p): int(n) for p, n in end.get("begin", {}).items()}
        out: list[Split] = []
        for p in sorted(int(k) for k in end["partitions"]):
            b = begin.get(p, known.get(p))
            if b is None:
                raise SourceError(f"Kafka offsets of batch end name partition {p}, which neither the start nor "
                                  "its begin knows", fix="the checkpoint was edited; start with a new --checkpoint")
            for lo, hi in cut_range(b, int(end["partitions"][str(p)]), self.split_records):
                meta = json.dumps({"partition": p, "topic_id": end["topic_id"]})
                out.append(Split(len(out), "kafka", self.topic, lo, hi, 0, meta))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        """Tell Kafka the group's progress (for lag monitoring), best effort: the checkpoint is what counts."""
        try:
            from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

            offsets = [TopicPartition(self.topic, int(p), int(n)) for p, n in end["partitions"].items()]
            if offsets:  # through the shared admin client: the group's offsets, with no consumer of its own
                futures = self._admin_client().alter_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(self.group, offsets)], request_timeout=REQUEST_TIMEOUT_S)
                for future in futures.values():
                    future.result(timeout=REQUEST_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - never fails the batch: the checkpoint holds the offsets
            log.warning("could not commit the offsets of Kafka topic %s for group %s: %s", self.topic, self.group,
                        err)

    def stop(self) -> None:
        """Let go of the clients (the process's: the last planner to stop closes them)."""
        key, self._key, self._consumer, self._admin = self._key, None, None, None
        if key is not None:
            release_clients(key)


READ_TIMEOUT_S = 60.0
"""How long a task waits for the next record of its range before it fails (the cluster unreachable, the range's
records gone)."""


def message_attributes(topic: str, partition: int, offset: int, timestamp: int, key: bytes | None,
                       headers: list[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """A record's attributes, as a Pub/Sub message's (``time_attribute`` may name one): its headers (decoded as
    UTF-8, bad bytes replaced; a later header of the same name wins) and ``kafka.key``, ``kafka.partition``,
    ``kafka.offset``, ``kafka.timestamp`` (milliseconds since the epoch)."""
    attrs = {str(k): (v.decode("utf-8", "replace") if isinstance(v, bytes) else "" if v is None else str(v))
             for k, v in (headers or [])}
    if key is not None:
        attrs["kafka.key"] = key.decode("utf-8", "replace")
    attrs["kafka.partition"] = str(partition)
    attrs["kafka.offset"] = str(offset)
    attrs["kafka.timestamp"] = str(timestamp)
    return attrs


CONSUME_RECORDS = 10_000
"""The most records a task's consumer hands over at a time (what the benchmark's bare loop asks for too)."""

READER_DEFAULTS: dict[str, Any] = {"max.partition.fetch.bytes": 16 << 20}
"""librdkafka settings of a task's consumer unless the properties file sets them: fetches of up to 16 MiB a
partition (librdkafka's default, 1 MiB, is ~4,500 records of ~225 B a request)."""


def _reader_config() -> dict[str, Any]:
    conf = kafka_config(group_id="event_etl.reader", enable_auto_commit=False, enable_partition_eof=True,
                        auto_offset_reset="error")
    for k, v in READER_DEFAULTS.items():
        conf.setdefault(k, v)
    return conf


def read_messages(topic: str, partition: int, start: int, end: int, *, timeout: float = READ_TIMEOUT_S
                  ) -> Iterator[list[Any]]:
    """The records of offsets ``[start, end)`` of a partition, in offset order, as runs of ``confluent_kafka``
    messages (what one ``consume`` returned, cut to the range; never empty).

    Offsets missing from the range (a compacted topic, transaction markers) are skipped.  No record for
    ``timeout`` seconds before ``end`` is a :class:`SourceError`, and so are records retention deleted."""
    yield from read_runs(topic, partition, start, end, timeout=timeout)


def read_runs(topic: str, partition: int, start: int, end: int, *, timeout: float = READ_TIMEOUT_S,
              take: Callable[[list[Any], bool], Any] | None = None) -> Iterator[Any]:
    """:func:`read_messages`, each run handed to ``take(run, consecutive)`` before it is yielded (``consecutive``:
    the run's offsets are ``first, first + 1, ...``, no gap), and what ``take`` returns yielded instead.

    The cyclic garbage collector is paused while a ``consume`` makes its messages and ``take`` reads them (it is
    never paused while the caller runs): a run's ten thousand ``Message`` objects, each tracked by the collector,
    would otherwise set off a dozen collections that walk the task's whole heap, to free nothing (a run holds no
    cycle).  When ``take`` keeps no message, they are freed by their reference counts before the collector runs
    again."""
    import gc
    import time
    from itertools import repeat
    from operator import is_not

    from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

    if end <= start:
        return
    # a consumed record always has an offset (None only for a message produced and not yet delivered)
    offset_of, error_of = cast("Callable[[Message], int]", Message.offset), Message.error
    consumer = Consumer(_reader_config())
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        nxt = start
        deadline = time.monotonic() + timeout
        while nxt < end:
            paused = gc.isenabled()  # a collector the caller paused stays paused
            if paused:
                gc.disable()
            try:
                msgs = consumer.consume(num_messages=min(CONSUME_RECORDS, end - nxt), timeout=1.0)
                empty = not msgs
                if empty:
                    out = None
                elif not any(map(is_not, map(error_of, msgs), repeat(None))) and offset_of(msgs[0]) >= nxt:
                    # the usual run: records only, in offset order from where the range stands
                    first, last = offset_of(msgs[0]), offset_of(msgs[-1])
                    if last >= end:
                        msgs = [m for m in msgs if offset_of(m) < end]
                    if msgs:
                        nxt = last + 1 if last < end else end
                        out = msgs if take is None else take(msgs, offset_of(msgs[-1]) - first == len(msgs) - 1)
                    else:
                        nxt, out = end, None
                else:
                    run, nxt = _slow_run(msgs, nxt, end, topic, partition, KafkaError)
                    out = None if not run else run if take is None else take(run, False)
                del msgs
            finally:
                if paused:
                    gc.enable()
            if empty:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"Kafka topic {topic} partition {partition}: no record after offset {nxt - 1} for "
                        f"{timeout:.0f}s, the batch reads up to offset {end - 1}",
                        fix="check that the cluster is reachable from the executors "
                        "(EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS, EVENT_ETL_KAFKA_PROPERTIES on every node); the batch "
                        "is replayed when the job runs again")
                continue
            deadline = time.monotonic() + timeout
            if out is not None:
                yield out
                out = None
    finally:
        consumer.close()


def _slow_run(msgs: list[Any], nxt: int, end: int, topic: str, partition: int, kafka_error: Any
              ) -> tuple[list[Any], int]:
    """A ``consume``'s messages with an error among them, or starting before ``nxt``, one by one: the records
    of ``[nxt, end)`` and where the range stands after them."""
    run: list[Any] = []
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == kafka_error._PARTITION_EOF:
                if m.offset() is not None and m.offset() >= end:
                    nxt = end  # the range's last offsets hold no record (compaction, a transaction marker)
                    break
                continue
            if err.code() in (kafka_error._AUTO_OFFSET_RESET, kafka_error.OFFSET_OUT_OF_RANGE):
                raise SourceError(
                    f"Kafka topic {topic} partition {partition}: offset {nxt} is no longer there (deleted by "
                    f"the topic's retention before this batch read it): {err.str()}",
                    fix="raise the topic's retention; a batch planned over deleted records cannot be "
                    "replayed: start with a new --checkpoint, or restore the records")
            raise SourceError(f"reading Kafka topic {topic} partition {partition}: {err.str()}",
                              fix=_FIX_CONNECT)
        off = m.offset()
        if off < nxt:
            continue
        if off >= end:
            nxt = end
            break
        run.append(m)
        nxt = off + 1
    return run, nxt


class RecordRun:
    """A run of consecutive records of a partition as columns, its ``Message`` objects let go: ``offsets`` and
    ``times`` (Kafka timestamps, milliseconds) as ``int64`` arrays, ``values`` (``b""`` for none), ``keys`` and
    ``headers`` (what :func:`record_fields` needs for the record path) as lists."""

    __slots__ = ("offsets", "times", "values", "keys", "headers")

    def __init__(self, offsets: Any, times: Any, values: list[bytes], keys: list[bytes | None],
                 headers: list[Any]) -> None:
        self.offsets, self.times, self.values, self.keys, self.headers = offsets, times, values, keys, headers

    def __len__(self) -> int:
        return len(self.values)


def record_columns(topic: str, partition: int) -> Callable[[list[Any], bool], RecordRun]:
    """A ``take`` for :func:`read_runs`: a run of messages as a :class:`RecordRun`, each accessor mapped over the
    run in C rather than called per record from Python; consecutive offsets made as a range.  A record without a
    timestamp is a :class:`SourceError` that names it (as :func:`record_times` says)."""
    from operator import itemgetter

    import numpy as np
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

    # a consumed record always has an offset (None only for a message produced and not yet delivered)
    offset_of = cast("Callable[[Message], int]", Message.offset)
    value_of, key_of, headers_of, stamp_of = Message.value, Message.key, Message.headers, Message.timestamp
    kind_of, time_of = itemgetter(0), itemgetter(1)

    def take(run: list[Any], consecutive: bool) -> RecordRun:
        n = len(run)
        if consecutive:
            first = offset_of(run[0])
            offsets = np.arange(first, first + n, dtype=np.int64)
        else:
            offsets = np.fromiter(map(offset_of, run), dtype=np.int64, count=n)
        stamps = list(map(stamp_of, run))
        times = np.fromiter(map(time_of, stamps), dtype=np.int64, count=n)
        if n and int(times.min()) <= 0 and TIMESTAMP_NOT_AVAILABLE in map(kind_of, stamps):
            record_times(run, topic, partition)  # raises, naming the record (a record without one says -1)
        values = list(map(value_of, run))
        if not all(values):
            values = [v or b"" for v in values]  # a record without a value (a tombstone): empty
        return RecordRun(offsets, times, cast("list[bytes]", values), list(map(key_of, run)),
                         list(map(headers_of, run)))

    return take


def record_times(run: list[Any], topic: str, partition: int) -> list[int]:
    """The Kafka timestamps (milliseconds since the epoch) of a run of records: their arrivals; a
    :class:`SourceError` names a record without one."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

    stamps = [m.timestamp() for m in run]
    for m, (ts_type, _) in zip(run, stamps):
        if ts_type == TIMESTAMP_NOT_AVAILABLE:
            raise SourceError(f"Kafka topic {topic} partition {partition} offset {m.offset()} has no timestamp",
                              fix="records need a timestamp (message format v1 or later, Kafka 0.10+)")
    return [ts for _, ts in stamps]


def record_payload(m: Any, topic: str, partition: int, ts: int
                   ) -> tuple[bytes, int, str, int, tuple[str, dict[str, str]]]:
    """A record as :meth:`event_etl.sources.read.SplitReader.payloads` yields it (see :func:`read_range`)."""
    off = int(m.offset())
    return (m.value() or b"", ts, f"kafka:{topic}/{partition}@", off,
            (f"{topic}/{partition}/{off}", message_attributes(topic, partition, off, ts, m.key(), m.headers())))


def record_fields(topic: str, partition: int, offset: int, ts: int, value: bytes, key: bytes | None,
                  headers: list[tuple[str, bytes | None]] | None
                  ) -> tuple[bytes, int, str, int, tuple[str, dict[str, str]]]:
    """A record of a :class:`RecordRun` as :func:`record_payload` makes it from its message."""
    return (value, ts, f"kafka:{topic}/{partition}@", offset,
            (f"{topic}/{partition}/{offset}", message_attributes(topic, partition, offset, ts, key, headers)))


def read_range(topic: str, partition: int, start: int, end: int, *, timeout: float = READ_TIMEOUT_S
               ) -> Iterator[tuple[bytes, int, str, int, tuple[str, dict[str, str]]]]:
    """The records of offsets ``[start, end)`` of a partition, in offset order, as
    :meth:`event_etl.sources.read.SplitReader.payloads` yields them: ``(value, timestamp_ms, where, offset,
    (message id, attributes))``, the message id ``topic/partition/offset`` (what dedupes a record read twice).

    Offsets missing from the range (a compacted topic, transaction markers) are skipped.  No record for
    ``timeout`` seconds before ``end`` is a :class:`SourceError`, and so are records retention deleted."""
    for run in read_messages(topic, partition, start, end, timeout=timeout):
        for m, ts in zip(run, record_times(run, topic, partition)):
            yield record_payload(m, topic, partition, ts)


class KafkaSession(PlannedSession):
    """A Kafka topic, planned by the engine at every round; what retention deleted unread is read from the type's
    offset log (:func:`event_etl.sources.kafka_offsets.batch_lost`)."""

    def __init__(self, planner: KafkaPlanner, spark_dir: str | None) -> None:
        super().__init__(planner)
        self.spark_dir = spark_dir

    def lost(self, batch_id: int) -> dict[int, int]:
        if self.spark_dir is None:
            return {}
        from event_etl.sources.kafka_offsets import batch_lost

        return batch_lost(self.spark_dir, batch_id)
