"""Consumers read a Parquet type's hours as they read an Avro type's: the same records, checked, by every recipe."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.consumer import read_records, read_table, verify_hour, write_jsonl
from event_etl.consumer.recipes import (
    bq_external_table_ddl,
    bq_load_command,
    duckdb_reader,
    files_format,
    hour_uris,
    spark_format,
    type_root,
)
from event_etl.errors import UsageError
from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

HOUR = "2026-11-21T13"


def _sink(root, fmt: str):
    """One type's hour 13 (and 14, which holds late records of 13), written in ``fmt``."""
    et = make_event_type(root / "types", out_of_orderness="2m", idle_timeout="1h", max_events_per_file=7,
                         allowed_lateness="2h", format=fmt)
    clock = FakeClock(t("13:00"))
    p = LocalPipeline(root, et, clock)
    for b in range(6):
        now = t("13:00:10") + 300_000 * b
        clock.now = now + 500
        p.batch([click(f"e{b}-{i}", now - i, page=None if i % 2 else f"/p{i}") for i in range(5)])
    clock.now = t("14:03")
    p.batch([click("x", t("14:02:30"))])
    clock.now = t("14:10")
    p.batch([click("late", t("13:30"))])  # arrives after hour 13 is complete: a late file of hour 14
    clock.now = t("15:03")
    p.batch([click("y", t("15:02:30"))])
    return p


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    return {fmt: _sink(tmp_path_factory.mktemp(fmt), fmt) for fmt in ("avro", "parquet")}


def test_a_parquet_hour_reads_as_the_same_records_as_an_avro_hour(both):
    avro, parquet = both["avro"], both["parquet"]
    for hour in (HOUR, "2026-11-21T14"):
        want = list(read_records(str(avro.sink), avro.et, hour))
        assert want and list(read_records(str(parquet.sink), parquet.et, hour)) == want
        assert read_table(str(parquet.sink), "click", hour).equals(read_table(str(avro.sink), "click", hour))
        outs = []
        for p in (avro, parquet):
            buf = io.StringIO()
            write_jsonl(str(p.sink), "click", hour, buf)
            outs.append(buf.getvalue())
        assert outs[0] == outs[1]
    uris = hour_uris(str(parquet.sink), "click", "2026-11-21T14")
    assert any("/late-" in u for u in uris) and all(u.endswith(".parquet") for u in uris)


def test_a_parquet_hour_reads_into_another_reader_schema_as_an_avro_hour(both):
    """A reader schema that differs from the files' (a field added with a default) resolves Parquet files too."""
    outs = {}
    for fmt, p in both.items():
        schema = {**p.et.schema, "fields": [*p.et.schema["fields"], {"name": "added", "type": "string",
                                                                        "default": "x"}]}
        outs[fmt] = list(read_records(str(p.sink), "click", HOUR, reader_schema=schema))
    assert outs["avro"] and outs["parquet"] == outs["avro"]
    assert {r["added"] for r in outs["parquet"]} == {"x"}


def test_cat_prints_a_parquet_hour_as_it_prints_an_avro_hour(both):
    outs = []
    for fmt in ("avro", "parquet"):
        p = both[fmt]
        res = CliRunner().invoke(main, ["cat", "click", HOUR, "--sink", str(p.sink), "--event-types",
                                        str(p.tmp / "types")])
        assert res.exit_code == 0, res.output
        outs.append(res.output)
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 30
    assert json.loads(outs[1].splitlines()[0])["id"].startswith("e")


def test_verify_checks_parquet_files_and_names_a_damaged_one(both, tmp_path):
    import shutil

    sink = tmp_path / "sink"
    shutil.copytree(both["parquet"].sink, sink)
    report = verify_hour(str(sink), "click", HOUR)
    assert report.ok and report.files >= 2
    folder = sink / "click" / "dt=2026-11-21" / "hour=13"
    victim = sorted(folder.glob("*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    (folder / "part-2026112113-b0000000099-s0000-0000.parquet").write_bytes(b"PAR1")
    report = verify_hour(str(sink), "click", HOUR)
    assert not report.ok
    assert [p.name for p in report.corrupted] == [victim.name]
    assert report.extra == ("part-2026112113-b0000000099-s0000-0000.parquet",)


def test_recipes_pick_each_tools_parquet_reader(both):
    p = both["parquet"]
    uris = hour_uris(str(p.sink), "click", HOUR)
    assert files_format(uris) == "parquet" and spark_format(uris) == "parquet"
    assert duckdb_reader(uris) == "read_parquet"
    avro_uris = hour_uris(str(both["avro"].sink), "click", HOUR)
    assert spark_format(avro_uris).endswith("AvroFileFormat") and duckdb_reader(avro_uris) == "read_avro"
    with pytest.raises(UsageError):
        files_format(uris + avro_uris)
    gs = [f"gs://b/s/{u.split('/sink/', 1)[1]}" for u in uris]
    cmd = bq_load_command(gs, "ds.click", hive_partitioning=True)
    assert "--source_format=PARQUET" in cmd and "--use_avro_logical_types" not in cmd
    assert "format = 'PARQUET'" in bq_external_table_ddl(gs, "p.ds.click")
    import duckdb

    files = ", ".join(f"'{u}'" for u in uris)
    n, ids = duckdb.sql(f"SELECT count(*), count(DISTINCT id) FROM read_parquet([{files}], hive_partitioning=true) "
                        "WHERE dt = '2026-11-21' AND hour = 13").fetchone()
    assert n == ids == 30
    assert type_root(str(p.sink), "click").endswith("/click")
