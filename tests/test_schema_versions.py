"""Schema versions of an event type: the registry in files, the decoder, hours that span a change, the commands.

The hour that spans a change runs through the real executor and controller
(:class:`tests.lib.harness.LocalPipeline`): a type's schema gains a field with a default
mid-hour (the job restarted with the new type), an Avro single-object payload of the old
version still arrives, the hour is marked, and one ``read_table`` reads it (and the hour
before) into the current schema.
"""

from __future__ import annotations

import base64
import copy
import io
import json
from pathlib import Path

import fastavro
import pytest
from click.testing import CliRunner

from event_etl import faults
from event_etl.cli import main
from event_etl.consumer import IncompatibleSchemaError, read_records, read_table
from event_etl.errors import CheckpointFormatError, ConfigError
from event_etl.eventtypes import check_schema_versions, load_event_type, schema_fingerprint
from event_etl.job.checkpoint import BatchIntent
from event_etl.rules.manifest import MANIFEST_VERSION, Manifest
from event_etl.rules.reasons import Reason
from event_etl.storage.avroio import encode_single_object
from event_etl.task.payload import Decoder
from tests.lib.harness import (
    CLICK_SCHEMA,
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    click,
    hour,
    make_event_type,
    read_deadletter,
    read_sink,
    t,
)

V1 = CLICK_SCHEMA
V2 = {**copy.deepcopy(CLICK_SCHEMA),
      "fields": [*copy.deepcopy(CLICK_SCHEMA["fields"]), {"name": "channel", "type": "string", "default": "web"}]}
SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}


def fp(schema) -> str:
    return schema_fingerprint(schema)


def write_versions(type_dir: Path, *schemas) -> None:
    (type_dir / "schemas").mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(schemas, 1):
        (type_dir / "schemas" / f"v{i}.avsc").write_text(json.dumps(s))


def versioned_type(root: Path, current: dict, *versions: dict, name: str = "click"):
    """A type whose schema.avsc is ``current`` and whose schemas/ holds ``versions`` (v1, v2...)."""
    make_event_type(root, name, schema=current, **SETTINGS)  # writes the folder
    write_versions(root / name, *versions)
    return load_event_type(root / name)


def soe_line(schema: dict, record: dict) -> bytes:
    """An Avro single-object message of ``schema``, base64 on its own line (as the directory source reads it)."""
    return base64.b64encode(encode_single_object(fastavro.parse_schema(schema), fp(schema), record))


# -- the registry in files --------------------------------------------------------------------------
def test_a_type_without_schemas_keeps_working_as_before(tmp_path):
    et = make_event_type(tmp_path, schema=V1)
    assert et.schema_versions == ()
    check_schema_versions(et, warn=pytest.fail)  # nothing to check, nothing to warn about
    d = Decoder(et)
    assert list(d.writer_schemas) == [et.fingerprint]
    ok, why, _detail = d.decode(base64.b64decode(soe_line(V2, {"id": "a", "ts": t("13:00"), "page": None,
                                                              "channel": "app"})))
    assert (ok, why) == (False, Reason.UNKNOWN_SCHEMA)


def test_versions_are_loaded_in_version_order(tmp_path):
    v3 = copy.deepcopy(V2)
    v3["fields"].append({"name": "n", "type": "long", "default": 0})
    vs = [V1] + [copy.deepcopy(V1) for _ in range(9)] + [V2]
    for i, s in enumerate(vs[1:10], 2):  # v2..v10 differ by one defaulted field each
        s["fields"].append({"name": f"f{i}", "type": "int", "default": i})
    et = versioned_type(tmp_path, vs[-1], *vs)
    assert [n for n, _ in et.schema_versions] == [f"v{i}" for i in range(1, 12)]
    assert et.version_of(fp(V1)) == "v1" and et.version_of(fp(V2)) == "v11" and et.version_of("00" * 8) is None


