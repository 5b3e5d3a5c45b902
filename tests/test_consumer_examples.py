"""examples/airflow_dag.py stays in step with the API (Airflow itself is not installed, nor needed by event_etl)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

from event_etl.consumer import poke_hour
from tests.test_consumer_scenario import build_hours

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "airflow_dag.py"


def _sensor_call() -> ast.Call:
    tree = ast.parse(EXAMPLE.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and any(k.arg == "python_callable" and getattr(k.value, "id", None) == "poke_hour" for k in n.keywords)]
    assert len(calls) == 1, "the example has one sensor poking with event_etl.consumer.poke_hour"
    return calls[0]


def _constants() -> dict[str, str]:
    tree = ast.parse(EXAMPLE.read_text())
    return {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets if isinstance(t, ast.Name)}


def test_the_sensor_op_kwargs_are_what_poke_hour_takes(tmp_path):
    call = _sensor_call()
    assert getattr(call.func, "id", None) == "PythonSensor"
    op_kwargs = next(k.value for k in call.keywords if k.arg == "op_kwargs")
    names = [k.value for k in op_kwargs.keys]
    inspect.signature(poke_hour).bind(**dict.fromkeys(names))
    assert _constants()["HOUR"] == "{{ data_interval_start }}"

    sc = build_hours(tmp_path)
    rendered = {"sink": sc.sink, "event_type": "click"}
    # how Airflow renders {{ data_interval_start }} for the runs of 14:00 and 15:00
    assert poke_hour(**rendered, hour="2026-11-21 14:00:00+00:00") is True
    assert poke_hour(**rendered, hour="2026-11-21 15:00:00+00:00") is False


def test_the_package_does_not_import_airflow():
    code = "import sys, event_etl.consumer, event_etl.cli; print(sorted(m for m in sys.modules if 'airflow' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_readme_documents_every_exit_code():
    from event_etl.consumer import ExitCode

    from event_etl.exitcodes import exit_codes_markdown

    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    assert exit_codes_markdown() in readme, "README has the one exit-code table, as event_etl.exitcodes makes it"
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 6, 7, 129, 130, 143]
