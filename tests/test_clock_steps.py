"""A step of the wall clock (NTP correcting a wrong clock, an operator's ``date -s``) must not close hours early.

The idle rule measures how long the source has been quiet on the monotonic clock: a forward
step of two hours while the source is quiet for two real minutes advances the watermark by
two minutes' worth, not by two hours; a backward step moves nothing back.  The step is seen,
printed and counted.  The real executor and controller, without Spark (tests.lib.harness)."""

from __future__ import annotations

import io

from event_etl.job.idle import IdleClock
from event_etl.job.progress import ProgressPrinter
from event_etl.rules.watermark import SourceActivity, clock_step, quiet_start
from tests.lib.harness import FakeClock, LocalPipeline, click, hour, make_event_type, read_sink, t

MINUTE = 60_000


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pipeline(tmp_path, mono: Monotonic):
    et = make_event_type(tmp_path / "types", out_of_orderness="2m", idle_timeout="1m")
    p = LocalPipeline(tmp_path, et, FakeClock(t("12:29")))
    p.controller.idle = IdleClock(clock=p.clock, monotonic=mono, watermark=p.controller.state.watermark,
                                  emit=p.controller.idle.emit)  # the idle timers of a job whose clock is `mono`
    # a source that reports, at every look, that it is quiet (no backlog, no outage)
    p.controller.idle.source_activity = lambda: SourceActivity(updated_at=p.clock.now)
    p.clock.now, mono.now = t("12:30"), mono.now + 60  # the job ran a minute before its first batch
    p.controller.tick()
    return p


def _pass(p, mono, *, wall_ms: int, mono_s: float, ticks: int = 4) -> None:
    """Let ``wall_ms`` of wall time and ``mono_s`` of monotonic time pass, in a few ticks."""
    for _ in range(ticks):
        p.clock.now += wall_ms // ticks
        mono.now += mono_s / ticks
        p.controller.tick()


def test_a_forward_step_of_the_wall_clock_while_the_source_is_quiet_closes_no_hour(tmp_path):
    mono = Monotonic()
    p = _pipeline(tmp_path, mono)
    lines = []
    p.controller.listeners.append(ProgressPrinter("click", p.clock, out=(out := io.StringIO())))
    p.controller.listeners.append(lambda kind, payload: lines.append((kind, payload)))
    p.batch([click("a", "12:25"), click("b", "12:29")])
    before = p.controller.state.watermark
    assert before == t("12:27")
    p.clock.now += 2 * 3600_000  # NTP steps the clock two hours ahead
    _pass(p, mono, wall_ms=2 * MINUTE, mono_s=120.0)  # two real minutes of quiet
    assert p.controller.state.watermark <= before + MINUTE, "advanced by the quiet time beyond idle_timeout only"
    assert p.controller.state.marked_through is None, "hour 12 is not closed by a step of the clock"
    assert not any(hc.marker for hc in read_sink(p.sink, "click").values())
    assert p.controller.idle.clock_steps == 1
    assert [v for k, v in lines if k == "clock_step"] == [2 * 3600_000]
    assert "clock step: the wall clock jumped +2h" in out.getvalue()
    # the rest of hour 12 comes and is timely
    ev = p.batch([click("c", "12:40")])
    assert ev.result.counts == {"timely": 1}


def test_a_backward_step_moves_nothing_and_quiet_time_still_runs_on_the_monotonic_clock(tmp_path):
    mono = Monotonic()
    p = _pipeline(tmp_path, mono)
    p.batch([click("a", "12:29")])
    wm = p.controller.state.watermark
    p.clock.now -= 3600_000  # a step back
    _pass(p, mono, wall_ms=30_000, mono_s=30.0)
    assert p.controller.state.watermark == wm and p.controller.idle.clock_steps == 1
    _pass(p, mono, wall_ms=40 * MINUTE, mono_s=40 * 60.0)  # 40 real minutes of quiet: the idle rule goes on
    assert p.controller.state.watermark >= wm + 38 * MINUTE
    assert p.controller.state.marked_through == hour("12")


def test_without_a_step_the_idle_rule_is_unchanged(tmp_path):
    mono = Monotonic()
    p = _pipeline(tmp_path, mono)
    p.batch([click("a", "12:29")])
    _pass(p, mono, wall_ms=10 * MINUTE, mono_s=600.0, ticks=10)
    assert p.controller.state.watermark == t("12:27") + 9 * MINUTE
    assert p.controller.idle.clock_steps == 0


def test_the_pure_rules():
    # the wall gap is trusted only up to the monotonic time since the last look
    assert quiet_start(t("12:00"), t("14:00"), mono_now=500.0, mono_last_look=380.0) == 380.0
    assert quiet_start(t("12:00"), t("12:01"), mono_now=500.0, mono_last_look=380.0) == 440.0
    assert quiet_start(t("12:05"), t("12:00"), mono_now=500.0, mono_last_look=380.0) == 500.0, "a step back"
    assert clock_step(t("12:00"), 100.0, t("14:00"), 102.0) == 2 * 3600_000 - 2000
    assert clock_step(t("12:00"), 100.0, t("12:00") + 1500, 101.0) == 0, "within the tolerance"
    assert clock_step(t("12:00"), 100.0, t("11:00"), 101.0) == -3600_000 - 1000
