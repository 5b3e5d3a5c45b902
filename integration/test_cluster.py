"""`event-etl submit` on a real Spark standalone cluster: a master and two workers on 127.0.0.1.

The cluster is :class:`event_etl.cluster.localcluster.LocalCluster`, what `bin/spark-cluster` starts:
the daemons of the pip pyspark, with a clean environment.  The executors run a Python that
has event_etl's dependencies but not event_etl (a venv whose site-packages only point at
this environment's packages), so event_etl reaches them in the bundle or not at all, and
whatever a job needs (emulator hosts, fault settings) reaches them through `submit`, as on
a real cluster.  The jobs run as users run them: `event-etl submit ...` in its own process.

The checks are those of the core tests (tests/lib/harness.py): every event once, in its own
hour or late in a later one, or dead-lettered with the reason its kind implies; every
hour marked from the first to the last; each manifest exactly its folder.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from event_etl.cluster.localcluster import LocalCluster
from event_etl.errors import EventEtlError
from event_etl.timeutil import HOUR_MS, now_millis
from tests.lib.generated import GEN, placement, write_inputs
from tests.lib.harness import check_manifest_matches_folder, make_event_type, read_deadletter, read_sink
from tests.lib.pubsub_scenario import Scenario

EXE = str(Path(sys.executable).with_name("event-etl"))
ROOT = Path(__file__).resolve().parent.parent
PAGE_VIEW_SCHEMA = json.loads((ROOT / "event_types" / "page_view" / "schema.avsc").read_text())

pytestmark = pytest.mark.slow


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A master and two workers (1 core, 1g each) on 127.0.0.1, free ports, for the module."""
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start(workers=2, cores=1, memory="1g", port=0, webui_port=0, timeout=120)
    except EventEtlError as err:
        pytest.fail(f"could not start a Spark standalone cluster on 127.0.0.1: {err.message}\n  fix: {err.fix}")
    yield c
    c.stop()


def _venv(folder: Path, *, with_dependencies: bool) -> str:
    """A Python without event_etl; ``with_dependencies``: its site-packages point at this environment's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    if with_dependencies:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "event_etl_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(python)


@pytest.fixture(scope="module")
def node_python(tmp_path_factory) -> str:
    """The executors' Python: event_etl's dependencies installed, event_etl not (as after `pip install -r`)."""
    folder = tmp_path_factory.mktemp("node") / "venv"
    python = _venv(folder, with_dependencies=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import fastavro, pyarrow, orjson, gcsfs\ntry:\n    import event_etl\nexcept ImportError:\n    print('ok')"
    r = subprocess.run([python, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "ok", f"the node Python should have the dependencies and not event_etl: {r.stderr}"
    return python


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bundle")


@pytest.fixture
def page(tmp_path):
    """page_view's schema in a type of its own (shipped in the bundle from --event-types), small files."""
    return make_event_type(tmp_path / "types", "page", schema=PAGE_VIEW_SCHEMA, time_field="event_time",
                           id_field="event_id", max_events_per_file=150)


def submit_command(cluster: LocalCluster, python: str, bundle: Path, *args: str) -> list[str]:
    return [EXE, "submit", *args, "--master", cluster.master_url, "--python", python, "--bundle-dir", str(bundle),
            "--conf", "spark.executor.memory=512m"]


def submit(cluster, python, bundle, *args, env=None, timeout=240) -> subprocess.CompletedProcess:
    r = subprocess.run(submit_command(cluster, python, bundle, *args), env=env or dict(os.environ),
                       capture_output=True, text=True, timeout=timeout)
    return r


def crafted_inputs(et, folder: Path, files: int, per_file: int):
    """Generated events (timely, out of order, late, too late, future, invalid) in files, hours before now."""
    now = now_millis()
    return write_inputs(et, folder, files=files, per_file=per_file,
                        params=replace(GEN, start=now - now % HOUR_MS - 6 * HOUR_MS))


