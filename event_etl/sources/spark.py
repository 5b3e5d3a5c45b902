"""The Spark face of every source: a Python streaming data source whose rows are splits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from event_etl.sources.registry import batch_cap, batch_unit, make_planner
from event_etl.sources.splits import SPLIT_SCHEMA, Split

__all__ = ["EtlSource", "make_planner"]


class SplitPartition(InputPartition):
    def __init__(self, splits: list[Split]) -> None:
        super().__init__(len(splits))
        self.splits = splits


class EtlStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.planner = make_planner(spec)
        self._delivered_at: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        offset: dict[str, Any] = self.planner.initial_offset()
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = batch_cap(self.spec)
        return ReadMaxFiles(cap) if batch_unit(self.spec) == "files" else ReadMaxRows(cap)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if isinstance(limit, ReadMaxFiles):
            cap = limit.max_files
        elif isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            cap = None
        else:
            cap = None
        end: dict[str, Any] = self.planner.latest_offset(start, cap)
        self._report(start, end)
        return end

    def _report(self, start: dict[str, Any], end: dict[str, Any]) -> None:
        """Tell the controller whether input waits (see :mod:`event_etl.sources.activity`)."""
        from event_etl.sources.activity import observe, report_activity
        from event_etl.timeutil import now_millis

        activity = observe(self.planner, start, end, now=now_millis(), delivered_at=self._delivered_at)
        self._delivered_at = activity.delivered_at
        report_activity(self.spec["log_dir"], activity)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The newest offset available (for the backlog metric), or None where the source cannot tell."""
        report = getattr(self.planner, "reported_latest", None)
        latest: dict[str, Any] | None = report() if report is not None else None
        return latest

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [SplitPartition([s]) for s in self.planner.splits(start, end)]

    def __getstate__(self) -> dict[str, Any]:
        # Spark ships the reader to executors for read(), which needs only the partition: the
        # planner (clients, threads, file logs) stays on the driver side.
        return {"spec": self.spec, "planner": None}

    def read(self, partition: InputPartition) -> Iterator[tuple[int, str, str, int, int, int, str]]:
        for s in partition.splits:  # type: ignore[attr-defined]
            yield s.as_row()

    def commit(self, end: dict[str, Any]) -> None:
        self.planner.commit(end)

    def stop(self) -> None:
        stop = getattr(self.planner, "stop", None)
        if stop is not None:
            stop()


class EtlSource(DataSource):
    """``spark.readStream.format("event_etl").option("spec", json)``: splits of one job's source."""

    @classmethod
    def name(cls) -> str:
        return "event_etl"

    def schema(self) -> str:
        return SPLIT_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EtlStreamReader(json.loads(self.options["spec"]))
