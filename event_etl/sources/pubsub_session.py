"""``pubsub:projects/P/subscriptions/S`` behind the source face: a fetcher pulls into the spool, the planner offers it.

A Pub/Sub type's session (:class:`PubSubSession`) holds two parts of :mod:`event_etl.sources`: the fetcher that
pulls beside the rounds and makes what it pulls durable in the type's spool (the driver's
:class:`~event_etl.sources.pubsub_fetch.Fetcher`, or the executors' fetch partitions,
:class:`~event_etl.sources.pubsub_partitions.ExecutorFetcher`, under ``EVENT_ETL_PUBSUB_FETCH_PARTITIONS``), and the
planner that offers the engine the spool's segments (:class:`~event_etl.sources.pubsub.PubSubPlanner`).  The session
answers for both: its activity is the fetcher's (what is pulled and not saved, whether the subscription can
deliver, whether a killed run's leases may still come back), a saved batch's segments are acknowledged through it,
and a drain stops its pulling once it has settled.
"""

from __future__ import annotations

import os
from typing import Any

from event_etl.rules.watermark import SourceActivity
from event_etl.sources.face import Offset, OpenRequest, PlannedSession, Source, Spooled
from event_etl.sources.pubsub import PubSubPlanner

__all__ = ["PubSubSource", "PubSubSession"]


class PubSubSession(PlannedSession):
    """One Pub/Sub type's hold on its subscription: the planner over its spool and the fetcher pulling into it."""

    spooled = True

    def __init__(self, planner: PubSubPlanner, fetcher: Any) -> None:
        super().__init__(planner)
        self.fetcher = fetcher

    def start(self) -> None:
        self.fetcher.start()  # a driver's puller runs already (it started when the session opened)

    def offer(self, start: Offset, cap: int | None, *, now: int) -> Offset:
        end: Offset = self.planner.latest_offset(start, cap)
        return end

    def activity(self) -> SourceActivity | None:
        """The spool's puller reports, not the planner: what it holds, whether the subscription can deliver."""
        activity: SourceActivity | None = self.fetcher.activity()
        return activity

    def acknowledge(self, keys: set[str]) -> bool | None:
        return bool(self.fetcher.ack(keys))

    def settling(self) -> float:
        if not self.fetcher.settling():
            return 0.0
        import time

        return max(0.0, float(self.fetcher.settle_until) - time.monotonic())

    def drained(self) -> None:
        self.fetcher.stop()  # no more pulls; every open segment closed

    def oldest_spooled(self) -> int | None:
        oldest: int | None = self.fetcher.spool.oldest_publish_ms()  # kept up to date, not scanned each time
        return oldest

    def stop_soon(self) -> None:
        self.fetcher.request_stop()

    def summary_line(self, name: str) -> str | None:
        line: str = self.fetcher.summary_line(name)
        return line

    def stop(self) -> None:
        if self._stopped:
            return
        try:
            self.fetcher.stop()
        finally:
            super().stop()


class PubSubSource(Source):
    """Pub/Sub: pulled beside the rounds into a spool in the checkpoint (see the module docstring)."""

    @classmethod
    def open(cls, request: OpenRequest) -> PubSubSession:
        from event_etl.settings import current_settings
        from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings

        spec = request.spec
        subscription, log_dir = spec["params"]["subscription"], spec["log_dir"]
        settings = FetchSettings.from_env(dict(current_settings().pubsub),  # the EVENT_ETL_PUBSUB_* variables
                                          emulator=bool(os.environ.get("PUBSUB_EMULATOR_HOST")))
        fetcher: Any
        if settings.fetch_partitions > 0:  # pulling on the executors: starts with the lane (start())
            from event_etl.sources.pubsub_partitions import ExecutorFetcher

            fetcher = ExecutorFetcher(subscription, log_dir, spark=request.spark, once=request.once,
                                      settings=settings)
            fetcher.fence, fetcher.sink = request.fence, request.sink  # the tasks check the job's lease as they pull
            fetcher.leased_at = request.leased_at
        else:  # the driver's puller starts at once: it finishes what a killed run left open before the planner looks
            from event_etl.sources.pubsub_pool import shared_pool

            # a fleet's types pull in turns on the fleet's pullers (no thread per type); a single type, as ever
            pool = shared_pool(settings.pullers, max_held_messages=settings.fleet_max_held_messages,
                               max_held_bytes=settings.fleet_max_held_bytes) if request.fleet else None
            fetcher = Fetcher(subscription, log_dir, once=request.once, settings=settings, pool=pool)
            fetcher.leased_at = request.leased_at
            fetcher.start()
        try:
            planner = cls.planner(request)
        except BaseException:
            fetcher.stop()
            raise
        return PubSubSession(planner, fetcher)

    @classmethod
    def planner(cls, request: OpenRequest) -> PubSubPlanner:
        """The planner over the type's spool (what the session offers the engine)."""
        spec = request.spec
        return PubSubPlanner(spec["params"]["subscription"], spec["log_dir"],
                             max_messages=int(spec["max_events_per_batch"]), clock=request.clock,
                             tasks_per_batch=int(spec.get("tasks_per_batch", 2)))

    @classmethod
    def spooled_at(cls, log_dir: str) -> Spooled | None:
        from event_etl.sources.spool import Spool

        spool = Spool.at(log_dir)  # read-only: None if the checkpoint holds no spool
        return Spooled(spool.oldest_publish_ms()) if spool is not None else None

    @classmethod
    def check(cls, params: dict[str, Any]) -> None:
        from event_etl.sources.pubsub import check_subscription

        check_subscription(params["subscription"])

    @classmethod
    def warning(cls, event_type: str, params: dict[str, Any], log_dir: str) -> str | None:
        """A checkpoint a restart of the machine loses (a spool on a volatile file system)."""
        from event_etl.settings import current_settings
        from event_etl.sources.pubsub_fetch import FetchSettings, spool_warning

        return spool_warning(event_type, log_dir, FetchSettings.from_env(dict(current_settings().pubsub)))
