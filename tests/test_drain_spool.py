"""A drain never closes an hour while acknowledged messages wait in the spool (issue 47, item 6).

With ``EVENT_ETL_PUBSUB_ACK=spooled`` a message is acknowledged once it is in the checkpoint's spool, and from then
until its batch commits the spool is its only copy.  A drain (SIGTERM, ``--once --drain``) moves the watermark past
the last hour holding data and marks it: messages of that hour still in an open segment, or in a closed one no batch
has read, would come back as ``late-`` records of the next run.  So a drain first waits out the settling (batches
still reading), stops pulling, has every segment read and committed, and refuses to drain over what is left
(:mod:`event_etl.job.draining`).

The job runs here as ``event-etl run`` runs it, with the shared engine, in this process: the Spark job of a round is
played by a stand-in that runs the real task over each slice of splits (:class:`FakeSpark`); the subscription is the
fake of the real service of tests/test_pubsub_fetch.py.  integration/test_drain_spool.py runs both engines against
the Pub/Sub emulator and a real Spark.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from event_etl.errors import IntegrityError
from event_etl.job.draining import drain_job, spool_left
from event_etl.job.fleet import run_fleet
from event_etl.job.runner import RunOptions, run_job
from event_etl.job.shared import SharedEngine, SparkLog
from event_etl.job.stopping import Interrupted, StopSignals
from event_etl.rules.watermark import SourceActivity
from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from event_etl.timeutil import HOUR_MS, now_millis
from tests.harness import FakeClock, LocalPipeline, click, make_event_type, read_sink, t
from tests.test_pubsub_fetch import SUB
from tests.test_spool_wal import CappedService

MINUTE = 60_000


class _RDD:
    """The part of an RDD a shared round uses, run here: a list of partitions."""

    def __init__(self, parts: list[list[Any]]) -> None:
        self.parts = parts

    def flatMap(self, f):  # noqa: N802 - Spark's name
        return _RDD([[y for x in p for y in f(x)] for p in self.parts])

    def mapPartitions(self, f):  # noqa: N802 - Spark's name
        return _RDD([list(f(iter(p))) for p in self.parts])

    def collect(self) -> list[Any]:
        return [x for p in self.parts for x in p]


class FakeSpark:
    """What the shared engine asks of a session: its settings, its parallelism, and one job per round, whose tasks
    (the real ones, :func:`event_etl.task.executor.make_shared_task`) run here, one slice after the other."""

    def __init__(self) -> None:
        self.conf = SimpleNamespace(get=lambda key, default=None: default)
        self.sparkContext = SimpleNamespace(defaultParallelism=2, setJobGroup=lambda *a, **k: None,
                                            cancelJobGroup=lambda *a: None,
                                            parallelize=lambda data, n: _RDD([[x] for x in data]))


@pytest.fixture
def pubsub(monkeypatch):
    """The subscription the job pulls from: the real service's fake, at most 10 messages a pull, with small
    segments (10 messages; never closed by age: an open segment stays open until the stop) and quick outages."""
    svc = CappedService(cap=10)
    svc.subscription_deadline = 1  # a killed run's leases settle 1 + 2 s
    monkeypatch.setattr("event_etl.sources.pubsub_fetch.subscriber", lambda factory: svc)
    monkeypatch.setattr("event_etl.sources.pubsub.check_subscription", lambda subscription: None)
    for name, value in {"ACK": "spooled", "STREAMS": "1", "SEGMENT_MESSAGES": "10", "SEGMENT_AGE": "600",
                        "PULL_TIMEOUT": "0.2", "OUTAGE_SECONDS": "0.5", "ONCE_QUIET": "0.5"}.items():
        monkeypatch.setenv(f"EVENT_ETL_PUBSUB_{name}", value)
    monkeypatch.setenv("EVENT_ETL_FLEET_BACKOFF", "600")  # a quarantined type is not tried again in these tests
    return svc


def _hour() -> int:
    """An hour three hours ago: its events are timely, and only a drain closes it (out_of_orderness 10 minutes)."""
    now = now_millis()
    return now - now % HOUR_MS - 3 * HOUR_MS


def _publish(svc, prefix: str, first_ms: int, n: int) -> list[str]:
    ids = [f"{prefix}{k}" for k in range(n)]
    for k, i in enumerate(ids):
        svc.publish(click(i, first_ms + k * MINUTE // 4), now_millis())
    return ids


def _event_type(tmp_path: Path):
    return make_event_type(tmp_path / "types", out_of_orderness="10m", source=f"pubsub:{SUB}")


def _options(tmp_path: Path, **kw) -> RunOptions:
    return RunOptions(sink=str(tmp_path / "sink"), checkpoint=str(tmp_path / "ck"),
                      trigger_interval=kw.pop("trigger_interval", "60s"), tick_seconds=0.2, **kw)


class _Run:
    """A job running in a thread as ``event-etl run`` runs it (one type, or a fleet of one), its stops at hand."""

    def __init__(self, et, options: RunOptions, *, fleet: bool = False) -> None:
        self.stops = StopSignals()
        self.events: list[tuple[str, Any]] = []  # what the controller told its listeners (one type only)
        self.result: dict[str, Any] = {}

        def target() -> None:
            try:
                if fleet:
                    self.result["summary"] = run_fleet([et], options, spark=FakeSpark(), install_signals=False,
                                                       stops=self.stops, status_every_s=3600)
                else:
                    self.result["summary"] = run_job(et, options, spark=FakeSpark(), install_signals=False,
                                                     stops=self.stops, listeners=[self.heard])
            except BaseException as err:  # noqa: BLE001 - handed to the test
                self.result["error"] = err

        self.thread = threading.Thread(target=target, name="test-job", daemon=True)
        self.thread.start()

    def heard(self, kind: str, payload: Any) -> None:
        self.events.append((kind, payload))

    def wait(self, cond, what: str, timeout: float = 10.0) -> None:
        """Wait until ``cond()`` holds; the job's own error if it ended meanwhile."""
        deadline = time.monotonic() + timeout
        while not cond():
            if not self.thread.is_alive():
                self.end()
                raise AssertionError(f"the job ended before {what}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def end(self, timeout: float = 60.0) -> dict[str, Any]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the job did not end"
        if "error" in self.result:
            raise self.result["error"]
        return self.result["summary"]


def _spool(tmp_path: Path, fleet_type: str | None = None) -> Path:
    root = tmp_path / "ck" / fleet_type if fleet_type else tmp_path / "ck"
    return root / "etl" / "source" / "pubsub"


def _in_open_segments(spool: Path) -> int:
    from event_etl.sources.spool import _scan

    return sum(_scan(p.read_bytes()).count for p in (spool / "segments").glob("*.open"))


def _check_hour(tmp_path: Path, h: int, ids: list[str]) -> None:
    """Every one of ``ids`` in hour ``h``'s own files, the hour marked with all of them, nothing late anywhere."""
    content = read_sink(tmp_path / "sink", "click")
    assert sorted(content[h].timely) == sorted(ids), "every acknowledged message in its own hour"
    assert content[h].marker is not None and content[h].marker.records == len(ids)
    assert not [i for hc in content.values() for i in hc.late], "none left to come late"


@pytest.mark.parametrize("fleet", [False, True], ids=["one type", "fleet"])
def test_a_sigterm_drain_reads_the_open_and_the_unoffered_segments_before_it_marks_the_hour(tmp_path, pubsub, fleet,
                                                                                            monkeypatch):
    """Acknowledged messages in closed segments no batch has been offered (the next round is a minute away) and in
    an open segment when SIGTERM comes: the drain reads them all, then marks their hour."""
    planned = []
    plan = SharedEngine.plan
    monkeypatch.setattr(SharedEngine, "plan", lambda self, names: (planned.append(names), plan(self, names))[1])
    et = _event_type(tmp_path)
    h = _hour()
    run = _Run(et, _options(tmp_path), fleet=fleet)
    spool = _spool(tmp_path, "click" if fleet else None)
    run.wait(lambda: planned, what="the first round")  # over an empty spool: the next one is a minute away
    ids = _publish(pubsub, "a", h, 20) + _publish(pubsub, "b", h + 30 * MINUTE, 5)
    run.wait(lambda: len(pubsub.acked) == 25 and _in_open_segments(spool) == 5, what="25 messages acknowledged")
    assert len(list((spool / "segments").glob("*.seg"))) == 2, "two closed segments, not offered yet"
    run.stops.request(signal.SIGTERM)
    summary = run.end()
    drained = summary["click"]["drained"] if fleet else summary["drained"]
    assert drained
    _check_hour(tmp_path, h, ids)
    assert not list((spool / "segments").glob("*.open")) and not list((spool / "segments").glob("*.seg"))
    if not fleet:  # the hour was marked once every batch holding its messages was saved, not before
        order = [(kind, p.result.counts.get("timely", 0) if kind == "batch" else getattr(p, "hour", None))
                 for kind, p in run.events if kind in ("batch", "marker")]
        assert order[-1] == ("marker", h) and sum(n for kind, n in order if kind == "batch") == 25, order


def test_once_drain_reads_every_segment_before_it_marks_the_hour(tmp_path, pubsub):
    """``--once --drain``: the fetcher closes its open segment and says the subscription is empty (``DRAINED``)
    before the planner ends the run, so the drain finds the spool read."""
    et = _event_type(tmp_path)
    h = _hour()
    ids = _publish(pubsub, "a", h, 25)  # two segments of 10, and 5 in a segment closed only once the run found it empty
    summary = _Run(et, _options(tmp_path, once=True, drain=True)).end()
    assert summary["drained"] and summary["events_in"] == 25
    _check_hour(tmp_path, h, ids)


def _killed_run_left_leased(tmp_path: Path, svc, n: int) -> None:
    """A run killed after its pull and before its spool: ``n`` messages leased to nobody for 1 s, and a spool whose
    record says the run did not stop cleanly (the next run settles for the subscription's ack deadline + 2 s)."""
    Fetcher(SUB, _spool(tmp_path), settings=FetchSettings(streams=1), client_factory=lambda: svc).begin_run()
    svc.deadline_s = 1.0
    got = 0
    while got < n:
        got += len(svc.pull(SUB, n - got).received_messages)


def test_a_drain_waits_for_the_source_to_settle_and_reads_what_comes_back_meanwhile(tmp_path, pubsub, monkeypatch,
                                                                                  capsys):
    """SIGTERM as the run starts, while the messages a killed run pulled are still leased to it: the drain says how
    long it waits, and waits.  Batches go on reading meanwhile, so the spool's bound (20 messages here) does not
    stop the pulls: every redelivered message is read, and none is left for the next run to bring late."""
    monkeypatch.setenv("EVENT_ETL_PUBSUB_MAX_HELD_MESSAGES", "20")
    pubsub.subscription_deadline = 2  # settles for 2 + 2 s from when the job took its checkpoint
    et = _event_type(tmp_path)
    h = _hour()
    ids = _publish(pubsub, "a", h, 100)
    _killed_run_left_leased(tmp_path, pubsub, 100)  # delivered again after 1 s
    started = time.monotonic()
    run = _Run(et, _options(tmp_path, trigger_interval="200ms"))
    run.stops.request(signal.SIGTERM)  # before the first round
    summary = run.end()
    out = capsys.readouterr().out
    assert re.search(r"\[click\] before the drain marks hours: waiting [34] s for messages a killed run left leased "
                     "to come back", out), out
    assert time.monotonic() - started > 3.9, "the settling was waited out"
    assert summary["drained"] and summary["events_in"] == 100
    _check_hour(tmp_path, h, ids)
    assert not pubsub.queue and len(pubsub.acked) == 100, "the subscription emptied before the hour was marked"


def test_a_second_sigterm_while_the_drain_waits_for_the_settling_stops_at_once(tmp_path, pubsub, capsys):
    """The wait for the settling is a drain's: a second SIGTERM stops at once (exit 143), and no hour is marked."""
    pubsub.subscription_deadline = 60  # settles for a minute
    et = _event_type(tmp_path)
    h = _hour()
    _publish(pubsub, "a", h, 10)
    _killed_run_left_leased(tmp_path, pubsub, 10)
    run = _Run(et, _options(tmp_path))
    run.stops.request(signal.SIGTERM)
    run.wait(lambda: "before the drain marks hours: waiting" in capsys.readouterr().out, timeout=30,
             what="the wait for the settling")
    run.stops.request(signal.SIGTERM)
    started = time.monotonic()
    with pytest.raises(Interrupted) as info:
        run.end(timeout=30)
    assert info.value.exit_code == 143 and "stopped at once" in info.value.message
    assert time.monotonic() - started < 10
    assert not any(hc.marker for hc in read_sink(tmp_path / "sink", "click").values())


def test_a_fleet_type_whose_source_failed_is_not_drained_over_its_spool_and_the_next_run_reads_it(tmp_path, pubsub,
                                                                                                 capsys):
    """A type of a fleet quarantined because Pub/Sub stayed unreachable, while messages it acknowledged wait in an
    open segment: SIGTERM drains the fleet, but not this type over its spool (its status says why, its hours stay
    open).  The next run reads the spool, then marks the hour with every message in it."""
    et = _event_type(tmp_path)
    h = _hour()
    first = _publish(pubsub, "a", h, 10)  # one segment, read by a batch
    run = _Run(et, _options(tmp_path, trigger_interval="200ms"), fleet=True)
    spool = _spool(tmp_path, "click")
    run.wait(lambda: len(read_sink(tmp_path / "sink", "click").get(h, SimpleNamespace(timely=[])).timely) == 10,
             what="the first segment read")
    second = _publish(pubsub, "b", h + 30 * MINUTE, 5)  # acknowledged, in an open segment
    run.wait(lambda: _in_open_segments(spool) == 5 and len(pubsub.acked) == 15, what="5 more acknowledged")
    pubsub.outage = True
    status = tmp_path / "ck" / "click" / "etl" / "status.json"
    run.wait(lambda: json.loads(status.read_text())["state"] == "quarantined", timeout=20, what="the quarantine")
    run.stops.request(signal.SIGTERM)
    summary = run.end()["click"]
    assert summary["state"] == "drain failed" and not summary["drained"], summary
    assert "cannot drain: the spool still holds 1 segment (5 messages)" in summary["last_error"], summary
    assert "[click] not drained: cannot drain: the spool still holds" in capsys.readouterr().err
    assert read_sink(tmp_path / "sink", "click")[h].marker is None, "the hour stays open"

    pubsub.outage = False
    summary = _Run(et, _options(tmp_path, once=True, drain=True), fleet=True).end()["click"]
    assert summary["drained"], summary
    _check_hour(tmp_path, h, first + second)


def test_the_spool_is_read_only_once_a_committed_batch_has_read_every_segment(tmp_path):
    """What :func:`spool_left` counts: an open segment, a segment the planner's log does not name yet, a segment
    named after the end offset of the last committed batch; not a segment a committed batch read (a query's
    source deletes it only when Spark plans its next batch)."""
    spool = tmp_path / "spool"
    segdir, logdir = spool / "segments", spool / "log"
    segdir.mkdir(parents=True)
    logdir.mkdir()
    fetcher = SimpleNamespace(segdir=segdir)
    log = SparkLog(tmp_path / "spark")
    names = [f"a1b2c3d4-00-{i:08d}-n10.seg" for i in range(3)]
    for n in names:
        (segdir / n).write_bytes(b"")
    assert spool_left(fetcher, log.root) == "3 segments (30 messages)", "none listed, nothing committed"
    (logdir / f"{5:012d}.json").write_text(json.dumps(names[:2]))  # at places 5 and 6 of the log
    log.write_offset(0, {"spool": 0, "seg": 6}, now=0, conf={})
    assert spool_left(fetcher, log.root) == "3 segments (30 messages)", "batch 0 not committed"
    log.write_commit(0)
    assert spool_left(fetcher, log.root) == "2 segments (20 messages)", "the one at 6 not read, the third not listed"
    (logdir / f"{7:012d}.json").write_text(json.dumps(names[2:]))
    log.write_offset(1, {"spool": 0, "seg": 8}, now=0, conf={})
    log.write_commit(1)
    assert spool_left(fetcher, log.root) is None
    (segdir / "a1b2c3d4-00-00000003.open").write_bytes(b"")
    assert spool_left(fetcher, log.root) == "1 open segment"


def test_a_drain_refuses_while_the_source_settles(tmp_path):
    """The controller's own rule, as for a tick: while input a killed run held may still come back, no drain closes
    an hour (the runner waits the settling out before it drains; this is what holds should anything drain sooner)."""
    clock = FakeClock(t("13:30"))
    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types"), clock)
    p.batch([click("a", "13:05")])
    p.controller.source_activity = lambda: SourceActivity(clock(), 0, False, None, settling=True)
    with pytest.raises(IntegrityError, match="cannot drain: the source is settling"):
        p.controller.drain()
    assert p.controller.state.marked_through is None
    p.controller.source_activity = lambda: SourceActivity(clock(), 0, False, None, settling=False)
    assert [m.hour for m in drain_job(SimpleNamespace(fetcher=None, controller=p.controller))] == [t("13:00")]
