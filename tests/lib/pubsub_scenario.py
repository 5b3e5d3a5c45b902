"""One Pub/Sub integration test's world: a topic, a subscription, a bucket and a checkpoint on the emulators, the
events published, the job run as users run it (a separate ``event-etl`` process), and what it wrote read back.

:class:`Scenario` holds it; :func:`scenario` is the fixture (integration/conftest.py imports it, so a test asks for
it by name), on integration/conftest.py's ``pubsub_server``, ``gcs_server`` and ``gcs_bucket``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from event_etl.eventtypes import load_event_type
from event_etl.rules.buckets import MARKER_NAME
from event_etl.rules.manifest import Manifest
from event_etl.storage import Storage

__all__ = ["EXE", "PROJECT", "ROOT", "Scenario", "env", "scenario"]

EXE = str(Path(sys.executable).with_name("event-etl"))
ROOT = Path(__file__).resolve().parents[2]
PROJECT = "event-etl-test"


def env(pubsub_server, gcs_server) -> dict:
    return {**os.environ, "PUBSUB_EMULATOR_HOST": pubsub_server.host, "STORAGE_EMULATOR_HOST": gcs_server.url,
            "PYSPARK_PYTHON": sys.executable, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


class Scenario:
    """A topic, a subscription, a bucket and a checkpoint of one test, and the events published."""

    def __init__(self, tmp: Path, pubsub_server, gcs_server, gcs_bucket: str, *, ack_deadline: int = 10) -> None:
        from google.cloud import pubsub_v1

        self.tmp = tmp
        self.env = env(pubsub_server, gcs_server)
        os.environ["PUBSUB_EMULATOR_HOST"] = pubsub_server.host
        name = f"t{uuid.uuid4().hex[:10]}"
        self.topic = f"projects/{PROJECT}/topics/{name}"
        self.subscription = f"projects/{PROJECT}/subscriptions/{name}-etl"
        self.sink = f"{gcs_bucket}/out"
        self.checkpoint = str(tmp / "ck")
        self.et = load_event_type(ROOT / "event_types" / "page_view")
        self.setup(ack_deadline)
        self.publisher = pubsub_v1.PublisherClient()
        self.sent: list[dict] = []  # what we published: id, event time, kind, payload

    def setup(self, ack_deadline: int = 10) -> None:
        r = subprocess.run([EXE, "setup", "page_view", "--topic", self.topic, "--subscription", self.subscription,
                            "--ack-deadline", str(ack_deadline)], env=self.env, capture_output=True, text=True,
                            timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr

    def event(self, event_time: int, kind: str, *, eid: str | None = None) -> dict:
        eid = eid or str(uuid.uuid4())
        rec = {"event_id": eid, "event_time": event_time, "anonymous_id": "a1", "session_id": "s1", "product_id": "p1",
               "page_url": "https://shop.example.com/p/1", "device_type": "MOBILE"}
        return {"id": eid, "t": event_time, "kind": kind, "payload": json.dumps(rec).encode()}

    def publish(self, events: list[dict]) -> None:
        # Pub/Sub refuses a message with neither data nor attributes: an empty payload carries one attribute
        futures = [self.publisher.publish(self.topic, e["payload"], **({} if e["payload"] else {"note": "empty"}))
                   for e in events]
        for f in futures:
            f.result(timeout=30)
        self.sent.extend(events)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def command(self, *args: str) -> list[str]:
        return [EXE, "run", "page_view", "--source", f"pubsub:{self.subscription}", "--sink", self.sink,
                "--checkpoint", self.checkpoint, "--master", "local[2]", "--trigger-interval", "1s", *args]

    # -- reading the result ----------------------------------------------------------------
    def sink_content(self) -> dict[int, dict]:
        return self.sink_content_of("page_view", "event_id")

    def sink_content_of(self, event_type: str, id_field: str) -> dict[int, dict]:
        import io

        import fastavro

        st = Storage(self.sink)
        out = {}
        for day in st.list_dirs(event_type):
            if not day.startswith("dt="):
                continue
            for h in st.list_dirs(f"{event_type}/{day}"):
                rel = f"{event_type}/{day}/{h}"
                files = st.list_files(rel)
                entry = {"timely": [], "late": [], "marker": None, "files": files, "rel": rel, "bytes": {}}
                for name in files:
                    if name == MARKER_NAME:
                        entry["marker"] = Manifest.from_bytes(st.read(f"{rel}/{name}"))
                    elif name.endswith(".avro"):
                        data = st.read(f"{rel}/{name}")
                        entry["bytes"][name] = data
                        ids = [r[id_field] for r in fastavro.reader(io.BytesIO(data))]
                        entry["late" if name.startswith("late-") else "timely"].extend(str(i) for i in ids)
                from event_etl.rules.buckets import parse_hour_dir

                out[parse_hour_dir(rel)[1]] = entry
        return out

    def deadletters(self) -> list[dict]:
        from event_etl.storage.deadletter import iter_deadletters

        return [{"reason": d.reason, "payload": d.payload} for d in iter_deadletters(Storage(self.sink), "page_view")]

    def check_manifests(self, content: dict[int, dict]) -> None:
        import hashlib

        for h, e in content.items():
            m = e["marker"]
            if m is None:
                continue
            names = sorted(n for n in e["files"] if n.endswith(".avro"))
            assert [f.name for f in m.files] == names, f"hour {h}: manifest and folder differ"
            for f in m.files:
                assert f.bytes == len(e["bytes"][f.name]) and f.sha256 == hashlib.sha256(e["bytes"][f.name]).hexdigest()
            assert m.records == len(e["timely"]) + len(e["late"])
            assert m.late_records == len(e["late"])


@pytest.fixture
def scenario(tmp_path, pubsub_server, gcs_server, gcs_bucket):
    return Scenario(tmp_path, pubsub_server, gcs_server, gcs_bucket)
