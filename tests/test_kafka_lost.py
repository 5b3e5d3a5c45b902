"""Issue 40, Kafka: records retention deleted before the job read them (``EVENT_ETL_KAFKA_ON_DATA_LOSS=skip``) are
counted per batch from its offsets and reported in the progress line, the run's summary and a metric; each
partition's lag is a metric.

Against a real Kafka-protocol broker (tansu, as tests/test_kafka_source.py): tansu cannot delete records
(no ``DeleteRecords``, no retention run on demand), so a loss is a faked low watermark over the broker's real
answers, the way tests/test_kafka_source.py fakes it; everything else is the real planner, the shared engine's
:class:`~event_etl.job.engine.Lane` and Spark offset log, the executor and the controller (no Spark)."""

from __future__ import annotations

import io
import json
import uuid

import pytest

from event_etl.job.progress import ProgressPrinter, format_summary
from event_etl.settings import Settings, settings_in_force
from event_etl.sources.kafka import KafkaPlanner
from event_etl.sources.kafka_offsets import lag_by_partition, lost_between
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type

NOW = 1_764_003_600_000  # 2025-11-24 17:00 UTC


# -- the offsets alone (no broker) -------------------------------------------------------------

def test_the_records_a_batch_lost_are_its_end_lost_minus_its_start_lost():
    start = {"topic": "t", "topic_id": "i", "partitions": {"0": 5, "1": 9}, "lost": {"1": 4}}
    end = {"topic": "t", "topic_id": "i", "partitions": {"0": 9, "1": 20}, "lost": {"1": 10, "2": 3}}
    assert lost_between(start, end) == {1: 6, 2: 3}
    assert lost_between(end, end) == {}  # a batch that lost nothing more
    assert lost_between(None, end) == {1: 10, 2: 3}  # batch 0: its start is the initial offset (nothing lost)
    assert lost_between({"files": 3}, {"files": 4}) == {}  # another source's offsets


def test_a_partitions_lag_is_its_high_watermark_minus_the_committed_offset():
    end = {"topic": "t", "topic_id": "i", "partitions": {"0": 5, "1": 9}}
    latest = json.dumps({"topic": "t", "topic_id": "i", "partitions": {"0": 7, "1": 9, "2": 4}})  # as Spark's JSON
    assert lag_by_partition(end, latest) == {("t", 0): 2, ("t", 1): 0, ("t", 2): 4}
    assert lag_by_partition({"files": 3}, {"files": 5}) is None
    assert lag_by_partition({"n": 3, "partitions": {}}, {"n": 5, "partitions": {}}) is None  # not Kafka's shape


def test_the_progress_line_and_the_summary_say_lost():
    out = io.StringIO()
    printer = ProgressPrinter("click", lambda: NOW, out=out)
    from event_etl.job.controller import BatchEvent
    from event_etl.rules.watermark import WatermarkState
    from event_etl.task.report import BatchResult

    ev = BatchEvent(3, BatchResult(), WatermarkState(), [], NOW - 1000, NOW, False, 0, {2: 1_500, 0: 7})
    printer("batch", ev)
    assert out.getvalue().rstrip().endswith("LOST 1,507 (deleted by retention before read; partition 0: 7, 2: 1,500)")
    quiet = printer.batch_line(BatchEvent(4, BatchResult(), WatermarkState(), [], NOW - 1000, NOW, False))
    assert "LOST" not in quiet
    summary = {"event_type": "click", "batches": 2, "seconds": 1.0, "events_in": 0, "events_per_second": 0.0,
               "totals": {"lost": 1_507}, "watermark": None, "hours_marked": []}
    assert "  LOST           1,507 (deleted by the source's retention" in format_summary(summary)
    assert "LOST" not in format_summary({**summary, "totals": {}})


def test_a_fleets_summary_line_says_lost():
    from event_etl.job.fleet import summary_lines

    (line,) = summary_lines({"click": {"state": "stopped", "batches": 2, "totals": {"lost": 12}, "hours_marked": []}})
    assert "12 records LOST" in line
    (line,) = summary_lines({"click": {"state": "stopped", "batches": 2, "totals": {}, "hours_marked": []}})
    assert "LOST" not in line


