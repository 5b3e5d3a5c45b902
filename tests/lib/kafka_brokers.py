"""The Kafka brokers as fixtures: ``kafka_broker`` (tansu) and ``noida`` (noida-db, for what tansu refuses).

``tests/conftest.py`` and ``integration/conftest.py`` import them, so a test asks for them by name; each is started
once per test module on 127.0.0.1 (:mod:`tests.lib.servers`) and stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["kafka_broker", "noida"]


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A tansu broker for the module (tests/lib/servers.py ``KafkaBroker``)."""
    from tests.lib.servers import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def noida(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A noida-db broker for the module (tests/lib/servers.py ``NoidaKafka``): partitions added, DeleteRecords,
    retention, transactions and true high watermarks."""
    from tests.lib.servers import NoidaKafka

    broker = NoidaKafka(tmp_path_factory.mktemp("noida")).start()
    try:
        yield broker
    finally:
        broker.stop()
