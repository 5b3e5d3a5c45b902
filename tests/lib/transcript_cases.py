"""The event-time transcripts' cases (tests/transcripts/*.yaml) and the negative ones (tests/transcripts/negative/),
loaded once: the local run (tests/test_transcripts.py) and the Spark run (integration/test_spark_transcripts.py)
take them from here."""

from __future__ import annotations

from pathlib import Path

from event_etl.testing.transcripts import load_cases

__all__ = ["CASES", "FOLDER", "NEGATIVE"]

FOLDER = Path(__file__).resolve().parents[1] / "transcripts"
CASES = load_cases(sorted(FOLDER.glob("*.yaml")))
NEGATIVE = load_cases(sorted((FOLDER / "negative").glob("*.yaml")))