@pytest.mark.parametrize("setup,match", [
    (lambda d: (d / "schemas" / "1.avsc").write_text(json.dumps(V1)), "must be named v<N>.avsc"),
    (lambda d: (d / "schemas" / "v01.avsc").write_text(json.dumps(V1)), "must be named v<N>.avsc"),
    (lambda d: (d / "schemas" / "v2.avsc").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "schemas" / "v2.avsc").write_text(json.dumps({"type": "string"})), "must be an Avro record"),
    (lambda d: (d / "schemas" / "v2.avsc").write_text(json.dumps(
        {"type": "record", "name": "Click", "fields": [{"name": "a", "type": "strng"}]})), "not a valid Avro schema"),
    (lambda d: (d / "schemas" / "v2.avsc").write_text(json.dumps({**V1, "doc": "same fields, other doc"})),
     "same fingerprint"),
])
def test_a_broken_version_file_is_a_clear_error(tmp_path, setup, match):
    make_event_type(tmp_path, schema=V1, **SETTINGS)
    write_versions(tmp_path / "click", V1)
    setup(tmp_path / "click")
    with pytest.raises(ConfigError, match=match) as info:
        load_event_type(tmp_path / "click")
    assert "schemas" in str(info.value) and info.value.fix


def test_schemas_must_be_a_folder(tmp_path):
    make_event_type(tmp_path, schema=V1)
    (tmp_path / "click" / "schemas").write_text("v1")
    with pytest.raises(ConfigError, match="not a folder"):
        load_event_type(tmp_path / "click")


def test_other_files_in_schemas_are_left_alone(tmp_path):
    et = versioned_type(tmp_path, V1, V1)
    (tmp_path / "click" / "schemas" / "README.md").write_text("history of click")
    (tmp_path / "click" / "schemas" / ".v2.avsc.swp").write_text("editor")
    assert [n for n, _ in load_event_type(tmp_path / "click").schema_versions] == ["v1"] == \
        [n for n, _ in et.schema_versions]


# -- the check before a job starts ------------------------------------------------------------------
def test_a_compatible_current_schema_passes_and_an_unregistered_one_is_a_warning(tmp_path):
    warnings = []
    check_schema_versions(versioned_type(tmp_path / "a", V2, V1, V2), warn=warnings.append)
    assert warnings == []
    check_schema_versions(versioned_type(tmp_path / "b", V2, V1), warn=warnings.append)
    assert (
        len(warnings) == 1 and "is not registered" in warnings[0] and "event-etl schema register click" in warnings[0]
    )


def test_a_current_schema_that_cannot_read_a_version_is_refused_with_the_fields_and_the_fix(tmp_path):
    bad = copy.deepcopy(V1)
    bad["fields"][0]["type"] = "long"  # id: string -> long
    bad["fields"].append({"name": "channel", "type": "string"})  # no default
    et = versioned_type(tmp_path, bad, V1, V2)
    with pytest.raises(ConfigError) as info:
        et.check_versions()
    msg = str(info.value)
    assert info.value.exit_code == 2
    assert f"v1 (crc64avro:{fp(V1)}): field `id`: type changed from string to long, not promotable" in msg
    assert f"v1 (crc64avro:{fp(V1)}): field `channel`: added without a default" in msg
    assert f"v2 (crc64avro:{fp(V2)}): field `id`" in msg
    assert f"v2 (crc64avro:{fp(V2)}): field `channel`" not in msg  # v2 has channel: the string reads it
    assert "event-etl schema check click" in info.value.fix and "new event type" in info.value.fix


def test_run_and_submit_refuse_an_incompatible_schema_before_starting(tmp_path):
    bad = copy.deepcopy(V1)
    bad["fields"][2]["type"] = ["null", "long"]  # page: string -> long
    versioned_type(tmp_path, bad, V1)
    runner = CliRunner()
    for command in (["run", "click", "--once"], ["submit", "click", "--master", "local[1]", "--dry-run"]):
        res = runner.invoke(main, [*command, "--event-types", str(tmp_path), "--sink", str(tmp_path / "sink"),
                                   "--checkpoint", str(tmp_path / "ck")])
        assert res.exit_code == 2, (command, res.output)
        assert "field `page`: type changed from string to long, not promotable" in res.output
        assert "fix:" in res.output
    assert not (tmp_path / "sink").exists() and not (tmp_path / "ck").exists()