# -- against a broker --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(kafka_broker):
    """The module's tansu broker (tests/lib/kafka_brokers.py), the job's settings pointing at it."""
    with settings_in_force(Settings.from_env({"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap})):
        yield kafka_broker


def _topic(broker, partitions: int, records: list[tuple[int, bytes]]) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions)
    broker.produce(name, [(p, value, None, NOW - 50_000 + i, None) for i, (p, value) in enumerate(records)])
    return name


def _fake_lows(monkeypatch, planner: KafkaPlanner, lows: dict[int, int]) -> None:
    """Retention deleted the records of partition p below lows[p] (the broker's high watermarks stay real)."""
    real = KafkaPlanner._watermarks.__get__(planner)

    def faked(partitions):
        return {p: (max(lo, lows.get(p, lo)), hi) for p, (lo, hi) in real(partitions).items()}

    monkeypatch.setattr(planner, "_watermarks", faked)


def test_lost_records_and_the_lag_per_partition_through_the_shared_engines_lane(tmp_path, broker, monkeypatch):
    """The shared engine's path without Spark: the lane plans with the real planner and writes the batch's offset
    to the Spark log, the controller runs the batch through the real executor and counts what the batch's offsets
    say was lost (as event_etl.job.setup wires it), the metrics read the lag from the lane's progress."""
    from event_etl.job.lane import Lane, SparkLog
    from event_etl.metrics import JobMetrics, PrometheusEndpoint
    from event_etl.sources.kafka import KafkaSession
    from tests.lib.metrics import value

    topic = _topic(broker, 2, [(i % 2, click(f"e{i}", NOW - 60_000 + i)) for i in range(40)])  # 20 a partition
    et = make_event_type(tmp_path / "types")
    p = LocalPipeline(tmp_path, et, FakeClock(NOW))
    spark_dir = p.ckpt.spark_dir
    out = io.StringIO()
    p.controller.listeners.append(ProgressPrinter(et.name, p.clock, out=out))
    prom = PrometheusEndpoint()
    metrics = JobMetrics(et.name, clock=p.clock, controller_state=lambda: p.controller.state, exports=[prom])
    p.controller.listeners.extend(metrics.listeners)
    planner = KafkaPlanner(topic, event_type=et.name, on_loss="skip")
    session = KafkaSession(planner, str(spark_dir))
    p.controller.source = session  # its hooks, as event_etl.job.setup gives them to the controller
    try:
        lane = Lane.open(session, SparkLog(spark_dir), cap=30, once=False)
        assert value(prom.text(), "event_etl_input_lost_records_total", event_type=et.name) == 0  # from the start

        def run_batch() -> None:
            batch, start, end = lane.offer(now=NOW, conf={})
            p.controller.run_batch(batch, p.task_runner(planner.splits(start, end)))
            lane.committed()
            metrics.observe_progress(lane.progress())

        _fake_lows(monkeypatch, planner, {1: 6})  # partition 1 lost offsets 0..5 before the first batch
        run_batch()  # 30 of the 34 left: partition 1's 14, 16 of partition 0's 20
        s = prom.text()
        assert value(s, "event_etl_input_lost_records_total", event_type=et.name) == 6
        assert value(s, "event_etl_kafka_lag_records", event_type=et.name, topic=topic, partition="0") == 4
        assert value(s, "event_etl_kafka_lag_records", event_type=et.name, topic=topic, partition="1") == 0
        assert value(s, "event_etl_input_backlog_events", event_type=et.name) == 4
        assert "LOST 6 (deleted by retention before read; partition 1: 6)" in out.getvalue()

        _fake_lows(monkeypatch, planner, {0: 18})  # partition 0 lost offsets 16 and 17 since
        run_batch()
        s = prom.text()
        assert value(s, "event_etl_input_lost_records_total", event_type=et.name) == 8
        assert value(s, "event_etl_kafka_lag_records", event_type=et.name, topic=topic, partition="0") == 0
        lines = out.getvalue().splitlines()
        assert lines[-1].endswith("LOST 2 (deleted by retention before read; partition 0: 2)"), lines[-1]
        assert p.controller.totals["lost"] == 8
        assert json.loads((spark_dir / "offsets" / "1").read_text().splitlines()[-1])["lost"] == {"0": 2, "1": 6}
        written = sum(p.controller.totals.get(o, 0) for o in ("timely", "late"))
        assert written == 40 - 8, p.controller.totals  # every record left read once; the lost ones counted

        broker.produce(topic, [(1, click("new", NOW - 1_000), None, NOW - 1_000, None)] * 3)
        planner.latest_offset(lane.start, 0)  # asks for the watermarks, as the engine does at its next round
        metrics.observe_progress(lane.progress())
        s = prom.text()
        assert value(s, "event_etl_kafka_lag_records", event_type=et.name, topic=topic, partition="1") == 3
        assert value(s, "event_etl_input_lost_records_total", event_type=et.name) == 8  # counted once
        _lint(s)
    finally:
        planner.stop()
        metrics.shutdown()


def _lint(text: str) -> None:
    """promtool's lint of a Kafka job's scrape (tests/test_monitoring.py lints one of a directory source's)."""
    import subprocess

    from tests.lib.metrics import promtool

    r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    flagged = {line.split()[0] for line in (r.stdout + r.stderr).splitlines() if line.startswith("event_etl_")}
    assert flagged <= {"event_etl_hours_completed_total"}, r.stdout + r.stderr  # the 0.1 name, flagged as known
