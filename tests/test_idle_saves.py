"""A quiet type's idle watermark is saved when it completes an hour, not at every tick (issue 58 item 3: a thousand
quiet types must not write their state every second), and a restart loses nothing by it."""

from __future__ import annotations

from event_etl.job.checkpoint import Checkpoint
from event_etl.job.controller import IDLE_SAVE_S
from event_etl.rules.watermark import SourceActivity
from event_etl.timeutil import MINUTE_MS
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, read_sink, t

SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}


def _quiet_pipeline(tmp_path):
    et = make_event_type(tmp_path / "types", **SETTINGS)
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:00")))
    p.clock.now = t("13:10")
    p.batch([click("a", "13:05")])
    p.controller.idle.source_activity = lambda: SourceActivity(p.clock.now)  # quiet: no backlog, no outage
    return p


def test_ticks_within_an_hour_keep_the_watermark_in_memory_and_save_it_every_30_s_or_when_an_hour_closes(tmp_path):
    p = _quiet_pipeline(tmp_path)
    saves = []
    real = p.ckpt.save_state
    p.ckpt.save_state = lambda st: saves.append(st.watermark) or real(st)
    p.clock.now = t("13:16")  # past the idle timeout: the watermark moves with the clock from here
    p.controller.tick()
    moved = p.controller.state.watermark
    assert moved is not None and moved > t("13:03")
    for _ in range(int(IDLE_SAVE_S) - 2):  # a tick a second, fewer than IDLE_SAVE_S of them
        p.clock.now += 1000
        p.controller.tick()
    assert p.controller.state.watermark > moved, "the watermark goes on moving, in memory"
    assert len(saves) <= 1, f"saved at {len(saves)} ticks"
    for _ in range(5):
        p.clock.now += 1000
        p.controller.tick()
    assert len(saves) >= 1 and Checkpoint(p.ckpt.root).load_state().watermark > moved, "saved within IDLE_SAVE_S"
    p.clock.now = t("14:20")  # quiet until the watermark passes 14:00: hour 13 closes, saved at once
    p.controller.tick()
    assert Checkpoint(p.ckpt.root).load_state().marked_through == t("13:00")
    assert read_sink(p.sink, p.et.name)[t("13:00")].marker is not None


def test_a_restart_after_unsaved_ticks_marks_nothing_early_and_loses_nothing(tmp_path):
    p = _quiet_pipeline(tmp_path)
    p.clock.now = t("13:16")
    for _ in range(10):
        p.clock.now += 1000
        p.controller.tick()
    in_memory = p.controller.state.watermark
    saved = Checkpoint(p.ckpt.root).load_state().watermark
    assert saved is not None and saved <= in_memory
    p.restart()  # the process dies here: the state on disk is the one saved
    assert p.controller.state.watermark == saved
    p.clock.now += MINUTE_MS
    ev = p.batch([click("b", "13:20")])
    assert ev.result.counts == {"timely": 1}
    assert read_sink(p.sink, p.et.name)[t("13:00")].marker is None, "no hour marked early"