# -- the decoder --------------------------------------------------------------------------------------
def test_old_version_payloads_are_resolved_to_the_current_schema(tmp_path):
    et = versioned_type(tmp_path, V2, V1, V2)
    d = Decoder(et)
    assert set(d.writer_schemas) == {fp(V1), fp(V2)}
    ok, rec, ms = d.decode(base64.b64decode(soe_line(V1, {"id": "a", "ts": t("13:05"), "page": "/p"})))
    assert ok and ms == t("13:05") and rec["channel"] == "web" and rec["page"] == "/p"
    ok, rec, _ = d.decode(base64.b64decode(soe_line(V2, {"id": "b", "ts": t("13:05"), "page": None, "channel": "app"})))
    assert ok and rec["channel"] == "app"
    ok, rec, _ = d.decode(click("c", "13:05"))  # JSON without the new field: its default
    assert ok and rec["channel"] == "web"
    ok, rec, _ = d.decode(click("c", "13:05", channel=5))  # JSON is checked against the current schema
    assert not ok and rec is Reason.SCHEMA_MISMATCH
    ok, why, detail = d.decode(b"\xc3\x01" + bytes(8) + b"\x00")
    assert (ok, why) == (False, Reason.UNKNOWN_SCHEMA) and "0000000000000000" in detail


def test_a_registered_version_the_current_schema_cannot_read_is_dead_lettered_not_a_crash(tmp_path):
    """`run` refuses such a type; a decoder built anyway (a library user) explains each payload."""
    bad = copy.deepcopy(V1)
    bad["fields"][2] = {"name": "page", "type": "long"}
    et = versioned_type(tmp_path, bad, V1)
    ok, why, detail = Decoder(et).decode(base64.b64decode(soe_line(V1, {"id": "a", "ts": t("13:05"), "page": "/p"})))
    assert (ok, why) == (False, Reason.SCHEMA_MISMATCH) and fp(V1) in detail


def test_an_event_type_from_a_frozen_intent_keeps_its_versions(tmp_path):
    """Batch intents freeze the versions (JSON): the type rebuilt from them accepts what the first attempt did."""
    from dataclasses import replace

    from event_etl.job.checkpoint import FROZEN_SETTINGS

    et = versioned_type(tmp_path, V2, V1, V2)
    assert "schema_versions" in FROZEN_SETTINGS
    frozen = json.loads(json.dumps({k: getattr(et, k) for k in FROZEN_SETTINGS}))
    today = versioned_type(tmp_path / "today", V2, V2)  # v1 unregistered since
    again = replace(today, **frozen)
    assert again.schema_versions == et.schema_versions and again.decoder_key == et.decoder_key
    assert today.decoder_key != et.decoder_key
    assert Decoder(again).decode(base64.b64decode(soe_line(V1, {"id": "a", "ts": t("13:05"), "page": None})))[0]


def test_an_intent_from_before_schema_versions_accepts_its_own_schema_only(tmp_path):
    from event_etl.job.checkpoint import FROZEN_SETTINGS

    et = versioned_type(tmp_path, V2, V1, V2)
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:30")))
    old_settings = {k: getattr(et, k) for k in FROZEN_SETTINGS if k != "schema_versions"}
    frozen = p.controller.event_type_of(BatchIntent(0, None, t("13:30"), json.loads(json.dumps(old_settings))))
    assert frozen.schema_versions == ()
    assert list(Decoder(frozen).writer_schemas) == [fp(V2)]
    assert p.controller.event_type_of(BatchIntent(0, None, t("13:30"), None)) is p.controller.et


