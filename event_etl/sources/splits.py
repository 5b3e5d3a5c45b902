"""A split: one unit of a micro-batch's input, read by one executor task."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Split", "SPLIT_SCHEMA"]

SPLIT_SCHEMA = "shard int, kind string, uri string, start long, end long, arrival long, meta string"


@dataclass(frozen=True)
class Split:
    """Where a task finds its payloads.

    - ``shard``: index of the split in its batch; part of the output file names.
    - ``kind``: ``file`` (bytes ``start``..``end`` of ``uri``, whole lines) or ``gen``
      (generator indexes ``start``..``end``, parameters in ``meta``).
    - ``arrival``: when the payloads arrived (ms), for splits that share one arrival time.
    """

    shard: int
    kind: str
    uri: str
    start: int
    end: int
    arrival: int
    meta: str = ""

    def as_row(self) -> tuple:
        return (self.shard, self.kind, self.uri, self.start, self.end, self.arrival, self.meta)
