"""Marker delay and watermark lag as every command says them (issue 50 item 4): one definition (the manifest's, on
the wall clock), its clock in its name, never a negative duration."""

from __future__ import annotations

import re

import pytest

from event_etl.job.progress import ProgressPrinter
from event_etl.rules.delays import MARKER_DELAY_NAME, lag_text, marked_early, marker_delay_text
from event_etl.rules.manifest import Manifest
from event_etl.testing.transcripts import hour, t


@pytest.mark.parametrize("delay_ms, closed_by, text, early", [
    (None, None, "-", None),
    (0, "watermark", "0ms", None),
    (127_000, "watermark", "2m07s", None),
    (2 * 3_600_000, "drain", "2h", None),  # a drain after the hour ended: a delay like any other
    (-45 * 60_000 - 10_000, "drain", "drained", "drained"),  # the drain's `marker delay -45m10s`
    (-7 * 3_600_000 - 20 * 60_000, "watermark", "ahead", "ahead"),  # `wait`'s `-7h20m`: event time ahead
    (-1, None, "ahead", "ahead"),  # a manifest written before `closed_by` existed
])
def test_a_marker_delay_is_never_a_negative_duration(delay_ms, closed_by, text, early):
    assert marker_delay_text(delay_ms, closed_by) == text
    assert marked_early(delay_ms, closed_by) == early


def test_a_lag_is_never_a_negative_duration():
    assert [lag_text(v) for v in (None, 0, 192_000, -1, -45 * 60_000)] == ["-", "0ms", "3m12s", "ahead", "ahead"]
    assert MARKER_DELAY_NAME == "marker delay (wall clock)"


def _manifest(completed: str, closed_by: str) -> Manifest:
    return Manifest(event_type="click", hour=hour("13"), watermark=hour("14"), completed_at=t(completed), files=(),
                    extra={"closed_by": closed_by})


def test_the_runs_lines_after_a_drain_print_no_negative_duration():
    """A drain at 13:14:50 by the generator's clock marks hour 13 45m10s before it ends; the lines used to read
    `marker delay -45m10s (generator clock)` and `lag -45m10s (generator clock)`."""
    wall = t("2026-11-21T13:14:50")
    printer = ProgressPrinter("click", lambda: wall, event_clock=lambda: wall)
    line = printer.marker_line(_manifest("2026-11-21T13:14:50", "drain"))
    assert line.endswith("  marker delay (wall clock) drained"), line
    assert printer.lag_text(hour("14")) == "ahead (generator clock)"
    assert printer.lag_text(hour("13")) == "14m50s (generator clock)"
    assert not re.search(r" -\d", line + printer.lag_text(hour("14")))
    # the marker delay is the manifest's, on the wall clock, not the generator's
    ahead = ProgressPrinter("click", lambda: wall, event_clock=lambda: wall + 3 * 3_600_000)
    assert ahead.marker_line(_manifest("2026-11-21T14:02:00", "watermark")).endswith(
        "  marker delay (wall clock) 2m")