# -- an hour that spans a change, through the real executor and controller ---------------------------
@pytest.fixture
def spanning(tmp_path):
    """Hour 12 and the first part of hour 13 written with v1; then v2 (a field with a default) mid-hour."""
    root = tmp_path / "types"
    et1 = versioned_type(root, V1, V1)
    p = LocalPipeline(tmp_path, et1, FakeClock(t("13:30")))
    ev = p.batch([click("a", "12:50", page="/a"), click("b", "13:05")])
    assert ev.result.counts == {"timely": 2}
    # the schema gains a field with a default; the job restarts with the new type
    (root / "click" / "schema.avsc").write_text(json.dumps(V2))
    (root / "click" / "schemas" / "v2.avsc").write_text(json.dumps(V2))
    p.et = load_event_type(root / "click")
    p.et.check_versions(warn=pytest.fail)
    p.restart()
    p.clock.now = t("13:40")
    ev = p.batch([click("c", "13:20", channel="app"), click("d", "13:25"),
                  soe_line(V1, {"id": "e", "ts": t("13:30"), "page": "/old-producer"})])
    assert ev.result.counts == {"timely": 3}, ev.result.reasons
    p.clock.now = t("14:10")
    ev = p.batch([click("f", "14:05", channel="app")])
    assert [m.hour for m in ev.marked] == [hour("13")]  # hour 12 was marked by the batch before
    assert sorted(h for h, hc in read_sink(p.sink, "click").items() if hc.marker) == [hour("12"), hour("13")]
    return p


def test_an_hour_spanning_a_change_is_marked_with_each_files_schema(spanning):
    p = spanning
    m = check_manifest_matches_folder(p.sink, "click", hour("13"))
    assert json.loads((p.sink / "click/dt=2026-11-21/hour=13/_COMPLETE").read_text())["manifest_version"] == 3
    assert MANIFEST_VERSION == 3
    by_batch = {f.name.split("-")[2]: f.schema_fingerprint for f in m.files}
    assert by_batch == {"b0000000000": f"crc64avro:{fp(V1)}", "b0000000001": f"crc64avro:{fp(V2)}"}
    assert m.schema_fingerprints == tuple(sorted([f"crc64avro:{fp(V1)}", f"crc64avro:{fp(V2)}"]))
    assert m.schema_fingerprint == f"crc64avro:{fp(V2)}"  # the job that marked it
    for name, data in read_sink(p.sink, "click")[hour("13")].files.items():  # and each file is in its schema
        header = json.loads(fastavro.reader(io.BytesIO(data)).metadata["avro.schema"])
        assert f"crc64avro:{fp(header)}" == m.file_fingerprint(next(f for f in m.files if f.name == name))
    assert read_deadletter(p.sink, "click") == []


def test_one_read_table_reads_hours_before_and_after_the_change_into_the_current_schema(spanning):
    p = spanning
    table = read_table(p.sink, "click", "2026-11-21T12", until="2026-11-21T14")  # by name: no event_types needed
    rows = sorted(table.to_pylist(), key=lambda r: r["id"])
    assert table.column_names == ["id", "ts", "page", "channel"]
    assert [(r["id"], r["page"], r["channel"]) for r in rows] == [
        ("a", "/a", "web"), ("b", None, "web"), ("c", None, "app"), ("d", None, "web"), ("e", "/old-producer", "web")]
    same = read_table(p.sink, p.et, "2026-11-21T12", until="2026-11-21T14")  # the type's current schema
    assert same.schema == table.schema and same.num_rows == 5
    one = read_table(p.sink, "click", "2026-11-21T13")
    assert one.column_names == ["id", "ts", "page", "channel"] and one.num_rows == 4
    assert sorted(r["id"] for r in read_records(p.sink, "click", "2026-11-21T13")) == ["b", "c", "d", "e"]
    assert {r["channel"] for r in read_records(p.sink, "click", "2026-11-21T12", until="2026-11-21T14")} == {
        "web",
        "app",
    }


