"""PySpark's worker daemon of local jobs (event_etl.job.sparkdaemon): what it imports before forking workers.

Workers are forked from the daemon; a module imported there is loaded in every worker without
importing it again, but a thread running in the daemon at a fork would leave its locks held in
the child.  So what the daemon imports must start no thread, and the daemon must still be
single-threaded when it starts forking."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from event_etl.job import sparkdaemon

PROBE = """
import json, sys
from event_etl.job import sparkdaemon
done = sparkdaemon.warm()
loaded = sorted(m for m in done if m in sys.modules)
print(json.dumps({"done": done, "threads": sparkdaemon.threads(), "loaded": loaded}))
"""


def test_the_daemon_imports_the_task_modules_and_stays_single_threaded():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "JE_ARROW_MALLOC_CONF")}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["threads"] == 1, "a fork from a multi-threaded daemon could copy held locks into workers"
    assert got["done"] == list(sparkdaemon.WARM_MODULES), r.stderr
    assert {"pyspark.worker", "event_etl.task.executor", "fsspec", "pyarrow.json"} <= set(got["done"])
    assert r.stderr == "", r.stderr


def test_the_daemon_stops_importing_at_a_module_that_starts_a_thread(tmp_path):
    (tmp_path / "threaded_mod.py").write_text("import threading, time\n"
                                               "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    probe = ("import json; from event_etl.job import sparkdaemon\n"
             "print(json.dumps(sparkdaemon.warm(('threaded_mod', 'event_etl.task.dedupe'))))")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [], "nothing more is imported after a module that started a thread"
    assert "importing threaded_mod started a thread" in r.stderr


def test_pyspark_comes_from_the_installed_package_when_sparks_zips_are_that_packages_own(tmp_path):
    """Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on a worker's path; modules in a zip are
    compiled on every import.  When the zip is the installed package's own, the daemon puts it last."""
    pkg = tmp_path / "site" / "pyspark"
    (pkg / "python" / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    zips = [str(pkg / "python" / "lib" / "pyspark.zip"), str(pkg / "python" / "lib" / "py4j-0.10.9.9-src.zip")]
    path = [*zips, "/app", str(tmp_path / "site"), "/usr/lib/python311.zip"]
    found = sparkdaemon.installed_pyspark(path)
    assert found == str(pkg)
    assert sparkdaemon.installed_first(path, found) == ["/app", str(tmp_path / "site"), "/usr/lib/python311.zip",
                                                        *zips]


def test_another_sparks_zips_and_a_zip_only_pyspark_stay_where_spark_put_them(tmp_path):
    other = [str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip"), "/app"]
    (tmp_path / "site" / "pyspark").mkdir(parents=True)
    (tmp_path / "site" / "pyspark" / "__init__.py").write_text("")
    path = [*other, str(tmp_path / "site")]
    assert sparkdaemon.installed_first(path, sparkdaemon.installed_pyspark(path)) == path, \
        "a SPARK_HOME elsewhere may hold another release of PySpark than the installed one"
    assert sparkdaemon.installed_pyspark(other) is None
    assert sparkdaemon.installed_first(other, None) == other
