"""Where an hour's late records went (manifest version 3's `late_event_hours`, `event-etl late`), on the real
executor and controller: late files of several batches and event hours, merged before the marker."""

from __future__ import annotations

import json

from click.testing import CliRunner

from event_etl.cli import main
from event_etl.consumer.late import late_records_of, late_window
from event_etl.rules.buckets import MARKER_NAME
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import HOUR_MS
from tests.lib.consumer_scenario import build_hours, complete_hour_15
from tests.lib.harness import FakeClock, LocalPipeline, click, hour, make_event_type, t


def _manifest(p: LocalPipeline, hh: str) -> Manifest:
    return Manifest.from_bytes((p.sink / f"click/dt=2026-11-21/hour={hh}/{MARKER_NAME}").read_bytes())


def test_a_manifest_counts_its_late_records_by_event_hour_across_batches_and_merges(tmp_path):
    et = make_event_type(tmp_path / "types", "click", max_events_per_file=50, allowed_lateness="6h")
    clock = FakeClock(t("10:10"))
    p = LocalPipeline(tmp_path, et, clock)
    p.batch([click("a", "10:05")])
    clock.now = t("13:10")
    p.batch([click("b", "13:05")])  # hours 10..12 complete; 13 open
    late = {"10": 0, "11": 0, "12": 0}
    for i in range(6):  # six batches of late records of three hours: small late files, merged before the marker
        clock.now = t("13:10") + (i + 1) * 60_000
        lines = []
        for hh, n in (("10", 1), ("11", 2 + i), ("12", 3)):
            lines += [click(f"l{i}-{hh}-{k}", f"{hh}:{20 + k:02d}") for k in range(n)]
            late[hh] += n
        ev = p.batch(lines)
        assert ev.result.counts.get("late") == sum(n for _, n in (("10", 1), ("11", 2 + i), ("12", 3)))
    clock.now = t("14:10")
    p.batch([click("d", "14:05")])  # hour 13 complete
    m = _manifest(p, "13")
    late_files = [f for f in m.files if f.late]
    assert len(late_files) < 6, "the late files were merged before the marker"
    assert m.late_records == sum(late.values()) == 51
    assert m.late_event_hours == {hour(hh): n for hh, n in late.items()}
    doc = json.loads((p.sink / f"click/dt=2026-11-21/hour=13/{MARKER_NAME}").read_text())
    assert doc["manifest_version"] == 3
    assert doc["late_event_hours"] == {f"2026-11-21T{hh}:00:00Z": n for hh, n in late.items()}
    assert _manifest(p, "10").late_event_hours == {}, "an hour without late files says so: none, not unknown"

    r = late_records_of(p.sink, et, "2026-11-21T11")
    assert [(x.hour, x.records) for x in r.landed] == [(hour("13"), late["11"])]
    assert r.not_complete and not r.final, "hours up to 11:00 + 1h + 6h may still receive some"


def test_the_late_window_ends_with_the_hour_open_when_allowed_lateness_runs_out():
    assert late_window(hour("13"), 30 * 60_000) == (hour("14"), hour("15"))
    assert late_window(hour("13"), 24 * HOUR_MS) == (hour("14"), hour("14") + 25 * HOUR_MS)


def test_event_etl_late_lists_where_an_hours_late_records_landed(tmp_path):
    sc = build_hours(tmp_path)  # d, an event of 13:30, arrived when 13 was complete: in hour 14's late file
    args = ["--sink", sc.sink, "--event-types", sc.types]
    res = CliRunner().invoke(main, ["late", "click", "2026-11-21T13", *args])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[:2] == ["click 2026-11-21T13:00:00Z: 1 late records in 1 later hours:",
                                           "  2026-11-21T14:00:00Z           1"]
    assert "final: every hour from 2026-11-21T14:00:00Z to 2026-11-21T14:00:00Z is complete" in res.output
    res = CliRunner().invoke(main, ["late", "click", "2026-11-21T14", "--json", *args])
    doc = json.loads(res.output)
    assert (doc["late_records"], doc["final"], doc["not_complete"]) == (0, False, ["2026-11-21T15:00:00Z"])
    complete_hour_15(sc)
    doc = json.loads(CliRunner().invoke(main, ["late", "click", "2026-11-21T14", "--json", *args]).output)
    assert (doc["late_records"], doc["final"]) == (0, True)