def test_an_hour_of_a_version_1_manifest_spanning_a_change_still_reads_as_one_table(spanning):
    """A 0.1.0 manifest gives no file's schema; read_table finds the files' schemas differ and takes the newest."""
    marker = spanning.sink / "click/dt=2026-11-21/hour=13/_COMPLETE"
    doc = json.loads(marker.read_text())
    doc["manifest_version"] = 1
    for entry in doc["files"]:
        del entry["schema_fingerprint"]
    marker.write_text(json.dumps(doc))
    assert Manifest.from_bytes(marker.read_bytes()).schema_fingerprints == (f"crc64avro:{fp(V2)}",)
    table = read_table(spanning.sink, "click", "2026-11-21T13")
    assert table.column_names == ["id", "ts", "page", "channel"]
    assert sorted(zip(table.column("id").to_pylist(), table.column("channel").to_pylist())) == [
        ("b", "web"), ("c", "app"), ("d", "web"), ("e", "web")]


def test_a_reader_schema_the_caller_passes(spanning, tmp_path):
    p = spanning
    old = read_table(p.sink, "click", "2026-11-21T12", until="2026-11-21T14", reader_schema=V1)  # forward: v1 readers
    assert old.column_names == ["id", "ts", "page"] and old.num_rows == 5
    path = tmp_path / "v1.avsc"
    path.write_text(json.dumps(V1))
    assert [sorted(r) for r in read_records(p.sink, "click", "2026-11-21T13", reader_schema=str(path))] == \
        [["id", "page", "ts"]] * 4
    bad = copy.deepcopy(V2)
    bad["fields"][0]["type"] = "long"
    with pytest.raises(IncompatibleSchemaError) as info:
        read_table(p.sink, "click", "2026-11-21T13", reader_schema=bad)
    assert "field `id`: type changed from string to long, not promotable" in str(info.value)
    assert info.value.exit_code == 2 and "reader_schema" in info.value.fix


def test_a_range_with_an_hour_not_complete_is_not_read(spanning):
    from event_etl.consumer import HourNotCompleteError

    with pytest.raises(HourNotCompleteError):
        read_table(spanning.sink, "click", "2026-11-21T13", until="2026-11-21T15")


def test_cat_reads_across_the_change_and_takes_a_reader_schema(spanning, tmp_path):
    p = spanning
    runner = CliRunner()
    common = ["--sink", str(p.sink), "--event-types", str(tmp_path / "types")]
    res = runner.invoke(main, ["cat", "click", "2026-11-21T12", "--until", "2026-11-21T14", *common])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.output.splitlines()]
    assert sorted((r["id"], r["channel"]) for r in lines) == [("a", "web"), ("b", "web"), ("c", "app"), ("d", "web"),
                                                            ("e", "web")]
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    res = runner.invoke(main, ["cat", "click", "2026-11-21T13", "--reader-schema", str(tmp_path / "v1.avsc"), *common])
    assert res.exit_code == 0 and all("channel" not in json.loads(x) for x in res.output.splitlines())
    out = tmp_path / "out.avro"
    res = runner.invoke(main, ["cat", "click", "2026-11-21T13", "--format", "avro", *common])
    out.write_bytes(res.stdout_bytes)
    recs = list(fastavro.reader(io.BytesIO(out.read_bytes())))
    assert sorted((r["id"], r["channel"]) for r in recs) == [("b", "web"), ("c", "app"), ("d", "web"), ("e", "web")]
    (tmp_path / "bad.avsc").write_text("{")
    res = runner.invoke(main, ["cat", "click", "2026-11-21T13", "--reader-schema", str(tmp_path / "bad.avsc"), *common])
    assert res.exit_code == 2 and "bad.avsc: not valid JSON" in res.output