def check_every_event_once(sink: Path, et, batches: list[list]) -> None:
    """The core tests' checks, by event id, on the sink of a drained job."""
    got = placement(sink, et.name)
    ids = Counter(i for _, i, _ in got)
    assert ids and max(ids.values()) == 1, "nothing written twice"
    everything = [g for b in batches for g in b]
    by_intent = Counter(g.intent for g in everything)
    dl = read_deadletter(sink, et.name)
    reasons = Counter(r["reason"] for r in dl)
    assert reasons["future"] == by_intent["future"]
    assert sum(n for r, n in reasons.items() if r not in ("future", "too_late")) == by_intent["invalid"]
    valid = [g for g in everything if g.intent not in ("invalid", "future")]
    too_late = {json.loads(r["payload"])["event_id"] for r in dl if r["reason"] == "too_late"}
    assert set(ids) | too_late == {g.event_id for g in valid}, "nothing lost"
    assert not set(ids) & too_late
    times = {g.event_id: g.event_time for g in valid}
    for h, i, late in got:
        own = times[i] - times[i] % HOUR_MS
        assert (own < h) if late else (own == h), "timely in its own hour, late in a later one"
    content = read_sink(sink, et.name, et.id_field)
    marked = sorted(h for h, hc in content.items() if hc.marker)
    assert marked == sorted(content), "drained: every hour is marked"
    assert marked == list(range(marked[0], marked[-1] + HOUR_MS, HOUR_MS))
    for h in marked:
        check_manifest_matches_folder(sink, et.name, h)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, (
        f"exit code {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-6000:]}"
    )
    assert "run finished" in r.stdout, r.stdout[-3000:]
    return r.stdout


# -- tests -----------------------------------------------------------------------------------
def test_directory_to_local_sink_on_the_cluster(cluster, node_python, bundle_dir, page, tmp_path):
    batches = crafted_inputs(page, tmp_path / "in", files=6, per_file=300)
    out = _ok(submit(cluster, node_python, bundle_dir, "page", "--event-types", str(tmp_path / "types"),
                     "--source", str(tmp_path / "in"), "--sink", str(tmp_path / "sink"),
                     "--checkpoint", str(tmp_path / "ck"), "--max-files-per-batch", "2", "--drain"))
    assert f"on {cluster.master_url}: event_etl from event_etl-" in out, "the driver imports event_etl from the bundle"
    assert node_python in out, "the executors ran the node Python, which has no event_etl of its own"
    check_every_event_once(tmp_path / "sink", page, batches)


class ClusterScenario(Scenario):
    """The Pub/Sub tests' scenario, its job submitted to the cluster instead of run on local[2]."""

    submit_args: list[str] = []

    def command(self, *args: str) -> list[str]:
        return [EXE, "submit", "page_view", "--source", f"pubsub:{self.subscription}", "--sink", self.sink,
                "--checkpoint", self.checkpoint, "--trigger-interval", "1s", *self.submit_args, *args]


def test_pubsub_emulator_to_gcs_emulator_on_the_cluster(cluster, node_python, bundle_dir, tmp_path, pubsub_server,
                                                        gcs_server, gcs_bucket):
    s = ClusterScenario(tmp_path, pubsub_server, gcs_server, gcs_bucket)
    s.submit_args = submit_command(cluster, node_python, bundle_dir)[2:]  # --master ... --conf ...
    rng = random.Random(3)
    now = now_millis()
    h0 = now - now % HOUR_MS - 4 * HOUR_MS
    timely = [s.event(h0 + k * HOUR_MS + rng.randint(0, HOUR_MS - 1), "timely") for k in range(3) for _ in range(40)]
    rng.shuffle(timely)
    last = max(e["t"] for e in timely)
    recent = [s.event(last - rng.randint(0, 5 * 60_000), "timely") for _ in range(10)]
    retries = [dict(e, kind="duplicate") for e in recent[:4]]  # producer retries, inside the dedupe window
    invalid = [{"id": None, "t": None, "kind": "invalid", "payload": p} for p in (b"{broken", b"[1,2]", b"")]
    s.publish(timely + recent + retries + invalid)
    r = s.run("--once", "--drain")
    assert "executors checked on" in _ok(r)
    content = s.sink_content()
    s.check_manifests(content)
    ids = Counter(i for e in content.values() for i in e["timely"] + e["late"])
    assert max(ids.values()) == 1, "nothing written twice (producer retries removed)"
    valid = {e["id"]: e for e in timely + recent}
    assert set(ids) == set(valid), "every valid event is in a bucket"
    # The puller's streams spool what they pull as it comes and a batch takes what has accumulated, so
    # the first batch may hold only part of these shuffled hours; what comes after the watermark passed
    # its hour is late and goes to the hour open then (a later one), as the contract says.
    for h, e in content.items():
        assert all(valid[i]["t"] - valid[i]["t"] % HOUR_MS == h for i in e["timely"]), "timely: in its own hour"
        assert all(valid[i]["t"] - valid[i]["t"] % HOUR_MS < h for i in e["late"]), "late: in a later, open hour"
    assert all(e["marker"] is not None for e in content.values()), "drained: every hour is marked"
    hours = sorted(content)
    assert hours == list(range(hours[0], hours[-1] + HOUR_MS, HOUR_MS))
    assert sum(Counter(d["reason"] for d in s.deadletters()).values()) == len(invalid)


