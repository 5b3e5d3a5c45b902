"""Integration fixtures: one local SparkSession for the whole test session."""

from __future__ import annotations

import os
import sys

import pytest


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