def test_a_replay_after_a_new_version_was_registered_writes_the_same_files(tmp_path, monkeypatch):
    """A batch killed after writing its files, then v3 registered: the replay judges with the frozen versions."""

    class Killed(BaseException):
        pass

    root = tmp_path / "types"
    et = versioned_type(root, V1, V1)
    p = LocalPipeline(tmp_path, et, FakeClock(t("13:30")))
    v3 = copy.deepcopy(V1)
    v3["fields"].append({"name": "x", "type": "int", "default": 0})
    lines = [click("a", "13:10"), soe_line(v3, {"id": "b", "ts": t("13:11"), "page": None, "x": 1})]
    real = faults.point

    def point(name, detail=""):
        if name == "files_written":
            monkeypatch.setattr(faults, "point", real)
            raise Killed
        real(name, detail)

    monkeypatch.setattr(faults, "point", point)
    with pytest.raises(Killed):
        p.batch(lines)
    before = dict(read_sink(p.sink, "click")[hour("13")].files)
    dl_before = read_deadletter(p.sink, "click")
    assert [r["reason"] for r in dl_before] == ["unknown_schema"]
    (root / "click" / "schemas" / "v2.avsc").write_text(json.dumps(v3))  # registered while the batch was pending
    p.et = load_event_type(root / "click")
    assert len(p.et.schema_versions) == 2
    p.restart()
    p.batch([], batch_id=0)
    assert dict(read_sink(p.sink, "click")[hour("13")].files) == before
    assert read_deadletter(p.sink, "click") == dl_before
    p.clock.now = t("13:40")
    p.batch([soe_line(v3, {"id": "c", "ts": t("13:12"), "page": None, "x": 1})])  # a new batch accepts it
    assert sorted(read_sink(p.sink, "click")[hour("13")].timely) == ["a", "c"]


# -- manifests of versions 1 and 2, and newer ----------------------------------------------------------
def _manifest_doc(version, files):
    return {"manifest_version": version, "event_type": "click", "hour": "2026-11-21T13:00:00Z",
            "hour_end": "2026-11-21T14:00:00Z", "watermark": "2026-11-21T14:00:00Z",
            "completed_at": "2026-11-21T14:00:05Z", "records": sum(f["records"] for f in files), "late_records": 0,
            "bytes": 3, "schema_fingerprint": "crc64avro:aaaaaaaaaaaaaaaa", "files": files}


def test_manifests_of_version_1_to_4_read_and_a_newer_one_is_refused():
    f1 = {"name": "part-a.avro", "records": 1, "bytes": 3, "sha256": "x", "late": False}
    m1 = Manifest.from_json(_manifest_doc(1, [f1]))
    assert m1.files[0].schema_fingerprint == "" and m1.file_fingerprint(m1.files[0]) == "crc64avro:aaaaaaaaaaaaaaaa"
    assert m1.schema_fingerprints == ("crc64avro:aaaaaaaaaaaaaaaa",)
    f2 = {**f1, "name": "part-b.avro", "schema_fingerprint": "crc64avro:bbbbbbbbbbbbbbbb"}
    m2 = Manifest.from_json(_manifest_doc(2, [f1, f2]))
    assert m2.schema_fingerprints == ("crc64avro:aaaaaaaaaaaaaaaa", "crc64avro:bbbbbbbbbbbbbbbb")
    assert Manifest.from_bytes(m2.to_bytes()) == m2 and m2.to_json()["files"][1]["schema_fingerprint"] == \
        "crc64avro:bbbbbbbbbbbbbbbb"
    assert "schema_fingerprint" not in m2.to_json()["files"][0]
    doc = _manifest_doc(1, [f1])
    del doc["manifest_version"]
    assert Manifest.from_json(doc).files == m1.files
    with pytest.raises(CheckpointFormatError) as info:
        Manifest.from_json(_manifest_doc(5, [f1]))
    assert "version 5" in str(info.value) and "reads versions 1, 2, 3, 4" in str(info.value)
    assert "upgrade" in info.value.fix


