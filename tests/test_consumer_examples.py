"""examples/airflow_dag.py stays in step with the API (Airflow itself is not installed, nor needed by event_etl)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from datetime import UTC
from pathlib import Path

from event_etl.consumer import poke_hour
from tests.lib.consumer_scenario import build_hours

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


def _assigns(path: Path) -> dict[str, ast.expr]:
    tree = ast.parse(path.read_text())
    return {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def _render_strftime(template: str, when) -> str:
    """Airflow's Jinja for the one form the example uses: {{ data_interval_start.strftime('...') }}."""
    import re

    return re.sub(
        r"\{\{ data_interval_start\.strftime\('([^']*)'\) \}\}", lambda m: when.strftime(m.group(1)), template
    )


def test_the_gcs_sensor_example_watches_the_marker_event_etl_writes(tmp_path):
    from datetime import datetime

    from event_etl.consumer.airflow import marker_object

    values = _assigns(EXAMPLE.with_name("airflow_dag_gcs_sensor.py"))
    consts = {k: v.value for k, v in values.items() if isinstance(v, ast.Constant)}
    marker_template = ast.literal_eval(values["MARKER"]) if isinstance(values["MARKER"], ast.Constant) else None
    if marker_template is None:  # PREFIX + "/" + EVENT_TYPE + "..." : evaluate the string expression
        marker_template = eval(compile(ast.Expression(values["MARKER"]), "MARKER", "eval"), {}, dict(consts))
    when = datetime(2026, 11, 21, 13, tzinfo=UTC)
    object_name = _render_strftime(marker_template, when)
    sink = f"gs://{consts['BUCKET']}/{consts['PREFIX']}"
    assert marker_object(sink, consts["EVENT_TYPE"], when) == (consts["BUCKET"], object_name)


def test_the_deferrable_sensor_example_passes_what_the_sensor_takes():
    tree = ast.parse(EXAMPLE.with_name("airflow_dag_sensor.py").read_text())
    (call,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "HourCompleteSensor"
    ]
    given = {k.arg for k in call.keywords}
    assert {"sink", "event_type", "hour", "deferrable"} <= given
    assert any(isinstance(n, ast.ImportFrom) and n.module == "event_etl.consumer.airflow" for n in ast.walk(tree))
