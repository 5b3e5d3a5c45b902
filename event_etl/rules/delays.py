"""Marker delay and watermark lag as every command says them: one definition, one clock, never negative.

**Marker delay** is the manifest's: when the ``_COMPLETE`` marker was written (``completed_at``) minus the end of
its hour, both on the wall clock (:attr:`event_etl.rules.manifest.Manifest.marker_delay_ms`).  The run's
``COMPLETE`` line, ``event-etl hours``, ``event-etl wait`` and the graphs all show that figure, under the name
:data:`MARKER_DELAY_NAME`.  A marker written before its hour ended by the wall clock has no delay to show:

- ``drained``: a drain closed the hour (the manifest's ``closed_by`` is ``drain``): the job was stopped for good
  and marked the open hour at once;
- ``ahead``: the hour's event time runs ahead of the wall clock (a generator's clock, as in the demo, or a
  source whose clocks are fast), so its watermark passed the hour's end before the wall clock did.

**Watermark lag** is "now" minus the watermark; a watermark ahead of now (after a drain, or with a generator's
clock) has no lag: ``ahead``.

Pure: no clock is read here.
"""

from __future__ import annotations

from event_etl.timeutil import format_duration

__all__ = ["MARKER_DELAY_NAME", "AHEAD", "DRAINED", "marked_early", "marker_delay_text", "lag_text"]

MARKER_DELAY_NAME = "marker delay (wall clock)"
"""The name of the figure wherever it is printed: a column's heading, a progress line's label."""

AHEAD = "ahead"
DRAINED = "drained"


def marked_early(delay_ms: int | None, closed_by: str | None = None) -> str | None:
    """Why a marker was written before its hour ended by the wall clock (:data:`DRAINED` or :data:`AHEAD`); None for
    a marker written after it (a delay to show) or no marker."""
    if delay_ms is None or delay_ms >= 0:
        return None
    return DRAINED if closed_by == "drain" else AHEAD


def marker_delay_text(delay_ms: int | None, closed_by: str | None = None) -> str:
    """``2m07s``, ``drained``, ``ahead``, or ``-`` for no marker: never a negative duration."""
    if delay_ms is None:
        return "-"
    return marked_early(delay_ms, closed_by) or format_duration(delay_ms)


def lag_text(lag_ms: int | None) -> str:
    """``3m12s``, ``ahead`` for a watermark ahead of now, or ``-`` when it is not known: never a negative duration."""
    if lag_ms is None:
        return "-"
    return AHEAD if lag_ms < 0 else format_duration(lag_ms)
