"""What a bus keeps in its folder (``bus.json``): where the source let go, so that a type new to the bus never
starts before it, whichever of the bus's types opens first."""

from __future__ import annotations

import json

from event_etl.bus.session import BUS_STATE_FORMAT, Bus
from event_etl.rules.routing import BusPlan, Route, bus_id
from event_etl.sources.face import SourceSession

SUB = "pubsub:projects/my-project/subscriptions/datahub"


class _Log(SourceSession):
    """A source whose beginning stays at 0 however much it let go of (as a spool's log before it is read again)."""

    def __init__(self) -> None:
        self.commits: list[int] = []

    def initial_offset(self):
        return {"spool": 0, "seg": 0}

    def prepare_available_now(self) -> None:
        pass

    def offer(self, start, cap, *, now):
        return start

    def splits(self, start, end):
        return []

    def commit(self, end) -> None:
        self.commits.append(end["seg"])

    def activity(self):
        return None


def _plan(*names: str) -> BusPlan:
    return BusPlan(SUB, bus_id(SUB), tuple((n, Route("attribute", "type", (n,))) for n in names))


def test_a_type_added_later_starts_where_the_source_let_go_even_when_it_opens_first(tmp_path):
    state = tmp_path / "_bus" / "x" / "bus.json"
    first = Bus(_plan("a", "b"), _Log(), str(state))
    for n in "ab":
        first.view(n).initial_offset()
        first.view(n).commit({"spool": 0, "seg": 5})
    assert json.loads(state.read_text()) == {"format": BUS_STATE_FORMAT, "bus": bus_id(SUB),
                                             "released": {"spool": 0, "seg": 5}}
    # the next run, with a type added: the new type's lane opens before the others said where they stand
    again = Bus(_plan("a", "b", "c"), _Log(), str(state))
    assert again.view("c").initial_offset() == {"spool": 0, "seg": 5}, "never before what the source let go of"


def test_the_first_type_of_a_new_bus_starts_at_the_sources_beginning(tmp_path):
    bus = Bus(_plan("a"), _Log(), str(tmp_path / "bus.json"))
    assert bus.view("a").initial_offset() == {"spool": 0, "seg": 0}
