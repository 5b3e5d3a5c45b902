"""`event-etl submit` without a cluster: the bundle, the spark-submit command line, the driver's checks.

Everything here is a pure function or a file on disk; integration/test_cluster.py runs the
same code against a real standalone cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from event_etl import __version__
from event_etl.cli import main
from event_etl.cli.submitted import main as driver
from event_etl.cluster.bundle import build_bundle, bundle_members, bundled_event_types
from event_etl.cluster.localcluster import LocalCluster, _daemon_env, _port
from event_etl.cluster.preflight import SharedFolder, _judge, _python_error, executor_report, shared_folders
from event_etl.cluster.submit import (
    SubmitOptions,
    absolute_job_paths,
    check_python_here,
    check_submit_options,
    driver_args,
    forwarded_env,
    is_this_machine,
    submit_command,
    submit_conf,
    write_entry_script,
)
from event_etl.errors import EventEtlError, UsageError
from event_etl.eventtypes import load_event_types
from event_etl.job.setup import RunOptions
from tests.lib.harness import make_event_type

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "event_types"


# -- the bundle ------------------------------------------------------------------------------
@pytest.fixture
def types(tmp_path):
    root = tmp_path / "types"
    make_event_type(root, "click")
    (root / "_draft").mkdir()  # not a type: load_event_types skips it, so does the bundle
    (root / "_draft" / "etl.toml").write_text("")
    (root / "click" / ".notes.swp").write_text("editor file")
    return root


def test_the_bundle_holds_the_package_and_the_types(tmp_path, types):
    path, built = build_bundle(types, tmp_path / "b")
    assert built and path.name.startswith(f"event_etl-{__version__}-") and path.suffix == ".zip"
    names = zipfile.ZipFile(path).namelist()
    assert names == sorted(names)
    assert {"event_etl/__init__.py", "event_etl/submit_main.py", "event_etl/rules/buckets.py",
            "event_etl/log4j2.properties"} <= set(names)
    assert [n for n in names if n.startswith("event_types/")] == ["event_types/click/etl.toml",
                                                                  "event_types/click/schema.avsc"]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or "/." in n]


def test_the_bundle_is_named_by_its_content_and_reused(tmp_path, types):
    first, _ = build_bundle(types, tmp_path / "a")
    again, built = build_bundle(types, tmp_path / "a")
    assert again == first and not built
    elsewhere, _ = build_bundle(types, tmp_path / "b")
    assert elsewhere.name == first.name and elsewhere.read_bytes() == first.read_bytes(), "deterministic bytes"
    (types / "click" / "etl.toml").write_text('time_field = "ts"\nout_of_orderness = "5m"\n')
    changed, built = build_bundle(types, tmp_path / "a")
    assert built and changed != first


def test_the_bundled_types_are_extracted_once_and_load(tmp_path, types):
    path, _ = build_bundle(types, tmp_path / "b")
    folder = bundled_event_types(path, cache_root=tmp_path / "cache")
    assert list(load_event_types(folder)) == ["click"]
    assert bundled_event_types(path, cache_root=tmp_path / "cache") == folder
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.parent.name], "no staging folder left"


def test_a_zip_without_types_has_no_bundled_types(tmp_path):
    z = tmp_path / "code.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("event_etl/__init__.py", "")
    assert bundled_event_types(z, cache_root=tmp_path / "cache") is None


def test_imported_from_the_bundle_the_default_types_are_the_bundled_ones(tmp_path, types):
    """As on a cluster driver: event_etl comes from the zip, the project's event_types/ is not next to it."""
    path, _ = build_bundle(types, tmp_path / "b")
    code = ("import event_etl, event_etl.eventtypes as e; from event_etl.cluster.bundle import package_archive; "
            "print(event_etl.__file__); print(package_archive()); "
            "print(sorted(e.load_event_types(e.resolve_event_types_dir())))")
    env = {k: v for k, v in os.environ.items() if k != "EVENT_ETL_EVENT_TYPES"}
    env.update(PYTHONPATH=str(path), TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    file, archive, loaded = r.stdout.splitlines()
    assert file.startswith(str(path)) and archive == str(path)
    assert loaded == "['click']"


def test_bundle_members_of_the_shipped_types():
    members = dict(bundle_members(SHIPPED))
    assert {"event_types/page_view/schema.avsc", "event_types/page_view/etl.toml"} <= set(members)


# -- what the driver gets --------------------------------------------------------------------
@pytest.mark.parametrize("master, here", [
    ("local[2]", True), ("local", True), ("spark://127.0.0.1:7077", True), ("spark://localhost:7077", True),
    ("spark://127.0.0.1:7077,127.0.0.1:7078", True), ("spark://10.0.0.5:7077", False),
    ("spark://127.0.0.1:7077,node2:7077", False), ("yarn", False), ("k8s://https://10.0.0.1:6443", False),
])
def test_is_this_machine(master, here):
    assert is_this_machine(master) is here


def test_local_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = absolute_job_paths("page_view", {"source": "in", "sink": "./out", "checkpoint": None,
                                           "metrics_history": "m.jsonl", "conf": ()})
    assert job["source"] == f"dir:{tmp_path / 'in'}"
    assert job["sink"] == str(tmp_path / "out")
    assert job["checkpoint"] == str(tmp_path / "checkpoints" / "page_view")
    assert job["metrics_history"] == str(tmp_path / "m.jsonl")
    other = absolute_job_paths("page_view", {"source": "dir:rel", "sink": "gs://b/p", "checkpoint": "file://ck"})
    assert other["source"] == f"dir:{tmp_path / 'rel'}" and other["sink"] == "gs://b/p"
    assert other["checkpoint"] == str(tmp_path / "ck")
    # not folders (`submit --source kafka:T` once read T as a folder named "kafka:T")
    for source in ("generate:", "generate:rate=5,count=10", "pubsub:", "pubsub:projects/p/subscriptions/s",
                   "kafka:orders", None):
        assert absolute_job_paths("page_view", {"source": source})["source"] == source


def _parse_run(args: list[str]) -> dict:
    return main.commands["run"].make_context("run", list(args)).params


def test_driver_args_carry_every_run_option_as_parsed():
    given = ["page_view", "--source", "dir:/in", "--sink", "/out", "--checkpoint", "/ck", "--trigger-interval", "2s",
             "--max-files-per-batch", "3", "--max-events-per-batch", "99", "--once", "--drain", "--conf", "a=1",
             "--conf", "b=x=y", "--quiet", "--metrics-port", "0", "--metrics-host", "0.0.0.0", "--otlp-endpoint",
             "http://c:4318", "--metrics-history", "/h.jsonl", "--engine", "shared"]
    job = _parse_run(given)
    job.pop("master"), job.pop("event_types_dir"), job.pop("all_types"), job.pop("checkpoint_root")
    (event_type,) = job.pop("event_types")
    args = driver_args(event_type, job, driver.params)
    assert args == given, "the driver is given exactly what run would have parsed"
    parsed = driver.make_context("driver", list(args)).params
    assert {k: v for k, v in parsed.items() if k not in ("event_types", "all_types")} == job
    assert parsed["event_types"] == ("page_view",) and not parsed["all_types"]


def test_a_fleet_is_submitted_with_its_types_or_all():
    job = _parse_run(["page_view", "db_change"])
    for name in ("master", "event_types_dir", "event_types", "all_types", "checkpoint_root"):
        job.pop(name)
    assert driver_args(["page_view", "db_change"], job, driver.params) == ["page_view", "db_change"]
    parsed = driver.make_context("driver", driver_args(["--all"], job, driver.params)).params
    assert parsed["all_types"] and parsed["event_types"] == () and parsed["engine"] is None
    # a fleet's default checkpoint is the folder of every type's checkpoint, spelled out for the driver
    assert absolute_job_paths(None, {"checkpoint": None})["checkpoint"] == os.path.abspath("checkpoints")


def test_driver_args_leave_defaults_out():
    job = _parse_run(["page_view"])
    for name in ("master", "event_types_dir", "event_types", "all_types", "checkpoint_root"):
        job.pop(name)
    assert driver_args("page_view", job, driver.params) == ["page_view"]


def test_run_and_the_driver_build_the_same_run_options():
    from event_etl.cli.options import job_run_options

    job = _parse_run(["page_view", "--once", "--conf", "k=v", "--max-files-per-batch", "2"])
    job.pop("event_types_dir"), job.pop("event_types"), job.pop("all_types"), job.pop("checkpoint_root")
    opts = job_run_options(**job)
    assert isinstance(opts, RunOptions) and opts.once and opts.conf == {"k": "v"} and opts.max_files_per_batch == 2


def test_run_keeps_its_options_in_their_order():
    names = [p.name for p in main.commands["run"].params]
    assert names == ["event_types", "all_types", "source", "sink", "checkpoint", "trigger_interval",
                     "max_files_per_batch",
                     "max_events_per_batch", "once", "drain", "drain_on_stop", "master", "conf", "quiet",
                     "metrics_port",
                     "metrics_host", "otlp_endpoint", "metrics_history", "engine", "checkpoint_root",
                     "event_types_dir"]


def test_submit_takes_every_option_of_run():
    # a fleet's checkpoint root is --checkpoint there (--checkpoint-root is run's other name for it)
    run = {p.name for p in main.commands["run"].params} - {"checkpoint_root"}
    submit = {p.name for p in main.commands["submit"].params}
    assert run <= submit
    master = next(p for p in main.commands["submit"].params if p.name == "master")
    assert master.required


# -- the spark-submit command ----------------------------------------------------------------
PY = "/opt/venv/bin/python"


def test_conf_for_a_cluster_on_this_machine():
    conf = submit_conf(SubmitOptions(master="spark://127.0.0.1:7077"), (), env={}, executable=PY)
    assert conf["spark.pyspark.python"] == PY and conf["spark.pyspark.driver.python"] == PY
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.driver.extraJavaOptions"].startswith("-Dlog4j2.configurationFile=file:")
    assert conf["spark.driver.extraJavaOptions"].endswith("event_etl/log4j2.properties")


def test_conf_for_a_remote_cluster_keeps_its_python_and_addresses():
    conf = submit_conf(SubmitOptions(master="spark://master.example:7077"), (), env={}, executable=PY)
    assert "spark.pyspark.python" not in conf and "spark.driver.host" not in conf
    conf = submit_conf(SubmitOptions(master="yarn", python="/opt/conda/bin/python"), (), env={}, executable=PY)
    assert conf["spark.pyspark.python"] == "/opt/conda/bin/python"


def test_conf_with_a_packed_environment_in_cluster_mode():
    opts = SubmitOptions(master="yarn", deploy_mode="cluster", python_env="env.tar.gz")
    conf = submit_conf(opts, (), env={"EVENT_ETL_LEASE_TTL": "30s"}, executable=PY)
    assert conf["spark.pyspark.python"] == "./environment/bin/python"
    assert "spark.pyspark.driver.python" not in conf and "spark.driver.extraJavaOptions" not in conf
    assert conf["spark.yarn.appMasterEnv.EVENT_ETL_LEASE_TTL"] == "30s"
    assert conf["spark.executorEnv.EVENT_ETL_LEASE_TTL"] == "30s"
    k8s = submit_conf(SubmitOptions(master="k8s://https://k:6443", deploy_mode="cluster"), (),
                      env={"STORAGE_EMULATOR_HOST": "http://gcs:4443"}, executable=PY)
    assert k8s["spark.kubernetes.driverEnv.STORAGE_EMULATOR_HOST"] == "http://gcs:4443"


def test_the_users_conf_wins():
    conf = submit_conf(SubmitOptions(master="spark://127.0.0.1:7077"),
                       ("spark.pyspark.python=/usr/bin/python3", "spark.executor.memory=2g"), env={}, executable=PY)
    assert conf["spark.pyspark.python"] == "/usr/bin/python3" and conf["spark.executor.memory"] == "2g"


def test_event_etl_settings_and_emulators_reach_the_executors():
    env = {"EVENT_ETL_FAULT_PAUSE": "write_file=0.2", "EVENT_ETL_EVENT_TYPES": "/here/only", "PATH": "/bin",
           "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443", "PUBSUB_EMULATOR_HOST": "127.0.0.1:8085",
           "EVENT_ETL_DRIVER_PIDFILE": "/x", "GOOGLE_APPLICATION_CREDENTIALS": "/secret.json"}
    assert forwarded_env(env) == {"EVENT_ETL_FAULT_PAUSE": "write_file=0.2", "PUBSUB_EMULATOR_HOST": "127.0.0.1:8085",
                                  "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443"}
    conf = submit_conf(SubmitOptions(master="spark://127.0.0.1:7077"), (), env=env, executable=PY)
    assert conf["spark.executorEnv.EVENT_ETL_FAULT_PAUSE"] == "write_file=0.2"
    assert not [k for k in conf if "EVENT_TYPES" in k or "CREDENTIALS" in k]


def test_the_spark_submit_command_line():
    opts = SubmitOptions(master="yarn", deploy_mode="cluster", python_env="/envs/etl.tar.gz")
    cmd = submit_command(opts, spark_submit="/spark/bin/spark-submit", bundle=Path("/b/event_etl-0.1.0-ab.zip"),
                         entry=Path("/b/event_etl_driver.py"), conf={"z.last": "1", "a.first": "2"},
                         driver=["page_view", "--drain"], app_name="event_etl:page_view")
    assert cmd == ["/spark/bin/spark-submit", "--master", "yarn", "--deploy-mode", "cluster",
                   "--name", "event_etl:page_view", "--py-files", "/b/event_etl-0.1.0-ab.zip",
                   "--archives", "/envs/etl.tar.gz#environment", "--conf", "a.first=2", "--conf", "z.last=1",
                   "/b/event_etl_driver.py", "page_view", "--drain"]


@pytest.mark.parametrize("opts, words", [
    (SubmitOptions(master="spark://h:7077", deploy_mode="cluster"), "client mode only"),
    (SubmitOptions(master="local[2]", deploy_mode="cluster"), "no cluster"),
    (SubmitOptions(master="yarn", python_env="env.tar.gz"), "needs --deploy-mode cluster"),
    (SubmitOptions(master="yarn", deploy_mode="cluster", python_env="env/"), "not an archive"),
])
def test_combinations_that_cannot_work_are_refused(opts, words):
    with pytest.raises(UsageError, match=words) as err:
        check_submit_options(opts)
    assert err.value.fix


def test_in_client_mode_the_executors_python_must_exist_here_too():
    here = SubmitOptions(master="spark://node:7077")
    check_python_here(here, {"spark.pyspark.python": sys.executable})
    check_python_here(here, {"spark.pyspark.python": "python3"})
    check_python_here(here, {})
    check_python_here(SubmitOptions(master="yarn", deploy_mode="cluster"), {"spark.pyspark.python": "/no/such/python"})
    with pytest.raises(UsageError, match="/no/such/python is not on this machine") as err:
        check_python_here(here, {"spark.pyspark.python": "/no/such/python"})
    assert "--deploy-mode cluster" in err.value.fix


def test_the_entry_script_runs_the_driver(tmp_path):
    path = write_entry_script(tmp_path / "b")
    assert "from event_etl.cli.submitted import main" in path.read_text()
    assert write_entry_script(tmp_path / "b") == path


def test_dry_run_prints_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["submit", "page_view", "--master", "spark://127.0.0.1:7077", "--source", "in",
                                    "--drain", "--dry-run"])
    assert res.exit_code == 0, res.output
    bundle = next((tmp_path / ".event_etl-submit").glob("event_etl-*.zip"))
    assert f"--py-files {bundle}" in res.output
    assert f"event_etl_driver.py page_view --source dir:{tmp_path / 'in'} --sink {tmp_path / 'data'}" in res.output
    assert "(built)" in res.output
    again = CliRunner().invoke(main, ["submit", "page_view", "--master", "spark://127.0.0.1:7077", "--dry-run"])
    assert "(unchanged, reused)" in again.output


