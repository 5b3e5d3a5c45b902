"""Event-time transcripts (tests/transcripts/*.yaml) run through the real executor and controller.

The harness is :mod:`event_etl.testing.transcripts`; :class:`LocalTranscripts` is its local
pipeline.  The negative transcripts (tests/transcripts/negative/) hold wrong expectations on
purpose: the checker must catch each one, and name it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from event_etl.testing.transcripts import Case, Observed, TranscriptMismatch, run_case, t
from tests.lib.harness import FakeClock, LocalPipeline, make_event_type
from tests.lib.transcript_cases import CASES, NEGATIVE


class LocalTranscripts:
    """The local pipeline of the transcripts: :class:`tests.lib.harness.LocalPipeline`, with a clock the test owns."""

    name = "local"

    def __init__(self, tmp_path: Path, case: Case) -> None:
        self.clock = FakeClock(t("00:00"))
        self.p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types", **case.event_type_settings()), self.clock)
        self.batches: dict[int, list[bytes]] = {}
        self.parted: dict[int, dict[str, list[bytes]]] = {}

    @staticmethod
    def _shards(lines: list[bytes]) -> int:
        return 2 if len(lines) > 2 else 1

    def batch(self, payloads: list[bytes], *, at: int, parts: list[str] | None = None) -> None:
        self.clock.now = at
        if parts is not None:  # a partitioned source's batch: one split per part
            by_part: dict[str, list[bytes]] = {}
            for part, pl in zip(parts, payloads):
                by_part.setdefault(part, []).append(pl)
            ev = self.p.batch_parts(by_part)
            self.parted[ev.batch_id] = by_part
            return
        ev = self.p.batch(payloads, shards=self._shards(payloads))
        self.batches[ev.batch_id] = payloads

    def idle(self, at: int) -> None:
        self.clock.now = at
        self.p.controller.tick()

    def drain(self) -> None:
        self.p.controller.drain()

    def restart(self) -> None:
        self.p.restart()

    def replay(self, batch: int) -> None:
        if batch in self.parted:
            self.p.batch_parts(self.parted[batch], batch_id=batch)
            return
        self.p.batch(self.batches[batch], batch_id=batch, shards=self._shards(self.batches[batch]))

    def observe(self) -> Observed:
        return Observed(self.p.sink, self.p.et.name, self.p.controller.state.watermark)


LOCAL_CASES = [c for c in CASES if c.runs_here("local")]
LOCAL_NEGATIVE = [c for c in NEGATIVE if c.runs_here("local")]


def test_every_case_runs_somewhere_and_none_is_negative():
    assert CASES and NEGATIVE
    assert all(c.runs_on for c in CASES)
    assert not [c.id for c in CASES if c.fails], "negative cases belong in transcripts/negative/"
    assert not [c.id for c in NEGATIVE if not c.fails], "a negative case says which expectation fails"


@pytest.mark.parametrize("case", LOCAL_CASES, ids=[c.id for c in LOCAL_CASES])
def test_transcript(case, tmp_path):
    run_case(case, LocalTranscripts(tmp_path, case))


@pytest.mark.parametrize("case", LOCAL_NEGATIVE, ids=[c.id for c in LOCAL_NEGATIVE])
def test_the_checker_catches_a_wrong_expectation(case, tmp_path):
    with pytest.raises(TranscriptMismatch) as caught:
        run_case(case, LocalTranscripts(tmp_path, case))
    assert caught.value.what == case.fails, str(caught.value)
