"""Unit-test fixtures: the shared ones of tests/shared.py (the Kafka brokers), by name."""

from tests.registry_server import registry_server  # noqa: F401 - fixtures are found by their name in a conftest
from tests.shared import kafka_broker, noida  # noqa: F401 - fixtures are found by their name in a conftest
