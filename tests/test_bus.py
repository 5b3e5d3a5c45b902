"""A bus's rules (event_etl.rules.routing) and its shared session (event_etl.bus.session), on plain values: which types
form a bus and what is refused, which type a message goes to, where each type's batch ends and what the source may
let go of."""

from __future__ import annotations

import json

import pytest

from event_etl.bus.session import Bus, behind, earliest
from event_etl.errors import ConfigError
from event_etl.rules.routing import BusPlan, Route, Router, Unclaimed, bus_id, plan_buses, route_of
from event_etl.sources.face import SourceSession
from event_etl.sources.splits import Split
from tests.lib.harness import make_event_type

SUB = "pubsub:projects/my-project/subscriptions/datahub"


def _route(values=None, by="attribute", key="type", name="x"):
    return route_of(name, attribute=key if by == "attribute" else None, field=key if by == "field" else None,
                    values=values)


def test_types_that_route_one_source_form_one_bus_each_claiming_its_name_by_default():
    plans = plan_buses([("a", SUB, _route(name="a")), ("b", SUB, _route(["bee", "b2"], name="b")),
                        ("c", "pubsub:projects/p/subscriptions/own", None)])
    assert len(plans) == 1
    (plan,) = plans
    assert plan.names == ["a", "b"] and plan.id == bus_id(SUB)
    router = plan.router()
    assert router.route(b"{}", {"type": "a"}) == "a"
    assert router.route(b"{}", {"type": "b2"}) == "b"
    assert router.route(b"{}", {"type": "c"}) == Unclaimed("attribute 'type' is 'c', which no type of the bus claims")
    assert router.route(b"{}", {}) == Unclaimed("no attribute 'type'")
    assert router.route(b"{}", None) == Unclaimed("no attribute 'type'")


def test_a_field_of_the_json_payload_routes_numbers_by_their_text_and_says_why_a_message_is_unclaimed():
    router = Router({"a": Route("field", "type", ("a",)), "b": Route("field", "type", ("2",))})
    assert router.route(b'{"type": "a", "x": 1}', {"type": "b"}) == "a", "the field decides, not an attribute"
    assert router.route(b'{"type": 2}', None) == "b"
    assert router.route(b'{"x": 1}', None) == Unclaimed("no field 'type'")
    assert router.route(b"[1]", None) == Unclaimed("not a JSON object (field 'type' routes this bus)")
    assert router.route(b"\xff", None) == Unclaimed("not a JSON object (field 'type' routes this bus)")
    assert router.route(b'{"type": {"k": 1}}', None) == Unclaimed("field 'type' is not a string, a number or a "
                                                                   "boolean")


@pytest.mark.parametrize(("types", "words"), [
    ([("a", SUB, "attr"), ("b", SUB, None)], ["b and a read", "give b the same route_attribute"]),
    ([("a", SUB, "attr"), ("b", SUB, "field")], ["route it differently", "attribute 'type'", "field 'type'"]),
    ([("a", SUB, ("attr", ["x"])), ("b", SUB, ("attr", ["x", "y"]))], ["a and b both claim attribute 'type' = 'x'",
                                                                       "change route_value of b"]),
    ([("a", "dir:/tmp/in", "attr")], ["which is not a bus", "pubsub:"]),
])
def test_what_cannot_be_one_bus_is_refused_naming_the_types_and_the_fix(types, words):
    def rule(spec, name):
        if spec is None:
            return None
        kind, values = spec if isinstance(spec, tuple) else (spec, None)
        return _route(values, by="attribute" if kind == "attr" else "field", name=name)

    with pytest.raises(ConfigError) as err:
        plan_buses([(n, s, rule(spec, n)) for n, s, spec in types], files={"a": "A/etl.toml", "b": "B/etl.toml"})
    text = str(err.value) + (err.value.fix or "")
    for w in words:
        assert w in text, text
    assert "/etl.toml" in str(err.value)


