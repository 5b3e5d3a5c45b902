"""The generator: deterministic by index, realistic shares, payloads that follow the schema."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from event_etl.eventtypes import load_event_types
from event_etl.rules.reasons import Reason
from event_etl.sources.generator import GeneratorParams, generate, parse_generator_params
from event_etl.task.payload import Decoder
from tests.harness import t

TYPES = load_event_types(Path(__file__).resolve().parent.parent / "event_types")


def params(**kw):
    return replace(GeneratorParams(start=t("10:00"), rate=1000, speedup=60), **kw)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_generated_events_follow_the_schema(name):
    et = TYPES[name]
    d = Decoder(et)
    p = params(out_of_order=0, late=0, too_late=0, future=0, invalid=0)
    for g in generate(et, p, 0, 300):
        good, rec, ms = d.decode(g.payload)
        assert good, (name, rec, ms, g.payload[:200])
        assert ms == g.event_time
        if et.id_field:
            assert str(rec[et.id_field]) == g.event_id


def test_avro_format_decodes(tmp_path):
    et = TYPES["page_view"]
    d = Decoder(et)
    for g in generate(et, params(format="avro", invalid=0, out_of_order=0, late=0, too_late=0, future=0), 0, 50):
        assert d.decode(g.payload)[0]


def test_same_index_same_bytes():
    et = TYPES["payment_authorization"]
    a = [g.payload for g in generate(et, params(), 100, 200)]
    b = [g.payload for g in generate(et, params(), 150, 200)]
    assert a[50:] == b


def test_arrival_follows_rate_and_speedup():
    p = params(rate=100, speedup=60)
    assert p.arrival(0) == t("10:00") and p.arrival(100) == t("10:01")


def test_shares_are_roughly_as_asked_and_invalid_ones_are_invalid():
    et = TYPES["page_view"]
    p = params(late=0.1, too_late=0.05, invalid=0.05, duplicate=0.05, future=0.02, out_of_order=0.1)
    gens = list(generate(et, p, 0, 4000))
    c = Counter(g.intent for g in gens)
    for intent, share in (("late", 0.1), ("too_late", 0.05), ("invalid", 0.05), ("duplicate", 0.05), ("future", 0.02)):
        assert abs(c[intent] / 4000 - share) < share * 0.3, (intent, c)
    d = Decoder(et)
    reasons = Counter()
    for g in gens:
        good, r, _ = d.decode(g.payload)
        if g.intent == "invalid":
            assert not good
            reasons[r] += 1
        else:
            assert good
    assert len(reasons) >= 4 and Reason.INVALID_UTF8 in reasons
    dups = [g for g in gens if g.intent == "duplicate"]
    originals = {g.payload for g in gens if g.intent != "duplicate"}
    assert all(g.payload in originals for g in dups)


def test_parse_params():
    p = parse_generator_params("rate=500,speedup=1,late=0.2,seed=7", now=t("13:20"))
    assert (p.rate, p.speedup, p.late, p.seed, p.start) == (500, 1, 0.2, 7, t("13:20"))
    demo = parse_generator_params("", now=t("13:20"))
    assert demo.speedup > 1 and demo.start == t("10:45")
    assert parse_generator_params("start=-1h,speedup=1", now=t("13:20")).start == t("12:20")
    for bad in ("rate=0", "late=2", "nope=1", "rate", "format=xml"):
        with pytest.raises(ValueError):
            parse_generator_params(bad, now=t("13:20"))


def test_a_producer_clock_8_minutes_fast_marks_no_hour_before_the_clock_passed_its_end(tmp_path):
    """The demo with `generate:fast_clock=0.3`: three events in ten are stamped 8 minutes ahead of their
    arrival.  They are accepted into their own hours, yet no hour is marked before the generator's clock
    (the arrivals) has passed its end."""
    import json

    from event_etl.sources.generate import GeneratorPlanner
    from tests.harness import FakeClock, LocalPipeline, read_sink

    et = TYPES["page_view"]
    p = params(rate=100, speedup=120, fast_clock=0.3, out_of_order=0, late=0, too_late=0, future=0, invalid=0,
               count=6000)
    planner = GeneratorPlanner(p, max_rows=200, clock=FakeClock(t("10:00")), tasks_per_batch=1)
    pipe = LocalPipeline(tmp_path, et, FakeClock(t("10:00")))
    gen = list(generate(et, p, 0, 6000))
    fast = [g for g in gen if g.intent == "fast_clock"]
    assert len(fast) > 1000 and all(g.event_time - g.arrival > 7 * 60_000 for g in fast)
    start, batch = planner.initial_offset(), 0
    while True:
        end = planner.latest_offset(start, None)
        if end == start:
            break
        splits = planner.splits(start, end)
        clock = gen[int(end["n"]) - 1].arrival  # the generator's clock when the batch ran
        pipe.clock.now = clock
        ev = pipe.controller.run_batch(batch, pipe.task_runner(splits))
        assert ev.result.counts.get("future", 0) == 0, "8 minutes ahead is within max_future_skew"
        for m in ev.marked:
            assert m.hour + 3_600_000 <= clock, f"hour {m.hour} marked at {clock}, before its end"
        start, batch = end, batch + 1
    content = read_sink(pipe.sink, "page_view", "event_id")
    written = {i for hc in content.values() for i in hc.timely + hc.late}
    assert {g.event_id for g in fast} <= written
    assert json.dumps(p.to_json())  # the parameters stay JSON (frozen in the offsets)
