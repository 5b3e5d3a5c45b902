"""Small statistics for the benchmark scripts: medians, (weighted) percentiles, formatting."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

__all__ = ["median", "percentile", "weighted_percentile", "mib", "rate", "ratio"]


def median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by the nearest-rank method: a value that was observed."""
    return weighted_percentile(values, [1] * len(values), q)


def weighted_percentile(values: Sequence[float], weights: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile where ``values[i]`` was observed ``weights[i]`` times."""
    pairs = sorted((v, w) for v, w in zip(values, weights) if w > 0)
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    target = q / 100.0 * total
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= target:
            return v
    return pairs[-1][0]


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}×"