def test_a_types_settings_route_it_and_refuse_half_a_rule(tmp_path):
    et = make_event_type(tmp_path, "orders", source=SUB, route_attribute="service", route_value=["orders", "o"])
    assert et.route == Route("attribute", "service", ("orders", "o"))
    assert make_event_type(tmp_path, "plain").route is None
    with pytest.raises(ConfigError, match="route_value is set without"):
        make_event_type(tmp_path, "half", route_value="x")
    with pytest.raises(ConfigError, match="both set"):
        make_event_type(tmp_path, "both", route_attribute="a", route_field="b")
    with pytest.raises(ConfigError, match="a string or a list of strings"):
        make_event_type(tmp_path, "bad", route_attribute="a", route_value=3)


def test_bus_ids_are_stable_safe_folder_names():
    assert bus_id(SUB) == bus_id(SUB)
    assert bus_id(SUB).startswith("datahub-") and bus_id(SUB) != bus_id(SUB + "2")
    assert "/" not in bus_id("kafka:some/topic:x") and ":" not in bus_id("kafka:some/topic:x")


def test_offsets_order_the_way_each_source_reads():
    assert behind({"spool": 0, "seg": 3}, {"spool": 0, "seg": 5})
    assert not behind({"spool": 0, "seg": 5}, {"spool": 0, "seg": 5})
    k = {"topic": "t", "topic_id": "i", "partitions": {"0": 5, "1": 7}}
    assert behind({**k, "partitions": {"0": 5, "1": 6}}, k)
    assert not behind({**k, "partitions": {"0": 6, "1": 6}}, k), "ahead on one partition: not behind"
    assert earliest([{"spool": 0, "seg": 4}, {"spool": 0, "seg": 2}]) == {"spool": 0, "seg": 2}
    low = earliest([k, {**k, "partitions": {"0": 2, "1": 9, "2": 4}, "begin": {"2": 0}}])
    assert low["partitions"] == {"0": 2, "1": 7}, "each partition at its least; one a type never read, left out"
    assert "begin" not in low


class _Spool(SourceSession):
    """A source whose offsets are positions in a log that grows by ``available``; records offers and commits."""

    def __init__(self) -> None:
        self.available = 0
        self.offers: list[int] = []
        self.caps: list[int | None] = []
        self.commits: list[int] = []

    def initial_offset(self):
        return {"spool": 0, "seg": 0}

    def prepare_available_now(self) -> None:
        pass

    def offer(self, start, cap, *, now):
        self.offers.append(start["seg"])
        self.caps.append(cap)
        return {"spool": 0, "seg": self.available if cap is None else min(self.available, start["seg"] + cap)}

    def splits(self, start, end):
        return [Split(0, "seg", "", 0, end["seg"] - start["seg"], 0, json.dumps([start["seg"], end["seg"]]))]

    def commit(self, end) -> None:
        self.commits.append(end["seg"])

    def activity(self):
        return None


def _bus(*names):
    src = _Spool()
    plan = BusPlan(SUB, bus_id(SUB), tuple((n, Route("attribute", "type", (n,))) for n in names))
    return Bus(plan, src), src


def _seg(n):
    return {"spool": 0, "seg": n}


def test_caught_up_types_share_one_offer_and_the_same_splits_per_round():
    bus, src = _bus("a", "b", "c")
    starts = {n: bus.view(n).initial_offset() for n in "abc"}
    src.available = 10
    ends = {n: bus.view(n).offer(starts[n], None, now=1) for n in "abc"}
    assert src.offers == [0], "the source asked once for the round"
    assert ends == {n: _seg(10) for n in "abc"}
    assert bus.splits(_seg(0), _seg(10)) is bus.splits(_seg(0), _seg(10)), "one list of splits for every type"


def test_a_round_of_the_bus_reads_up_to_each_types_cap_times_its_types():
    """--max-events-per-batch bounds each type's batch: three types of a bus read three caps' worth in a round (each
    gets about its cap), as three topics of their own would, not a third of it each."""
    bus, src = _bus("a", "b", "c")
    starts = {n: bus.view(n).initial_offset() for n in "abc"}
    src.available = 1_000
    ends = {n: bus.view(n).offer(starts[n], 100, now=1) for n in "abc"}
    assert src.caps == [300] and ends == {n: _seg(300) for n in "abc"}


