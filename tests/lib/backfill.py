"""A job's first batches with backfills sixty days old (issue 50): a local pipeline whose clock says :data:`NOW`,
and the events (more than ``max_backfill``, 30 days by default, before their arrival)."""

from __future__ import annotations

from event_etl.timeutil import DAY_MS
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

__all__ = ["NOW", "SETTINGS", "pipeline", "sixty_days_old"]

NOW = t("13:30")
SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}


def pipeline(tmp_path, **settings) -> LocalPipeline:
    et = make_event_type(tmp_path / "types", **{**SETTINGS, **settings})
    return LocalPipeline(tmp_path, et, FakeClock(NOW))


def sixty_days_old(n: int) -> list[bytes]:
    return [click(f"old{i}", NOW - 60 * DAY_MS + i * 60_000) for i in range(n)]
