"""The test suite's library: the helpers the tests of tests/ and integration/ share, and nothing else.

No module here holds tests (pytest collects only ``test_*.py``), and no ``test_*.py`` module imports another: what two
test modules both need lives here, in a module named for what it holds (tests/test_suite_layout.py fails on a test
module imported anywhere in tests/ or integration/).  Each module's docstring says what it holds; among them:

- the job without Spark: :mod:`~tests.lib.harness` (a tiny event type, a fake clock, ``LocalPipeline``: the real
  executor and controller on local disk), :mod:`~tests.lib.kills` (``Killed``), :mod:`~tests.lib.power_loss` (a
  disk that loses what was not synced), :mod:`~tests.lib.disks` (a real tmpfs of a few pages, for full disks);
- scenarios several modules run: :mod:`~tests.lib.consumer_scenario` (a sink as a real job leaves it),
  :mod:`~tests.lib.backfill`, :mod:`~tests.lib.fastpath` (the fast path beside the record path),
  :mod:`~tests.lib.transcript_cases`, :mod:`~tests.lib.metrics` (scrapes, a job with metrics, promtool),
  :mod:`~tests.lib.storage_contract` (one storage contract, run against every backend);
- sources and servers: :mod:`~tests.lib.servers` (fake-gcs-server, the Pub/Sub emulator, Prometheus, tansu, noida-db
  on 127.0.0.1), :mod:`~tests.lib.kafka_brokers` (the brokers as fixtures), :mod:`~tests.lib.registry_server` (a
  Confluent schema registry over real HTTP), :mod:`~tests.lib.dialects` (producers' Protobuf and Confluent frames),
  :mod:`~tests.lib.pubsub_service` (the real Pub/Sub service's fake, a fetcher on it),
  :mod:`~tests.lib.pubsub_scenario`, :mod:`~tests.lib.kafka_job` and :mod:`~tests.lib.generated` (what integration
  tests publish, run and read back);
- :mod:`~tests.lib.waiting`: ``wait_until``, the one way a test waits for something.

The sweeps and the campaign that drive the code through every window are programs, not helpers: they live in
tests/sweeps/ and integration/campaigns/.
"""
