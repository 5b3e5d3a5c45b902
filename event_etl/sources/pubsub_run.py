"""A fetcher's run, as the next one sees it: what a killed run may have left leased, and how this one stopped.

Each start of a Pub/Sub job is a new *run* of its fetcher (a new id: the acknowledgement ids
of an earlier run have expired).  A run records in the spool (``run.json``,
:class:`~event_etl.sources.spool.RunRecord`) the longest lease it may grant and, when it stops,
whether it left any message leased.  The next run, finding an unclean stop, is *settling* until
that lease has run out (on the monotonic clock, counted from when the job took its checkpoint's
lease): the messages the killed run held come back meanwhile, and until then the watermark
holds, no hour is marked, the quiet time of the idle rule does not run, and ``once`` does not
take the subscription for empty.

:class:`FetchRun` is that bookkeeping for the driver's fetcher
(:class:`~event_etl.sources.pubsub_fetch.Fetcher`) and for the driver's side of fetch partitions
(:class:`~event_etl.sources.pubsub_partitions.ExecutorFetcher`): :meth:`FetchRun.begin` finishes
the open segments a killed run left (:meth:`~event_etl.sources.spool.Spool.recover`), settles,
learns the subscription's lease and records this run; :meth:`FetchRun.end` records how it stopped.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from event_etl.errors import SourceError
from event_etl.sources.spool import MAX_LEASE_SECONDS, Spool

__all__ = ["FetchRun", "settle_until", "subscription_deadline", "SETTLE_MARGIN_SECONDS",
           "DEFAULT_SUBSCRIPTION_DEADLINE", "MAX_LEASE_SECONDS"]

log = logging.getLogger(__name__)

DEFAULT_SUBSCRIPTION_DEADLINE = 10
"""Seconds: a subscription's ack deadline when it was created without one (Pub/Sub's default)."""
SETTLE_MARGIN_SECONDS = 2.0
"""Added to the longest lease a killed run may have left: requests in flight, and the service's own delay."""


def settle_until(seconds: float, leased_at: float | None) -> float:
    """The monotonic time until which a restart settles for ``seconds`` of leases a killed run may have left.

    Counted from ``leased_at``, when the job took its checkpoint's lease (the killed run was gone by then), not from
    when pulling starts: the wait then overlaps the start of Spark.  None: from now."""
    now = time.monotonic()
    return (min(leased_at, now) if leased_at is not None else now) + seconds


def subscription_deadline(client: Any, subscription: str) -> int:
    """The subscription's ack deadline in seconds (the lease a pull grants), or :data:`MAX_LEASE_SECONDS` when it
    cannot be learnt: what a killed run may have left leased is then assumed as long as Pub/Sub allows."""
    try:
        sub = client.get_subscription(subscription=subscription, timeout=10)
    except Exception as err:  # noqa: BLE001 - unknown: assume the longest
        log.warning("could not read the ack deadline of %s (%s); assuming %d s", subscription, err,
                    MAX_LEASE_SECONDS)
        return MAX_LEASE_SECONDS
    return int(getattr(sub, "ack_deadline_seconds", 0) or DEFAULT_SUBSCRIPTION_DEADLINE)


class FetchRun:
    """The run record's side of a fetcher pulling ``subscription`` into ``spool`` (see the module docstring)."""

    def __init__(self, spool: Spool, subscription: str, *, clock: Callable[[], int]) -> None:
        self.spool = spool
        self.subscription = subscription
        self.clock = clock

    def begin(self, run: str, ack: str, client: Any, requests: Counter[str], *, extensions: int = 0,
              leased_at: float | None = None) -> tuple[int, float, float]:
        """Finish the open segments a killed run left, settle for the leases an unclean stop of the last run may
        have left, and record run ``run`` (acknowledging ``ack``; ``extensions``: the deadline it extends leases
        to, if it does).  ``leased_at`` (monotonic): when the job took its checkpoint's lease, which the settling
        counts from (:func:`settle_until`).

        Returns the subscription's ack deadline (the lease a pull grants), and how long to settle and until when
        (monotonic; 0 and 0: the last run stopped cleanly)."""
        self.spool.recover()
        lease = self.spool.record.previous_lease()
        seconds = until = 0.0
        if lease > 0:
            seconds = lease + SETTLE_MARGIN_SECONDS
            until = settle_until(seconds, leased_at)
            log.warning("the last run of %s did not stop cleanly: messages it held may come back within %.0f s; "
                        "until then no hour is marked", self.subscription, max(0.0, until - time.monotonic()))
        own = subscription_deadline(client, self.subscription)
        requests["get_subscription"] += 1
        try:
            self.spool.record.begin(run, ack, max(own, extensions), clock=self.clock)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise SourceError(
                f"the disk of the checkpoint's spool {self.spool.dir} has no room to begin a run ({err.strerror})",
                fix=f"free space on the disk that holds --checkpoint ({self.spool.dir}), or give it a larger volume, "
                    "then start the job again: it loses nothing") from err
        return own, seconds, until

    def end(self, run: str, *, clean: bool, leased_until: int | None = None) -> None:
        """Record how run ``run`` stopped: ``clean``, no message it pulled may still be leased; else, if known,
        until when (``leased_until``, ms on the wall clock) what it left may stay so."""
        self.spool.record.end(run, clean=clean, clock=self.clock, leased_until=leased_until)
