"""The test suite's library: the helpers the tests of tests/ and integration/ share, and nothing else.

No module here holds tests (pytest collects only ``test_*.py``); what two test modules both need lives here, in a
module named for what it holds.

- :mod:`~tests.lib.harness`: a tiny event type, a fake clock, and ``LocalPipeline``, the real executor and controller
  on local disk without Spark;
- :mod:`~tests.lib.waiting`: ``wait_until``, the one way a test waits for something;
- :mod:`~tests.lib.servers`: real servers on 127.0.0.1 (fake-gcs-server, the Pub/Sub emulator, Prometheus, tansu,
  noida-db), and :mod:`~tests.lib.kafka_brokers`, the Kafka brokers as fixtures;
- :mod:`~tests.lib.registry_server`: a Confluent schema registry over real HTTP (and its fixture);
- :mod:`~tests.lib.dialects`: producers' payloads (Protobuf, Confluent frames) made as producers make them;
- :mod:`~tests.lib.disks`: real small file systems (a tmpfs of a few pages) for full-disk tests;
- :mod:`~tests.lib.storage_contract`: one storage contract, run against every backend.

The sweeps and campaigns that drive the code through every window are not helpers: they live in tests/sweeps/ and
integration/campaigns/.
"""
