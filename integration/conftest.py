"""Integration fixtures: one local SparkSession for the whole test session."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from event_etl.sparkutil import get_session

    session = get_session("local[2]", {"spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"},
                          app_name="event_etl-tests")
    yield session
    session.stop()
