"""Few files per hour on GCS (fake-gcs-server through gcsfs): an hour's many small files merged and marked.

On an object store the merge reads and deletes its members several requests at a time; the
hour must still come out whole: every record once, the marker listing exactly the folder's
files, all of them merged."""

from __future__ import annotations

import math

from event_etl.consumer import read_records, verify_hour
from event_etl.job.merges import MERGE_REQUESTS
from event_etl.rules.compaction import ROLLING_FILES, is_merged_name
from event_etl.storage import Storage
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

H13 = "2026-11-21T13:00Z"


def test_an_hour_of_many_small_files_on_gcs_is_merged_whole_and_marked(tmp_path, gcs_bucket):
    per_file = 1000  # no rolling merge by records: 3 events a batch never fill a file
    et = make_event_type(tmp_path / "types", out_of_orderness="2m", idle_timeout="1h", max_events_per_file=per_file)
    sink = f"{gcs_bucket}/data"
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock, sink_url=sink)
    ids = set()
    files = ROLLING_FILES - 1  # no rolling merge by count either: the final merge takes them all
    for b in range(files):  # a batch of 3 events each: small files, more than the merge's requests at a time
        now = t("13:00:10") + 20 * b * 1000
        clock.now = now + 500
        batch = [f"e{b * 3 + i}" for i in range(3)]
        ids.update(batch)
        p.batch([click(i, now - k) for k, i in enumerate(batch)])
    folder = f"{et.name}/dt=2026-11-21/hour=13"
    assert len(Storage(sink).list_files(folder)) >= files > MERGE_REQUESTS, "the open hour holds a file per batch"
    clock.now = t("14:03")
    p.batch([click("x0", t("14:02:30"))])  # the watermark passes hour 13: merged, then marked

    report = verify_hour(sink, et.name, H13)
    assert report.checked and not (report.missing or report.extra or report.corrupted), report
    names = [n for n in Storage(sink).list_files(folder) if n.endswith(".avro")]
    assert len(names) <= math.ceil(len(ids) / per_file) + 2, sorted(names)
    assert all(is_merged_name(n) for n in names), sorted(names)
    got = [r["id"] for r in read_records(sink, et.name, H13)]
    assert sorted(got) == sorted(ids), "every record once"
