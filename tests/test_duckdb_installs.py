"""DuckDB's readers come with the installs the docs name (issue 60 item 2): ``[duckdb]`` (and so ``[all]``) brings
both extensions, Avro and Iceberg; without DuckDB (the light install) ``duckdb_connect()`` and
``duckdb_iceberg_connect()`` say which extra to install instead of a bare ``ModuleNotFoundError``."""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

import pytest

from event_etl.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


def _extra(name: str) -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.extras_require"][name].splitlines()
    return {ln.split(">")[0].split("=")[0].split("[")[0].strip() for ln in lines if ln.strip() and "#" not in ln}


@pytest.mark.parametrize("extra", ["duckdb", "all"])
def test_duckdbs_extensions_are_in_the_extras_the_docs_name(extra: str) -> None:
    assert {"duckdb", "duckdb-extension-avro", "duckdb-extension-iceberg"} <= _extra(extra)
    install = (ROOT / "docs" / "install.md").read_text()
    assert "`pip install 'event_etl[duckdb]'`" in install and "duckdb_iceberg_connect()" in install
    assert "`pip install 'event_etl[iceberg]'`" in install


@pytest.mark.parametrize("connect", ["recipes", "iceberg"])
def test_without_duckdb_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch, connect: str) -> None:
    monkeypatch.setitem(sys.modules, "duckdb", None)  # as on the light install: import duckdb fails
    if connect == "recipes":
        from event_etl.consumer.recipes import duckdb_connect as fn
    else:
        from event_etl.consumer.iceberg import duckdb_iceberg_connect as fn
    with pytest.raises(UsageError) as err:
        fn()
    assert "DuckDB is not installed" in err.value.message and "pip install 'event_etl[duckdb]'" in str(err.value.fix)


def test_both_extensions_load_from_the_test_install() -> None:
    from event_etl.consumer.iceberg import duckdb_iceberg_connect

    con = duckdb_iceberg_connect()
    loaded = {r[0] for r in con.execute("select extension_name from duckdb_extensions() where loaded").fetchall()}
    assert {"avro", "iceberg"} <= loaded
