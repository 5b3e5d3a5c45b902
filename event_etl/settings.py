"""Every ``EVENT_ETL_*`` environment variable event_etl reads, in one object.

:meth:`Settings.from_env` reads them all at once from an environment (``os.environ`` by
default); the rest of event_etl asks a :class:`Settings` instead of ``os.environ``.

They are read **once, at the edge** of a process's work: the command line reads them when a command starts, the
driver of a submitted job when it starts, an executor task when it starts (each with
:func:`settings_in_force`), and everything below asks :func:`current_settings` for those, never the environment
again.  Code called with no edge around it (a library user, a test) gets the environment's settings of the
moment.  The
command line's options win over the variables (click reads the ones that are option
defaults: ``--sink``, ``--event-types``, ``graphs --prometheus``, ``submit --spark-submit``).
docs/environment.md lists them all; ``tests/test_docs.py`` checks the two agree.

Not read here: the fault-injection variables of the test campaigns (``EVENT_ETL_FAULT_*``),
which :mod:`event_etl.faults` reads where the job passes its fault points (inert in
production), and those of ``bin/*`` only (``EVENT_ETL_PYTHON``, ``EVENT_ETL_VENV``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Settings", "current_settings", "settings_in_force", "ENV_SINK", "ENV_EVENT_TYPES", "ENV_DEBUG",
           "ENV_STORAGE_RETRY", "ENV_LEASE_TTL",
           "ENV_FLEET_BACKOFF", "ENV_PROMETHEUS_URL", "ENV_METRICS_OLD_NAMES", "ENV_METRICS_JOB",
           "ENV_SPARK_LOG_LEVEL", "ENV_SPARK_SUBMIT", "ENV_DRIVER_PIDFILE", "ENV_CACHE_DIR", "PUBSUB_PREFIX",
           "ENV_KAFKA_BOOTSTRAP_SERVERS", "ENV_KAFKA_PROPERTIES", "ENV_KAFKA_ON_DATA_LOSS", "read_kafka_properties",
           "ENV_SCHEMA_REGISTRY_AUTH", "ENV_SCHEMA_REGISTRY_AUTH_FILE", "ENV_SCHEMA_REGISTRY_OUTAGE",
           "LOCAL_ONLY"]

ENV_SINK = "EVENT_ETL_SINK"
ENV_EVENT_TYPES = "EVENT_ETL_EVENT_TYPES"
ENV_DEBUG = "EVENT_ETL_DEBUG"
ENV_STORAGE_RETRY = "EVENT_ETL_STORAGE_RETRY_SECONDS"
ENV_LEASE_TTL = "EVENT_ETL_LEASE_TTL"
ENV_FLEET_BACKOFF = "EVENT_ETL_FLEET_BACKOFF"
ENV_PROMETHEUS_URL = "EVENT_ETL_PROMETHEUS_URL"
ENV_METRICS_OLD_NAMES = "EVENT_ETL_METRICS_OLD_NAMES"
ENV_METRICS_JOB = "EVENT_ETL_METRICS_JOB"
ENV_SPARK_LOG_LEVEL = "EVENT_ETL_SPARK_LOG_LEVEL"
ENV_SPARK_SUBMIT = "EVENT_ETL_SPARK_SUBMIT"
ENV_DRIVER_PIDFILE = "EVENT_ETL_DRIVER_PIDFILE"
ENV_CACHE_DIR = "EVENT_ETL_CACHE_DIR"
ENV_KAFKA_BOOTSTRAP_SERVERS = "EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS"
ENV_KAFKA_PROPERTIES = "EVENT_ETL_KAFKA_PROPERTIES"
ENV_KAFKA_ON_DATA_LOSS = "EVENT_ETL_KAFKA_ON_DATA_LOSS"
ENV_SCHEMA_REGISTRY_AUTH = "EVENT_ETL_SCHEMA_REGISTRY_AUTH"
ENV_SCHEMA_REGISTRY_AUTH_FILE = "EVENT_ETL_SCHEMA_REGISTRY_AUTH_FILE"
ENV_SCHEMA_REGISTRY_OUTAGE = "EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS"
ENV_PUBSUB_OUTAGE = "EVENT_ETL_PUBSUB_OUTAGE_SECONDS"
DEFAULT_OUTAGE_S = 120.0
"""How long an unreachable Pub/Sub service or schema registry is retried before the job stops, by default."""
KAFKA_ON_DATA_LOSS = ("fail", "skip")
PUBSUB_PREFIX = "EVENT_ETL_PUBSUB_"
"""The Pub/Sub fetcher's settings (:class:`event_etl.sources.pubsub_settings.FetchSettings`) are
``EVENT_ETL_PUBSUB_<FIELD>``."""

LOCAL_ONLY = frozenset({ENV_EVENT_TYPES, ENV_DRIVER_PIDFILE, ENV_CACHE_DIR, "EVENT_ETL_VENV", "EVENT_ETL_PYTHON"})
"""Variables of this machine only: ``event-etl submit`` does not pass them on to the cluster."""


def _flag(text: str | None, default: bool) -> bool:
    if text is None:
        return default
    return text.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    """event_etl's environment, read once (see the module docstring and docs/environment.md)."""

    sink: str | None = None
    event_types: str | None = None
    debug: bool = False
    storage_retry_seconds: float = 120.0
    lease_ttl: str | None = None
    """A duration text (``"60s"``); None: the lease's default."""
    fleet_backoff: float | None = None
    """Seconds before a failed type of a fleet is restarted the first time; None: the fleet's default."""
    prometheus_url: str | None = None
    metrics_old_names: bool = True
    metrics_job: str = "event_etl"
    spark_log_level: str = "ERROR"
    spark_submit: str | None = None
    driver_pidfile: str | None = None
    cache_dir: str | None = None
    """Where event_etl keeps what it builds for this machine (the JVM class archive); None: the XDG cache."""
    pubsub: Mapping[str, str] = field(default_factory=dict)
    """The ``EVENT_ETL_PUBSUB_*`` variables as given (``FetchSettings.from_env`` parses them)."""
    kafka_bootstrap_servers: str | None = None
    """The Kafka cluster (``host:port,host:port``) of the ``kafka:TOPIC`` source."""
    kafka_properties: str | None = None
    """The path of a librdkafka properties file (SASL, SSL...); read by :meth:`kafka_config`."""
    kafka_on_data_loss: str = "fail"
    """``fail``: a batch whose start offset retention deleted fails; ``skip``: it goes on from what is left."""
    schema_registry_auth: str | None = None
    """``user:password`` for the schema registry of ``payload = "confluent"`` types (basic auth)."""
    schema_registry_auth_file: str | None = None
    """A file whose first line is that ``user:password`` (read by :mod:`event_etl.payloads.registry`)."""
    schema_registry_outage: float = DEFAULT_OUTAGE_S
    """Seconds an unreachable schema registry is waited for (the batch in flight waits) before the job stops:
    ``EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS``, else the Pub/Sub source's ``EVENT_ETL_PUBSUB_OUTAGE_SECONDS``, else
    120 (the sources' bound)."""

    def kafka_config(self) -> dict[str, str]:
        """The librdkafka configuration every Kafka client of event_etl starts from: the bootstrap servers and the
        properties file's entries (raises :class:`~event_etl.errors.UsageError` for an unreadable or bad file)."""
        conf = read_kafka_properties(self.kafka_properties) if self.kafka_properties else {}
        if self.kafka_bootstrap_servers:
            conf["bootstrap.servers"] = self.kafka_bootstrap_servers
        return conf

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        fleet_backoff = env.get(ENV_FLEET_BACKOFF)
        return cls(
            sink=env.get(ENV_SINK) or None,
            event_types=env.get(ENV_EVENT_TYPES) or None,
            debug=bool(env.get(ENV_DEBUG)),
            storage_retry_seconds=float(env.get(ENV_STORAGE_RETRY, "120")),
            lease_ttl=env.get(ENV_LEASE_TTL) or None,
            fleet_backoff=float(fleet_backoff) if fleet_backoff else None,
            prometheus_url=env.get(ENV_PROMETHEUS_URL) or None,
            metrics_old_names=_flag(env.get(ENV_METRICS_OLD_NAMES), True),
            metrics_job=env.get(ENV_METRICS_JOB) or "event_etl",
            spark_log_level=env.get(ENV_SPARK_LOG_LEVEL, "ERROR"),
            spark_submit=env.get(ENV_SPARK_SUBMIT) or None,
            driver_pidfile=env.get(ENV_DRIVER_PIDFILE) or None,
            cache_dir=env.get(ENV_CACHE_DIR) or None,
            pubsub={k: v for k, v in env.items() if k.startswith(PUBSUB_PREFIX)},
            kafka_bootstrap_servers=(env.get(ENV_KAFKA_BOOTSTRAP_SERVERS) or "").strip() or None,
            kafka_properties=env.get(ENV_KAFKA_PROPERTIES) or None,
            kafka_on_data_loss=_on_data_loss(env.get(ENV_KAFKA_ON_DATA_LOSS)),
            schema_registry_auth=env.get(ENV_SCHEMA_REGISTRY_AUTH) or None,
            schema_registry_auth_file=env.get(ENV_SCHEMA_REGISTRY_AUTH_FILE) or None,
            schema_registry_outage=_seconds(env, ENV_SCHEMA_REGISTRY_OUTAGE, ENV_PUBSUB_OUTAGE),
        )


