"""The Pub/Sub spool: messages made durable in the checkpoint before Spark is told about them.

Three modules, from the bytes up:

- :mod:`~event_etl.sources.spool.segment`: a segment's format (frames of whole ``PullResponse``
  messages, each with its length, CRC-32C and oldest publish time), its names, the open segment
  a stream appends to durably (:class:`OpenSegment`), the recovery of open segments a killed
  writer left (fence, keep the longest valid prefix), and the readers executors use;
- :mod:`~event_etl.sources.spool.seglog`: the discovery log, the order the planner found the
  closed segments in, whose positions are the source's offsets;
- :mod:`~event_etl.sources.spool.folder`: :class:`Spool`, the one owner of the spool's folder
  (segments, the log, the offered pointer, fencing and recovery, the run record, the error and
  ``DRAINED``/``STOP`` flags, fetch partitions' reports): the fetchers write through it, the
  planner reads through it, ``event-etl status`` opens it read-only (:meth:`Spool.at`).
"""

from __future__ import annotations

from event_etl.sources.spool.folder import (
    ACKED_SUFFIX,
    DRAINED,
    ERROR_FILE,
    MAX_LEASE_SECONDS,
    RUN_FILE,
    STOP,
    RunRecord,
    Spool,
)
from event_etl.sources.spool.seglog import SegmentLog
from event_etl.sources.spool.segment import (
    FENCED_SUFFIX,
    MAGIC,
    MAGIC_V1,
    NO_TIME,
    OPEN_SUFFIX,
    RUNBOOK_SEEK,
    AppendFailed,
    OpenSegment,
    SegmentFenced,
    SegmentName,
    SpoolDamaged,
    ack_ids,
    describe,
    finish_open_segments,
    frame,
    message_runs,
    oldest_of,
    oldest_publish_ms,
    publish_range,
    raw_messages,
    read_messages,
    segment_count,
    write_segment,
)

__all__ = [
    "Spool",
    "RunRecord",
    "SegmentLog",
    "ACKED_SUFFIX",
    "DRAINED",
    "ERROR_FILE",
    "MAX_LEASE_SECONDS",
    "RUN_FILE",
    "STOP",
    "MAGIC",
    "MAGIC_V1",
    "NO_TIME",
    "RUNBOOK_SEEK",
    "SegmentName",
    "OpenSegment",
    "OPEN_SUFFIX",
    "FENCED_SUFFIX",
    "AppendFailed",
    "SegmentFenced",
    "SpoolDamaged",
    "finish_open_segments",
    "write_segment",
    "read_messages",
    "raw_messages",
    "message_runs",
    "ack_ids",
    "segment_count",
    "frame",
    "oldest_of",
    "oldest_publish_ms",
    "publish_range",
    "describe",
]
