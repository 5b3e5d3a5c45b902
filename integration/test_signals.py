"""Stopping `event-etl` the way people stop programs: a terminal, systemd, `timeout`, Kubernetes, a kill.

Every job is the real command in a session of its own (so the test can signal its process
group, as a terminal, `timeout` or `kill -- -PGID` do; every process of the job, as systemd
does by default; or its process alone, as Kubernetes and docker do).  After every stop: the exit status,
nothing that looks like a failure in its output (no Python traceback, no ERROR line, no Java exception), the drain's
markers where a drain is due, and no process of the job left (its JVM included, found by
pid among the job's descendants recorded while it ran).  One checkpoint carries a chain of
runs, each stopped another way and each continuing where the last one stopped; no plain stop
marks the open hour (issue 50); the last run is asked to drain (`event-etl drain`), and the sink
must then hold every generated event exactly once, none of them late.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from event_etl.eventtypes import load_event_types, resolve_event_types_dir
from event_etl.job.stopping import SAME_SIGNAL_S
from event_etl.sources.generator import Generator, GeneratorParams
from tests.lib.harness import check_manifest_matches_folder, read_sink

EXE = str(Path(sys.executable).with_name("event-etl"))
COUNT = 80_000
SOURCE = (f"generate:count={COUNT},rate=2000,speedup=600,start=-6h,seed=19,out_of_order=0.05,late=0,too_late=0,"
          "future=0,invalid=0,duplicate=0")
FAILURE_SIGNS = re.compile(r"Traceback|(^|\s)ERROR(\s|$)|Exception in thread|StackOverflowError|Py4J\w*Error")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR",
            "PYTHONUNBUFFERED": "1", **extra}


_STARTED: list[Job] = []


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test():
    """A test that fails half-way leaves no job running (its JVM included)."""
    yield
    while _STARTED:
        job = _STARTED.pop()
        job._watching = False
        if job.proc.poll() is None:
            for p in [*job._alive(), psutil.Process(job.proc.pid)]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            job.proc.wait(timeout=30)


class Job:
    """`event-etl ...` in a session of its own; its output in a file; its descendants recorded while it runs."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        _STARTED.append(self)
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen([EXE, *args], env=env or _env(), stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pgid = self.proc.pid
        self.descendants: dict[int, float] = {}
        self._watching = True
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while self._watching and self.proc.poll() is None:
            try:
                for p in psutil.Process(self.proc.pid).children(recursive=True):
                    self.descendants.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
            time.sleep(0.2)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate, what: str, timeout: float = 120, poll: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job exited ({self.proc.returncode}) before {what}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{self.output()[-3000:]}")
            time.sleep(poll)

    def jvm(self) -> psutil.Process:
        for pid in self.descendants:
            try:
                p = psutil.Process(pid)
                if "java" in p.name() or any("java" in part for part in p.cmdline()[:1]):
                    return p
            except psutil.Error:
                continue
        raise AssertionError(f"no JVM among the job's processes {sorted(self.descendants)}")

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        """Wait for the exit; then every process the job ever had must be gone within seconds."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self._watching = False
            if self.proc.poll() is None:
                os.killpg(self.pgid, signal.SIGKILL)
        self._watcher.join(timeout=5)
        self._out.close()
        deadline = time.monotonic() + 15
        alive = self._alive()
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = self._alive()
        for p in alive:  # leave nothing behind, then fail
            p.kill()
        assert not alive, f"processes of the job still running after it exited: {[p.cmdline()[:3] for p in alive]}"
        assert self.descendants, "the job's JVM was never seen"
        return code, self.log.read_text(errors="replace")

    def _alive(self) -> list[psutil.Process]:
        out = []
        for pid, created in self.descendants.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out


def _ids(d: Path, pattern: str) -> set[int]:
    if not d.is_dir():
        return set()
    return {int(p.name.split(".")[0]) for p in d.glob(pattern) if p.name.split(".")[0].isdigit()}


def commits(ck: Path) -> set[int]:
    return _ids(ck / "spark" / "commits", "[0-9]*")


def in_flight(ck: Path) -> int | None:
    """The batch whose intent is written but which Spark has not committed (it runs now), if any."""
    open_ = _ids(ck / "etl" / "batches", "*.json") - commits(ck)
    return max(open_) if open_ else None


def clean(out: str) -> None:
    lines = out.splitlines()
    bad = [i for i, line in enumerate(lines) if FAILURE_SIGNS.search(line)]
    assert not bad, "the output looks like a failure:\n" + "\n".join(lines[bad[0]:bad[0] + 40])


def hours_with_data(sink: Path, name: str, id_field: str):
    return {h: hc for h, hc in read_sink(sink, name, id_field).items() if hc.timely or hc.late}


def all_closed(sink: Path, name: str, id_field: str) -> None:
    content = hours_with_data(sink, name, id_field)
    assert content, "nothing was written"
    assert all(hc.marker is not None for hc in content.values()), \
        f"hours holding data without _COMPLETE: {[h for h, hc in content.items() if hc.marker is None]}"


def run_args(sink: Path, ck: Path, *extra: str, per_batch: int = 1500) -> list[str]:
    return ["run", "page_view", "--source", SOURCE, "--sink", str(sink), "--checkpoint", str(ck), "--master",
            "local[2]",
            "--trigger-interval", "1s", "--max-events-per-batch", str(per_batch), *extra]


def all_committed(ck: Path) -> bool:
    """Spark has committed a batch whose end offset is the generator's last event."""
    offsets = _ids(ck / "spark" / "offsets", "[0-9]*")
    if not offsets:
        return False
    last = max(offsets)
    end = json.loads((ck / "spark" / "offsets" / str(last)).read_text().splitlines()[-1])
    return int(end["n"]) >= COUNT and last in commits(ck)


def test_every_way_of_stopping_is_clean_and_each_run_continues_where_the_last_stopped(tmp_path):
    sink, ck = tmp_path / "data", tmp_path / "ck"

    def start(name: str, per_batch: int = 1500, *extra: str, env: dict[str, str] | None = None) -> Job:
        return Job(run_args(sink, ck, *extra, per_batch=per_batch), tmp_path / f"{name}.log", env=env)

    def after_a_new_batch(job: Job) -> None:
        before = len(commits(ck))
        job.wait_for(lambda: len(commits(ck)) > before, "a committed batch")

    def drained(name: str, out: str, sig: signal.Signals) -> None:
        tail = out[out.rindex("] batch "):]  # after the last batch line: the drain
        assert "COMPLETE" in tail and "drain: watermark" in tail, f"{name}: the drain closed the open hours\n{out}"
        assert f"stopped by     {sig.name}; drained" in out, out
        all_closed(sink, "page_view", "event_id")

    def not_drained(name: str, out: str, how: str) -> int:
        """A plain stop: no drain, the open hour (the newest holding data) left open; the last line says exit 0."""
        assert "drain: watermark" not in out and "drained: every hour" not in out, f"{name}: no drain\n{out}"
        lines = out.strip().splitlines()
        assert re.fullmatch(rf"\[page_view\] stopped after batch \d+ \({how}\), not drained \(the hours from \S+ "
                            r"stay open: the watermark, \S+, has not passed them\)"
                            r"(?: \(batch \d+ was planned, not begun: it runs first\))?"  # a stop between plan and run
                            r"; run the same command to continue",
                            lines[-2]), lines[-2]
        assert lines[-1] == (f"[page_view] run finished: exit 0 (stopped by {how}, not drained: the open hours stay "
                             "open for the next run)"), lines[-1]
        assert "events in" not in out, "a stop: two lines, no summary"
        content = hours_with_data(sink, "page_view", "event_id")
        assert content[max(content)].marker is None, f"{name}: the newest hour holding data stays open"
        return max(content)

    # 1. Ctrl-C as `timeout -s INT` sends it: SIGINT to the process, then to its whole group, at once (issue 50: this
    # was taken for Ctrl-C twice). Stops after the batch, no drain.
    job = start("1-ctrl-c")
    after_a_new_batch(job)
    jvm = job.jvm()
    assert os.getsid(jvm.pid) != os.getsid(job.proc.pid), "the JVM runs in a session of its own"
    ignored = int(next(line for line in open(f"/proc/{jvm.pid}/status") if line.startswith("SigIgn")).split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        assert ignored & (1 << (sig - 1)), f"the JVM ignores {sig.name} (systemd signals every process of a unit)"
    os.kill(job.proc.pid, signal.SIGINT)
    os.killpg(job.pgid, signal.SIGINT)
    code, out = job.finish()
    assert code == 0, out
    clean(out)
    not_drained("1-ctrl-c", out, "Ctrl-C")
    assert "(generator clock)" in out and not re.search(r"lag -\d", out), "lag against the generator's clock"

    # 2. Ctrl-C twice while a batch runs: stop at once (exit 130, one line); the batch is replayed by the next run.
    # The batch waits 8 s once its files are written (a fault point's pause): caught in flight, however loaded.
    faults = tmp_path / "faults.log"
    job = start("2-ctrl-c-twice", 1500, env=_env(EVENT_ETL_FAULT_LOG=str(faults),
                                                 EVENT_ETL_FAULT_PAUSE="files_written=8"))
    job.wait_for(lambda: faults.exists() and "files_written " in faults.read_text(), "a batch in flight")
    assert "(replay)" not in job.output(), "Ctrl-C stopped at a batch boundary: nothing to replay"
    cut = in_flight(ck)
    assert cut is not None
    os.killpg(job.pgid, signal.SIGINT)
    time.sleep(SAME_SIGNAL_S + 0.5)  # two separate key presses (within 0.5 s they are one signal, two paths)
    os.killpg(job.pgid, signal.SIGINT)
    code, out = job.finish()
    assert code == 130, out
    clean(out)
    last = out.strip().splitlines()[-1]
    assert last.startswith("[page_view] stopped at once (Ctrl-C twice), not drained"), out
    assert f"batch {cut} was cut" in last and last.endswith("(exit 130)"), out
    assert cut not in commits(ck), "the batch cut short was not committed"

    # 3. SIGKILL (OOM killer, kill -9) during a batch: nothing to clean up, but the JVM must go by itself.
    job = start("3-sigkill", per_batch=5000)
    job.wait_for(lambda: f"batch {cut} (replay)" in job.output(), f"batch {cut} replayed")
    job.wait_for(lambda: in_flight(ck) is not None, "a batch in flight", poll=0.02)
    os.kill(job.proc.pid, signal.SIGKILL)
    code, _ = job.finish()  # fails if the JVM (or anything else of the job) outlives it by 15 s
    assert code == -signal.SIGKILL

    # 4. systemd's default (KillMode=control-group): SIGTERM to every process of the job while a batch runs --
    # the group (as `timeout` and `kill -- -PGID` do), the JVM, the Python workers. The batch finishes, the job
    # stops, exit 0, and the open hour is NOT marked (a deploy's stop: issue 50).
    job = start("4-systemd", 5000)
    after_a_new_batch(job)
    job.wait_for(lambda: in_flight(ck) is not None, "a batch in flight", poll=0.02)
    running = in_flight(ck)
    os.killpg(job.pgid, signal.SIGTERM)
    for p in psutil.Process(job.proc.pid).children(recursive=True):
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    code, out = job.finish()
    assert code == 0, out
    clean(out)
    left_open = not_drained("4-systemd", out, "SIGTERM")
    assert running in commits(ck), "the batch running when every process got SIGTERM finished"

    # 5. Once every event is in, `event-etl drain` asks the running job to drain and stop (SIGUSR1 to the pid in its
    # checkpoint lock). The sink then holds every generated event exactly once, none late (no stop before marked an
    # hour early), and every hour holding data is complete, the one the SIGTERM left open included.
    job = start("5-drain", per_batch=20_000)
    job.wait_for(lambda: all_committed(ck), "every generated event committed", timeout=180)
    replayed = set(re.findall(r"\] batch (\d+) \(replay\)", job.output()))
    assert not replayed, "SIGTERM stopped at a batch boundary: nothing to replay"
    r = subprocess.run([EXE, "drain", "page_view", "--checkpoint", str(ck), "--wait"], env=_env(), capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"[page_view] asked pid {job.proc.pid}" in r.stdout and "has stopped" in r.stdout, r.stdout
    code, out = job.finish()
    assert code == 0, out
    clean(out)
    drained("5-drain", out, signal.SIGUSR1)
    assert out.strip().splitlines()[-1] == ("[page_view] run finished: exit 0 (stopped by a drain request, drained: "
                                            "every hour holding data is complete)"), out[-2000:]
    offsets = (ck / "spark" / "offsets" / "0").read_text().splitlines()
    params = GeneratorParams.from_json(json.loads(offsets[-1])["p"])  # as frozen when the checkpoint was made
    et = load_event_types(resolve_event_types_dir(None))["page_view"]
    gen = Generator(et, params)
    expected = [g.event_id for g in (gen.one(i) for i in range(COUNT))]
    content = read_sink(sink, "page_view", "event_id")
    got = Counter(i for hc in content.values() for i in hc.timely + hc.late)
    assert max(got.values()) == 1, f"duplicated: {[i for i, n in got.items() if n > 1][:5]}"
    assert set(got) == set(expected), f"lost {len(set(expected) - set(got))}, foreign {len(set(got) - set(expected))}"
    for h in content:
        check_manifest_matches_folder(sink, "page_view", h)
    assert content[left_open].marker is not None and not content[left_open].late, \
        "the hour a plain SIGTERM left open was marked later, by the watermark, with none of its events late"
    late = {h: len(hc.late) for h, hc in content.items() if hc.late}
    assert not late, f"no stop marked an hour early, so no event came late: {late}"


def _fleet_types(root: Path) -> Path:
    """page_view and db_change with a finite generator each (a fleet takes every type's own `source`)."""
    shipped = Path(resolve_event_types_dir(None))
    for name in ("page_view", "db_change"):
        shutil.copytree(shipped / name, root / name)
        toml = root / name / "etl.toml"
        source = 'source = "generate:count=40000,rate=2000,speedup=600,start=-6h,seed=3"'
        toml.write_text(re.sub(r"(?m)^source\s*=.*$", source, toml.read_text()))
    return root


def test_a_fleet_run_with_drain_on_stop_drains_every_type_when_its_terminal_hangs_up(tmp_path):
    """SIGHUP to the group, as when the terminal of a foreground job closes: with --drain-on-stop, stop and drain, like
    SIGTERM."""
    types, sink, ck = _fleet_types(tmp_path / "types"), tmp_path / "data", tmp_path / "ck"
    job = Job(["run", "page_view", "db_change", "--event-types", str(types), "--sink", str(sink), "--checkpoint",
               str(ck), "--master", "local[2]", "--trigger-interval", "1s", "--max-events-per-batch", "1500",
               "--drain-on-stop"], tmp_path / "fleet.log")
    job.wait_for(lambda: all(len(commits(ck / n)) >= 2 for n in ("page_view", "db_change")), "two batches of each type")
    os.killpg(job.pgid, signal.SIGHUP)
    code, out = job.finish()
    assert code == 0, out
    clean(out)
    for name, id_field in (("page_view", "event_id"), ("db_change", "change_id")):
        all_closed(sink, name, id_field)
        assert re.search(rf"\[{name}\] run finished \(stopped\): .*stopped by SIGHUP, drained", out), out
        status = json.loads((ck / name / "etl" / "status.json").read_text())
        assert status["state"] == "stopped" and status["last_error"] is None, status
    assert out.strip().splitlines()[-1] == ("[fleet] run finished: exit 0 (stopped by SIGHUP, drained: every hour "
                                            "holding data is complete)"), out[-2000:]


def test_wait_ends_at_once_on_ctrl_c_or_sigterm_with_one_line(tmp_path):
    # a job has started on page_view (its lease is there) and not closed the hour: wait waits
    (tmp_path / "data" / "page_view").mkdir(parents=True)
    (tmp_path / "data" / "page_view" / "_LEASE").write_text("{}")
    for sig, how, code in ((signal.SIGINT, "group", 130), (signal.SIGTERM, "process", 143)):
        proc = subprocess.Popen([EXE, "wait", "page_view", "2026-11-21T13", "--sink", str(tmp_path / "data"),
                                 "--poll-interval", "30s"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        line = proc.stderr.readline()  # "waiting: ..." once it has looked
        assert line.startswith("waiting:"), line
        started = time.monotonic()
        os.killpg(proc.pid, sig) if how == "group" else os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == code, (out, err)
        assert time.monotonic() - started < 5, "at once, not at the next poll"
        assert err.strip().splitlines() == [f"interrupted ({sig.name}): page_view 2026-11-21T13:00:00Z was not "
                                            "complete yet"], err


def test_submit_passes_sigterm_to_its_driver_which_drains_under_drain_on_stop(tmp_path):
    """`event-etl submit` (client mode): spark-submit's JVM runs the driver; SIGTERM to submit's group reaches it, and
    --drain-on-stop reaches the driver too."""
    sink, ck = tmp_path / "data", tmp_path / "ck"
    job = Job(["submit", "page_view", "--master", "local[2]", "--source", SOURCE, "--sink", str(sink), "--checkpoint",
               str(ck), "--trigger-interval", "1s", "--max-events-per-batch", "5000", "--bundle-dir",
               str(tmp_path / "bundle"), "--drain-on-stop"], tmp_path / "submit.log")
    job.wait_for(lambda: len(commits(ck)) >= 2, "two committed batches")
    os.killpg(job.pgid, signal.SIGTERM)
    code, out = job.finish()
    assert code == 0, out
    clean(out)
    assert "stopped by     SIGTERM; drained" in out, out
    all_closed(sink, "page_view", "event_id")


def test_publish_stops_sending_on_ctrl_c_and_counts_exactly_what_it_sent(tmp_path, pubsub_server):
    from google.cloud import pubsub_v1

    topic, sub = "projects/signals/topics/page-views", "projects/signals/subscriptions/page-views-etl"
    env = {**_env(), "PUBSUB_EMULATOR_HOST": pubsub_server.host}
    r = subprocess.run([EXE, "setup", "page_view", "--topic", topic, "--subscription", sub], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    counts = tmp_path / "counts.json"
    proc = subprocess.Popen([EXE, "publish", "page_view", "--topic", topic, "--rate", "400", "--duration", "120",
                             "--count-file", str(counts)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    line = proc.stderr.readline()  # "published 400/48,000": it runs
    assert line.startswith("published "), line
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    clean(out + err)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["stopped_by"] == "SIGINT" and 400 <= result["published"] < 48_000, result
    written = json.loads(counts.read_text())
    assert written["published"] == result["published"] == sum(written["intents"].values())
    subscriber = pubsub_v1.SubscriberClient(client_options={"api_endpoint": pubsub_server.host})
    received, deadline = 0, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:  # every message it counted is on the topic, and no other
            wanted = received < result["published"]
            resp = subscriber.pull(subscription=sub, max_messages=1000, timeout=10 if wanted else 2)
            if not resp.received_messages and not wanted:
                break
            received += len(resp.received_messages)
            if resp.received_messages:
                subscriber.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in resp.received_messages])
    finally:
        subscriber.close()
    assert received == result["published"]
