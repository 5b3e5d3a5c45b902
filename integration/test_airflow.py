"""The Airflow sensor under a real Airflow: ``apache-airflow`` from PyPI in a virtual environment of its own, the
light consumer installed there from a wheel of this checkout, and ``airflow dags test`` on a DAG with one sensor per
case: a complete hour (poke mode, and reschedule mode), a wrong sink, an hour that never completes while deferred
(the sensor's timeout ends it), and an hour the job completes while the sensor is deferred.

Two Airflows, the same DAG and the same assertions: 3 (``.airflow-test-venv/``) and the last 2.x, 2.11
(``.airflow2-test-venv/``; installed without Airflow's constraints file, which is not on PyPI). Each environment is
made once in the checkout and reused while its Airflow and the checkout's setup.cfg stay the same: by ``uv`` (a test
dependency, setup.cfg's ``[test]``) in ~10-20 s from PyPI, by pip where uv is missing (~1 to 2 minutes).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lib.consumer_scenario import build_hours, complete_hour_15

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Airflow:
    requirement: str
    venv: Path


AIRFLOWS = {
    "airflow3": Airflow("apache-airflow>=3.1,<4", ROOT / ".airflow-test-venv"),
    "airflow2": Airflow("apache-airflow>=2.11,<3", ROOT / ".airflow2-test-venv"),
}

pytestmark = pytest.mark.slow

DAG = '''
import os
from datetime import datetime, timezone

from airflow import DAG
from event_etl.consumer.airflow import HourCompleteSensor

SINK = os.environ["ETL_SINK"]
with DAG("etl_hours", start_date=datetime(2026, 11, 21, tzinfo=timezone.utc), schedule=None, catchup=False):
    HourCompleteSensor(task_id="complete_poke", sink=SINK, event_type="click", hour="2026-11-21T14:00:00Z",
                       poke_interval=1, timeout=30)
    HourCompleteSensor(task_id="complete_reschedule", sink=SINK, event_type="click", hour="2026-11-21T13:00:00Z",
                       poke_interval=1, timeout=30, mode="reschedule")
    HourCompleteSensor(task_id="wrong_sink", sink=SINK + "-typo", event_type="click", hour="2026-11-21T14:00:00Z",
                       poke_interval=1, timeout=30)
    HourCompleteSensor(task_id="deferred_times_out", sink=SINK, event_type="click", hour="2026-11-21T16:00:00Z",
                       poke_interval=1, timeout=6, deferrable=True)
    HourCompleteSensor(task_id="deferred_completes", sink=SINK, event_type="click", hour="2026-11-21T15:00:00Z",
                       poke_interval=1, timeout=300, deferrable=True)
'''


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _states(home: Path) -> dict[str, str]:
    """Each task's state as Airflow recorded it in its metadata database (SQLite, in ``AIRFLOW_HOME``): what `airflow
    tasks states-for-dag-run` prints for the one run `dags test` made, without starting Airflow's CLI twice more
    (`dags list-runs` for the run's id, and before it, on 2, `dags reserialize`)."""
    with closing(sqlite3.connect(home / "airflow.db")) as db:
        rows = db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'etl_hours'").fetchall()
    assert len({task for task, _ in rows}) == len(rows), f"one run of each task: {rows}"
    return dict(rows)


def _installer(py: Path) -> list:
    """The command that installs into the environment of ``py``: ``uv pip`` (next to this Python: a test dependency),
    which resolves, downloads and unpacks Airflow's ~200 distributions in parallel and compiles nothing; else pip,
    with --no-compile (Airflow's ~10,000 modules compile when a run imports them: half of pip's time)."""
    uv = Path(sys.executable).with_name("uv")
    if uv.exists():
        return [uv, "pip", "install", "--quiet", "--python", py]
    return [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]


def _key(requirement: str) -> str:
    return hashlib.sha256((requirement + (ROOT / "setup.cfg").read_text()).encode()).hexdigest()[:16]


@pytest.fixture(scope="module", params=list(AIRFLOWS))
def airflow_env(request, tmp_path_factory) -> Airflow:
    """An Airflow (3, or the last 2.x) in a virtual environment with the light consumer (this checkout's code, as a
    wheel)."""
    af = AIRFLOWS[request.param]
    venv = af.venv
    py = venv / "bin" / "python"
    src = tmp_path_factory.mktemp("wheel") / "src"  # a copy: building in the checkout would leave build/ behind
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "event_etl", src / "event_etl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    install = _installer(py)
    by_uv = install[0] != py
    ready = venv / f".ready-{_key(af.requirement + (' by uv' if by_uv else ''))}"  # a uv one has no pip
    if not ready.exists():
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", *(["--without-pip"] if by_uv else []), venv])
        r = subprocess.run([str(c) for c in [*install, af.requirement, src]], capture_output=True, text=True,
                           timeout=900)
        if r.returncode != 0:
            pytest.fail(f"could not install {af.requirement} and event_etl's dependencies from PyPI (this test needs "
                        f"them):\n{r.stderr[-2000:]}")
        ready.write_text("")
    # this checkout's code, every time
    _run([*install, "--reinstall" if by_uv else "--force-reinstall", "--no-deps", src])
    return af


def test_the_sensor_under_airflow(airflow_env, tmp_path):
    sc = build_hours(tmp_path / "made")  # 13, 14 complete; 15 open; 16 not started
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "etl_hours.py").write_text(DAG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ETL_", "PYTHON", "PYSPARK", "AIRFLOW"))}
    env.pop("VIRTUAL_ENV", None)
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "ETL_SINK": sc.sink})
    airflow = airflow_env.venv / "bin" / "airflow"
    _run([airflow, "db", "migrate"], env=env)

    log_path = tmp_path / "dags-test.log"
    done = threading.Event()

    def complete_hour_15_while_deferred() -> None:
        """The job marks hour 15 once the sensor waiting for it has handed the wait to its trigger."""
        marker = "running task <TaskInstance: etl_hours.deferred_completes"
        while not done.is_set():
            text = log_path.read_text() if log_path.exists() else ""
            at = text.find(marker)
            if at >= 0 and "running trigger in line" in text[at:]:
                time.sleep(3)  # a few pokes of the trigger find the hour open
                complete_hour_15(sc)
                return
            time.sleep(0.2)

    helper = threading.Thread(target=complete_hour_15_while_deferred, daemon=True)
    helper.start()
    with open(log_path, "w") as log:
        proc = subprocess.run([str(airflow), "dags", "test", "etl_hours", "2026-11-21"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=600)
    done.set()
    text = log_path.read_text()
    assert proc.returncode != 0, "two of the sensors fail: the DAG run fails"
    assert _states(home) == {
        "complete_poke": "success", "complete_reschedule": "success", "wrong_sink": "failed",
        "deferred_times_out": "failed", "deferred_completes": "success"}, text[-5000:]
    assert "nothing at" in text, "a wrong sink fails with the sink's own message"
    # (hour 16 is `not started`, or `open` once the job has marked 15 for the other sensor)
    assert re.search(r"2026-11-21T16:00:00Z was not complete \((not started|open)\) when the sensor's timeout ran out",
                     text)
    assert "AirflowSensorTimeout" in text
