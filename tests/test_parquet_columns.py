"""A Parquet hour for consumers (issue 60 item 8): ``read_table`` reads a Parquet file's columns with pyarrow, no
record made (before, each file became an Avro container of records, then an Arrow table again); the table is the
one an Avro hour of the same records gives, a reader schema that differs still resolves; and ``cat`` prints a
Parquet hour as it prints the same hour written in Avro."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.consumer import read_table
from event_etl.storage import parquetio
from tests.lib.harness import CLICK_SCHEMA, FakeClock, LocalPipeline, click, make_event_type, t


def _sink(tmp, fmt: str) -> str:
    """``click``: hour 13 complete (four records, one file each), hour 14 complete with two late records of 13."""
    et = make_event_type(tmp / "types", format=fmt, max_events_per_file=1, allowed_lateness="30m")
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp, et, clock)
    p.batch([click(f"a{i}", f"13:0{i}", page=None if i % 2 else f"/p/{i}") for i in range(4)])
    clock.now = t("14:10")
    p.batch([click("c0", "14:05", page="/c")])
    clock.now = t("14:11")
    p.batch([click("d0", "13:30", page="/late"), click("d1", "13:31")])
    clock.now = t("15:10")
    p.batch([click("e0", "15:05")])
    return str(p.sink)


@pytest.fixture(scope="module")
def sinks(tmp_path_factory) -> dict[str, str]:
    return {fmt: _sink(tmp_path_factory.mktemp(fmt), fmt) for fmt in ("avro", "parquet")}


def test_read_table_reads_a_parquet_hour_as_columns_not_records(sinks, monkeypatch):
    want = read_table(sinks["avro"], "click", "2026-11-21T13", until="2026-11-21T15")

    def no_records(data: bytes) -> bytes:
        raise AssertionError("read_table made records of a Parquet file")

    monkeypatch.setattr(parquetio, "parquet_as_container", no_records)
    got = read_table(sinks["parquet"], "click", "2026-11-21T13", until="2026-11-21T15")
    assert got.schema == want.schema and got.equals(want)
    assert got.num_rows == 4 + 1 + 2
    own = read_table(sinks["parquet"], "click", "2026-11-21T14", include_late=False)
    assert own.column("id").to_pylist() == ["c0"]


def test_a_parquet_file_in_another_schema_is_resolved_into_the_reader_schema(sinks):
    reader = {**CLICK_SCHEMA, "fields": [*CLICK_SCHEMA["fields"],
                                         {"name": "country", "type": ["null", "string"], "default": None}]}
    got = read_table(sinks["parquet"], "click", "2026-11-21T13", reader_schema=reader)
    want = read_table(sinks["avro"], "click", "2026-11-21T13", reader_schema=reader)
    assert got.equals(want) and got.column_names == ["id", "ts", "page", "country"]
    assert got.column("country").null_count == got.num_rows == 4


def test_cat_prints_a_parquet_hour_as_it_prints_the_avro_one(sinks):
    def cat(fmt: str, *args: str):
        r = CliRunner().invoke(main, ["cat", "click", "2026-11-21T14", "--sink", sinks[fmt], *args])
        assert r.exit_code == 0, r.output
        return r

    assert cat("parquet").stdout == cat("avro").stdout
    assert [json.loads(line)["id"] for line in cat("parquet").stdout.splitlines()] == ["c0", "d0", "d1"]
    assert "the last 2 of them late records" in cat("parquet").stderr
    records = {fmt: list(fastavro.reader(io.BytesIO(cat(fmt, "--format", "avro").stdout_bytes)))
               for fmt in ("avro", "parquet")}
    assert records["parquet"] == records["avro"] and len(records["avro"]) == 3
