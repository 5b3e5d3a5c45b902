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
from typing import NoReturn, TypeVar

__all__ = ["exponential_backoff", "retry_call"]

T = TypeVar("T")


def _wait(first: float, cap: float):
    import tenacity

    return tenacity.wait_exponential(multiplier=first, max=cap)


def exponential_backoff(n: int, *, first: float, cap: float) -> float:
    """Seconds of the ``n``-th wait (``n`` >= 1) of a backoff that starts at ``first`` and doubles up to ``cap``:
    ``min(cap, first * 2**(n-1))`` (never negative; ``cap`` when that is too large for a float)."""
    import tenacity

    if first == 0:
        return 0.0  # tenacity takes 0 * 2**n that overflows a float for the cap

    state = tenacity.RetryCallState(None, None, (), {})
    state.attempt_number = n
    return _wait(first, cap)(state)


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

    def give_up(state: tenacity.RetryCallState):
        if on_give_up is not None:
            on_give_up(state.outcome.exception())
        return state.outcome.result()  # raises the error

    def announce(state: tenacity.RetryCallState) -> None:
        on_retry(state.outcome.exception(), state.upcoming_sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda err: isinstance(err, Exception) and retryable(err)),
        wait=_wait(first, cap),
        stop=lambda state: time.monotonic() + state.upcoming_sleep > deadline,
        before_sleep=announce if on_retry is not None else None,
        retry_error_callback=give_up,
        sleep=_sleep,
    )
    return retrying(fn)