def test_submit_needs_a_master_and_a_known_type():
    res = CliRunner().invoke(main, ["submit", "page_view"])
    assert res.exit_code == 2 and "--master" in res.output
    res = CliRunner().invoke(main, ["submit", "nope", "--master", "yarn", "--dry-run"])
    assert res.exit_code == 2 and "no event type 'nope'" in res.output


def test_the_driver_takes_the_options_of_run_but_the_master_from_spark_submit(monkeypatch):
    res = CliRunner().invoke(driver, ["--help"])
    assert res.exit_code == 0 and "--source" in res.output and "--master" not in res.output
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    res = CliRunner().invoke(driver, ["page_view"])
    assert res.exit_code == 2
    assert "runs under spark-submit only" in res.output and "event-etl submit page_view" in res.output


# -- the driver's preflight ------------------------------------------------------------------
def _opts(**kw) -> RunOptions:
    return RunOptions(**kw)


def test_shared_folders_of_each_source_and_sink(tmp_path):
    et = make_event_type(tmp_path / "t", "click")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("{}\n")
    folders = shared_folders(et, _opts(source=f"dir:{tmp_path / 'in'}", sink=str(tmp_path / "out")), token="t1")
    assert [(f.what, f.path) for f in folders] == [("sink", str(tmp_path / "out")), ("input folder",
                                                                                     str(tmp_path / "in"))]
    assert folders[0].probe == ".event_etl-probe-t1" and folders[1].names == ("a.jsonl",)
    folders = shared_folders(et, _opts(source="pubsub:projects/my-project/subscriptions/sub-1", sink="gs://b/p",
                                       checkpoint=str(tmp_path / "ck")), token="t")
    assert [(f.what, f.path) for f in folders] == [("checkpoint", str(tmp_path / "ck"))]
    assert shared_folders(et, _opts(source="generate:", sink="gs://b/p"), token="t") == []