def test_a_type_behind_the_bus_catches_up_without_asking_the_source():
    bus, src = _bus("a", "b")
    a, b = bus.view("a"), bus.view("b")
    a.commit(_seg(4))  # where each stood when the run began (a's lane read its commit log)
    b.commit(_seg(2))
    src.available = 8
    assert a.offer(_seg(4), None, now=1) == _seg(8)
    assert b.offer(_seg(2), None, now=1) == _seg(8), "b reads up to where the bus is"
    assert src.offers == [4]
    src.available = 12
    assert a.offer(_seg(8), None, now=2) == _seg(12) == b.offer(_seg(8), None, now=2)
    assert src.offers == [4, 8]


def test_the_source_lets_go_only_of_what_every_type_committed():
    bus, src = _bus("a", "b", "c")
    for n in "abc":
        bus.view(n).initial_offset()
    src.available = 5
    bus.view("a").commit(_seg(5))
    bus.view("b").commit(_seg(5))
    assert max(src.commits, default=0) == 0, "c (quarantined, say) has not committed: the spool keeps its messages"
    bus.view("c").commit(_seg(5))
    assert src.commits[-1] == 5
    bus.view("a").commit(_seg(9))
    assert src.commits[-1] == 5, "nothing more until the others pass it"


def test_the_session_stops_once_its_last_type_stopped():
    bus, src = _bus("a", "b")
    stopped = []
    src.stop = lambda: stopped.append(True)  # type: ignore[method-assign]
    a, b = bus.view("a"), bus.view("b")
    a.stop()
    a.stop()
    assert not stopped
    b.stop()
    assert stopped == [True] and bus.closed


def test_a_split_several_types_of_a_bus_read_in_a_round_is_one_row_of_the_job():
    """Read once: the engine's job gets one row for a bus's split that its caught-up types share, each other split
    (a type behind the bus, a type of no bus) a row of its own."""
    from types import SimpleNamespace

    from event_etl.job.engine import Engine
    from event_etl.task.executor import bus_row

    bus, _ = _bus("a", "b", "c")
    engine = Engine.__new__(Engine)
    engine.lanes = {n: SimpleNamespace(session=bus.view(n)) for n in "abc"}
    engine.lanes["solo"] = SimpleNamespace(session=_Spool())
    shared, own = Split(0, "seg", "", 0, 10, 0, "[0, 10]"), Split(0, "seg", "", 0, 4, 0, "[6, 10]")
    work = {"a": (None, [shared]), "b": (None, [shared]), "c": (None, [own]), "solo": (None, [shared])}
    rows, buses = Engine._rows(engine, work)
    assert sorted(rows) == sorted([(bus_row(bus.id, ["a", "b"]), shared.as_row()),
                                   (bus_row(bus.id, ["c"]), own.as_row()), ("solo", shared.as_row())])
    assert list(buses) == [bus.id]


def test_check_shows_each_bus_and_refuses_a_value_claimed_twice_with_the_fix(tmp_path):
    from click.testing import CliRunner

    from event_etl.cli import main

    types = tmp_path / "types"
    make_event_type(types, "orders", source=SUB, route_attribute="service")
    make_event_type(types, "refunds", source=SUB, route_attribute="service", route_value=["refunds", "chargebacks"])
    make_event_type(types, "alone", source="pubsub:projects/my-project/subscriptions/own")
    res = CliRunner().invoke(main, ["check", "--event-types", str(types)])
    assert res.exit_code == 0, res.output
    assert "route     claims attribute 'service' = 'refunds', 'chargebacks'" in res.output
    assert f"bus {bus_id(SUB)}: {SUB} read once for 2 type(s)" in res.output
    assert f"<sink>/_unclaimed/{bus_id(SUB)}/" in res.output
    make_event_type(types, "payments", source=SUB, route_attribute="service", route_value="orders")
    res = CliRunner().invoke(main, ["check", "--event-types", str(types)])
    assert res.exit_code == 2, res.output
    assert "orders and payments both claim attribute 'service' = 'orders'" in res.output
    assert "fix: each value belongs to one type" in res.output


