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


def test_a_checkpoint_with_offsets_goes_on_only_where_its_offsets_were_made(tmp_path):
    """Offsets are positions in a spool: a type that joins or leaves a bus, or whose bus's folder moved, would read
    another spool from them (skipping or repeating): refused with the fix; a checkpoint that read nothing yet may."""
    from types import SimpleNamespace

    import pytest

    from event_etl.errors import CheckpointMismatchError
    from event_etl.job.setup import _same_place

    spark = tmp_path / "ck" / "spark"
    p = SimpleNamespace(ckpt=SimpleNamespace(spark_dir=spark, root=tmp_path / "ck"),
                        event_type=SimpleNamespace(name="orders"))
    bus = {"id": "datahub-etl-1f0e47", "folder": str(tmp_path / "_bus" / "datahub-etl-1f0e47" / "pubsub")}
    _same_place(p, None, bus)  # nothing read yet: it may join
    (spark / "offsets").mkdir(parents=True)
    (spark / "offsets" / "0").write_text("v1\n{}\n{}")
    _same_place(p, bus, dict(bus))  # the same place
    with pytest.raises(CheckpointMismatchError) as err:
        _same_place(p, None, bus)
    assert "read its source on its own, and would now read bus datahub-etl-1f0e47" in str(err.value)
    assert "--drain" in (err.value.fix or "")
    with pytest.raises(CheckpointMismatchError):
        _same_place(p, bus, {**bus, "folder": "/elsewhere"})
    with pytest.raises(CheckpointMismatchError):
        _same_place(p, bus, None)