def _seconds(env: Mapping[str, str], *names: str) -> float:
    """The first of ``names`` set in ``env``, as a positive number of seconds; :data:`DEFAULT_OUTAGE_S` if none."""
    for name in names:
        text = (env.get(name) or "").strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            from event_etl.errors import UsageError

            raise UsageError(f"{name}={text!r} is not a positive number of seconds", fix=f"set {name}=120, say")
        return value
    return DEFAULT_OUTAGE_S


def _on_data_loss(text: str | None) -> str:
    value = (text or "fail").strip().lower()
    if value not in KAFKA_ON_DATA_LOSS:
        from event_etl.errors import UsageError

        raise UsageError(f"{ENV_KAFKA_ON_DATA_LOSS}={text!r} is neither fail nor skip",
                         fix=f"set {ENV_KAFKA_ON_DATA_LOSS}=fail (the default: stop when retention deleted unread "
                         "records) or skip (go on from the oldest record left, and count what was lost)")
    return value


def read_kafka_properties(path: str) -> dict[str, str]:
    """A librdkafka properties file: ``key=value`` lines, ``#`` comments and blank lines ignored (as the Java
    clients' ``client.properties``).  Raises :class:`~event_etl.errors.UsageError` naming the bad line."""
    from event_etl.errors import UsageError

    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as err:
        raise UsageError(f"{ENV_KAFKA_PROPERTIES}: cannot read {path}: {err}",
                         fix=f"point {ENV_KAFKA_PROPERTIES} at a readable file of key=value lines") from err
    conf: dict[str, str] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{ENV_KAFKA_PROPERTIES}: {path} line {n} is not key=value",  # not shown: a secret
                             fix="write each setting as key=value (e.g. security.protocol=SASL_SSL), "
                             "comments start with #")
        conf[key.strip()] = value.strip()
    return conf


_in_force: Settings | None = None


def current_settings() -> Settings:
    """The settings the edge of this process's work read (:func:`settings_in_force`), else the environment's now."""
    return _in_force if _in_force is not None else Settings.from_env()


@contextmanager
def settings_in_force(settings: Settings | None = None) -> Iterator[Settings]:
    """Make ``settings`` (default: the environment's, read now) what :func:`current_settings` answers, in every
    thread, until the block ends (then what was in force before is again)."""
    global _in_force
    before, _in_force = _in_force, settings if settings is not None else Settings.from_env()
    try:
        yield _in_force
    finally:
        _in_force = before
