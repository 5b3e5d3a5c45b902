"""What a Pub/Sub fetcher holds leased, and how it lets go: acknowledgements, deadlines, hand-backs.

A message a run pulls stays leased to it until it is acknowledged, handed back (a deadline
of 0: delivered again at once) or its lease runs out (delivered again then).  When it is
acknowledged is ``EVENT_ETL_PUBSUB_ACK`` (:mod:`event_etl.sources.pubsub_fetch`):
``spooled``, by its stream once it is durable in the spool; ``committed``, once the batch that
read its segment is saved (:meth:`Acknowledger.ack`), its deadline extended meanwhile.

:class:`Acknowledger` is the fetcher's side of those requests (Acknowledge and
ModifyAckDeadline, in bulk: :data:`ACK_CHUNK` ids a request) and its ledger:

- the segments this run wrote that no batch has saved yet (:class:`HeldSegments`: their
  messages and bytes, what the spool's bound counts, and ``committed`` their ack ids), and the
  earlier runs' segments still in the spool (:attr:`Acknowledger.leftover`);
- what may stay leased after this run, so that its stop is not taken for a clean one: an
  acknowledgement that failed (:attr:`~Acknowledger.left_leased`), a pull that failed after
  the service may have served it, a hand-back that failed (:attr:`~Acknowledger.leased_until`);
- acknowledgements that came after their lease ran out (:attr:`~Acknowledger.late_acks`): the
  service may have delivered those messages again meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from event_etl import faults
from event_etl.sources.pubsub_settings import FetchSettings
from event_etl.sources.spool import MAX_LEASE_SECONDS, SegmentName, segment_count

__all__ = ["Acknowledger", "Held", "HeldSegments", "ACK_CHUNK", "acknowledge_in_bulk"]

log = logging.getLogger(__name__)

ACK_CHUNK = 2500  # acknowledgement ids per Acknowledge / ModifyAckDeadline request (the client library's own limit)


def acknowledge_in_bulk(client: Any, subscription: str, ids: list[str], requests: Counter[str]) -> bool:
    """Acknowledge ``ids`` up to :data:`ACK_CHUNK` a request; False if any request failed (those messages come
    again, and dedupe drops them)."""
    ok = True
    for i in range(0, len(ids), ACK_CHUNK):
        faults.point("acknowledging", str(i))  # the batch saved; its messages from here on not acknowledged
        try:
            requests["acknowledge"] += 1
            client.acknowledge(subscription=subscription, ack_ids=ids[i:i + ACK_CHUNK], timeout=30)
        except Exception as err:  # noqa: BLE001 - unacknowledged messages come again; dedupe drops them
            log.warning("acknowledging %d messages failed: %s", len(ids[i:i + ACK_CHUNK]), err)
            ok = False
    return ok


@dataclass
class Held:
    ack_ids: list[str]  # still to acknowledge (committed: when the batch is saved; spooled: none once acknowledged)
    count: int
    bytes: int
    written: bool = True  # False while its segment is being written
    acked: bool = False  # spooled: acknowledged once durable


class HeldSegments(dict[str, Held]):
    """The segments held (by name): their messages and bytes summed as they come and go, so that flow control
    looks at two numbers before every pull instead of adding up thousands of segments."""

    def __init__(self) -> None:
        super().__init__()
        self.messages = 0
        self.bytes = 0

    def __setitem__(self, name: str, held: Held) -> None:
        self.pop(name)
        super().__setitem__(name, held)
        self.messages += held.count
        self.bytes += held.bytes

    def pop(self, name: str, default: Any = None) -> Any:
        held = super().pop(name, None)
        if held is None:
            return default
        self.messages -= held.count
        self.bytes -= held.bytes
        return held


class InHand(Protocol):
    """What a pull stream holds that no segment does (:class:`~event_etl.sources.pubsub_stream.PullStream`)."""

    count: int  # committed: messages in its buffer, for its next segment
    pending: list[str]  # ack ids of its last pull, neither acknowledged nor handed back yet
    pending_sent: int  # when (ms, wall clock) that pull was sent


class Acknowledger:
    """Acknowledgements, deadlines and hand-backs of one fetcher, and its ledger of what it holds (see the module
    docstring).  ``room``: the fetcher's condition (on its lock), notified when something held is let go: the
    streams waiting for room in the spool pull again.  ``client()``: the subscriber client."""

    def __init__(self, subscription: str, settings: FetchSettings, *, client: Callable[[], Any],
                 requests: Counter[str], room: threading.Condition, clock: Callable[[], int]) -> None:
        self.subscription = subscription
        self.settings = settings
        self.client = client
        self.requests = requests
        self.room = room
        self.clock = clock
        self.held = HeldSegments()
        self.leftover = (0, 0)  # messages and bytes of segments of earlier runs still in the spool
        self.acked = 0
        self.late_acks = 0  # messages acknowledged after their lease ran out (they may come again)
        self.left_leased = False  # an acknowledgement failed, so messages stay leased after this run
        # ms on the wall clock: until then messages this run pulled may still be leased to it although it holds none
        # of them (a pull that failed after the service may have served it, a pull it could not hand back)
        self.leased_until = 0
        # the subscription's ack deadline (the lease a pull grants), learnt when the run begins (a fetch partition is
        # told it); until then the longest Pub/Sub grants
        self.lease_seconds = MAX_LEASE_SECONDS

    # -- requests --------------------------------------------------------------------------------------------
    def modify(self, ids: list[str], seconds: int) -> None:
        """Set the deadline of ``ids`` to ``seconds`` from now; a failure means a redelivery, which dedupe absorbs."""
        for i in range(0, len(ids), ACK_CHUNK):
            try:
                self.requests["modify_ack_deadline"] += 1
                self.client().modify_ack_deadline(subscription=self.subscription, ack_ids=ids[i:i + ACK_CHUNK],
                                                  ack_deadline_seconds=seconds, timeout=30)
            except Exception as err:  # noqa: BLE001 - a missed extension means a redelivery, which dedupe absorbs
                log.warning("extending ack deadlines failed: %s", err)

    def extend(self) -> None:
        """``committed``: extend the deadlines of every message held for a batch (a turn of the fetcher's loop)."""
        with self.room:
            ids = [a for h in self.held.values() for a in h.ack_ids]
        if ids:
            self.modify(ids, self.settings.ack_deadline)

    def hand_back(self, ids: list[str], sent_ms: int) -> None:
        """Give messages pulled at ``sent_ms`` and not spooled back to Pub/Sub at once (a deadline of 0, as the
        client libraries do when they shut down): they are delivered again now, not after their lease.  If that
        fails they stay leased until their lease runs out, and this run is not clean."""
        failed = 0
        for i in range(0, len(ids), ACK_CHUNK):
            try:
                self.requests["modify_ack_deadline"] += 1
                self.client().modify_ack_deadline(subscription=self.subscription, ack_ids=ids[i:i + ACK_CHUNK],
                                                  ack_deadline_seconds=0, timeout=30)
            except Exception as err:  # noqa: BLE001 - then they come back when their lease runs out
                log.warning("handing %d messages back failed: %s", len(ids[i:i + ACK_CHUNK]), err)
                failed += 1
        if failed:
            self.maybe_served(sent_ms)

    def maybe_served(self, sent_ms: int) -> None:
        """A pull sent at ``sent_ms`` failed after the service may have served it (its answer lost: a deadline, a
        dropped connection): its messages, if any, stay leased for a lease from then."""
        with self.room:
            self.leased_until = max(self.leased_until, sent_ms + self.lease_seconds * 1000)

    def pull_acked(self, n: int, sent: float, *, ok: bool, in_time: bool) -> bool:
        """``spooled``: how the acknowledgement of a pull of ``n`` messages sent at ``sent`` (monotonic) went (with
        the lock held); whether they count as acknowledged (else the batch that reads them keeps their keys)."""
        if ok and in_time:
            self.acked += n
            return True
        if not ok:  # they come again once their lease runs out: the batch's dedupe keys wait for them
            self.left_leased = True
            return False
        # Acknowledged after the lease ran out: on a subscription without exactly-once delivery the service answers
        # OK all the same, and may have delivered them again meanwhile.  Counted as not received: the batch keeps
        # their keys until the redelivery has come (event_etl.task.dedupe).
        self.late_acks += n
        log.warning("%d messages of %s were acknowledged %.1f s after their pull, past the subscription's "
                    "%d-s lease: they may be delivered again (and dropped as duplicates)", n,
                    self.subscription, time.monotonic() - sent, self.lease_seconds)
        return False

    # -- a batch saved segments --------------------------------------------------------------------------------
    def ack(self, names: set[str] | list[str]) -> bool:
        """A batch saved the segments ``names``: acknowledge their messages (``committed``; ``spooled``: they were
        acknowledged when written), and no longer count them against the spool's bound.

        True if every one of them was pulled by this run and acknowledged: otherwise Pub/Sub
        will deliver some of them again (an earlier run's ids have expired, or an acknowledgement failed)."""
        if self.settings.spooled:
            return self.release(names)
        all_fresh = True
        ids: list[str] = []
        done: list[str] = []
        with self.room:
            for name in names:
                h = self.held.get(os.path.basename(name))
                if h is None:
                    all_fresh = False
                    continue
                ids.extend(h.ack_ids)
                done.append(os.path.basename(name))
        ok = acknowledge_in_bulk(self.client(), self.subscription, ids, self.requests)
        with self.room:
            for name in done:
                h = self.held.pop(name, None)
                if h is not None and ok:
                    self.acked += h.count
            self.room.notify_all()
        for name in names:  # an earlier run's segment: no longer held once saved
            if SegmentName.parse(os.path.basename(name)) and os.path.basename(name) not in done:
                with self.room:
                    m, b = self.leftover
                    self.leftover = (max(0, m - segment_count(name)), b)
                    self.room.notify_all()
        return all_fresh and ok

    def release(self, names: set[str] | list[str]) -> bool:
        """``spooled``: the segments ``names`` are saved by a batch; True if this run acknowledged all of them."""
        all_acked = True
        with self.room:
            for name in names:
                base = os.path.basename(name)
                h = self.held.pop(base, None)
                if h is None:  # an earlier run's: acknowledged or not, it is no longer held once saved
                    all_acked = False
                    m, b = self.leftover
                    self.leftover = (max(0, m - segment_count(base)), b)
                elif not h.acked:
                    all_acked = False
            self.room.notify_all()
        return all_acked

    # -- what it holds -----------------------------------------------------------------------------------------
    def totals(self) -> tuple[int, int]:
        """Messages and bytes of the segments held: this run's that no batch saved, and earlier runs'."""
        return self.leftover[0] + self.held.messages, self.leftover[1] + self.held.bytes

    def leaves_leased(self, streams: Sequence[InHand]) -> bool:
        """Whether messages this run pulled may still be leased (they come back when their lease runs out): pulled
        by ``streams`` and neither spooled nor handed back, held for a batch (``committed``), not acknowledged, or
        brought by a pull that failed after the service may have served it."""
        with self.room:
            if any(s.count or s.pending for s in streams) or self.left_leased:
                return True
            if self.leased_until > self.clock():
                return True
            return any(h.ack_ids for h in self.held.values())

    def left_leased_until(self, streams: Sequence[InHand]) -> int:
        """Until when (ms, wall clock) what this run leaves leased may stay so: its last pulls' leases."""
        with self.room:
            until = self.leased_until
            for s in streams:
                if s.pending:
                    until = max(until, s.pending_sent + self.lease_seconds * 1000)
            if self.left_leased or any(h.ack_ids for h in self.held.values()) or any(s.count for s in streams):
                until = max(until, self.clock() + max(self.lease_seconds, self.settings.ack_deadline) * 1000)
            return until
