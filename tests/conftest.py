"""Unit-test fixtures: the shared ones of tests/lib/kafka_brokers.py (the Kafka brokers), by name."""

from tests.lib.kafka_brokers import kafka_broker, noida  # noqa: F401 - fixtures are found by their name in a conftest
from tests.lib.registry_server import registry_server  # noqa: F401 - fixtures are found by their name in a conftest