def test_executor_report_names_missing_modules_and_unseen_folders(tmp_path):
    (tmp_path / "seen").mkdir()
    (tmp_path / "seen" / ".probe").write_text("x")
    folders = (SharedFolder("sink", str(tmp_path / "seen"), fix="-", probe=".probe"),
               SharedFolder("checkpoint", str(tmp_path / "elsewhere"), fix="share it", probe=".probe"),
               SharedFolder("input folder", str(tmp_path / "seen"), fix="-", names=(".probe",)))
    [report] = list(executor_report(("json", "no_such_module_xyz"), folders))
    assert report["missing"] == {"no_such_module_xyz": "no_such_module_xyz"}
    assert report["unseen"] == ["checkpoint"]
    with pytest.raises(EventEtlError, match="cannot import no_such_module_xyz") as err:
        _judge([report], list(folders))
    assert "dependencies" in err.value.fix
    report["missing"] = {}
    with pytest.raises(UsageError, match=f"checkpoint {tmp_path / 'elsewhere'} is not visible") as err:
        _judge([report], list(folders))
    assert err.value.fix == "share it"


def test_the_python_error_is_found_in_a_spark_error():
    text = ("An error occurred while calling o1.collect.\n: org.apache.spark.SparkException: Job aborted\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "ModuleNotFoundError: No module named 'fastavro'\n\tat org.apache.spark...\n")
    assert _python_error(text) == "ModuleNotFoundError: No module named 'fastavro'"
    assert _python_error("just one line") == "just one line"


# -- the local cluster -----------------------------------------------------------------------
def test_the_cluster_daemons_get_a_clean_environment(monkeypatch):
    for k, v in {"EVENT_ETL_FAULT_PAUSE": "x", "STORAGE_EMULATOR_HOST": "h", "PYSPARK_PYTHON": "p",
                 "PYTHONPATH": "/p", "SPARK_CONF_DIR": "/c"}.items():
        monkeypatch.setenv(k, v)
    env = _daemon_env()
    assert not {"EVENT_ETL_FAULT_PAUSE", "STORAGE_EMULATOR_HOST", "PYSPARK_PYTHON", "PYTHONPATH",
                "SPARK_CONF_DIR"} & set(env)
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1" and Path(env["SPARK_HOME"], "bin", "spark-class").is_file()


def test_a_busy_port_is_refused_with_the_fix():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UsageError, match="in use") as err:
            _port(s.getsockname()[1], "master")
    assert "--port" in err.value.fix
    assert _port(0, "master") > 0


def test_a_cluster_that_never_started_is_not_running(tmp_path):
    c = LocalCluster(tmp_path)
    assert c.state == {} and not c.is_running("master") and c.stop() == []


def test_the_workers_are_told_the_port_the_master_bound_when_it_was_not_the_one_chosen(tmp_path):
    """Between choosing a free port and the master binding it, another process may take it: Spark then binds the next
    port, and the workers (started after the master says ALIVE) must connect there, or they never register (seen
    under a loaded test run: 'could not bind on port 46319. Attempting port 46320', then 120 s without workers)."""
    c = LocalCluster(tmp_path)
    c.state = {"port": 46319, "webui_port": 8080, "pids": {}}
    c._adopt_port({"url": "spark://127.0.0.1:46320", "status": "ALIVE"})
    assert c.master_url == "spark://127.0.0.1:46320"
    assert '"port": 46320' in (tmp_path / "cluster.json").read_text()
    c._adopt_port({"status": "ALIVE"})  # an answer without a URL changes nothing
    assert c.master_url == "spark://127.0.0.1:46320"
