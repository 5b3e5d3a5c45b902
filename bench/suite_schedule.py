"""How the whole suite's tests fall on 2 xdist workers: xdist's own schedulers driven over the suite's items.

    .venv/bin/python bench/suite_schedule.py [--unit-seconds 400] [--other-integration-seconds 765]

It collects the suite (``pytest --collect-only``), gives each test an estimated duration (the campaigns' and
``SLOW_MODULES``' figures of integration/conftest.py spread over their tests; the rest of the unit tests and the
rest of the integration tests share the totals given), runs xdist's ``LoadScheduling`` (``--dist load``, what
``bin/test`` uses; ``simulate`` takes ``loadscope`` too) over the order integration/conftest.py makes and over
collection order (the campaigns at the chunks' starts, as before issue 49 item 7), with workers that run their
items one by one as xdist's do (the last one only once more come or the worker is shut down), and prints the wall
time of each.  A module-scoped fixture costs again on a second worker (``FIXTURE``).  Figures, not a test: the
durations are estimates; what it shows is where the order sends the long tests.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import xdist.scheduler.load as load  # noqa: E402
import xdist.scheduler.loadscope as loadscope  # noqa: E402

from integration import conftest  # noqa: E402

CAMPAIGNS = {conftest.LONGEST[0]: 310.0, conftest.LONGEST[1]: 200.0}  # after issue 49 item 7, on a loaded machine
FIXTURE = {"integration/test_cluster.py": 30.0, "integration/test_consumer_install.py": 40.0,
           "integration/test_upgrade.py": 20.0}


class _Node:
    def __init__(self, k: int) -> None:
        self.k, self.queue, self.shutting_down, self.seen = k, [], False, set()
        self.gateway = types.SimpleNamespace(id=f"gw{k}")

    def send_runtest_some(self, indexes) -> None:
        self.queue += list(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return f"gw{self.k}"


def simulate(order: list[str], duration, dist: str) -> list[float]:
    load.parse_tx_spec_config = loadscope.parse_tx_spec_config = lambda config: [0, 0]
    config = types.SimpleNamespace(getoption=lambda name: None, getvalue=lambda name: None,
                                   option=types.SimpleNamespace(loadscopereorder=False))
    sched = (load.LoadScheduling if dist == "load" else loadscope.LoadScopeScheduling)(config)
    sched.log = lambda *a: None
    nodes = [_Node(0), _Node(1)]
    for n in nodes:
        sched.add_node(n)
    for n in nodes:
        sched.add_node_collection(n, order)
    sched.schedule()
    clock, busy, events = [0.0, 0.0], [False, False], []

    def start(k: int) -> None:
        n = nodes[k]
        if not busy[k] and n.queue and (len(n.queue) >= 2 or n.shutting_down):
            i = n.queue.pop(0)
            module = order[i].split("::")[0]
            d = duration(order[i]) + (FIXTURE.get(module, 0.0) if module not in n.seen else 0.0)
            n.seen.add(module)
            busy[k] = True
            heapq.heappush(events, (clock[k] + d, k, i, d))

    for k in range(2):
        start(k)
    while events:
        now, k, i, d = heapq.heappop(events)
        clock[k], busy[k] = now, False
        sched.mark_test_complete(nodes[k], i, d)
        for j in range(2):
            if not busy[j]:
                clock[j] = max(clock[j], now)
            start(j)
    return clock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unit-seconds", type=float, default=400.0, help="all of tests/ together")
    ap.add_argument("--other-integration-seconds", type=float, default=765.0,
                    help="integration/ but the campaigns and SLOW_MODULES, together")
    args = ap.parse_args()
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests",
                          "integration"], cwd=ROOT, capture_output=True, text=True).stdout
    ids = [line.strip() for line in out.splitlines() if "::" in line]
    module = {i: i.split("::")[0] for i in ids}
    count = collections.Counter(module.values())
    slow = conftest.SLOW_MODULES
    units = sum(1 for i in ids if i.startswith("tests/"))
    others = sum(1 for i in ids if i.startswith("integration/") and i not in CAMPAIGNS and module[i] not in slow)

    def duration(i: str) -> float:
        if i in CAMPAIGNS:
            return CAMPAIGNS[i]
        if module[i] in slow:
            return slow[module[i]] / count[module[i]]
        return (args.other_integration_seconds / others) if i.startswith("integration/") else args.unit_seconds / units

    items = [types.SimpleNamespace(nodeid=i) for i in ids]
    new = [x.nodeid for x in conftest._order(items, max(len(ids) // 2 // 4, 2), 2)]
    old = [i for i in ids if i not in CAMPAIGNS]
    for k, n in enumerate(reversed(conftest.LONGEST)):  # before: the campaigns at the first chunks' starts
        old.insert(min(k * max(len(ids) // 8, 2), len(old)), n)
    total = sum(duration(i) for i in ids)
    print(f"{len(ids)} tests, {total:,.0f} s of test time: {total / 2:,.0f} s on 2 workers at best")
    for name, order, dist in (("collection order, campaigns first (before)", old, "load"),
                              ("integration/conftest.py's order (after)", new, "load")):
        clock = simulate(order, duration, dist)
        print(f"  {name:<52} {max(clock):7,.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
