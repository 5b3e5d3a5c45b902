"""Integration fixtures: one local SparkSession for the whole test session; and the order of the tests under xdist,
longest first, the two kill campaigns one on each pytest worker (:func:`pytest_collection_modifyitems`)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.lib.kafka_brokers import kafka_broker, noida  # noqa: F401 - fixtures are found by their name in a conftest
from tests.lib.pubsub_scenario import scenario  # noqa: F401 - fixtures are found by their name in a conftest
from tests.lib.registry_server import registry_server  # noqa: F401 - fixtures are found by their name in a conftest

LONGEST = ("integration/test_campaign.py::test_campaign_directory_source_to_local_disk",
           "integration/test_campaign.py::test_campaign_pubsub_to_gcs")
"""The two longest tests (~330 s and ~200 s on 2 cores): each starts first on a worker of its own."""

SLOW_MODULES = {
    "integration/test_pubsub_gcs.py": 150, "integration/test_upgrade.py": 140, "integration/test_signals.py": 130,
    "integration/test_storage_faults.py": 110, "integration/test_cluster.py": 110,
    "integration/test_airflow.py": 150, "integration/test_consumer_demo.py": 85, "integration/test_kafka_broker.py": 80,
    "integration/test_dialects.py": 60,  # 2026-11-29: five runs (three as a fleet in-process, two subprocesses)
}
"""Integration modules that take a minute or more (seconds of test time, from CI's ``--durations`` on 2 cores on
2026-11-28, test_airflow.py's since its installs are uv's; a rough figure is enough: only their order counts).
Every other module of integration/ comes after them, in collection order."""


def _order(items: list, chunk: int, workers: int) -> list:
    """The longest first where it counts, for xdist's load scheduler, which sends worker ``k`` the items ``k * chunk``
    to ``(k + 1) * chunk - 1`` first, then, to each worker that runs low, the next items in batches of up to a quarter
    of those still pending (the first to ask takes the front of the queue by the hundred).  So each of
    :data:`LONGEST` begins a worker's first chunk, the rest of which is quick tests (unit tests; without them, the
    last integration modules); the queue is the other unit tests first (shared out in big batches while the
    campaigns run), then the integration modules, the slow ones longest first (:data:`SLOW_MODULES`), so that the
    last, small batches are short tests that even out the workers' ends.  Put first in the queue, the slow modules
    would all go to the worker that ran low first (simulated: ~2,000 s instead of ~1,320 s).  A module's items stay
    together and in their order: its module-scoped fixtures (a broker, a cluster) are set up once per worker."""
    longest = [item for n in LONGEST for item in items if item.nodeid == n][:workers]
    rest = [item for item in items if item not in longest]
    unit = [item for item in rest if not item.nodeid.startswith("integration/")]
    module = {id(item): item.nodeid.split("::", 1)[0] for item in rest}
    slow = sorted((item for item in rest if module[id(item)] in SLOW_MODULES),
                  key=lambda item: -SLOW_MODULES[module[id(item)]])  # stable: collection order within a module
    other = [item for item in rest if module[id(item)].startswith("integration/") and item not in slow]
    need = (chunk - 1) * len(longest)
    fill = [*unit[:need], *other[len(other) - max(need - len(unit), 0):]]  # quick ones, in their order
    used = {id(item) for item in fill}
    out: list = []
    for k, first in enumerate(longest):
        out += [first, *fill[k * (chunk - 1):(k + 1) * (chunk - 1)]]
    return (out + [item for item in unit if id(item) not in used] + slow
            + [item for item in other if id(item) not in used])


def pytest_collection_modifyitems(config, items) -> None:
    """Under ``-n N --dist load`` (``bin/test``), the longest tests first where it counts (:func:`_order`): in
    collection order the two campaigns came last, both on one worker, the other idle through most of the second, and
    the last integration module (test_upgrade.py, ~140 s) could start last.  Without xdist, nothing moves.

    xdist's load scheduler sends worker ``k`` the items ``k * chunk`` to ``(k + 1) * chunk - 1`` first, ``chunk``
    being a quarter of the items per worker (at least 2); if it ever sends otherwise, only the speed suffers.  The
    order is made where it counts, in each worker's collection (the scheduler indexes into it; every worker makes
    the same order)."""
    workerinput = getattr(config, "workerinput", None)  # set in an xdist worker, whose own options say "no xdist"
    if workerinput is None:
        return
    workers = int(workerinput.get("workercount", 1))
    if workers < 2:
        return
    items[:] = _order(items, max(len(items) // workers // 4, 2), workers)


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from event_etl.job.session import get_session

    session = get_session("local[2]", {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"},
                          app_name="event_etl-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server for the session; STORAGE_EMULATOR_HOST points at it."""
    from tests.lib.servers import GcsEmulator

    server = GcsEmulator(tmp_path_factory.mktemp("gcs")).start()
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    yield server
    server.stop()
    if old is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = old


_BUCKETS = iter(range(10**6))


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch):
    """A new, empty bucket on the GCS emulator: its gs:// URL (STORAGE_EMULATOR_HOST pointing at the session's
    emulator for the test, whatever an earlier test of the worker left there)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.url)
    name = f"test-bucket-{next(_BUCKETS)}"
    gcs_server.create_bucket(name)
    return f"gs://{name}"


@pytest.fixture(scope="session")
def pubsub_emulator(tmp_path_factory):
    """Google's Pub/Sub emulator for the session (tests ask for ``pubsub_server``)."""
    from tests.lib.servers import PubSubEmulator

    server = PubSubEmulator(tmp_path_factory.mktemp("pubsub")).start(timeout=90)
    yield server
    server.stop()


@pytest.fixture
def pubsub_server(pubsub_emulator, monkeypatch):
    """The session's Pub/Sub emulator, running, with PUBSUB_EMULATOR_HOST pointing at it for the test, whatever an
    earlier test of the same worker left there (a campaign points it at an emulator of its own, then stops it: the
    Pub/Sub clients read the variable, and a client pointed at a stopped emulator retries for ten minutes)."""
    proc = pubsub_emulator.proc
    if proc is None or proc.poll() is not None:
        pytest.fail(f"the session's Pub/Sub emulator is not running (exit code {proc and proc.returncode}); "
                    f"its log: {pubsub_emulator.log}")
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    return pubsub_emulator
