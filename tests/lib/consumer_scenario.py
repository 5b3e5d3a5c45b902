"""A sink as a real job leaves it, for the consumer tests (local in tests/, on the GCS emulator in integration/).

Built with :class:`tests.lib.harness.LocalPipeline` (the real executor and
controller), one record per file so that an hour has several files::

    hour 12   never        (before the job's first hour)
    hour 13   complete     part a, part b                 (b: both timely)
    hour 14   complete     part c, late d                 (d: an event of 13:30 that arrived at 14:11)
    hour 15   open         part e
    hour 16   not started

``allowed_lateness`` is 30m, so late records of 13 can only land in hour 14 (its lateness
horizon): an audit of 13 is final, an audit of 14 (horizon 15, still open) is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from event_etl.eventtypes import EventType
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

__all__ = ["Scenario", "build_hours", "build_recipe_hours", "complete_hour_15", "TYPES_DIR"]

TYPES_DIR = "types"


@dataclass
class Scenario:
    pipeline: LocalPipeline
    et: EventType
    sink: str
    clock: FakeClock

    @property
    def types(self) -> str:
        return str(self.pipeline.tmp / TYPES_DIR)


def build_hours(tmp: Path, *, sink_url: str | None = None, **settings) -> Scenario:
    settings.setdefault("max_events_per_file", 1)
    settings.setdefault("allowed_lateness", "30m")
    et = make_event_type(Path(tmp) / TYPES_DIR, "click", **settings)
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp, et, clock, sink_url=sink_url)
    p.batch([click("a", "13:05"), click("b", "13:06")])
    clock.now = t("14:10")
    p.batch([click("c", "14:05")])  # watermark 14:03: hour 13 complete
    clock.now = t("14:11")
    p.batch([click("d", "13:30")])  # late: written into hour 14
    clock.now = t("15:10")
    p.batch([click("e", "15:05")])  # watermark 15:03: hour 14 complete, 15 open
    return Scenario(p, et, sink_url or str(p.sink), clock)


def complete_hour_15(sc: Scenario) -> None:
    """One more batch: the watermark passes 16:00 and hour 15 gets its marker."""
    sc.clock.now = t("16:10")
    sc.pipeline.batch([click("f", "16:05")])


# -- a sink for the recipes (tests/test_recipes.py, integration/test_consumer_recipes.py) -------------------------
RECIPE_HOUR_13 = 2100 + 2  # records: two batches, merged by the job at the marker into one file
RECIPE_HOUR_14 = 3 + 2  # its own 3 and 2 late records of 13:30
RECIPE_TEMPORARY = ".part-2026112113-b0000000009-s0000-0000.avro.0badc0de.tmp"


def build_recipe_hours(tmp: Path, *, sink_url: str | None = None) -> Scenario:
    """A sink for the readers' recipes, as a real job leaves it (``max_events_per_file`` 2,500)::

        hour 13   complete   2,100 + 2 records of two batches, in one file as the job merges an hour's small files
                             at its marker (page, ["null", "string"], null every 5th: a union read across
                             DuckDB's 2,048-row vectors), and a write's temporary RECIPE_TEMPORARY (garbage bytes)
        hour 14   complete   part 3, late 2 (events of 13:30 that arrived at 14:11)
        hour 15   open       part 1
        _deadletter/dt=2026-11-21/   two dl- files (a line that is not JSON, in batches 0 and 3)
    """
    et = make_event_type(Path(tmp) / TYPES_DIR, "click", max_events_per_file=2500, allowed_lateness="30m")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp, et, clock, sink_url=sink_url)
    p.batch([click(f"a{i:04d}", t("13:00") + i * 250, page=None if i % 5 == 0 else f"/p/{i}")
             for i in range(2100)] + [b"{not json"])
    clock.now = t("13:40")
    p.batch([click("b0", "13:35", page="/b"), click("b1", "13:36")])
    clock.now = t("14:10")
    p.batch([click(f"c{i}", "14:05", page="/c") for i in range(3)])  # hour 13 complete
    clock.now = t("14:11")
    p.batch([click("d0", "13:30", page="/late"), click("d1", "13:31"), b"not json either"])  # late: into hour 14
    clock.now = t("15:10")
    p.batch([click("e0", "15:05", page="/e")])  # hour 14 complete, 15 open
    sc = Scenario(p, et, sink_url or str(p.sink), clock)
    if sink_url is None:
        (p.sink / "click" / "dt=2026-11-21" / "hour=13" / RECIPE_TEMPORARY).write_bytes(b"half a write")
    return sc
