"""The controller's steps are collaborators (issue 49 item 2): each works on what it is given at construction and
per call, not on the controller's attributes; the guard and listeners a job sets after construction still reach
them.  On the real executor and controller, on local disk (:class:`tests.lib.harness.LocalPipeline`)."""

from __future__ import annotations

import pytest

from event_etl.errors import EventEtlError
from event_etl.job.context import TypeContext
from event_etl.job.markers import MarkerWriter
from event_etl.job.merges import Merger
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.manifest import Manifest
from tests.lib.harness import FakeClock, LocalPipeline, click, hour, make_event_type, t


def _marker(p: LocalPipeline, h: int) -> Manifest | None:
    path = p.sink / hour_dir("click", h) / MARKER_NAME
    return Manifest.from_bytes(path.read_bytes()) if path.exists() else None


def test_a_marker_writer_marks_an_hour_from_what_it_is_given(tmp_path):
    """Built alone over a job's sink and checkpoint, a marker writer (and the merger it merges with) marks the hour a
    batch filled from its ledger: the state to mark is all it needs of the job."""
    et = make_event_type(tmp_path / "types", "click")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    p.batch([click("a", "13:05"), click("b", "13:20")])
    state = p.controller.state
    assert _marker(p, hour("13")) is None and state.marked_through is None

    guarded, events = [], []
    ctx = TypeContext(event_type=et, storage=p.storage, checkpoint=p.ckpt, clock=clock,
                      guard=lambda: guarded.append(1), emit=lambda kind, payload: events.append(kind))
    merger = Merger(ctx)
    markers = MarkerWriter(ctx, merger=merger)
    new, marked = markers.mark(state.with_watermark(t("14:00")), t("14:01"), "drain")

    assert [m.hour for m in marked] == [hour("13")] and new.marked_through == hour("13")
    m = _marker(p, hour("13"))
    assert m is not None and m.records == 2 and m.extra["closed_by"] == "drain"
    assert {f.name for f in m.files} == {e.name for e in p.ckpt.read_ledger(hour("13"))}
    assert guarded, "it asked the guard it was given before writing"
    assert markers.written_after(state) == [m], "a restart finds it as written after the saved state"


class LeaseLost(EventEtlError):
    pass


def test_a_guard_set_after_construction_stops_the_marker_step(tmp_path):
    """A job sets the controller's guard after building it (the lease it holds): the marker step asks that guard, so
    a job that lost its lease during a batch writes no marker and saves no state; the batch is pending."""
    et = make_event_type(tmp_path / "types", "click")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    p.batch([click("a", "13:05")])
    asked = []

    def lease(n: int = 1) -> None:  # held when the batch begins, lost by the time its markers are written
        asked.append(1)
        if len(asked) > n:
            raise LeaseLost("the lease is lost", fix="start the job again")

    p.controller.guard = lease
    clock.now = t("14:20")
    with pytest.raises(LeaseLost):
        p.batch([click("b", "14:10")])  # completes hour 13
    assert _marker(p, hour("13")) is None
    assert p.controller.state.last_batch_id == 0 and p.controller.pending_batch == 1


def test_listeners_added_after_construction_hear_the_steps(tmp_path):
    """Listeners a job adds after building the controller (progress, metrics) hear the markers and merges its steps
    make."""
    et = make_event_type(tmp_path / "types", "click", max_events_per_file=2)
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp_path, et, clock)
    heard = []
    p.controller.listeners.append(lambda kind, payload: heard.append(kind))
    for i in range(3):  # small files of one open hour: a rolling merge once they could fill a file
        clock.now = t("13:10") + i * 60_000
        p.batch([click(f"a{i}", f"13:{10 + i:02d}")])
    clock.now = t("14:20")
    p.batch([click("b", "14:10")])
    assert "merged" in heard and "marker" in heard and heard.count("batch") == 4
    assert p.controller.merges == heard.count("merged")