def test_a_type_that_gets_nothing_from_a_busy_bus_is_quiet_once_the_bus_is_caught_up():
    """The bus delivers every round (to its busy types); a type of it with no events of its own must still close its
    hours by its idle rule: quiet counts from its own last records, and only while the bus has no backlog."""
    from event_etl.rules.watermark import SourceActivity, quiet_since

    bus, src = _bus("busy", "idle")
    src.activity = lambda: SourceActivity(updated_at=1_000_000, delivered_at=999_000)  # type: ignore[method-assign]
    idle = bus.view("idle")
    got = idle.activity()
    assert got is not None and got.delivered_at is None and got.updated_at == 1_000_000
    assert quiet_since(400_000, got, now=1_000_500, stale_after=30_000) == 400_000, "quiet since its own last input"
    src.activity = lambda: SourceActivity(updated_at=1_000_000, backlog=5)  # type: ignore[method-assign]
    assert quiet_since(400_000, idle.activity(), now=1_000_500, stale_after=30_000) == 1_000_500, \
        "a bus with a backlog is not quiet for any of its types"


def test_a_topic_pattern_is_a_bus_whose_types_claim_topics_by_name():
    from event_etl.sources.kafka_pattern import matching_topics

    assert matching_topics(["cdc.shop.orders", "cdc.shop.refunds", "cdc.shopx.a", "__consumer_offsets", "other"],
                           r"cdc\.shop\..*") == ["cdc.shop.orders", "cdc.shop.refunds"]
    src = r"kafka:re:cdc\.shop\..*"
    orders = route_of("orders", attribute=None, field=None, values=["cdc.shop.orders"], source=src)
    refunds = route_of("refunds", attribute=None, field=None, values=None, source=src)
    assert orders == Route("topic", "topic", ("cdc.shop.orders",)) and refunds == Route("topic", "topic", ("refunds",))
    (plan,) = plan_buses([("orders", src, orders), ("refunds", src, refunds)])
    router = plan.router()
    assert router.route(b"{}", {}, "cdc.shop.orders") == "orders"
    assert router.route(b"{}", {}, "cdc.shop.audit") == Unclaimed("topic is 'cdc.shop.audit', which no type of the "
                                                                  "bus claims")
    p = {"pattern": "x", "topics": {"a": {"topic": "a", "partitions": {"0": 3}}}}
    q = {"pattern": "x", "topics": {"a": {"topic": "a", "partitions": {"0": 5}},
                                    "b": {"topic": "b", "partitions": {"0": 1}}}}
    assert behind(p, q) and not behind(q, p)
    assert earliest([p, q]) == {"pattern": "x", "topics": {"a": {"topic": "a", "partitions": {"0": 3}}}}


