"""The order of the whole suite under xdist (integration/conftest.py): the longest tests start first, each campaign
on a worker of its own, and nothing is lost, repeated or torn from its module."""

from __future__ import annotations

from types import SimpleNamespace

from integration.conftest import LONGEST, SLOW_MODULES, _order


def _items(ids: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=i) for i in ids]


UNIT = [f"tests/test_{m}.py::test_{k}" for m in ("a", "b", "c") for k in range(12)]
SLOW = sorted(SLOW_MODULES, key=SLOW_MODULES.get)  # shortest first: the order must turn it round
INTEGRATION = ["integration/test_quick.py::test_1", "integration/test_quick.py::test_2",
               *(f"{m}::test_{k}" for m in SLOW for k in range(2)), *LONGEST, "integration/test_zzz.py::test_1"]


def _chunks(order: list[str], chunk: int, workers: int) -> list[list[str]]:
    """What xdist's load scheduler sends each worker first."""
    return [order[k * chunk:(k + 1) * chunk] for k in range(workers)]


def test_each_campaign_begins_a_workers_first_chunk_then_unit_tests_then_slow_modules_longest_first():
    items = _items(UNIT + INTEGRATION)
    chunk = len(items) // 2 // 4
    order = [i.nodeid for i in _order(items, chunk, 2)]
    assert sorted(order) == sorted(i.nodeid for i in items), "every test once"
    first = _chunks(order, chunk, 2)
    assert [c[0] for c in first] == list(LONGEST)
    assert all(n.startswith("tests/") for c in first for n in c[1:]), "quick tests behind a campaign"
    queue = order[2 * chunk:]
    # the unit tests first: xdist hands the front of the queue out in big batches, and the slow modules would all
    # go to one worker
    units = [k for k, n in enumerate(queue) if n.startswith("tests/")]
    assert units == list(range(len(units)))
    modules = [n.split("::")[0] for n in queue if n.split("::")[0] in SLOW_MODULES]
    assert modules == [m for m in sorted(SLOW_MODULES, key=lambda m: -SLOW_MODULES[m]) for _ in range(2)]
    assert queue[-1] == "integration/test_zzz.py::test_1", "short integration tests even out the workers' ends"


def test_without_enough_unit_tests_the_campaigns_still_start_on_different_workers():
    items = _items(INTEGRATION)
    chunk = max(len(items) // 2 // 4, 2)
    order = [i.nodeid for i in _order(items, chunk, 2)]
    assert sorted(order) == sorted(i.nodeid for i in items)
    assert [c[0] for c in _chunks(order, chunk, 2)] == list(LONGEST)
    # a slow module's tests stay together, in their order (module-scoped fixtures are set up once per worker)
    for m in SLOW_MODULES:
        at = [k for k, n in enumerate(order) if n.startswith(m + "::")]
        assert at == list(range(at[0], at[0] + len(at))), m
