"""The event-time transcripts again, through the real Spark job on the directory source.

:class:`SparkTranscripts` is the Spark pipeline of :mod:`event_etl.testing.transcripts`.
Every batch step becomes one input file and one ``run --once`` of the job on the same
checkpoint, so each batch is also a restart.  The job lists the file at the real clock:
cases that need arrivals at given times, idle ticks or replays declare ``runs_on: [local]``
and are covered by the unit transcripts and by the crash tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from event_etl.job.checkpoint import Checkpoint
from event_etl.job.driver import run_job
from event_etl.job.setup import RunOptions
from event_etl.testing.transcripts import Case, Observed, TranscriptMismatch, run_case, t
from tests.lib.harness import FakeClock, make_event_type
from tests.lib.transcript_cases import CASES, NEGATIVE

SPARK_CASES = [c for c in CASES if c.runs_here("spark")]
# one negative case is enough to show the Spark pipeline's observations reach the checker
SPARK_NEGATIVE = [c for c in NEGATIVE if c.runs_here("spark")][:1]


class SparkTranscripts:
    """The Spark job as a transcript pipeline: one ``run --once`` (or ``--drain``) per step."""

    name = "spark"

    def __init__(self, spark, tmp_path: Path, case: Case) -> None:
        self.spark = spark
        self.et = make_event_type(tmp_path / "types", **case.event_type_settings())
        self.inputs = tmp_path / "in"
        self.inputs.mkdir()
        self.sink = tmp_path / "sink"
        self.ckpt = tmp_path / "ckpt"
        self.clock = FakeClock(t("00:00"))
        self.files = 0
        self.opts = dict(source=f"dir:{self.inputs}", sink=str(self.sink), checkpoint=str(self.ckpt), quiet=True,
                         max_files_per_batch=1)

    def _run(self, **how) -> None:
        run_job(self.et, RunOptions(**how, **self.opts), spark=self.spark, clock=self.clock, install_signals=False)

    def batch(self, payloads: list[bytes], *, at: int) -> None:
        self.clock.now = at
        (self.inputs / f"{self.files:04d}.jsonl").write_bytes(b"\n".join(payloads) + b"\n")
        self.files += 1
        self._run(once=True)

    def drain(self) -> None:
        self._run(drain=True)

    def restart(self) -> None:
        pass  # every run is a restart here

    def idle(self, at: int) -> None:
        raise NotImplementedError("the Spark job lists files at the real clock: such a case runs_on [local]")

    def replay(self, batch: int) -> None:
        raise NotImplementedError("a replay is Spark's own, after a crash: such a case runs_on [local]")

    def observe(self) -> Observed:
        return Observed(self.sink, self.et.name, Checkpoint(self.ckpt).load_state().watermark)


@pytest.mark.parametrize("case", SPARK_CASES, ids=[c.id for c in SPARK_CASES])
def test_transcript_through_spark(spark, tmp_path, case):
    run_case(case, SparkTranscripts(spark, tmp_path, case))


@pytest.mark.parametrize("case", SPARK_NEGATIVE, ids=[c.id for c in SPARK_NEGATIVE])
def test_the_checker_catches_a_wrong_expectation_through_spark(spark, tmp_path, case):
    with pytest.raises(TranscriptMismatch) as caught:
        run_case(case, SparkTranscripts(spark, tmp_path, case))
    assert caught.value.what == case.fails, str(caught.value)