@pytest.mark.parametrize(("url", "words"), [("kafka:re:", "names no pattern"), ("kafka:re:(", "not a regular")])
def test_a_topic_pattern_that_cannot_be_read_is_refused_with_the_fix(url, words, monkeypatch):
    from event_etl.errors import UsageError
    from event_etl.sources import parse_source

    monkeypatch.setenv("EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    with pytest.raises(UsageError, match=words) as err:
        parse_source(url, now=0)
    assert err.value.fix


def test_an_unclaimed_message_keeps_its_attributes_and_a_type_added_later_claims_it_by_them():
    from event_etl.rules.routing import claimed_by, detail_attributes, with_attributes

    detail = with_attributes("attribute 'type' is 'refunds', which no type of the bus claims",
                             {"type": "refunds", "note": "a; attributes {x}"})
    assert detail_attributes(detail) == {"type": "refunds", "note": "a; attributes {x}"}
    assert with_attributes("no attribute 'type'", {}) == "no attribute 'type'"
    assert detail_attributes("no attribute 'type'") == {}
    assert claimed_by(Route("attribute", "type", ("refunds",)), b"{}", detail, "msg:1")
    assert not claimed_by(Route("attribute", "type", ("orders",)), b"{}", detail, "msg:1")
    assert claimed_by(Route("field", "kind", ("refunds",)), b'{"kind": "refunds"}', "no field", "msg:1")
    assert claimed_by(Route("topic", "topic", ("cdc.shop.audit",)), b"{}", "", "kafka:cdc.shop.audit/1@77")
    assert not claimed_by(Route("topic", "topic", ("cdc.shop.audit",)), b"{}", "", "msg:1")


def test_the_bus_counts_unclaimed_messages_once_on_the_metric_of_its_first_type():
    from event_etl.metrics.exporters import PrometheusEndpoint
    from event_etl.metrics.job import JobMetrics
    from tests.lib.harness import FakeClock
    from tests.lib.metrics import value

    bus, _ = _bus("a", "b")
    prom = PrometheusEndpoint()
    metrics = JobMetrics("a", clock=FakeClock(0), exports=[prom])
    bus.listen(lambda n: metrics.count_unclaimed(bus.id, n))
    assert value(prom.text(), "event_etl_bus_unclaimed_records_total", event_type="a", bus=bus.id) == 0
    bus.note_unclaimed(3)
    bus.note_unclaimed(4)
    assert value(prom.text(), "event_etl_bus_unclaimed_records_total", event_type="a", bus=bus.id) == 7
    assert bus.unclaimed == 7
    metrics.shutdown()


def test_an_unclaimed_message_is_kept_once_however_its_range_is_cut_and_however_often_it_comes(tmp_path, monkeypatch):
    """The bus campaign (issue 59 item 6, RELIABILITY.md): a type that was behind the bus (quarantined) caught up over
    a range the others had read in two rounds, cut otherwise, and the unclaimed messages in it were kept again (a
    file was named by its split); a Pub/Sub redelivery of an unclaimed message came as a message of another split.
    Now each is a file of its own named by the message: every read writes the same file once, counted once."""
    import fastavro

    from event_etl.bus import task as bus_task
    from event_etl.storage import Storage
    from event_etl.task.executor import store_unclaimed

    def msg(i: int) -> tuple:
        attributes = {"type": "a"} if i % 3 == 0 else {"type": "refunds"} if i % 3 == 1 else {}
        return (json.dumps({"i": i}).encode(), 1_795_000_000_000 + i, "msg:", str(100 + i), (str(100 + i), attributes))

    class Reader:
        kind = "seg"

        def payloads(self, split, et):
            lo, hi = json.loads(split.meta)
            return iter([msg(i) for i in range(lo, hi)] + ([msg(4)] if split.start == 99 else []))

    monkeypatch.setattr("event_etl.sources.registry.split_reader", lambda kind: Reader())
    sink = Storage(str(tmp_path / "sink"))
    ctx = type("Ctx", (), {"fence": None, "sink": str(tmp_path / "sink"), "event_type": None})()
    router = Router({"a": Route("attribute", "type", ("a",))})

    def read(start: int, lo: int, hi: int, names=("a",)) -> int:
        split = Split(0, "seg", "", start, hi - lo, 0, json.dumps([lo, hi]))
        out = list(bus_task.process_bus_split(split, dict.fromkeys(names, ctx), router, "hub-1", lambda _: sink,
                                              process=lambda s, c, st, reader: ({"n": len(reader.items)}, b""),
                                              store_unclaimed=store_unclaimed))
        assert [o[0] for o in out] == [*names, ""]
        assert [o[3] for o in out] == [None] * len(out), "no type's processing failed"
        return int(out[-1][1]["unclaimed"])

    assert read(0, 0, 5) + read(0, 5, 10) == 6, "the rounds the caught-up types read: 6 of 10 claimed by no type"
    assert read(0, 0, 10) == 0, "a type behind the bus catching up over both rounds in one range keeps nothing again"
    assert read(99, 3, 6) == 0, "a redelivery of message 4 (a Pub/Sub message id read again) is not kept again"
    files = sorted((tmp_path / "sink" / "_unclaimed" / "hub-1").glob("dt=*/u-*.avro"))
    kept = [r for f in files for r in fastavro.reader(f.open("rb"))]
    assert sorted(r["source"] for r in kept) == [f"msg:{100 + i}" for i in range(10) if i % 3], "each once"
    assert {r["reason"] for r in kept} == {"unclaimed"}
