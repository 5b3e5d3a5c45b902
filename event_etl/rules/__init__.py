"""The rules of event_etl, as plain functions over plain values.

Nothing in this package reads a clock, touches a file system or imports Spark.  Event
times, watermarks and hours are integers (milliseconds since the epoch, UTC); the
current time, where a rule needs it, is an argument.  Spark, Pub/Sub and storage code
call these functions; these functions call nothing of theirs.

- ``buckets``: where an event of a given hour is written, and how files are named.
- ``judge``: whether an event is timely, late, too late or from the future.
- ``watermark``: how the watermark moves (events, idleness, drain), never backwards.
- ``completeness``: which hours are complete and must get a ``_COMPLETE`` marker.
- ``manifest``: what a ``_COMPLETE`` marker says about its hour.
- ``reasons``: why a record went to the dead-letter area.
- ``compat``: whether one Avro schema reads data written with another, and why not (field by field).
"""

from event_etl.rules.buckets import (
    DEADLETTER_DIR,
    MARKER_NAME,
    DataFileName,
    data_file_name,
    deadletter_file_path,
    hour_dir,
    parse_data_file_name,
    parse_hour_dir,
    validate_event_type_name,
)
from event_etl.rules.completeness import hours_to_mark, is_complete, open_hour
from event_etl.rules.judge import Outcome, Verdict, judge, make_judge
from event_etl.rules.manifest import FileEntry, Manifest, build_manifest, compare_listing
from event_etl.rules.reasons import Reason
from event_etl.rules.watermark import (
    WatermarkState,
    drain_watermark,
    idle_watermark,
    watermark_after_batch,
)

__all__ = [
    "DEADLETTER_DIR",
    "MARKER_NAME",
    "DataFileName",
    "FileEntry",
    "Manifest",
    "Outcome",
    "Reason",
    "Verdict",
    "WatermarkState",
    "build_manifest",
    "compare_listing",
    "data_file_name",
    "deadletter_file_path",
    "drain_watermark",
    "hour_dir",
    "hours_to_mark",
    "idle_watermark",
    "is_complete",
    "judge",
    "make_judge",
    "open_hour",
    "parse_data_file_name",
    "parse_hour_dir",
    "validate_event_type_name",
    "watermark_after_batch",
]
