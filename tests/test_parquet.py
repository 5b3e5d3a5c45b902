"""A type of ``format = "parquet"``: its files, their bytes, their manifests and merges (issue 51, item 1)."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from event_etl import faults
from event_etl.errors import ConfigError
from event_etl.rules.buckets import data_file_name, parse_data_file_name
from event_etl.rules.compaction import merge_groups, merged_file_name
from event_etl.rules.manifest import FileEntry, Manifest, build_manifest, compare_listing
from event_etl.sources import read
from event_etl.storage.compaction import MergeError, merge_containers
from event_etl.storage.parquetio import AvroArrow, encode_parquet
from event_etl.storage.rolling import ParquetOutput, RollingFiles, SplitFiles
from tests.lib.fastpath import BASE, HOUR, SCHEMA, assert_same, count_fast_decodes, dump, lines, run_both
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

H13 = t("13:00")

EDGES = {
    "type": "record", "name": "Edge", "namespace": "e",
    "fields": [
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "i", "type": "int"},
        {"name": "n", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "b", "type": "boolean"},
        {"name": "raw", "type": "bytes"},
        {"name": "s", "type": "string"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "where", "type": ["null", {"type": "record", "name": "Where", "fields": [
            {"name": "lat", "type": "double"}, {"name": "kinds", "type": {"type": "array", "items": "Kind"}}]}],
         "default": None},
        {"name": "opt_ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
        {"name": "h2", "type": ["null", "Hash"], "default": None},
    ],
}


def edge_records():
    import datetime as dt
    import uuid

    utc = dt.UTC
    first = {
        "ts": dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=utc), "us": dt.datetime(9999, 12, 31, 23, 59, 59,
                                                                                        999999, tzinfo=utc),
        "local": dt.datetime(2026, 11, 21, 13, 0), "day": dt.date(1, 1, 1), "tm": dt.time(23, 59, 59, 999000),
        "tu": dt.time(0, 0, 0, 1), "price": Decimal("-999999999.999"), "uid": uuid.UUID(int=0), "i": -2**31,
        "n": 2**63 - 1, "f": float("inf"), "d": -0.0, "b": False, "raw": b"\x00\xff", "s": "", "kind": "B",
        "hash": b"\x00\x01\x02\x03", "tags": [], "attrs": {}, "where": None, "opt_ts": None, "h2": None,
    }
    second = {
        "ts": dt.datetime(2026, 11, 21, 13, 0, tzinfo=utc), "us": dt.datetime(1, 1, 1, tzinfo=utc),
        "local": dt.datetime(1, 1, 1), "day": dt.date(9999, 12, 31), "tm": dt.time(0), "tu": dt.time(23, 59, 59,
                                                                                                     999999),
        "price": Decimal("0.001"), "uid": uuid.UUID("12345678-1234-5678-1234-567812345678"), "i": 2**31 - 1,
        "n": -2**63, "f": -1.5, "d": 1e308, "b": True, "raw": b"", "s": "é\u2028😀", "kind": "A", "hash": b"abcd",
        "tags": ["x", ""], "attrs": {"a": None, "": -1}, "where": {"lat": -90.0, "kinds": ["A", "B"]},
        "opt_ts": dt.datetime(2026, 1, 1, tzinfo=utc), "h2": b"zzzz",
    }
    return [first, second]


def _rows(table: pa.Table) -> list[dict]:
    """Rows of a table with maps as dicts (Arrow gives a map as a list of pairs)."""
    rows = table.to_pylist()
    for r in rows:
        r["attrs"] = dict(r["attrs"])
    return rows


def test_every_avro_type_keeps_its_values_in_parquet_columns():
    # the mapping written down in event_etl/storage/parquetio.py, on edge values of each type
    parsed = fastavro.parse_schema(EDGES)
    group = RollingFiles(0, H13, False, SplitFiles(batch_id=1, shard=0, writer="", schema=parsed, codec="snappy",
                                                   max_records=10, drop={}, parquet=ParquetOutput.of(EDGES, "snappy")))
    for rec in edge_records():
        assert group.add(rec, H13) is None
    ((name, data, n, _),) = group.finish()
    assert name.endswith(".parquet") and n == 2
    table = pq.read_table(io.BytesIO(data))
    assert table.schema == AvroArrow(EDGES).schema
    assert str(table.schema.field("ts").type) == "timestamp[ms, tz=UTC]"
    assert not table.schema.field("ts").nullable and table.schema.field("where").nullable
    want = []
    for rec in edge_records():  # as fastavro reads the same records back from an Avro file
        buf = io.BytesIO()
        fastavro.writer(buf, parsed, [rec])
        buf.seek(0)
        (back,) = list(fastavro.reader(buf))
        back["uid"] = str(back["uid"])
        want.append(back)
    assert _rows(table) == want
    # plain files: no field ids (pyiceberg's add_files takes only files without them)
    assert all(b"PARQUET:field_id" not in (f.metadata or {}) for f in table.schema)


def test_a_parquet_type_refuses_a_union_parquet_has_no_column_for(tmp_path):
    schema = {"type": "record", "name": "U", "fields": [{"name": "ts", "type": "long"},
                                                        {"name": "v", "type": ["null", "long", "string"]}]}
    assert make_event_type(tmp_path / "a", "u", schema, id_field="ts").format == "avro"  # Avro takes it
    with pytest.raises(ConfigError) as err:
        make_event_type(tmp_path / "b", "u", schema, id_field="ts", format="parquet")
    assert err.value.field == "format" and "union" in str(err.value) and err.value.fix


def test_an_unknown_format_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_event_type(tmp_path, format="parket")
    assert err.value.field == "format" and "parquet" in err.value.fix


def test_file_names_say_the_format_and_parse_back():
    name = data_file_name(H13, 42, 3, 1, late=True, writer="abc123", fmt="parquet")
    assert name == "late-2026112113-wabc123-b0000000042-s0003-0001.parquet"
    assert parse_data_file_name(name).name == name
    assert data_file_name(H13, 42, 3, 1, late=True).endswith(".avro")
    entries = [FileEntry(data_file_name(H13, b, 0, 0, late=False, fmt="parquet"), 5, 10, "x", False, "crc64avro:1")
               for b in (1, 2)]
    assert merged_file_name(entries, 0, 0).endswith("-s9000-0000.parquet")


def test_files_of_two_formats_never_merge_together():
    entries = [FileEntry(data_file_name(H13, b, 0, 0, late=False, fmt=f), 5, 10, "x", False, "crc64avro:1")
               for b, f in ((1, "avro"), (2, "parquet"), (3, "avro"), (4, "parquet"))]
    groups = merge_groups(entries, 100, final=True, max_files=2)
    assert sorted({e.format for e in g} for g in groups) == [{"avro"}, {"parquet"}]
    one = encode_parquet(AvroArrow(SCHEMA_SMALL).table([{"ts": 1}]), "snappy")
    with pytest.raises(MergeError):
        merge_containers([("a.parquet", one), ("b.avro", b"Obj\x01")], 10, str)


SCHEMA_SMALL = {"type": "record", "name": "S", "fields": [{"name": "ts", "type": "long"}]}


def test_a_manifest_of_parquet_files_says_so_and_one_of_avro_files_stays_as_it_was():
    def manifest(fmt):
        name = data_file_name(H13, 1, 0, 0, late=False, fmt=fmt)
        return build_manifest(event_type="click", hour=H13, files=[FileEntry(name, 3, 100, "ab", False, "crc64avro:1")],
                              watermark=H13 + 3_700_000, completed_at=H13 + 3_800_000, schema_fingerprint="crc64avro:1")

    avro = manifest("avro").to_json()
    assert avro["manifest_version"] == 3 and "format" not in avro["files"][0]
    doc = manifest("parquet").to_json()
    assert doc["manifest_version"] == 4 and doc["files"][0]["format"] == "parquet"
    back = Manifest.from_bytes(manifest("parquet").to_bytes())
    assert back.version == 4 and back.files[0].format == "parquet"
    assert compare_listing(back.files, {back.files[0].name: 100, "notes.txt": 3}).ok


def test_fast_and_record_paths_write_the_same_parquet_bytes_and_a_replay_the_same_files(tmp_path, monkeypatch):
    et = make_event_type(tmp_path / "types", "mixed", SCHEMA, time_field="ts", id_field="id", dedupe_window="10m",
                         max_events_per_file=7, allowed_lateness="1d", format="parquet")
    base = 1_795_225_200_000
    lines = [dump({"id": f"00000000-0000-0000-0000-{i:012d}", "ts": base + i * 60_000 + (i % 5) * 3_600_000,
                   "n": i * 2**40, "small": -i, "flag": i % 2 == 0, "kind": "ABC"[i % 3], "text": f"t{i}é",
                   "opt_s": None if i % 3 else "s", "opt_b": None, "opt_i": i}) for i in range(40)]
    data = b"\n".join(lines)
    taken = count_fast_decodes(monkeypatch)
    first = run_both(tmp_path / "one", et, data, base)
    assert taken and all(taken), "the fast path took the chunk (columns into the Parquet file)"
    second = run_both(tmp_path / "two", et, data, base)
    (r0, _, f0), (r1, _, f1) = first[False], first[True]
    assert r0 == r1 and f0 == f1, "the fast path writes the record path's bytes"
    assert f0 == second[False][2], "a replay writes the same files"
    parquet = {k: v for k, v in f0.items() if k.endswith(".parquet")}
    assert parquet and not any(k.endswith(".avro") and "_deadletter" not in k for k in f0)
    rows = sum(pq.read_table(io.BytesIO(v)).num_rows for v in parquet.values())
    assert rows == sum(f["records"] for f in r0["files"]) == 40
    assert {f["sha256"] for f in r0["files"]} == {__import__("hashlib").sha256(v).hexdigest()
                                                   for v in parquet.values()}


def test_a_parquet_type_marks_its_hours_with_merged_files_that_hold_every_record(tmp_path):
    et = make_event_type(tmp_path / "types", out_of_orderness="2m", idle_timeout="1h", max_events_per_file=10,
                         format="parquet")
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(tmp_path, et, clock)
    for b in range(30):  # 30 batches of 3 events: rolling merges of the small files
        now = t("13:00:10") + 20 * b * 1000
        clock.now = now + 500
        p.batch([click(f"e{b * 3 + i}", now - i) for i in range(3)])
    clock.now = t("14:03")
    p.batch([click("x", t("14:02:30"))])
    folder = p.sink / "click" / "dt=2026-11-21" / "hour=13"
    manifest = json.loads((folder / "_COMPLETE").read_text())
    assert manifest["manifest_version"] == 4 and manifest["records"] == 90
    names = {f["name"] for f in manifest["files"]}
    assert names == {x.name for x in folder.iterdir() if x.name != "_COMPLETE"}
    assert all(n.endswith(".parquet") and f["format"] == "parquet" for f in manifest["files"] for n in [f["name"]])
    assert len(names) <= 90 // 10 + 2 and any("-s90" in n for n in names), "small files were merged"
    table = pq.read_table([str(folder / n) for n in sorted(names)])
    assert sorted(table.column("id").to_pylist()) == sorted(f"e{i}" for i in range(90))
    assert str(table.schema.field("ts").type) == "timestamp[ms, tz=UTC]"


def test_the_footer_s_avro_schema_does_not_depend_on_the_order_of_its_keys():
    """A replay's type comes back from its batch intent (JSON, keys in another order): the same file bytes."""
    reordered = json.loads(json.dumps(SCHEMA, sort_keys=True))
    assert list(reordered) != list(SCHEMA)
    assert AvroArrow(SCHEMA, with_avro_schema=True).schema.metadata == \
        AvroArrow(reordered, with_avro_schema=True).schema.metadata