def _fault_lines(log: Path) -> list[tuple[str, int, str]]:
    """``(point, pid, detail)`` of every fault point reached so far (event_etl/faults.py)."""
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split(" ", 3)
        if len(parts) >= 3:
            out.append((parts[0], int(parts[1]), parts[3] if len(parts) > 3 else ""))
    return out


def test_a_worker_killed_mid_batch_loses_and_duplicates_nothing(cluster, node_python, bundle_dir, page, tmp_path):
    """SIGKILL a worker with its executor and Python processes while one of its tasks is inside a file write."""
    for worker in cluster.workers():  # two workers, whatever ran before
        if not cluster.is_running(worker):
            cluster.restart_worker(worker)
    batches = crafted_inputs(page, tmp_path / "in", files=6, per_file=300)
    log = tmp_path / "faults.log"
    # Each data file waits 1 s between its fault-log line and its write: a kill seen in the log lands inside it.
    env = {**os.environ, "EVENT_ETL_FAULT_LOG": str(log), "EVENT_ETL_FAULT_PAUSE": "write_file=1.0"}
    cmd = submit_command(cluster, node_python, bundle_dir, "page", "--event-types", str(tmp_path / "types"),
                         "--source", str(tmp_path / "in"), "--sink", str(tmp_path / "sink"),
                         "--checkpoint", str(tmp_path / "ck"), "--max-files-per-batch", "2", "--drain")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim, killed_at, trees = None, 0, {}
        deadline = time.monotonic() + 180
        while victim is None:
            assert time.monotonic() < deadline and proc.poll() is None, (
                f"no executor task wrote a file before the job ended or timed out:\n{proc.communicate()}")
            trees = {w: set(cluster.processes(w)) for w in cluster.workers()}
            lines = _fault_lines(log)
            writing = sorted(
                {w for p, pid, _ in lines if p == "write_file" for w, tree in trees.items() if pid in tree}
            )
            if writing:
                victim, killed_at = writing[0], len(lines)
                cluster.kill_worker(victim)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _ok(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    lines = _fault_lines(log)
    cut_short = {d for p, pid, d in lines[:killed_at] if p == "write_file" and pid in trees[victim]}
    after = {d for p, pid, d in lines[killed_at:] if p == "write_file" and pid not in trees[victim]}
    assert cut_short & after, (f"the file {victim} was writing was written again by another executor after the kill: "
                               f"{sorted(cut_short)} vs {sorted(after)}\nfault log:\n{log.read_text()[-3000:]}")
    assert cluster.status()["aliveworkers"] == len(cluster.workers()) - 1
    check_every_event_once(tmp_path / "sink", page, batches)


def test_executors_without_the_dependencies_stop_the_job_at_once_with_the_fix(cluster, bundle_dir, tmp_path):
    bare = _venv(tmp_path / "bare", with_dependencies=False)
    r = submit(cluster, bare, bundle_dir, "page_view", "--source", "generate:count=100", "--sink",
               str(tmp_path / "sink"), "--checkpoint", str(tmp_path / "ck"), "--once", timeout=180)
    out = r.stdout + r.stderr  # spark-submit passes its Python driver's stderr on to its stdout
    assert r.returncode == 1, out[-6000:]
    assert "error: the executors on " in out and f"({bare}) cannot import " in out and "fastavro" in out, out[-6000:]
    assert "fix: install event_etl's dependencies" in out
    assert "Traceback" not in out
    assert not (tmp_path / "sink" / "page_view").exists(), "stopped before the first batch"