def test_a_newer_manifest_stops_a_consumer_with_the_fix(spanning):
    p = spanning
    marker = p.sink / "click/dt=2026-11-21/hour=13/_COMPLETE"
    doc = json.loads(marker.read_text())
    marker.write_text(json.dumps({**doc, "manifest_version": 5}))
    res = CliRunner().invoke(main, ["cat", "click", "2026-11-21T13", "--sink", str(p.sink), "--event-types",
                                    str(p.tmp / "types")])
    assert res.exit_code == 2 and "version 5" in res.output and "upgrade event_etl" in res.output


# -- the commands ------------------------------------------------------------------------------------------
@pytest.fixture
def cli(tmp_path):
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(main, [*args, "--event-types", str(tmp_path / "types")])

    return invoke


def test_schema_check_says_which_versions_and_why(tmp_path, cli):
    versioned_type(tmp_path / "types", V2, V1)
    res = cli("schema", "check", "click")
    assert res.exit_code == 0, res.output
    assert f"v1          crc64avro:{fp(V1)}  FULL" in res.output
    assert "event-etl schema register click" in res.output
    bad = copy.deepcopy(V1)
    bad["fields"] = [fl for fl in bad["fields"] if fl["name"] != "page"]
    bad["fields"][0] = {"name": "id", "type": "long"}
    bad["fields"].append({"name": "channel", "type": "string"})
    (tmp_path / "new.avsc").write_text(json.dumps(bad))
    res = cli("schema", "check", "click", str(tmp_path / "new.avsc"))
    assert res.exit_code == 1
    assert "NOT compatible either way" in res.output
    assert "new cannot read v1: field `id`: type changed from string to long, not promotable" in res.output
    assert "new cannot read v1: field `channel`: added without a default" in res.output
    assert "v1 readers cannot read new: field `id`" in res.output
    assert "incompatible: not backward compatible with v1" in res.output and "fix:" in res.output


def test_schema_check_require_forward_or_full(tmp_path, cli):
    v2 = copy.deepcopy(V1)
    v2["fields"].append({"name": "channel", "type": "string"})  # v1 readers read it (they skip it); v2 cannot read v1
    versioned_type(tmp_path / "types", V1, V1)
    (tmp_path / "new.avsc").write_text(json.dumps(v2))
    assert cli("schema", "check", "click", str(tmp_path / "new.avsc")).exit_code == 1
    res = cli("schema", "check", "click", str(tmp_path / "new.avsc"), "--require", "forward")
    assert res.exit_code == 0 and "FORWARD only" in res.output
    widened = copy.deepcopy(V1)
    widened["fields"][2]["type"] = ["null", "bytes"]  # string -> bytes: both ways
    (tmp_path / "wide.avsc").write_text(json.dumps(widened))
    assert cli("schema", "check", "click", str(tmp_path / "wide.avsc"), "--require", "full").exit_code == 0


@pytest.mark.parametrize("content,match", [
    ("{not json", "not valid JSON"),
    (json.dumps({"type": "enum", "name": "E", "symbols": ["A"]}), "must be an Avro record"),
    (json.dumps({"type": "record", "name": "Click", "fields": [{"name": "id", "type": "strng"}]}),
     "not a valid Avro schema"),
    (json.dumps({"type": "record", "name": "Click", "fields": [{"name": "id", "type": "string"}]}),
     "no field 'ts'"),
])
def test_schema_check_of_a_bad_schema_says_what_is_wrong(tmp_path, cli, content, match):
    versioned_type(tmp_path / "types", V1, V1)
    (tmp_path / "new.avsc").write_text(content)
    res = cli("schema", "check", "click", str(tmp_path / "new.avsc"))
    assert res.exit_code == 2 and match in res.output and "fix:" in res.output, res.output


