"""Integration fixtures: one local SparkSession for the whole test session; and the two kill campaigns started first,
one on each pytest worker (:func:`pytest_collection_modifyitems`)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.shared import kafka_broker, noida  # noqa: F401 - fixtures are found by their name in a conftest

LONGEST = ("integration/test_campaign.py::test_campaign_pubsub_to_gcs",
           "integration/test_campaign.py::test_campaign_directory_source_to_local_disk")
"""The two longest tests (~530 s and ~340 s on 2 cores, more than a quarter of the suite's time together)."""


def pytest_collection_modifyitems(config, items) -> None:
    """Under ``-n N --dist load`` (``bin/test``), put the longest tests where each worker's first chunk begins, so
    they start at once on different workers while the rest of the suite fills around them.  In collection order
    they came last, both on one worker, and the other worker sat idle through most of the second.

    xdist's load scheduler sends worker ``k`` the items ``k * chunk`` to ``(k + 1) * chunk - 1`` first, ``chunk``
    being a quarter of the items per worker (at least 2); if it ever sends otherwise, only the speed suffers.
    Without xdist, nothing moves.  The order is made where it counts, in each worker's collection (the scheduler
    indexes into it; every worker makes the same order)."""
    workerinput = getattr(config, "workerinput", None)  # set in an xdist worker, whose own options say "no xdist"
    if workerinput is None:
        return
    workers = int(workerinput.get("workercount", 1))
    if workers < 2:
        return
    by_id = {item.nodeid: item for item in items}
    longest = [by_id[n] for n in LONGEST if n in by_id]
    if not longest:
        return
    rest = [item for item in items if item.nodeid not in LONGEST]
    chunk = max(len(items) // workers // 4, 2)
    for k, item in enumerate(longest[:workers]):
        rest.insert(min(k * chunk, len(rest)), item)
    rest.extend(longest[workers:])
    items[:] = rest


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
    from integration.servers import GcsEmulator

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
def gcs_bucket(gcs_server):
    """A new, empty bucket on the GCS emulator: its gs:// URL."""
    name = f"test-bucket-{next(_BUCKETS)}"
    gcs_server.create_bucket(name)
    return f"gs://{name}"


@pytest.fixture(scope="session")
def pubsub_server(tmp_path_factory):
    """Google's Pub/Sub emulator for the session; PUBSUB_EMULATOR_HOST points at it."""
    from integration.servers import PubSubEmulator

    server = PubSubEmulator(tmp_path_factory.mktemp("pubsub")).start(timeout=90)
    old = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = server.host
    yield server
    server.stop()
    if old is None:
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = old
