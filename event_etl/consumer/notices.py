"""Waiting on a Pub/Sub subscription instead of polling: the messages of the ``pubsub`` commit policy.

A job with a ``pubsub`` commit policy (:mod:`event_etl.job.policy_pubsub`) publishes a message per complete hour
(attributes ``event_type``, ``hour``, ...).  :class:`HourMessages` listens on a subscription of that topic
(streaming pull, in the background) and wakes a wait as soon as a message about an hour it waits for arrives.

A message is a hint, the marker is the contract: the wait still decides by reading the marker
(:func:`event_etl.consumer.wait.wait_for_hours`), at once when a message comes and every ``poll_interval``
otherwise, so a message lost, published before the subscription existed, or never sent (a policy that failed)
only makes the wait slower, never wrong.

Messages of the type for hours up to the last one waited for are acknowledged (they are about the past: the
marker says more).  Others (another type, a later hour) are left unacknowledged and come back to the
subscription once the wait ends; give each waiting consumer its own subscription, best with a filter such as
``attributes.event_type = "page_view"``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from event_etl.errors import SourceError, UsageError
from event_etl.timeutil import parse_hour

__all__ = ["HourMessages", "PubSubNotInstalledError"]


class PubSubNotInstalledError(UsageError, SourceError):
    """``--subscription`` without the Pub/Sub client (the ``[pubsub]`` extra): a missing extra, exit code 2 as every
    other (and a :class:`SourceError`, which this error was before: code catching that still catches it)."""


class HourMessages:
    """Wakes a wait when a message about one of ``hours`` (ms) of ``event_type`` arrives on ``subscription``."""

    def __init__(self, subscription: str, event_type: str, hours: Iterable[int], *,
                 warn: Callable[[str], None] | None = None) -> None:
        from event_etl.sources.pubsub import parse_subscription

        try:
            parse_subscription(subscription)
        except ValueError as err:
            raise SourceError(str(err), fix="give --subscription as projects/PROJECT/subscriptions/NAME") from err
        self.subscription = subscription
        self.event_type = event_type
        self.hours = set(hours)
        self.last = max(self.hours)
        self.received = 0
        self._warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self._event = threading.Event()
        self._client: Any = None
        self._future: Any = None

    def __enter__(self) -> HourMessages:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> HourMessages:
        """Check the subscription (a missing one is an error now, with the fix) and start listening."""
        try:
            from google.cloud import pubsub_v1  # noqa: F401 - not in the consumers' light install
        except ImportError as err:
            raise PubSubNotInstalledError(
                "--subscription needs the Pub/Sub client (the Python package 'google-cloud-pubsub'), which is not "
                "installed (it comes with the [pubsub] extra, and with [job])",
                fix="pip install 'event_etl[pubsub]', or wait without --subscription (the marker is polled)") from err
        from event_etl.sources.pubsub import check_subscription, subscriber_client

        check_subscription(self.subscription)
        self._client = subscriber_client()
        self._future = self._client.subscribe(self.subscription, self._on_message)
        self._future.add_done_callback(self._on_end)
        return self

    def _on_message(self, message: Any) -> None:
        attrs = message.attributes
        try:
            hour = parse_hour(attrs.get("hour", "")) if attrs.get("event_type") == self.event_type else None
        except ValueError:
            hour = None
        if hour is None or hour > self.last:
            return  # not ours: back to the subscription when the wait ends
        message.ack()
        self.received += 1
        if hour in self.hours:
            self._event.set()

    def _on_end(self, future: Any) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._warn(f"the subscription {self.subscription} failed ({future.exception()}); waiting on the marker "
                       "alone")

    def sleeper(self, sleep: Callable[[float], None]) -> Callable[[float], None]:
        """A ``sleep`` for the wait loop that ends early once a message about an awaited hour came (checked every
        quarter of a second; ``sleep`` does the waiting, so a caller's signal handling still applies)."""

        def wait(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while not self._event.is_set() and (left := deadline - time.monotonic()) > 0:
                sleep(min(0.25, left))
            self._event.clear()

        return wait

    def close(self) -> None:
        if self._future is not None:
            self._future.cancel()
            try:
                self._future.result(timeout=10)
            except Exception:  # noqa: BLE001 - cancelled (or already failed and reported): nothing to add
                pass
        if self._client is not None:
            self._client.close()