def test_schema_check_without_history_and_register(tmp_path, cli):
    make_event_type(tmp_path / "types", schema=V1)
    res = cli("schema", "check", "click")
    assert res.exit_code == 0 and "no schemas/ folder" in res.output and "register schema.avsc" in res.output
    res = cli("schema", "register", "click")
    assert res.exit_code == 0 and "registered as" in res.output
    assert json.loads((tmp_path / "types/click/schemas/v1.avsc").read_text()) == V1
    assert "already registered" in cli("schema", "register", "click").output
    (tmp_path / "types/click/schema.avsc").write_text(json.dumps(V2))
    res = cli("schema", "register", "click")
    assert res.exit_code == 0 and "v2.avsc" in res.output
    res = cli("schema", "list", "click")
    assert res.exit_code == 0
    assert [line.split()[:2] for line in res.output.splitlines()[1:]] == [["v1", f"crc64avro:{fp(V1)}"],
                                                                        ["v2", f"crc64avro:{fp(V2)}"]]
    assert res.output.splitlines()[2].endswith("yes")
    bad = copy.deepcopy(V2)
    bad["fields"][0]["type"] = "long"
    (tmp_path / "types/click/schema.avsc").write_text(json.dumps(bad))
    res = cli("schema", "register", "click")
    assert res.exit_code == 2 and "field `id`: type changed from string to long" in res.output
    assert not (tmp_path / "types/click/schemas/v3.avsc").exists()


def test_register_brings_a_same_fingerprint_version_up_to_date(tmp_path, cli):
    versioned_type(tmp_path / "types", V1, V1)
    documented = {**V1, "doc": "clicks on the shop"}
    (tmp_path / "types/click/schema.avsc").write_text(json.dumps(documented))
    res = cli("schema", "register", "click")
    assert res.exit_code == 0 and "updated" in res.output
    assert json.loads((tmp_path / "types/click/schemas/v1.avsc").read_text()) == documented
    assert not (tmp_path / "types/click/schemas/v2.avsc").exists()


def test_the_page_view_example_flow(tmp_path):
    """README/docs: add a field with a default to page_view, check it, the job accepts it."""
    import shutil

    root = Path(__file__).resolve().parent.parent / "event_types"
    shutil.copytree(root, tmp_path / "types")
    path = tmp_path / "types/page_view/schema.avsc"
    schema = json.loads(path.read_text())
    schema["fields"].append({"name": "ab_variant", "type": ["null", "string"], "default": None,
                             "doc": "A/B test variant shown, if any."})
    path.write_text(json.dumps(schema, indent=2))
    runner = CliRunner()
    res = runner.invoke(main, ["schema", "check", "page_view", "--event-types", str(tmp_path / "types")])
    assert res.exit_code == 0 and "FULL" in res.output, res.output
    et = load_event_type(tmp_path / "types/page_view")
    warnings = []
    et.check_versions(warn=warnings.append)
    assert len(warnings) == 1  # not registered yet: accepted, with the advice
    assert runner.invoke(main, ["schema", "register", "page_view", "--event-types", str(tmp_path / "types")]
                         ).exit_code == 0
    load_event_type(tmp_path / "types/page_view").check_versions(warn=pytest.fail)


def test_the_docs_show_what_schema_check_prints(tmp_path, monkeypatch):
    """docs/schemas.md's example output of `schema check` and `register` is what the commands print."""
    import re
    import shutil

    docs = (Path(__file__).resolve().parent.parent / "docs" / "schemas.md").read_text()
    field = json.loads(re.search(r'```json\n(\{"name": "ab_variant".*\})\n```', docs).group(1))
    root = Path(__file__).resolve().parent.parent / "event_types"
    shutil.copytree(root, tmp_path / "event_types")
    path = tmp_path / "event_types/page_view/schema.avsc"
    schema = json.loads(path.read_text())
    schema["fields"].append(field)
    path.write_text(json.dumps(schema, indent=2))
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)  # the docs show paths relative to the project
    for command in ("check", "register"):
        shown = re.search(rf"\$ event-etl schema {command} page_view\n(.*?)\n   ```", docs, re.S).group(1)
        want = [line[3:] for line in shown.splitlines()]
        res = runner.invoke(main, ["schema", command, "page_view", "--event-types", "event_types"])
        assert res.exit_code == 0 and res.output.splitlines() == want, res.output
