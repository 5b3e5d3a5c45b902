"""``generate:``: the built-in generator as a streaming source.

Offsets count generated events.  ``latestOffset`` makes ``rate`` events available per
wall-clock second since the job's first start (``t0``, kept in the offset), so a job that
was down finds a backlog, as with a real bus.  The generator's parameters are frozen in
the offsets when the checkpoint is created: a replayed batch regenerates exactly the
same payloads.  With ``count=N`` every event up to N counts as available at once (for
``--once`` runs and tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from event_etl.sources.face import OpenRequest, PlannedSession, Source
from event_etl.sources.generator import GeneratorParams
from event_etl.sources.splits import Split

__all__ = ["GeneratorPlanner", "GeneratorSource"]

SPLIT_ROWS = 250_000
MIN_SPLIT_ROWS = 5_000
FIRST_BATCH_ROWS = 20_000


class GeneratorPlanner:
    def __init__(
        self, params: GeneratorParams, *, max_rows: int, clock: Callable[[], int], tasks_per_batch: int = 2
    ) -> None:
        self.params = params
        self.tasks_per_batch = max(1, tasks_per_batch)
        self.max_rows = max_rows
        self.clock = clock
        self.target: int | None = None
        self._last_start: dict[str, Any] | None = None

    def initial_offset(self) -> dict[str, Any]:
        return {"n": 0, "t0": self.clock(), "p": self.params.to_json()}

    def _due(self, start: dict[str, Any]) -> int:
        p = GeneratorParams.from_json(start["p"])
        if p.count:
            return p.count
        return int((self.clock() - int(start["t0"])) / 1000.0 * p.rate)

    def prepare_available_now(self) -> None:
        self.target = -1  # fixed on the first latest_offset, which knows the start offset

    def reported_latest(self) -> dict[str, Any] | None:
        start = self._last_start
        if start is None:
            return None
        due = self._due(start) if self.target in (None, -1) else self.target
        return {"n": due, "t0": start["t0"], "p": start["p"]}

    def latest_offset(self, start: dict[str, Any], max_rows: int | None) -> dict[str, Any]:
        self._last_start = start
        n = int(start["n"])
        if self.target == -1:
            self.target = self._due(start)
        due = self._due(start) if self.target is None else self.target
        if n == 0:
            max_rows = min(max_rows or FIRST_BATCH_ROWS, FIRST_BATCH_ROWS)  # no watermark yet: keep it small
        end = due if max_rows is None else min(due, n + max_rows)
        return {"n": max(n, end), "t0": start["t0"], "p": start["p"]}

    def backlog(self, start: dict[str, Any]) -> dict[str, int]:
        return {"events": max(0, self._due(start) - int(start["n"]))}

    def splits(self, start: dict[str, Any], end: dict[str, Any]) -> list[Split]:
        a, b = int(start["n"]), int(end["n"])
        total = b - a
        if total <= 0:
            return []
        pieces = max(-(-total // SPLIT_ROWS), min(self.tasks_per_batch, max(1, total // MIN_SPLIT_ROWS)))
        meta = json.dumps(end["p"], sort_keys=True)
        bounds = [a + total * k // pieces for k in range(pieces + 1)]
        return [Split(k, "gen", "", lo, hi, 0, meta) for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if hi > lo]

    def commit(self, end: dict[str, Any]) -> None:
        pass


class GeneratorSource(Source):
    """``generate:``: the built-in generator, planned by the engine at every round."""

    @classmethod
    def open(cls, request: OpenRequest) -> PlannedSession:
        spec = request.spec
        session = PlannedSession(GeneratorPlanner(
            GeneratorParams.from_json(spec["params"]), max_rows=int(spec["max_events_per_batch"]), clock=request.clock,
            tasks_per_batch=int(spec.get("tasks_per_batch", 2)),
        ))
        session.event_clock = True
        return session
