"""A split: one unit of a micro-batch's input, read by one executor task."""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Split"]


@dataclass(frozen=True)
class Split:
    """Where a task finds its payloads.

    - ``shard``: index of the split in its batch; part of the output file names.
    - ``kind``: ``files`` (``meta`` lists ``[path, start, end, arrival]`` byte ranges of whole
      lines), ``gen`` (generator indexes ``start``..``end``, parameters in ``meta``), ``seg``
      (ranges of spooled Pub/Sub segments), ``spool`` (a 0.1.0 spool file) or ``kafka`` (offsets
      ``start``..``end`` of the topic ``uri``, ``meta`` ``{"partition": p, "topic_id": id}``, no
      secrets: the task reads the settings itself); each kind is read by
      its reader (:func:`event_etl.sources.registry.split_reader`, :mod:`event_etl.sources.read`).
    - ``arrival``: when the payloads arrived (ms), where one time holds for the whole split.
    """

    shard: int
    kind: str
    uri: str
    start: int
    end: int
    arrival: int
    meta: str = ""

    @classmethod
    def of_files(cls, shard: int, ranges: list[tuple[str, int, int, int]]) -> Split:
        """A split over byte ranges of files: ``[(path, start, end, arrival_ms), ...]``."""
        return cls(shard, "files", "", 0, sum(e - s for _, s, e, _ in ranges), 0,
                   json.dumps([list(r) for r in ranges]))

    def ranges(self) -> list[tuple[str, int, int, int]]:
        return [(str(p), int(s), int(e), int(a)) for p, s, e, a in json.loads(self.meta)]

    def as_row(self) -> tuple[int, str, str, int, int, int, str]:
        return (self.shard, self.kind, self.uri, self.start, self.end, self.arrival, self.meta)
