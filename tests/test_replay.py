"""Issue 50 item 2: dead letters sent back through the live job's source (`event-etl deadletter --replay-to`).

The selection and the "too late again" rule as plain functions (event_etl.rules.replay); the replay record and the
dir: target over a real sink folder; the command's output and its refusals.  The end to end run with a real job is
integration/test_replay.py.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import fastavro
import pytest
from click.testing import CliRunner

from event_etl.cli.job import deadletter_cmd
from event_etl.consumer.replay import (
    Criteria,
    LiveType,
    load_entries,
    parse_target,
    plan_replay,
    replay_records,
    run_replay,
)
from event_etl.errors import UsageError
from event_etl.job.checkpoint import Checkpoint
from event_etl.rules.replay import future_again, select, split_future, split_too_late, too_late_again
from event_etl.rules.watermark import WatermarkState
from event_etl.storage import Storage
from event_etl.storage.deadletter import DEADLETTER_SCHEMA
from event_etl.timeutil import iso, now_millis

ROOT = Path(__file__).resolve().parents[1]
H = 3_600_000
T0 = 1_795_000_000_000 // H * H  # an hour start (2026-11-18)


@dataclass(frozen=True)
class C:
    key: str
    reason: str
    event_time: int | None


def test_too_late_again_is_the_judges_rule_for_a_job_with_a_watermark():
    lateness = 2 * H
    # the hour T0 ends at T0 + 1h; too late once the watermark is more than 2h past that end
    assert not too_late_again(T0 + 10, T0 + 3 * H, lateness)
    assert too_late_again(T0 + 10, T0 + 3 * H + 1, lateness)
    assert too_late_again(T0 + H - 1, T0 + 3 * H + 1, lateness)
    assert not too_late_again(T0 + H, T0 + 3 * H + 1, lateness), "the next hour: not yet"
    assert not too_late_again(None, T0 + 100 * H, lateness), "no event time: the job decides"
    assert not too_late_again(T0, None, lateness), "no watermark yet: nothing is too late"


def test_select_by_reason_hour_range_count_and_what_was_sent():
    cs = [C("a#0", "schema_mismatch", T0), C("a#1", "invalid_json", None), C("a#2", "schema_mismatch", T0 + H),
          C("b#0", "schema_mismatch", T0 + 2 * H), C("b#1", "before_backfill", T0 + 2 * H + 5),
          C("b#2", "a_reason_added_later", T0 + 3 * H)]
    assert [c.key for c in select(cs).chosen] == ["a#0", "a#1", "a#2", "b#0", "b#1", "b#2"]
    assert [c.key for c in select(cs, reasons=["schema_mismatch"]).chosen] == ["a#0", "a#2", "b#0"]
    assert [c.key for c in select(cs, reasons=["a_reason_added_later"]).chosen] == ["b#2"], "any reason string"
    s = select(cs, since=T0 + H, until=T0 + 3 * H)
    assert [c.key for c in s.chosen] == ["a#2", "b#0", "b#1"] and s.no_event_time == 1
    s = select(cs, reasons=["schema_mismatch"], limit=2)
    assert [c.key for c in s.chosen] == ["a#0", "a#2"] and s.beyond_limit == 1
    s = select(cs, reasons=["schema_mismatch"], limit=2, sent={"a#0"})
    assert [c.key for c in s.chosen] == ["a#2", "b#0"] and s.already_sent == 1 and s.beyond_limit == 0
    s = select(cs, reasons=["schema_mismatch"], sent={"a#0", "a#2", "b#0"})
    assert s.chosen == [] and s.already_sent == 3
    assert len(select(cs, reasons=["schema_mismatch"], sent={"a#0"}, again=True).chosen) == 3


def test_split_too_late_keeps_the_order():
    cs = [C("a", "x", T0), C("b", "x", T0 + 5 * H), C("c", "x", None), C("d", "x", T0 + 1)]
    ok, late = split_too_late(cs, T0 + 4 * H, H)
    assert [c.key for c in ok] == ["b", "c"] and [c.key for c in late] == ["a", "d"]


def _dead_letters(sink: Path, event_type: str, day: str, name: str, rows: list[tuple[str, int | None, bytes]]):
    folder = sink / event_type / "_deadletter" / f"dt={day}"
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fastavro.writer(buf, DEADLETTER_SCHEMA, [
        {"event_type": event_type, "reason": reason, "detail": "d", "arrived_at": T0 + 10 * H, "event_time": t,
         "source": f"{name}@{i}", "batch_id": 0, "payload": payload} for i, (reason, t, payload) in enumerate(rows)])
    (folder / name).write_bytes(buf.getvalue())


@pytest.fixture
def sink(tmp_path):
    sink = tmp_path / "data"
    _dead_letters(sink, "page_view", "2026-11-18", "dl-b0000000000-s0000.avro", [
        ("schema_mismatch", T0, b'{"n": 1}'), ("too_late", T0 - 30 * H, b'{"n": 2}'),
        ("invalid_json", None, b"{not json"), ("schema_mismatch", T0 + H, b'{"n":\n 4}')])
    _dead_letters(sink, "page_view", "2026-11-19", "dl-b0000000003-s0001.avro", [
        ("schema_mismatch", T0 + 2 * H, b'{"n": 5}')])
    return sink


def test_a_dir_replay_writes_one_file_the_job_finds_whole_and_is_recorded(sink, tmp_path):
    storage = Storage(str(sink))
    entries = load_entries(storage, "page_view")
    assert [e.key for e in entries] == ["dt=2026-11-18/dl-b0000000000-s0000.avro#0",
                                        "dt=2026-11-18/dl-b0000000000-s0000.avro#1",
                                        "dt=2026-11-18/dl-b0000000000-s0000.avro#2",
                                        "dt=2026-11-18/dl-b0000000000-s0000.avro#3",
                                        "dt=2026-11-19/dl-b0000000003-s0001.avro#0"]
    (tmp_path / "in").mkdir()
    target = parse_target(f"dir:{tmp_path / 'in'}")
    plan = plan_replay(entries, [], target, now=T0 + 11 * H, criteria=Criteria(reasons=["schema_mismatch"]),
                       live=LiveType(watermark=T0 + 3 * H, allowed_lateness=24 * H))
    assert [e.letter.payload for e in plan.send] == [b'{"n": 1}', b'{"n": 5}']
    assert [e.letter.payload for e in plan.not_a_line] == [b'{"n":\n 4}'], "a newline cannot be one line"
    rec = run_replay(storage, "page_view", plan, now=T0 + 11 * H)
    files = sorted(p.name for p in (tmp_path / "in").iterdir())
    assert files == [f"replay-{plan.replay_id}.jsonl"], "no hidden temporary left behind"
    assert (tmp_path / "in" / files[0]).read_bytes() == b'{"n": 1}\n{"n": 5}\n'
    assert rec["state"] == "sent" and rec["count"] == 2 and rec["reasons"] == {"schema_mismatch": 2}
    assert replay_records(storage, "page_view") == [rec]
    assert len(load_entries(storage, "page_view")) == 5, "the record sits next to the dead letters, not among them"
    again = plan_replay(load_entries(storage, "page_view"), replay_records(storage, "page_view"), target,
                        now=T0 + 12 * H, criteria=Criteria(reasons=["schema_mismatch"]))
    assert again.send == [] and again.selection.already_sent == 2


def test_targets_are_parsed_with_an_error_and_a_fix(tmp_path):
    assert parse_target("pubsub", "projects/p/topics/t").url == "pubsub:projects/p/topics/t"
    assert parse_target("pubsub:projects/p/topics/u", "projects/p/topics/t").where == "projects/p/topics/u"
    assert parse_target("kafka:views").url == "kafka:views"
    for bad in ("pubsb:x", "dir:", f"dir:{tmp_path / 'nope'}", "kafka:", "pubsub:topics/x"):
        with pytest.raises(UsageError) as err:
            parse_target(bad, "projects/p/topics/t")
        assert err.value.fix
    with pytest.raises(UsageError, match="has no Pub/Sub topic") as err:  # was a TypeError (ConfigError needs file=)
        parse_target("pubsub", None)
    assert "[pubsub] topic" in (err.value.fix or "")


def _types(tmp_path: Path, lateness: str = "24h") -> Path:
    types = tmp_path / "types"
    shutil.copytree(ROOT / "event_types" / "page_view", types / "page_view")
    toml = types / "page_view" / "etl.toml"
    toml.write_text(toml.read_text().replace('allowed_lateness = "24h"', f'allowed_lateness = "{lateness}"'))
    return types


def test_the_command_says_what_is_too_late_again_before_sending_and_sends_nothing_twice(sink, tmp_path):
    types, folder, ck = _types(tmp_path), tmp_path / "in", tmp_path / "ck"
    folder.mkdir()
    Checkpoint(ck).save_state(WatermarkState(watermark=T0 + 3 * H))  # the live job's: T0 - 30h is past 24h
    args = ["page_view", "--sink", str(sink), "--event-types", str(types), "--replay-to", f"dir:{folder}",
            "--checkpoint", str(ck)]
    r = CliRunner().invoke(deadletter_cmd, [*args, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert f"[page_view] 1 would be too late again (hour {iso(T0 - 30 * H)}: the live job's watermark" in r.output
    assert "left out (--too-late sends them anyway)" in r.output
    assert "1 payloads hold a newline" in r.output
    assert "would send 3 dead letters" in r.output and "invalid_json 1, schema_mismatch 2" in r.output
    assert list(folder.iterdir()) == [] and not (sink / "page_view" / "_deadletter" / "_replays").exists()

    r = CliRunner().invoke(deadletter_cmd, args)
    assert r.exit_code == 0, r.output
    assert "sent 3 dead letters to " in r.output and "_replays/" in r.output
    (sent,) = folder.iterdir()
    assert sent.read_bytes() == b'{"n": 1}\n{not json\n{"n": 5}\n'

    r = CliRunner().invoke(deadletter_cmd, args)
    assert r.exit_code == 0, r.output
    assert "3 matching dead letters were sent by an earlier replay: left out (--again sends them again)" in r.output
    assert "nothing to replay" in r.output and len(list(folder.iterdir())) == 1

    r = CliRunner().invoke(deadletter_cmd, [*args, "--again", "--too-late", "--limit", "2"])
    assert r.exit_code == 0, r.output
    assert "sent anyway (--too-late)" in r.output and "sent 2 dead letters" in r.output
    assert "more match beyond --limit" in r.output
    recs = replay_records(Storage(str(sink)), "page_view")
    assert [r["count"] for r in recs] == [3, 2] and recs[1]["too_late_sent"] == 1


def test_the_listing_is_unchanged_and_replay_options_need_replay_to(sink, tmp_path):
    types = _types(tmp_path)
    common = ["page_view", "--sink", str(sink), "--event-types", str(types)]
    r = CliRunner().invoke(deadletter_cmd, [*common, "--counts"])
    assert r.exit_code == 0 and "schema_mismatch      3" in r.output and "total                5" in r.output
    r = CliRunner().invoke(deadletter_cmd, [*common, "--json", "--limit", "1"])
    assert r.exit_code == 0 and json.loads(r.output.splitlines()[0])["reason"] == "schema_mismatch"
    r = CliRunner().invoke(deadletter_cmd, [*common, "--again"])
    assert r.exit_code == 2 and "--again is an option of a replay" in r.output and "fix:" in r.output
    r = CliRunner().invoke(deadletter_cmd, [*common, "--replay-to", "pubsb:projects/x/topics/y"])
    assert r.exit_code == 2 and "not a replay target" in r.output and "fix:" in r.output


def test_the_replay_goes_where_the_live_job_reads_and_its_checkpoint_is_of_this_sink(sink, tmp_path):
    types, ck = _types(tmp_path), tmp_path / "ck"
    (tmp_path / "in").mkdir()
    (tmp_path / "other").mkdir()
    Checkpoint(ck).save_state(WatermarkState(watermark=T0 + 3 * H))
    (ck / "etl" / "job.json").write_text(json.dumps({"event_type": "page_view", "sink": str(sink),
                                                     "source": f"dir:{tmp_path / 'in'}"}))
    common = ["page_view", "--sink", str(sink), "--event-types", str(types), "--checkpoint", str(ck)]
    r = CliRunner().invoke(deadletter_cmd, [*common, "--replay-to", f"dir:{tmp_path / 'other'}"])
    assert r.exit_code == 2 and f"reads dir:{tmp_path / 'in'}" in r.output, r.output
    assert f"fix: --replay-to dir:{tmp_path / 'in'}" in r.output
    r = CliRunner().invoke(deadletter_cmd, [*common, "--replay-to", "kafka:views"])
    assert r.exit_code == 2 and "not a kafka: source" in r.output, r.output
    r = CliRunner().invoke(deadletter_cmd, [*common, "--replay-to", f"dir:{tmp_path / 'in'}", "--sink",
                                            str(tmp_path / "elsewhere")])
    assert r.exit_code != 0
    r = CliRunner().invoke(deadletter_cmd, [*common[:-1], str(tmp_path / "nope"), "--replay-to",
                                            f"dir:{tmp_path / 'in'}"])
    assert r.exit_code == 2 and "no job's checkpoint there" in r.output, r.output
    r = CliRunner().invoke(deadletter_cmd, [*common, "--replay-to", f"dir:{tmp_path / 'in'}", "--dry-run"])
    assert r.exit_code == 0 and "would send 3 dead letters" in r.output, r.output


def test_a_replay_cut_short_is_named_by_the_next(sink, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Checkpoint(tmp_path / "checkpoints" / "page_view").save_state(WatermarkState(watermark=T0))  # the default's
    types, folder = _types(tmp_path), tmp_path / "in"
    folder.mkdir()
    storage = Storage(str(sink))
    plan = plan_replay(load_entries(storage, "page_view"), [], parse_target(f"dir:{folder}"), now=T0,
                       criteria=Criteria(reasons=["invalid_json"]))
    rec = {"format": 1, "replay": plan.replay_id, "state": "sending", "entries": [e.key for e in plan.send]}
    storage.write_atomic(f"page_view/_deadletter/_replays/{plan.replay_id}.json", json.dumps(rec).encode())
    r = CliRunner().invoke(deadletter_cmd, ["page_view", "--sink", str(sink), "--event-types", str(types),
                                            "--replay-to", f"dir:{folder}", "--reason", "invalid_json"])
    assert r.exit_code == 0, r.output
    assert f"warning: replay {plan.replay_id} was cut short" in r.output and "nothing to replay" in r.output
    assert f"live job's watermark: {iso(T0)}" in r.output, "./checkpoints/page_view, as `run` has it by default"


def test_kafka_originals_reads_each_partition_in_runs_and_counts_what_is_gone(monkeypatch):
    import event_etl.sources.kafka as kafka
    from event_etl.consumer.replay import kafka_originals
    from event_etl.errors import SourceError

    class Msg:
        def __init__(self, off):
            self.off = off

        def offset(self):
            return self.off

        def key(self):
            return f"k{self.off}".encode()

        def headers(self):
            return [("h", b"v")]

    reads = []

    def read_messages(topic, partition, start, end, *, timeout):
        reads.append((topic, partition, start, end))
        if partition == 1:
            raise SourceError("gone", fix="-")
        yield [Msg(o) for o in range(start, end)]

    monkeypatch.setattr(kafka, "read_messages", read_messages)
    out, missing = kafka_originals(["kafka:t/0@5", "kafka:t/0@7", "kafka:t/0@5000", "kafka:t/1@3", "msg:123"])
    assert sorted(reads) == [("t", 0, 5, 8), ("t", 0, 5000, 5001), ("t", 1, 3, 4)]
    assert out["kafka:t/0@7"] == (b"k7", [("h", b"v")]) and set(out) == {"kafka:t/0@5", "kafka:t/0@7",
                                                                          "kafka:t/0@5000"}
    assert missing == 1


# -- issue 60 item 5: future dead letters warn as too-late ones do; the checkpoint found as `run` has it --------------
def test_future_again_is_the_judges_rule_at_the_replays_arrival():
    skew = 10 * 60_000
    assert future_again(T0 + skew + 1, T0, skew) and not future_again(T0 + skew, T0, skew)
    assert not future_again(None, T0, skew), "no event time: the job decides"
    ok, ahead = split_future([C("a", "future", T0 + H), C("b", "future", T0), C("c", "x", None)], T0, skew)
    assert [c.key for c in ok] == ["b", "c"] and [c.key for c in ahead] == ["a"]


@pytest.fixture
def future_sink(tmp_path):
    """Two future dead letters, one whose time has come (an hour ago) and one still two days ahead of now."""
    sink = tmp_path / "data"
    now = now_millis()
    _dead_letters(sink, "page_view", "2026-11-18", "dl-b0000000000-s0000.avro", [
        ("future", now - H, b'{"n": 1}'), ("future", now + 48 * H, b'{"n": 2}'), ("schema_mismatch", T0, b'{"n": 3}')])
    return sink


def test_future_dead_letters_still_ahead_are_counted_and_left_out_unless_future(future_sink, tmp_path):
    types, folder, ck = _types(tmp_path), tmp_path / "in", tmp_path / "ck"
    folder.mkdir()
    Checkpoint(ck).save_state(WatermarkState(watermark=T0))
    args = ["page_view", "--sink", str(future_sink), "--event-types", str(types), "--replay-to", f"dir:{folder}",
            "--checkpoint", str(ck), "--reason", "future"]
    r = CliRunner().invoke(deadletter_cmd, args)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "would be future again" in x)
    assert line.startswith("[page_view] 1 would be future again (event time up to ")
    assert "still more than max_future_skew, 10m, ahead of now): left out (--future sends them anyway" in line
    assert "sent 1 dead letters" in r.output
    assert [f.read_bytes() for f in folder.iterdir()] == [b'{"n": 1}\n'], "the one whose time has come"

    r = CliRunner().invoke(deadletter_cmd, [*args, "--future"])
    assert r.exit_code == 0, r.output
    assert "1 would be future again" in r.output and "sent anyway (--future)" in r.output
    assert "sent 1 dead letters" in r.output, "the other one was sent by the first replay"
    recs = replay_records(Storage(str(future_sink)), "page_view")
    assert [r["future_sent"] for r in recs] == [0, 1]


def test_the_replay_finds_the_checkpoint_as_run_has_it_and_refuses_without_one(sink, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    types, folder = _types(tmp_path), tmp_path / "in"
    folder.mkdir()
    common = ["page_view", "--sink", str(sink), "--event-types", str(types), "--replay-to", f"dir:{folder}",
              "--dry-run"]
    # no ./checkpoints/page_view: refused (was "watermark: unknown ... nothing is counted as too late", exit 0)
    r = CliRunner().invoke(deadletter_cmd, common)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: no checkpoint of page_view's job at checkpoints/page_view"), r.output
    assert "--checkpoint-root DIR" in r.output.splitlines()[1] and "Traceback" not in r.output
    assert "unknown" not in r.output and "would send" not in r.output
    # the job ran with --checkpoint-root ROOT: found at ROOT/page_view
    root = tmp_path / "ckroot"
    Checkpoint(root / "page_view").save_state(WatermarkState(watermark=T0 + 3 * H))
    r = CliRunner().invoke(deadletter_cmd, [*common, "--checkpoint-root", str(root)])
    assert r.exit_code == 0, r.output
    assert f"live job's watermark: {iso(T0 + 3 * H)}" in r.output and "1 would be too late again" in r.output
    # a fleet's --checkpoint ROOT is ROOT/<type>, as `run --all --checkpoint ROOT` has it
    r = CliRunner().invoke(deadletter_cmd, [*common, "--checkpoint", str(root)])
    assert r.exit_code == 0 and f"live job's watermark: {iso(T0 + 3 * H)}" in r.output, r.output
    for bad in (["--checkpoint-root", str(tmp_path / "nope")], ["--checkpoint", str(root), "--checkpoint-root",
                                                                 str(root)]):
        r = CliRunner().invoke(deadletter_cmd, [*common, *bad])
        assert r.exit_code == 2 and "error:" in r.output and "fix:" in r.output, r.output
    # --too-late sends them all: no watermark needed, and it says so
    r = CliRunner().invoke(deadletter_cmd, [*common, "--too-late"])
    assert r.exit_code == 0, r.output
    assert "live job's watermark: not read (no checkpoint; --too-late" in r.output and "would send 4" in r.output
