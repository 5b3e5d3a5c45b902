"""Starting Spark for event_etl: the Python of the workers, quiet logs, loopback only."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Mapping

from event_etl.errors import EventEtlError

__all__ = ["check_java", "get_session", "DEFAULT_MASTER"]

DEFAULT_MASTER = "local[*]"

_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.stopGracefullyOnShutdown": "false",
    # Our tasks write their own files and return small reports; keep driver memory modest.
    "spark.driver.memory": "1g",
}


def check_java() -> str:
    """Path of the ``java`` Spark will use, or an error that says how to install Java 17."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise EventEtlError(
            "Java was not found; Spark needs Java 17 (or 21)"
            + (f" (JAVA_HOME={home} has no bin/java)" if home else ""),
            fix="install it, e.g. 'sudo apt-get install openjdk-17-jre-headless' (Debian/Ubuntu), "
            "'brew install openjdk@17' (macOS), then open a new shell or set JAVA_HOME",
        )
    return java


def get_session(master: str | None = None, conf: Mapping[str, str] | None = None, app_name: str = "event_etl"):
    """The process's SparkSession (created on first call), with event_etl's source registered."""
    check_java()
    master = master or DEFAULT_MASTER
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Local workers must run this very interpreter, or they fail to connect back.  (On a
        # cluster this path may not exist on the executors: `event-etl submit` sets their Python.)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from event_etl.sources.spark import EtlSource

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = dict(_DEFAULTS)
    # Tasks allocate Arrow buffers chunk by chunk; the system allocator gives them back between
    # tasks (mimalloc, pyarrow's default, keeps them: ~100 MiB more per Python worker).
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # local workers inherit the driver's environment
    settings["spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"] = os.environ["ARROW_DEFAULT_MEMORY_POOL"]
    log4j = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
    if os.path.isfile(log4j):  # not when event_etl is imported from a zip (`submit`)
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
        if master.startswith("local"):
            settings["spark.executor.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    if master.startswith("local"):
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("EVENT_ETL_SPARK_LOG_LEVEL", "ERROR"))
    spark.dataSource.register(EtlSource)
    return spark
