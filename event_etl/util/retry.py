"""Backoff and retries, on `tenacity <https://tenacity.readthedocs.io>`_: the one place event_etl computes how
long to wait before trying again.

- :func:`exponential_backoff`: the ``n``-th wait of a doubling backoff, ``first * 2**(n-1)`` and at most ``cap``
  (the fleet's restarts, the policy chain's retries: loops that keep their own state between tries).
- :func:`retry_call`: call a function until it succeeds, retrying the errors a predicate accepts with that
  backoff while the next wait still ends before a deadline (the storage's object-store calls).

tenacity is imported when one of them is first called: a module that imports this one costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

__all__ = ["exponential_backoff", "retry_call"]

T = TypeVar("T")


def _wait(first: float, cap: float) -> Any:
    import tenacity

    return tenacity.wait_exponential(multiplier=first, max=cap)


def exponential_backoff(n: int, *, first: float, cap: float) -> float:
    """Seconds of the ``n``-th wait (``n`` >= 1) of a backoff that starts at ``first`` and doubles up to ``cap``:
    ``min(cap, first * 2**(n-1))`` (never negative; ``cap`` when that is too large for a float).  The schedule of
    :func:`retry_call`'s waits (tenacity's ``wait_exponential``), for loops that count their own attempts."""
    if first <= 0:
        return 0.0
    try:
        return max(0.0, min(cap, first * 2.0 ** (max(1, n) - 1)))
    except OverflowError:
        return cap


def _sleep(seconds: float) -> None:
    time.sleep(seconds)  # looked up at each wait, as a loop calling time.sleep did


def retry_call(fn: Callable[[], T], *, retryable: Callable[[Exception], bool], first: float, cap: float,
               deadline: float, on_retry: Callable[[Exception, float], None] | None = None,
               on_give_up: Callable[[Exception], NoReturn] | None = None) -> T:
    """``fn()``, tried again while it raises an :class:`Exception` that ``retryable`` accepts.

    The waits are :func:`exponential_backoff`'s (``first``, doubling up to ``cap``), each announced to
    ``on_retry(error, seconds)`` before it is slept.  When the next wait would end after ``deadline`` (on
    :func:`time.monotonic`'s clock), ``on_give_up(error)`` is called: it raises what the caller wants raised
    (without it, or if it returns, the error itself is raised).  Anything else ``fn`` raises (an error
    ``retryable`` refuses, a ``KeyboardInterrupt``) is raised at once, as it is."""
    import tenacity

    def error_of(state: tenacity.RetryCallState) -> Exception:
        err = state.outcome.exception() if state.outcome is not None else None
        assert isinstance(err, Exception)  # retried only for an Exception (retry_if_exception below)
        return err

    def give_up(state: tenacity.RetryCallState) -> T:
        if on_give_up is not None:
            on_give_up(error_of(state))
        raise error_of(state)

    def announce(state: tenacity.RetryCallState) -> None:
        if on_retry is not None:
            on_retry(error_of(state), state.upcoming_sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda err: isinstance(err, Exception) and retryable(err)),
        wait=_wait(first, cap),
        stop=lambda state: time.monotonic() + state.upcoming_sleep > deadline,
        before_sleep=announce if on_retry is not None else None,
        retry_error_callback=give_up,
        sleep=_sleep,
    )
    return retrying(fn)
