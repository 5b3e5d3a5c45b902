"""The light consumer as a user installs it: a wheel built from this checkout, ``pip install`` WITHOUT extras
into a fresh virtual environment, no event types folder, then ``event-etl hours/wait/verify/cat/audit``
against a sink this test makes.

It needs PyPI (the dependencies are downloaded, or taken from pip's cache).  The size of the
installation is printed (run with ``-s`` to see it), never asserted: it depends on the versions
PyPI serves that day.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_consumer_scenario import build_hours

ROOT = Path(__file__).resolve().parents[1]
# (opentelemetry-api itself comes with google-api-core, a dependency of gcsfs; the SDK and exporters do not)
HEAVY = ("pyspark", "matplotlib", "google.cloud.pubsub_v1", "opentelemetry.sdk", "opentelemetry.exporter", "pandas",
         "numpy", "duckdb", "airflow", "xxhash", "pyarrow")

pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout}\n{r.stderr}"
    return r


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("light")
    src = tmp / "src"  # a copy: building in the checkout would leave build/ and egg-info behind
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "event_etl", src / "event_etl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp / "dist", src])
    (wheel,) = (tmp / "dist").glob("event_etl-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    before = _du(venv)
    _run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel])
    size = _du(venv) - before
    print(f"\nthe consumer install (pip install {wheel.name}, no extras): {size / 1e6:.0f} MB in {site}")
    return venv, size


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ETL_", "PYTHON", "PYSPARK"))}
    env.pop("VIRTUAL_ENV", None)
    return env


def test_the_base_install_brings_no_spark_no_graphs_no_pubsub_no_otel(light_venv):
    venv, _ = light_venv
    code = (f"import importlib.util, json; print(json.dumps([m for m in {HEAVY!r} if "
            "(lambda n: (lambda s: s is not None)(importlib.util.find_spec(n.split('.')[0]) and "
            "importlib.util.find_spec(n)))(m)]))")
    found = json.loads(_run([venv / "bin" / "python", "-c", code], env=_env()).stdout)
    assert found == []


def test_consumer_commands_work_from_the_light_install_without_event_types(light_venv, tmp_path):
    venv, _ = light_venv
    sc = build_hours(tmp_path / "made")
    work = tmp_path / "work"  # no event_types/ here, none in the installed package
    work.mkdir()
    exe = venv / "bin" / "event-etl"

    def cli(*args):
        return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=work, env=_env(), timeout=300)

    r = cli("types")  # the installed package has no event types folder: said in one line, with the fix
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "fix:" in r.stderr
    r = cli("hours", "click", "--sink", sc.sink, "--since", "2026-11-21T12", "--until", "2026-11-21T17", "--json")
    assert r.returncode == 0, r.stderr
    assert [h["state"] for h in json.loads(r.stdout)] == ["never", "complete", "complete", "open", "not started"]
    r = cli("wait", "click", "2026-11-21T14", "--sink", sc.sink, "--timeout", "10")
    assert r.returncode == 0 and "complete: records 2 (late 1)" in r.stdout, r.stderr
    r = cli("wait", "click", "2026-11-21T15", "--sink", sc.sink, "--timeout", "0.5", "--poll-interval", "0.1")
    assert r.returncode == 3, r.stderr
    r = cli("verify", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T15", "--sink", sc.sink)
    assert r.returncode == 0 and r.stdout.count(": ok (") == 2, r.stdout + r.stderr
    r = cli("cat", "click", "2026-11-21T14", "--sink", sc.sink)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(line)["id"] for line in r.stdout.splitlines()) == ["c", "d"]
    r = cli("audit", "click", "2026-11-21T13", "--expected", "3", "--time-field", "ts", "--allowed-lateness", "30m",
            "--sink", sc.sink)
    assert r.returncode == 0 and "match" in r.stdout, r.stdout + r.stderr
    r = cli("hours", "click", "--sink", sc.sink + "-typo")
    assert r.returncode == 6 and "nothing at" in r.stderr
    # what needs an extra says which
    r = cli("run", "click", "--sink", sc.sink)
    assert r.returncode == 2 and "fix: pip install 'event_etl[job]'" in r.stderr and "Traceback" not in r.stderr
    r = cli("graphs", "click", "--history", "h.jsonl")
    assert r.returncode == 2 and "fix: pip install 'event_etl[graphs]'" in r.stderr


def test_the_library_and_the_recipes_from_the_light_install(light_venv, tmp_path):
    venv, _ = light_venv
    sc = build_hours(tmp_path / "made")
    code = f"""
import json
from event_etl.consumer import read_records, read_table, verify_hour, wait_for_hour
from event_etl.consumer.recipes import hour_uris
from event_etl.consumer.airflow import poke
from event_etl.errors import UsageError
sink = {sc.sink!r}
m = wait_for_hour(sink, "click", "2026-11-21T14", timeout=5)
rows = list(read_records(sink, "click", "2026-11-21T13", until="2026-11-21T15"))
try:
    read_table(sink, "click", "2026-11-21T13")
    table = "read"
except UsageError as err:
    table = err.fix
print(json.dumps({{"records": m.records, "rows": len(rows), "ok": verify_hour(sink, "click", "2026-11-21T13").ok,
                  "uris": len(hour_uris(sink, "click", "2026-11-21T14")),
                  "poke": poke(sink, "click", "2026-11-21T15").done, "table": table}}))
"""
    out = json.loads(_run([venv / "bin" / "python", "-c", code], env=_env(), cwd=tmp_path).stdout)
    assert out == {"records": 2, "rows": 4, "ok": True, "uris": 2, "poke": False,
                   "table": "pip install 'event_etl[arrow]'"}