@pytest.fixture(scope="module")
def parquet_type(tmp_path_factory):
    return make_event_type(tmp_path_factory.mktemp("types"), "mixed", SCHEMA, time_field="ts", id_field="id",
                           dedupe_window="10m", max_events_per_file=7, allowed_lateness="1d", format="parquet")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(lines(), min_size=1, max_size=40), wm=st.sampled_from([None, BASE + 2 * HOUR + 60_000]),
       chunk=st.sampled_from([200, 1 << 20]))
def test_a_parquet_type_writes_the_same_bytes_by_either_path_whatever_the_lines(
    tmp_path_factory, parquet_type, monkeypatch, body, wm, chunk
):
    # a Parquet type's fast path checks its columns without encoding them (an enum symbol it lacks, an int beyond
    # 32 bits, a wrong type send the chunk to the record path, as for an Avro type): same files, reports, keys
    monkeypatch.setattr(read, "READ_BYTES", chunk)  # small chunks: some fast, some not, in one split
    assert_same(run_both(tmp_path_factory.mktemp("run"), parquet_type, b"\n".join(body), wm))


class _Killed(BaseException):
    """The process died here."""


def test_a_batch_replayed_after_the_format_changed_writes_what_its_first_attempt_wrote(tmp_path, monkeypatch):
    """``format`` is frozen in a batch's intent, as the other settings that decide a batch's files: killed after
    its Parquet files were written, then restarted with ``format = "avro"``, the batch's replay writes the same
    Parquet files (no Avro twin of its events); the next new batch writes Avro. An intent from a release before
    Parquet has no ``format``: its replay writes Avro."""
    from event_etl.job.checkpoint import FROZEN_SETTINGS, BatchIntent

    assert "format" in FROZEN_SETTINGS
    p = LocalPipeline(tmp_path, make_event_type(tmp_path / "types", out_of_orderness="2m", format="parquet"),
                      FakeClock(t("13:31")))
    real = faults.point

    def point(name: str, detail: str = "") -> None:
        if name == "files_written":
            monkeypatch.setattr(faults, "point", real)
            raise _Killed(name)
        real(name, detail)

    monkeypatch.setattr(faults, "point", point)
    with pytest.raises(_Killed):
        p.batch([click("a", "13:20")])
    assert p.ckpt.load_intent(0).settings["format"] == "parquet"
    files = sorted(f.name for f in p.sink.rglob("part-*"))
    assert files and all(n.endswith(".parquet") for n in files)
    p.et = make_event_type(tmp_path / "types", out_of_orderness="2m", format="avro")
    p.restart()
    ev = p.batch([], batch_id=0)
    assert ev.replayed and ev.result.counts == {"timely": 1}
    assert sorted(f.name for f in p.sink.rglob("part-*")) == files
    p.batch([click("b", "13:25")])
    assert sorted(f.suffix for f in p.sink.rglob("part-*")) == [".avro", ".parquet"]

    old = {k: getattr(p.et, k) for k in FROZEN_SETTINGS if k != "format"}
    q = LocalPipeline(tmp_path / "q", make_event_type(tmp_path / "q" / "types", out_of_orderness="2m",
                                                      format="parquet"), FakeClock(t("13:31")))
    q.ckpt.save_intent(BatchIntent(0, None, q.clock(), json.loads(json.dumps(old))))
    ev = q.batch([click("c", "13:20")], batch_id=0)
    assert ev.replayed
    assert [f.suffix for f in q.sink.rglob("part-*")] == [".avro"]
