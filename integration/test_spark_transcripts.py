"""The event-time transcripts again, through the real Spark job on the directory source.

Every batch step becomes one input file and one ``run --once`` of the job on the same
checkpoint, so each batch is also a restart.  The job lists the file at the real clock:
cases that need arrivals at given times, idle ticks or replays declare ``runs_on: [local]``
and are covered by the unit transcripts and by the crash tests.
"""

from __future__ import annotations

import pytest

from event_etl.runner import RunOptions, run_job
from tests.harness import FakeClock, make_event_type, t
from tests.test_transcripts import CASES, _check, _payload

SPARK_CASES = [(f, c) for f, c in CASES if "spark" in c.get("runs_on", ("local", "spark"))]


class _SparkPipeline:
    """What tests.test_transcripts._check reads: sink, event type, and the controller's state."""

    def __init__(self, sink, et, controller):
        self.sink, self.et, self.controller = sink, et, controller


@pytest.mark.parametrize("case", [c for _, c in SPARK_CASES], ids=[f"{f}:{c['name']}" for f, c in SPARK_CASES])
def test_transcript_through_spark(spark, tmp_path, case):
    settings = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}
    settings.update(case.get("settings", {}))
    et = make_event_type(tmp_path / "types", **settings)
    inputs = tmp_path / "in"
    inputs.mkdir()
    sink = tmp_path / "sink"
    clock = FakeClock(t("00:00"))
    seen = {}

    def listener(kind, payload):
        seen["controller_state"] = payload

    opts = dict(source=f"dir:{inputs}", sink=str(sink), checkpoint=str(tmp_path / "ckpt"), quiet=True,
                max_files_per_batch=1)
    from event_etl.checkpoint import Checkpoint

    for i, step in enumerate(case["steps"]):
        if "batch" in step:
            clock.now = t(step["at"])
            f = inputs / f"{i:04d}.jsonl"
            f.write_bytes(b"\n".join(_payload(ev) for ev in step["batch"]) + b"\n")
            run_job(et, RunOptions(once=True, **opts), spark=spark, clock=clock, install_signals=False)
        elif "drain" in step:
            run_job(et, RunOptions(drain=True, **opts), spark=spark, clock=clock, install_signals=False)
        elif "restart" in step:
            pass  # every run is a restart here
        state = Checkpoint(tmp_path / "ckpt").load_state()
        _check(_SparkPipeline(sink, et, type("C", (), {"state": state})), step.get("expect", {}), f"step {i + 1}")
