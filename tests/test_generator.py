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
from tests.lib.harness import t

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
    gens = list(generate(et, p, 200_000, 204_000))  # 3h20m after the start: late events have hours to land in
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
    originals = {g.payload for g in generate(et, p, 199_900, 204_000) if g.intent != "duplicate"}  # up to 51 back
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
    from tests.lib.harness import FakeClock, LocalPipeline, read_sink

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


def test_no_event_opens_an_hour_before_the_generators_start():
    """A demo's first lines were markers of hours before the generator's start, holding a record or two: its
    out-of-order and late events of the first hours lay there.  They are drawn as timely ones now (version 2)."""
    et = TYPES["page_view"]
    p = params(start=t("10:45"), speedup=3600, late=0.2, out_of_order=0.3, too_late=0, future=0)
    assert p.version == 2
    got = list(generate(et, p, 0, 20_000))  # 20 hours of event time
    assert min(g.event_time for g in got if g.event_time is not None) >= t("10:00")
    assert Counter(g.intent for g in got)["late"] > 1000, "late events once the first hour is behind"
    old = replace(p, version=1)
    assert min(g.event_time for g in generate(et, old, 0, 2_000) if g.event_time is not None) < t("10:00")


def test_a_checkpoint_of_a_release_before_the_version_replays_the_same_bytes():
    """Parameters kept by an older release (no ``version``) draw as they did: a replay gives the same events."""
    et = TYPES["page_view"]
    p = params(start=t("10:45"), late=0.2)
    kept = {k: v for k, v in p.to_json().items() if k != "version"}
    again = GeneratorParams.from_json(kept)
    assert again.version == 1
    assert [g.payload for g in generate(et, again, 0, 500)] == \
        [g.payload for g in generate(et, replace(p, version=1), 0, 500)]
    assert GeneratorParams.from_json(p.to_json()) == p
    with pytest.raises(ValueError, match="unknown generator option 'version'"):
        parse_generator_params("version=1", t("10:00"))
