"""The light consumer as a user installs it: a wheel built from this checkout, ``pip install`` WITHOUT extras
into a fresh virtual environment, no event types folder, then ``event-etl hours/wait/verify/cat/audit``
against a sink this test makes.

It needs PyPI (the dependencies are downloaded, or taken from pip's cache).  The size of the installation (what
``pip install`` adds to a fresh virtual environment: pip and setuptools, there before, are not counted) is held
to :data:`LIGHT_MB` (issue 50 item 5: it was ~101 MB while gcsfs, with aiohttp and grpc, was in it); run with
``-s`` to see it, package by package (docs/install.md states the figures).  The same commands also read a
``gs://`` sink (fake-gcs-server) through the light file system (:mod:`event_etl.storage.gcs_light`): no gcsfs, no
grpc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lib.consumer_scenario import build_hours

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pyspark", "matplotlib", "google.cloud.pubsub_v1", "opentelemetry.sdk", "opentelemetry.exporter", "pandas",
         "numpy", "duckdb", "airflow", "xxhash", "pyarrow", "gcsfs", "grpc", "aiohttp", "google.cloud.storage",
         "google.api_core", "google.protobuf")
LIGHT_MB = 60
"""The bound on the light install, in MB (10**6 bytes): ~50 MB on 2026-11-28 (docs/install.md)."""

pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout}\n{r.stderr}"
    return r


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _by_package(site: Path) -> dict[str, int]:
    """Bytes on disk of each installed distribution (the files its RECORD lists, with their compiled ``.pyc``)."""
    out = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0]
        files = {(site / line.rsplit(",", 2)[0]).resolve() for line in record.read_text().splitlines() if line}
        for f in list(files):
            if f.suffix == ".py":
                files.update(f.parent.glob(f"__pycache__/{f.stem}.*.pyc"))
        out[name] = sum(f.stat().st_size for f in files if f.is_file())
    return out


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
    packages = {k: v for k, v in _by_package(site).items() if k not in ("pip", "setuptools")}
    print(f"\nthe consumer install (pip install {wheel.name}, no extras): {size / 1e6:.1f} MB in {site} "
          f"(pip and setuptools, there before, not counted), {len(packages)} packages:")
    for name, n in sorted(packages.items(), key=lambda kv: -kv[1]):
        print(f"  {name:28} {n / 1e6:6.1f} MB")
    return venv, size


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ETL_", "PYTHON", "PYSPARK"))}
    env.pop("VIRTUAL_ENV", None)
    return env


def test_the_light_install_is_at_most_60_mb(light_venv):
    """What waiting, verifying and reading local and gs:// sinks costs: held to LIGHT_MB."""
    _, size = light_venv
    assert size <= LIGHT_MB * 1e6, f"the light install is {size / 1e6:.1f} MB, more than {LIGHT_MB} MB (run with -s)"


def test_the_base_install_brings_no_spark_no_graphs_no_pubsub_no_otel(light_venv):
    venv, _ = light_venv
    code = f"""
import importlib.util, json
def installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is not there either
        return False
print(json.dumps([m for m in {HEAVY!r} if installed(m)]))
"""
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
    r = cli("late", "click", "2026-11-21T13", "--allowed-lateness", "30m", "--sink", sc.sink, "--json")
    assert r.returncode == 0, r.stderr
    late = json.loads(r.stdout)  # d, of 13:30, landed in hour 14
    assert (late["late_records"], late["landed"], late["final"]) == (1, [{"hour": "2026-11-21T14:00:00Z",
                                                                           "records": 1}], True)
    r = cli("hours", "click", "--sink", sc.sink + "-typo")
    assert r.returncode == 6 and "nothing at" in r.stderr
    # what needs an extra says which
    r = cli("run", "click", "--sink", sc.sink)
    assert r.returncode == 2 and "fix: pip install 'event_etl[job]'" in r.stderr and "Traceback" not in r.stderr
    r = cli("graphs", "click", "--history", "h.jsonl")
    assert r.returncode == 2 and "fix: pip install 'event_etl[graphs]'" in r.stderr
    r = cli("wait", "click", "2026-11-21T15", "--sink", sc.sink, "--timeout", "1",
            "--subscription", "projects/my-project/subscriptions/hours")
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "fix: pip install 'event_etl[pubsub]'" in r.stderr and "google-cloud-pubsub" in r.stderr


def test_consumer_commands_read_a_gcs_sink_from_the_light_install(light_venv, tmp_path, gcs_bucket):
    """gs:// without gcsfs (nor grpc, aiohttp): the light file system, against fake-gcs-server (audit writes its
    record there, create-only)."""
    venv, _ = light_venv
    sc = build_hours(tmp_path / "made", sink_url=f"{gcs_bucket}/events")  # written here, with gcsfs
    work = tmp_path / "work"
    work.mkdir()

    def cli(*args):
        return subprocess.run([str(venv / "bin" / "event-etl"), *args, "--sink", sc.sink], capture_output=True,
                              text=True, cwd=work, env=_env(), timeout=300)

    assert "STORAGE_EMULATOR_HOST" in _env()
    r = cli("hours", "click", "--since", "2026-11-21T12", "--until", "2026-11-21T17", "--json")
    assert r.returncode == 0, r.stderr
    assert [h["state"] for h in json.loads(r.stdout)] == ["never", "complete", "complete", "open", "not started"]
    r = cli("wait", "click", "2026-11-21T14", "--timeout", "10")
    assert r.returncode == 0 and "complete: records 2 (late 1)" in r.stdout, r.stderr
    r = cli("wait", "click", "2026-11-21T15", "--timeout", "0.5", "--poll-interval", "0.1")
    assert r.returncode == 3, r.stderr
    r = cli("verify", "click", "--since", "2026-11-21T13", "--until", "2026-11-21T15")
    assert r.returncode == 0 and r.stdout.count(": ok (") == 2, r.stdout + r.stderr
    r = cli("cat", "click", "2026-11-21T14")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(line)["id"] for line in r.stdout.splitlines()) == ["c", "d"]
    r = cli("audit", "click", "2026-11-21T13", "--expected", "3", "--time-field", "ts", "--allowed-lateness", "30m")
    assert r.returncode == 0 and "match" in r.stdout, r.stdout + r.stderr
    r = cli("late", "click", "2026-11-21T13", "--allowed-lateness", "30m", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["landed"] == [{"hour": "2026-11-21T14:00:00Z", "records": 1}]
    r = subprocess.run([str(venv / "bin" / "event-etl"), "hours", "click", "--sink", f"{gcs_bucket}/typo"],
                       capture_output=True, text=True, cwd=work, env=_env(), timeout=300)
    assert r.returncode == 6 and "nothing at" in r.stderr, r.stderr
    code = f"""
from event_etl.storage import Storage
st = Storage({sc.sink!r})
print(st.create_only("click/x", b"x"), st.create_only("click/x", b"y"), st.read("click/x"), type(st.fs).__name__)
"""
    out = _run([venv / "bin" / "python", "-c", code], env=_env(), cwd=tmp_path).stdout.split()
    assert out == ["True", "False", "b'x'", "GCSLightFileSystem"]
