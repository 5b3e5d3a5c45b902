"""Pull and acknowledge on the gRPC wire, without the client library's per-message wrapping.

google-cloud-pubsub's generated client turns every ``PullResponse`` into proto-plus objects
(each message wrapped) and back, which costs more CPU than everything else the fetcher does
with a message: on the emulator, 17 µs of the client's CPU a message against 12 µs for the
same ``Pull`` and ``Acknowledge`` calls made with :mod:`grpc` directly (bench/RESULTS.md).  The
fetcher needs the response's bytes (a spool segment is the serialized ``PullResponse``) and
the ack ids, so :class:`WireSubscriber` makes the two calls it makes in a loop, ``Pull`` and
``Acknowledge`` (and ``ModifyAckDeadline``), on a channel built as the library builds it (its
transport's public :meth:`create_channel`, or an insecure one for ``PUBSUB_EMULATOR_HOST``),
with the library's own message classes, and returns ``Pull``'s answer as bytes.  gRPC errors
become the same :mod:`google.api_core.exceptions` the library raises, so callers handle both
alike; everything else (``GetSubscription``) goes through the library.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["WireSubscriber", "shared_subscriber", "pull_bytes"]

_SERVICE = "/google.pubsub.v1.Subscriber/"
_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
            ("grpc.keepalive_time_ms", 30000)]  # as the library's transport sets them


class WireSubscriber:
    """``pull`` (bytes of a serialized ``PullResponse``), ``acknowledge``, ``modify_ack_deadline`` over gRPC;
    ``get_subscription`` and ``close`` as the library's ``SubscriberClient``."""

    def __init__(self, channel: Any = None) -> None:
        import grpc
        from google.pubsub_v1.types import AcknowledgeRequest, ModifyAckDeadlineRequest, PullRequest

        if channel is None:
            emulator = os.environ.get("PUBSUB_EMULATOR_HOST")
            if emulator:
                channel = grpc.insecure_channel(emulator, options=_OPTIONS)
            else:
                from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport

                channel = SubscriberGrpcTransport.create_channel(
                    f"{SubscriberGrpcTransport.DEFAULT_HOST}:443", scopes=SubscriberGrpcTransport.AUTH_SCOPES,
                    options=_OPTIONS)
        self.channel = channel
        self._pull_request = PullRequest.pb()
        self._ack_request = AcknowledgeRequest.pb()
        self._modify_request = ModifyAckDeadlineRequest.pb()

        def call(name: str) -> Any:
            return channel.unary_unary(_SERVICE + name, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=None)  # None: the answer's bytes

        self._pull, self._ack, self._modify = call("Pull"), call("Acknowledge"), call("ModifyAckDeadline")
        self._library: Any = None  # the library's SubscriberClient, made when first needed
        self._library_lock = threading.Lock()

    @staticmethod
    def _raise(err: Exception) -> NoReturn:
        from google.api_core import exceptions

        # api_core's from_grpc_error carries no annotations: typed here as what it is
        from_grpc_error: Callable[[Exception], Exception] = exceptions.from_grpc_error
        raise from_grpc_error(err) from err

    def pull(self, *, subscription: str, max_messages: int, timeout: float | None = None) -> bytes:
        import grpc

        try:
            data: bytes = self._pull(self._pull_request(subscription=subscription, max_messages=max_messages),
                                     timeout=timeout)
            return data
        except grpc.RpcError as err:
            self._raise(err)

    def pull_future(self, *, subscription: str, max_messages: int, timeout: float | None = None) -> Any:
        """``pull`` without waiting: a gRPC future whose answer :meth:`answer` reads (a fleet's pooled streams)."""
        return self._pull.future(self._pull_request(subscription=subscription, max_messages=max_messages),
                                 timeout=timeout)

    def answer(self, future: Any) -> bytes:
        """The bytes of a :meth:`pull_future`'s answer, or the api_core error it ended with (as :meth:`pull`)."""
        import grpc

        try:
            data: bytes = future.result()
            return data
        except grpc.RpcError as err:
            self._raise(err)
        except grpc.FutureCancelledError as err:
            from google.api_core import exceptions

            cancelled: Callable[[str], Exception] = exceptions.Cancelled  # no annotations of its own
            raise cancelled("the pull was cancelled") from err

    def acknowledge(self, *, subscription: str, ack_ids: list[str], timeout: float | None = None) -> None:
        import grpc

        try:
            self._ack(self._ack_request(subscription=subscription, ack_ids=ack_ids), timeout=timeout)
        except grpc.RpcError as err:
            self._raise(err)

    def modify_ack_deadline(self, *, subscription: str, ack_ids: list[str], ack_deadline_seconds: int,
                            timeout: float | None = None) -> None:
        import grpc

        try:
            self._modify(self._modify_request(subscription=subscription, ack_ids=ack_ids,
                                              ack_deadline_seconds=ack_deadline_seconds), timeout=timeout)
        except grpc.RpcError as err:
            self._raise(err)

    def get_subscription(self, *, subscription: str, timeout: float | None = None) -> Any:
        with self._library_lock:  # made once, however many fetchers ask at once
            if self._library is None:
                from event_etl.sources.pubsub import subscriber_client

                self._library = subscriber_client()
        return self._library.get_subscription(subscription=subscription, timeout=timeout)

    def close(self) -> None:
        self.channel.close()
        if self._library is not None:
            self._library.close()


class _Shared:
    lock = threading.Lock()
    subscribers: dict[str, WireSubscriber] = {}


def shared_subscriber() -> WireSubscriber:
    """The process's subscriber for the service the environment names (``PUBSUB_EMULATOR_HOST``, else Google's):
    one gRPC channel, which every fetcher of the process pulls on at once (a channel multiplexes its calls), not a
    channel each; never closed (it lives as long as the process)."""
    target = os.environ.get("PUBSUB_EMULATOR_HOST") or "pubsub.googleapis.com"
    with _Shared.lock:
        sub = _Shared.subscribers.get(target)
        if sub is None:
            sub = _Shared.subscribers[target] = WireSubscriber()
        return sub


def pull_bytes(answer: Any) -> tuple[bytes, Any]:
    """A ``Pull`` answer as ``(its bytes, the parsed PullResponse protocol buffer)``, whether it came as bytes (the
    wire) or as the library's message (a client of the library's shape, e.g. a test's fake of the service)."""
    from google.pubsub_v1.types import PullResponse

    if isinstance(answer, (bytes, bytearray)):
        data = bytes(answer)
        return data, PullResponse.pb().FromString(data)
    raw = PullResponse.pb(answer)
    return raw.SerializeToString(), raw
