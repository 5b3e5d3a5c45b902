"""Event types as data: ``event_types/<name>/schema.avsc`` and ``event_types/<name>/etl.toml``.

Adding an event type needs no code: a folder with an Avro record schema and a settings
file.  Everything is checked when the type is loaded, and a broken file fails fast with
a message naming the file, the field and the fix.

Settings (``etl.toml``), all optional except ``time_field``:

======================  ===============  =====================================================
key                     default          meaning
======================  ===============  =====================================================
``time_field``          (required)       schema field holding the event time
``time_format``         ``epoch_millis`` ``epoch_millis``, ``epoch_seconds`` or ``iso8601``;
                                         a field with an Avro ``timestamp-millis`` /
                                         ``timestamp-micros`` logical type is read as such
``id_field``            none             string field that identifies an event (for dedupe)
``out_of_orderness``    ``"2m"``         watermark = max event time seen − this
``allowed_lateness``    ``"24h"``        later than this past its hour's end: dead-letter
``idle_timeout``        ``"5m"``         quiet this long: the watermark follows the clock
``max_future_skew``     ``"10m"``        event time further ahead of arrival: dead-letter
``max_backfill``        ``"30d"``        while the job has no watermark yet (its first batches),
                                         an event more than this before its arrival is
                                         ``too_late``: one stray old event cannot decide the
                                         job's first hour; ``"0"``: no bound
``max_events_per_file`` ``500000``       a larger group is split into several files
``max_payload_bytes``   ``1048576``      larger payloads go to dead-letter as ``oversized``
``format``              ``"avro"``       file format of data files: ``avro`` (container files) or
                                         ``parquet`` (the schema's Arrow columns, see
                                         :mod:`event_etl.storage.parquetio`)
``codec``               ``"snappy"``     compression of data files: ``null``, ``deflate`` or ``snappy``
                                         (Parquet: none, gzip or snappy)
``payload``             ``"json"``       what producers write (:mod:`event_etl.payloads`): ``json`` (a JSON
                                         object, or a self-describing Avro frame: single-object or
                                         Gilt's), ``protobuf`` (a message of ``schema.desc``),
                                         ``confluent`` (Confluent's wire format, schemas from
                                         ``schema_registry``) or ``avro`` (a bare Avro datum)
``protobuf_message``    none             ``payload = "protobuf"``: the message's full name in
                                         ``schema.desc`` (``pkg.Name``)
``protobuf_timestamps`` ``"micros"``     the Avro unit of a ``google.protobuf.Timestamp``
                                         (``micros`` or ``millis``)
``schema_registry``     none             ``payload = "confluent"``: the registry's URL (credentials:
                                         ``EVENT_ETL_SCHEMA_REGISTRY_AUTH[_FILE]``, never here)
``schema_attribute``    none             a Pub/Sub attribute or Kafka header naming a message's writer
                                         schema (``v2``, a fingerprint, a registry id): the payload is
                                         then a bare Avro datum of that schema
``source``              ``"generate:"``  source used when ``run`` gets no ``--source``
``route_attribute``     none             a bus (a source several types share): the Pub/Sub
                                         attribute (Kafka header) whose value names the type
``route_field``         none             a bus: the top-level JSON field whose value names it;
                                         a framed Avro or Protobuf payload: its record's name
``route_value``         the type's name  the value, or list of values, this type claims
``description``         ``""``           one line shown by ``event-etl types``
``[generator]``                          value pools for synthetic events (see below)
``[[commit_policy]]``                    what to do once an hour is complete (see below)
======================  ===============  =====================================================

``[generator.values]`` maps a field name to a list of values the generator picks from;
fields without a pool get values derived from their Avro type and name.

``[[commit_policy]]`` (an array of tables, run in order after each hour's ``_COMPLETE``, see
:mod:`event_etl.job.policies`): ``kind`` (``pubsub``, ``openlineage`` or ``iceberg``), an optional ``name``
(default: the kind; unique within the type: it names the policy's record in the checkpoint and
its metric series) and the kind's own keys, :data:`POLICY_KINDS`.

Schema versions (optional): ``event_types/<name>/schemas/v1.avsc``, ``v2.avsc``... keep every
schema the type has had, each identified by its CRC-64-AVRO fingerprint.  ``schema.avsc`` stays
the current schema (the one data files are written in); Avro single-object payloads of any
registered version are accepted and resolved to it.  Without a ``schemas/`` folder the type
has one version, ``schema.avsc``, as before.  :func:`check_schema_versions` (called before a
job starts) refuses a current schema that cannot read every registered version, naming the
fields and why (:mod:`event_etl.rules.compat`); ``event-etl schema check`` and ``event-etl
schema register`` (:mod:`event_etl.cli.schema`) are the commands.  See docs/schemas.md.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from event_etl import settings
from event_etl.errors import ConfigError
from event_etl.rules.buckets import validate_event_type_name
from event_etl.timeutil import DAY_MS, parse_duration

__all__ = [
    "EventType",
    "DEFAULT_ALLOWED_LATENESS_MS",
    "load_event_type",
    "load_event_types",
    "resolve_event_types_dir",
    "TIME_FORMATS",
    "ENV_EVENT_TYPES",
    "SCHEMAS_DIR",
    "schema_fingerprint",
    "load_schema_file",
    "check_schema_versions",
    "version_name",
    "POLICY_KINDS",
]

SCHEMAS_DIR = "schemas"
"""The folder of an event type that keeps its schema versions: ``v1.avsc``, ``v2.avsc``..."""
_VERSION_FILE = re.compile(r"^v([1-9][0-9]{0,5})\.avsc$")

ENV_EVENT_TYPES = settings.ENV_EVENT_TYPES
TIME_FORMATS = ("epoch_millis", "epoch_seconds", "iso8601")
CODECS = ("null", "deflate", "snappy")
PAYLOADS = ("json", "protobuf", "confluent", "avro")
"""What a type's producers write (``payload``; :mod:`event_etl.payloads`)."""
DESCRIPTOR_FILE = "schema.desc"
"""A Protobuf type's descriptor set, as ``protoc --include_imports --descriptor_set_out`` writes it."""
FORMATS = ("avro", "parquet")
"""The file formats of data files (``format``; :data:`event_etl.rules.buckets.DATA_FORMATS`)."""

_DURATION_KEYS = {
    "out_of_orderness": "2m",
    "allowed_lateness": "24h",
    "idle_timeout": "5m",
    "max_future_skew": "10m",
    "dedupe_window": "10m",
    "max_backfill": "30d",
}
DEFAULT_ALLOWED_LATENESS_MS = parse_duration(_DURATION_KEYS["allowed_lateness"])
"""A type's ``allowed_lateness`` when its etl.toml does not say: what consumers assume with only its name."""
DEFAULT_MAX_BACKFILL = 30 * DAY_MS
"""``max_backfill``'s default, ms: a job's first hour lies at most 30 days before its first events arrive."""
_INT_KEYS = {
    "max_events_per_file": (500_000, 1, 10_000_000),
    "max_payload_bytes": (1_048_576, 16, 64 * 1_048_576),
}
_STR_KEYS = {
    "time_field": None,
    "time_format": "epoch_millis",
    "id_field": None,
    "codec": "snappy",
    "format": "avro",
    "source": "generate:",
    "description": "",
    "time_attribute": None,
    "payload": "json",
    "protobuf_message": None,
    "protobuf_timestamps": "micros",
    "schema_registry": None,
    "schema_attribute": None,
    "route_attribute": None,
    "route_field": None,
}
_BOOL_KEYS = {"publish_time_fallback": False}
_TABLE_KEYS = {"generator", "pubsub"}
KNOWN_KEYS = (set(_DURATION_KEYS) | set(_INT_KEYS) | set(_STR_KEYS) | set(_BOOL_KEYS) | _TABLE_KEYS
              | {"commit_policy", "route_value"})

_TOPIC_RE = re.compile(r"^projects/[^/]+/topics/[a-zA-Z][\w.~+%-]{2,254}$")
POLICY_KINDS: dict[str, dict[str, tuple[Any, str]]] = {
    "pubsub": {
        "topic": (None, "the topic a message per complete hour goes to: projects/P/topics/T (required)"),
        "timeout": ("30s", "how long one publish may take before it counts as a failure (retried)"),
    },
    "openlineage": {
        "namespace": ("event_etl", "the OpenLineage job namespace of the run events"),
        "job_name": ("", "the OpenLineage job name (default: event_etl.<type>)"),
    },
    "iceberg": {  # event_etl/job/policy_iceberg.py (a Parquet type; pip install 'event_etl[iceberg]')
        "catalog": ("event_etl", "the pyiceberg catalog's name (its other properties may come from .pyiceberg.yaml "
                                 "or PYICEBERG_CATALOG__<NAME>__* variables: credentials go there)"),
        "catalog_uri": ("", "the catalog's uri: sqlite:///path/catalog.db (SQL catalog), http(s)://... (REST)"),
        "catalog_type": ("", "sql, rest, glue, hive...: when catalog_uri does not say"),
        "warehouse": ("", "where the catalog writes the table's metadata, e.g. file:///data/warehouse"),
        "table": ("", "<namespace>.<table> (default: event_etl.<type>)"),
        "partitioning": ("hour", "hour: identity partitions on etl_hour (the hour a file landed in) and etl_late"),
    },
}
"""Each commit policy kind's keys in ``[[commit_policy]]``: ``key -> (default (None: required), meaning)``."""

_TIMESTAMP_LOGICAL = {"timestamp-millis": 1, "timestamp-micros": 1000, "local-timestamp-millis": None,
                      "local-timestamp-micros": None}


@dataclass(frozen=True)
class EventType:
    """One event type: its schema and settings, checked.  Picklable, so executors get it whole."""

    name: str
    directory: str
    schema: dict[str, Any]
    time_field: str
    time_format: str
    time_logical_divisor: int | None
    id_field: str | None
    out_of_orderness: int
    allowed_lateness: int
    idle_timeout: int
    max_future_skew: int
    dedupe_window: int
    max_events_per_file: int
    max_payload_bytes: int
    codec: str
    source: str
    description: str
    time_attribute: str | None = None
    publish_time_fallback: bool = False
    max_backfill: int = DEFAULT_MAX_BACKFILL
    """While the job has no watermark, an event more than this (ms) before its arrival is ``too_late``; 0: no
    bound.  Frozen in batch intents (an intent without it, from an earlier release, judges with no bound)."""
    generator: dict[str, Any] = field(default_factory=dict)
    pubsub: dict[str, Any] = field(default_factory=dict)
    commit_policies: tuple[dict[str, Any], ...] = ()
    """The ``[[commit_policy]]`` tables, checked, in order: ``kind``, ``name`` and the kind's keys (defaults filled
    in, durations in ms).  Not frozen in batch intents: a policy changes nothing a batch writes."""
    format: str = "avro"
    """``avro`` or ``parquet``: the format of the data files (the Avro schema is the contract of both)."""
    payload: str = "json"
    """What producers write (:data:`PAYLOADS`, :mod:`event_etl.payloads`).  Frozen in batch intents."""
    protobuf_message: str | None = None
    """``payload = "protobuf"``: the message's full name in the descriptor set."""
    protobuf_descriptor: str = ""
    """``payload = "protobuf"``: the descriptor set's bytes (``schema.desc``), base64: frozen in batch intents and
    shipped to executors, which build the message from it."""
    schema_registry: str | None = None
    """``payload = "confluent"``: the schema registry's URL."""
    schema_attribute: str | None = None
    """The attribute (Kafka header) that names a message's writer schema, if any."""
    route_attribute: str | None = None
    """A bus's rule (:mod:`event_etl.rules.routing`): the attribute (Kafka header) whose value names the type."""
    route_field: str | None = None
    """A bus's rule: the top-level field of a JSON payload whose value names the type."""
    route_value: tuple[str, ...] = ()
    """The values this type claims on its bus (empty: its name)."""
    schema_versions: tuple[tuple[str, dict[str, Any]], ...] = ()
    """The registered versions, ``(name, schema)`` in version order (``schemas/v1.avsc``...): the
    writer schemas whose single-object payloads are accepted besides the current ``schema``.
    Empty: the type keeps no history, only ``schema`` is accepted.  Frozen in batch intents."""

    def __post_init__(self) -> None:
        # from a batch intent (JSON) the versions come back as lists: keep one form
        versions = tuple((str(n), dict(s)) for n, s in self.schema_versions)
        object.__setattr__(self, "schema_versions", versions)
        object.__setattr__(self, "route_value", tuple(str(v) for v in self.route_value))

    @property
    def route(self) -> Any:
        """The type's :class:`~event_etl.rules.routing.Route` on its bus, or None (it reads its source alone)."""
        from event_etl.rules.routing import route_of

        return route_of(self.name, attribute=self.route_attribute, field=self.route_field,
                        values=self.route_value, settings_file=self.settings_file, source=self.source,
                        payload=self.payload)

    @property
    def schema_file(self) -> str:
        return os.path.join(self.directory, "schema.avsc")

    @property
    def descriptor_file(self) -> str:
        return os.path.join(self.directory, DESCRIPTOR_FILE)

    @property
    def message_attributes_only(self) -> bool:
        """Whether each message must be decoded apart, for what its attributes say (the event time or the writer
        schema): then no chunk of messages takes the fast path."""
        return self.time_attribute is not None or self.schema_attribute is not None

    @property
    def schemas_dir(self) -> str:
        return os.path.join(self.directory, SCHEMAS_DIR)

    @property
    def settings_file(self) -> str:
        return os.path.join(self.directory, "etl.toml")

    def parsed_schema(self) -> dict[str, Any]:
        from fastavro import parse_schema

        parsed = parse_schema(self.schema)
        assert isinstance(parsed, dict)  # a record's schema parses to a dict
        return parsed

    @functools.cached_property
    def fingerprint(self) -> str:
        """CRC-64-AVRO fingerprint of the schema, as the 8 little-endian bytes in hex (as in single-object encoding)."""
        return schema_fingerprint(self.schema)

    @functools.cached_property
    def decoder_key(self) -> str:
        """A digest of everything a :class:`~event_etl.task.payload.Decoder` (and its fast plan) is built from.

        Executors keep one decoder per key: a batch replayed with frozen settings and a new
        batch with today's never share one."""
        doc = [self.name, self.schema, [list(v) for v in self.schema_versions], self.time_field, self.time_format,
               self.time_logical_divisor, self.id_field, self.dedupe_window, self.max_payload_bytes,
               self.time_attribute, self.publish_time_fallback]
        if self.payload != "json" or self.schema_attribute:  # a JSON type's key stays what it was
            doc += [self.payload, self.protobuf_message, self.protobuf_descriptor, self.schema_registry,
                    self.schema_attribute]
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()

    def version_of(self, fingerprint_hex: str) -> str | None:
        """The name of the registered version with this fingerprint (``v2``), or ``None``."""
        for name, s in self.schema_versions:
            if schema_fingerprint(s) == fingerprint_hex:
                return name
        return None

    def check_versions(self, *, warn: Callable[[str], None] | None = None) -> None:
        """Before a job starts: refuse a current schema that cannot read every registered version.

        See :func:`check_schema_versions`."""
        check_schema_versions(self, warn=warn)

    def settings_summary(self) -> dict[str, Any]:
        from event_etl.timeutil import format_duration

        return {
            "time_field": self.time_field,
            "time_format": self.time_format,
            "id_field": self.id_field,
            "out_of_orderness": format_duration(self.out_of_orderness),
            "allowed_lateness": format_duration(self.allowed_lateness),
            "idle_timeout": format_duration(self.idle_timeout),
            "max_future_skew": format_duration(self.max_future_skew),
            "max_backfill": format_duration(self.max_backfill) if self.max_backfill else "0",
            "max_events_per_file": self.max_events_per_file,
            "codec": self.codec,
            "format": self.format,
            "payload": self.payload,
        }


def schema_fingerprint(schema: Any) -> str:
    """The CRC-64-AVRO fingerprint of a schema's Parsing Canonical Form: 16 hex digits, the 8
    little-endian bytes that follow ``C3 01`` in single-object encoding."""
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    return fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")


def version_name(et: EventType, fingerprint_hex: str) -> str:
    """How messages name a schema: ``v2 (crc64avro:…)``, ``schema.avsc (crc64avro:…)`` or the fingerprint."""
    name = et.version_of(fingerprint_hex)
    if name is None and fingerprint_hex == et.fingerprint:
        name = "schema.avsc"
    return f"{name} (crc64avro:{fingerprint_hex})" if name else f"crc64avro:{fingerprint_hex}"


def check_schema_versions(et: EventType, *, warn: Callable[[str], None] | None = None) -> None:
    """Refuse (:class:`ConfigError`, exit code 2) a current schema that cannot read a registered version.

    Every registered version's single-object payloads are accepted and resolved to the current
    schema, so the current schema must read each of them by Avro's resolution rules.  The
    error names each version, field and reason, and the fix.  A current schema that is not
    registered yet is accepted with a warning (``warn``, default: a line on stderr).
    """
    from event_etl.rules.compat import reader_problems

    lines = []
    registered = set()
    for name, s in et.schema_versions:
        fp = schema_fingerprint(s)
        registered.add(fp)
        if fp == et.fingerprint:
            continue
        for p in reader_problems(et.schema, s, reader_is_new=True):
            lines.append(f"  {name} (crc64avro:{fp}): {p}")
    if lines:
        raise ConfigError(
            "the current schema cannot read the registered versions whose payloads it must accept:\n"
            + "\n".join(lines),
            file=et.schema_file,
            fix=(f"make the change compatible (a new field needs a default; a type may only widen: int to long, "
                 f"float or double, long to float or double, float to double, string to/from bytes; an enum "
                 f"keeps its symbols or gets a default) and check it with `event-etl schema check {et.name}`. "
                 f"A breaking change is a new event type (or a new major version in the namespace, e.g. "
                 f"event_types/{et.name}_v2 with namespace ...v2): run both during the switch (docs/schemas.md)"),
        )
    if et.schema_versions and et.fingerprint not in registered:
        (warn or _stderr)(
            f"warning: {et.schema_file} (crc64avro:{et.fingerprint}) is not registered in {et.schemas_dir}: "
            f"register it (`event-etl schema register {et.name}`) so that the next change is checked against it "
            f"and its payloads stay accepted after that change")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def with_schema(et: EventType, schema: dict[str, Any], schema_path: str | os.PathLike[str]) -> EventType:
    """``et`` with another current schema, its settings checked against it (:class:`ConfigError` if they do not fit:
    the time field or the id field missing or of another type)."""
    settings_path = Path(et.settings_file)
    built = _build(et.name, Path(et.directory), schema, Path(schema_path), _load_settings(settings_path), settings_path)
    from dataclasses import replace

    return _with_versions(replace(built, protobuf_descriptor=et.protobuf_descriptor), et.schema_versions)


def register_current_schema(et: EventType) -> tuple[str, str]:
    """Record ``schema.avsc`` as the type's next version in ``schemas/``; ``(version name, what was done)``.

    Refused (:class:`ConfigError`) when it cannot read every registered version.  A schema whose
    fingerprint is registered already is not added again; when its file differs in what the
    fingerprint leaves out (docs, defaults, aliases, logical types), that file is brought up to date.
    The new file is created, never overwritten: two registrations at once cannot both take a number.
    """
    check_schema_versions(et, warn=lambda line: None)
    folder = Path(et.schemas_dir)
    schema_file = Path(et.schema_file)
    # a Protobuf type without schema.avsc: the schema derived from its message is what its files are written in
    text = schema_file.read_text(encoding="utf-8") if schema_file.is_file() else json.dumps(et.schema, indent=2) + "\n"
    name = et.version_of(et.fingerprint)
    if name is not None:
        path = folder / f"{name}.avsc"
        if json.loads(path.read_text(encoding="utf-8")) == et.schema:
            return name, f"already registered as {path}"
        tmp = folder / f".{name}.avsc.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return name, (f"updated {path}: it had the same fingerprint but other docs, defaults, aliases or logical "
                      f"types than schema.avsc")
    folder.mkdir(exist_ok=True)
    numbers = [int(n[1:]) for n, _ in et.schema_versions]
    name = f"v{max(numbers, default=0) + 1}"
    path = folder / f"{name}.avsc"
    try:
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(text)
    except FileExistsError as err:
        raise ConfigError("exists already: another registration took this number", file=str(path),
                          fix=f"run `event-etl schema check {et.name}` and register again") from err
    return name, f"registered as {path}"


def resolve_event_types_dir(option: str | os.PathLike[str] | None = None) -> Path:
    """Where event types live: ``--event-types``, else ``$EVENT_ETL_EVENT_TYPES``, else the project's
    ``event_types/``."""
    if option:
        return Path(option)
    env = settings.current_settings().event_types
    if env:
        return Path(env)
    return _project_event_types()


def _project_event_types() -> Path:
    """``event_types/`` next to the package; when the package is imported from a job bundle
    (``event-etl submit``, :mod:`event_etl.cluster.bundle`), the bundle's copy, extracted to a local folder."""
    from event_etl.bundled import bundled_event_types, package_archive

    archive = package_archive()
    bundled = bundled_event_types(archive) if archive is not None else None
    return bundled or Path(__file__).resolve().parent.parent / "event_types"


def load_event_types(root: str | os.PathLike[str]) -> dict[str, EventType]:
    """Every event type under ``root``, by name.  The first broken one raises :class:`ConfigError`."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(
            "no such folder of event types",
            file=str(root),
            fix=f"pass --event-types DIR (or set {ENV_EVENT_TYPES}) to a folder holding <name>/schema.avsc and "
                f"<name>/etl.toml",
        )
    types = {}
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith((".", "_")):
            types[child.name] = load_event_type(child)
    return types


def load_event_type(directory: str | os.PathLike[str], name: str | None = None) -> EventType:
    """Load and check one event type folder."""
    directory = Path(directory)
    name = name or directory.name
    try:
        validate_event_type_name(name)
    except ValueError as err:
        raise ConfigError(str(err), file=str(directory), fix="rename the folder") from err
    schema_path = directory / "schema.avsc"
    settings_path = directory / "etl.toml"
    if not settings_path.is_file():
        if not schema_path.is_file():  # an empty folder: its schema is what is missing first
            raise ConfigError("file missing", file=str(schema_path),
                              fix="create schema.avsc with an Avro record schema (see event_types/page_view for an "
                                  "example)")
        raise ConfigError("file missing", file=str(settings_path),
                          fix="create etl.toml with the type's settings (see event_types/page_view for an example)")
    settings = _load_settings(settings_path)
    proto = _protobuf_of(directory, settings, str(settings_path))
    if schema_path.is_file():
        schema = _load_schema(schema_path)
        if proto is not None:
            _check_against_message(proto, schema, schema_path)
    elif proto is not None:  # no schema.avsc: the one derived from the message is the type's schema
        schema = proto.avro_schema(timestamp=str(settings.get("protobuf_timestamps", "micros")))
    else:
        raise ConfigError("file missing", file=str(schema_path),
                          fix="create schema.avsc with an Avro record schema (see event_types/page_view for an "
                              "example), or give a Protobuf type's schema.desc (docs/event-types.md)")
    et = _build(name, directory, schema, schema_path, settings, settings_path)
    if proto is not None:
        import base64
        from dataclasses import replace

        et = replace(et, protobuf_descriptor=base64.b64encode(proto.descriptor_set).decode("ascii"))
    versions = _load_versions(directory / SCHEMAS_DIR)
    return et if not versions else _with_versions(et, versions)


def _protobuf_of(directory: Path, settings: dict[str, Any], sp: str) -> Any:
    """A Protobuf type's message (:class:`event_etl.payloads.protobuf.ProtoSchema`) from ``schema.desc`` and
    ``protobuf_message``; None for a type of another payload.  :class:`ConfigError` names the file and the fix."""
    if _payload_name(settings.get("payload", "json"), sp) != "protobuf":
        return None
    message = settings.get("protobuf_message")
    if not isinstance(message, str) or not message:
        raise ConfigError("missing" if message is None else f"must be a string, got {message!r}", file=sp,
                          field="protobuf_message",
                          fix='name the message of schema.desc that producers send: protobuf_message = "pkg.Name"')
    unit = settings.get("protobuf_timestamps", "micros")
    if unit not in ("micros", "millis"):
        raise ConfigError(f"unknown unit {unit!r}", file=sp, field="protobuf_timestamps",
                          fix='write protobuf_timestamps = "micros" (the default) or "millis"')
    desc = directory / DESCRIPTOR_FILE
    if not desc.is_file():
        raise ConfigError("file missing", file=str(desc),
                          fix="write the descriptor set of the type's .proto files: protoc --include_imports "
                              f"--descriptor_set_out={desc} your.proto")
    from event_etl.payloads.protobuf import ProtoSchema

    return ProtoSchema.load(desc, message)


def _check_against_message(proto: Any, schema: dict[str, Any], schema_path: Path) -> None:
    """A Protobuf type's schema.avsc must hold every message, field by field."""
    problems = proto.check_against(schema)
    if problems:
        raise ConfigError(
            f"does not fit the message {proto.message} of schema.desc:\n" + "\n".join(f"  {p}" for p in problems),
            file=str(schema_path),
            fix="change schema.avsc to match the message (`event-etl check TYPE` prints the schema derived from it), "
                "or delete schema.avsc to use the derived one")


def event_type_from_settings(name: str, schema: dict[str, Any], settings: Mapping[str, Any], *,
                             origin: str = "(command line)") -> EventType:
    """An event type from a schema and ``etl.toml``-style settings, without a folder.

    For commands that read a sink without the event types folder (``event-etl audit
    --time-field ...``): the schema comes from the data files, the settings from options.
    Checked exactly as a folder's type is; messages name ``origin``.
    """
    try:
        validate_event_type_name(name)
    except ValueError as err:
        raise ConfigError(str(err), file=origin, fix="pass the event type's name, e.g. page_view") from err
    return _build(name, Path(origin), schema, Path(origin), dict(settings), Path(origin))


def _with_versions(et: EventType, versions: tuple[tuple[str, dict[str, Any]], ...]) -> EventType:
    from dataclasses import replace

    return replace(et, schema_versions=versions)


def load_schema_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An Avro record schema from a file, checked as ``schema.avsc`` is (:class:`ConfigError` if broken)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("no such file", file=str(path), fix="give the path of an .avsc file (an Avro record schema)")
    return _load_schema(path)


def _load_versions(folder: Path) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The registered versions in ``schemas/``: ``v<N>.avsc`` files, by N; none if the folder is absent."""
    if not folder.exists():
        return ()
    if not folder.is_dir():
        raise ConfigError("not a folder", file=str(folder),
                          fix="schemas/ holds the type's schema versions as v1.avsc, v2.avsc, ...; rename this file")
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    by_fp: dict[str, str] = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith((".", "_")) or not p.name.endswith(".avsc"):
            continue  # notes, editor files: only .avsc files are versions
        m = _VERSION_FILE.match(p.name)
        if m is None:
            raise ConfigError(
                "a schema version's file must be named v<N>.avsc", file=str(p),
                fix="rename it v1.avsc, v2.avsc, ... in the order the versions were made (no leading zeros)")
        schema = _load_schema(p)
        fp = schema_fingerprint(schema)
        name = f"v{m.group(1)}"
        if fp in by_fp:
            raise ConfigError(
                f"has the same fingerprint (crc64avro:{fp}) as {by_fp[fp]}.avsc: both are one version (the "
                f"fingerprint leaves out docs, defaults, aliases and logical types)", file=str(p),
                fix="keep one of the two files (the one that matches schema.avsc if either does)")
        by_fp[fp] = name
        found[int(m.group(1))] = (name, schema)
    return tuple(found[n] for n in sorted(found))


def _load_schema(path: Path) -> dict[str, Any]:
    from fastavro import parse_schema
    from fastavro.schema import SchemaParseException, UnknownType

    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"not valid JSON at line {err.lineno} column {err.colno}: {err.msg}",
            file=str(path),
            fix="an .avsc file is a JSON document; check quotes and commas",
        ) from err
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError(
            "the schema must be an Avro record",
            file=str(path),
            field="type",
            fix='write {"type": "record", "name": "...", "fields": [...]}',
        )
    try:
        parse_schema(schema)
    except (SchemaParseException, UnknownType, ValueError, TypeError, KeyError) as err:
        raise ConfigError(
            f"not a valid Avro schema: {err}",
            file=str(path),
            fix="check the field types against the Avro specification (https://avro.apache.org/docs/)",
        ) from err
    return schema


def _load_settings(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            settings = tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"not valid TOML: {err}", file=str(path), fix="see https://toml.io for the syntax") from err
    for key in settings:
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(
                "unknown setting",
                file=str(path),
                field=key,
                fix=f"{hint}known settings: {', '.join(sorted(KNOWN_KEYS))}",
            )
    return settings


def _field_types(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {f["name"]: f["type"] for f in schema.get("fields", [])}


def _non_null(t: Any) -> Any:
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        return rest[0] if len(rest) == 1 else t
    return t


def _base_and_logical(t: Any) -> tuple[Any, str | None]:
    t = _non_null(t)
    if isinstance(t, dict):
        return t.get("type"), t.get("logicalType")
    return t, None


def _build(
    name: str, directory: Path, schema: dict[str, Any], schema_path: Path, s: dict[str, Any], settings_path: Path
) -> EventType:
    """An event type from its schema and settings, each setting checked in its own step below."""
    sp = str(settings_path)
    get_str = _string_getter(s, sp)
    durations = _durations(s, sp)
    ints = _ints(s, sp)
    _check_bools_and_tables(s, sp)
    fields = _field_types(schema)
    time_field, time_format, divisor = _time_settings(fields, get_str, sp, schema_path)
    id_field = _id_field(fields, get_str, sp, schema_path)
    codec, fmt = _codec_and_format(schema, get_str, sp)
    payload = _payload_settings(get_str, sp)
    return EventType(
        name=name,
        directory=str(directory),
        schema=schema,
        time_field=time_field,
        time_format=time_format,
        time_logical_divisor=divisor,
        id_field=id_field,
        out_of_orderness=durations["out_of_orderness"],
        allowed_lateness=durations["allowed_lateness"],
        idle_timeout=durations["idle_timeout"],
        max_future_skew=durations["max_future_skew"],
        dedupe_window=durations["dedupe_window"],
        max_backfill=durations["max_backfill"],
        max_events_per_file=ints["max_events_per_file"],
        max_payload_bytes=ints["max_payload_bytes"],
        codec=codec,
        format=fmt,
        source=get_str("source") or "generate:",
        description=get_str("description") or "",
        time_attribute=get_str("time_attribute"),
        publish_time_fallback=bool(s.get("publish_time_fallback", False)),
        generator=dict(s.get("generator", {})),
        pubsub=dict(s.get("pubsub", {})),
        commit_policies=_commit_policies(s.get("commit_policy", []), sp),
        **_route_settings(name, s, get_str, sp),
        **payload,
    )


def _route_settings(name: str, s: dict[str, Any], get_str: Callable[[str], str | None], sp: str) -> dict[str, Any]:
    """``route_attribute``, ``route_field`` and ``route_value`` (a string or a list of strings), checked."""
    from event_etl.rules.routing import route_of

    raw = s.get("route_value")
    values: tuple[str, ...] = ()
    if raw is not None:
        if isinstance(raw, str):
            values = (raw,)
        elif isinstance(raw, list) and all(isinstance(v, str) for v in raw):
            values = tuple(raw)
        else:
            raise ConfigError("must be a string or a list of strings", file=sp, field="route_value",
                              fix=f'e.g. route_value = "{name}" or route_value = ["a", "b"]')
    attribute, field_ = get_str("route_attribute"), get_str("route_field")
    route_of(name, attribute=attribute, field=field_, values=values, settings_file=sp,  # refuses what cannot route
             source=get_str("source"), payload=get_str("payload") or "json")
    return {"route_attribute": attribute, "route_field": field_, "route_value": values}


def _payload_settings(get_str: Callable[[str], str | None], sp: str) -> dict[str, Any]:
    """``payload`` and the keys that go with it, checked: each dialect's keys present, none of another's."""
    payload = _payload_name(get_str("payload") or "json", sp)
    registry, attribute = get_str("schema_registry"), get_str("schema_attribute")
    if payload == "confluent":
        _check_registry_url(registry, sp)
    elif registry is not None and payload != "avro":
        raise ConfigError(f"a {payload} payload names no registry schema", file=sp, field="schema_registry",
                          fix='remove it, or write payload = "confluent" (or "avro" with schema_attribute)')
    if attribute is not None and payload in ("protobuf", "confluent"):
        raise ConfigError(f"a {payload} payload's schema is not named by an attribute", file=sp,
                          field="schema_attribute",
                          fix="remove it: " + ("the frame carries the registry id" if payload == "confluent"
                                               else "protobuf_message names the message"))
    if registry is not None and payload == "avro":
        _check_registry_url(registry, sp)
    if payload != "protobuf" and get_str("protobuf_message") is not None:
        raise ConfigError(f"a {payload} payload has no Protobuf message", file=sp, field="protobuf_message",
                          fix='remove it, or write payload = "protobuf"')
    return {"payload": payload, "protobuf_message": get_str("protobuf_message"), "schema_registry": registry,
            "schema_attribute": attribute}


def _payload_name(payload: Any, sp: str) -> str:
    """``payload``, one of :data:`PAYLOADS`; :class:`ConfigError` with the nearest name otherwise."""
    if payload not in PAYLOADS:
        close = difflib.get_close_matches(str(payload), PAYLOADS, n=1)
        raise ConfigError(f"unknown payload {payload!r}", file=sp, field="payload",
                          fix=(f"did you mean '{close[0]}'? " if close else "") + f"use one of {', '.join(PAYLOADS)}")
    return str(payload)


def _check_registry_url(url: str | None, sp: str) -> None:
    if not url:
        raise ConfigError("missing", file=sp, field="schema_registry",
                          fix='give the schema registry\'s URL: schema_registry = "https://registry.example.com"')
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"not an http(s) URL: {url!r}", file=sp, field="schema_registry",
                          fix='write schema_registry = "https://registry.example.com" (or http://host:port)')
    if parts.username or parts.password:
        from event_etl.errors import redact

        raise ConfigError(f"credentials in the URL ({redact(url)}): etl.toml is not the place for secrets", file=sp,
                          field="schema_registry",
                          fix="remove them from the URL and set EVENT_ETL_SCHEMA_REGISTRY_AUTH=user:password (or "
                              "EVENT_ETL_SCHEMA_REGISTRY_AUTH_FILE=/path/to/a/file holding it) where the job runs")


def _string_getter(s: dict[str, Any], sp: str) -> Callable[[str], str | None]:
    """``get_str(key)``: a string setting or its default (:data:`_STR_KEYS`); :class:`ConfigError` if not a string."""

    def get_str(key: str) -> str | None:
        v = s.get(key, _STR_KEYS[key])
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"must be a string, got {v!r}", file=sp, field=key, fix=f'write {key} = "..."')
        return v

    return get_str


def _durations(s: dict[str, Any], sp: str) -> dict[str, int]:
    durations = {}
    for key, default in _DURATION_KEYS.items():
        raw = s.get(key, default)
        try:
            durations[key] = parse_duration(raw)
        except ValueError as err:
            off = f' (or {key} = "0": no bound)' if key == "max_backfill" else ""
            raise ConfigError(str(err), file=sp, field=key, fix=f'write for example {key} = "{default}"{off}') from err
    return durations


def _ints(s: dict[str, Any], sp: str) -> dict[str, int]:
    ints: dict[str, int] = {}
    for key, (int_default, lo, hi) in _INT_KEYS.items():
        v = s.get(key, int_default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ConfigError(
                f"must be a whole number from {lo} to {hi}, got {v!r}", file=sp, field=key,
                fix=f"write {key} = {int_default}"
            )
        ints[key] = v
    return ints


def _check_bools_and_tables(s: dict[str, Any], sp: str) -> None:
    for key, bool_default in _BOOL_KEYS.items():
        if not isinstance(s.get(key, bool_default), bool):
            raise ConfigError("must be true or false", file=sp, field=key,
                              fix=f"write {key} = {str(bool_default).lower()}")
    for key in _TABLE_KEYS:
        if not isinstance(s.get(key, {}), dict):
            raise ConfigError("must be a table", file=sp, field=key, fix=f"write it as a [{key}] section")


def _time_settings(fields: dict[str, Any], get_str: Callable[[str], str | None], sp: str, schema_path: Path
                   ) -> tuple[str, str, int | None]:
    """``(time_field, time_format, divisor of a timestamp logical type or None)``, checked against the schema."""
    time_field = get_str("time_field")
    if not time_field:
        raise ConfigError(
            "missing", file=sp, field="time_field",
            fix='name the schema field holding the event time: time_field = "event_time"'
        )
    if time_field not in fields:
        close = difflib.get_close_matches(time_field, list(fields), n=1)
        raise ConfigError(
            f"no field {time_field!r} in {schema_path.name}",
            file=sp,
            field="time_field",
            fix=(f"did you mean '{close[0]}'? " if close else "") + f"fields are: {', '.join(fields)}",
        )
    time_format = get_str("time_format")
    if time_format not in TIME_FORMATS:
        raise ConfigError(
            f"unknown time format {time_format!r}", file=sp, field="time_format",
            fix=f"use one of {', '.join(TIME_FORMATS)}"
        )
    base, logical = _base_and_logical(fields[time_field])
    if logical in _TIMESTAMP_LOGICAL:
        divisor = _TIMESTAMP_LOGICAL[logical]
        if divisor is None:
            raise ConfigError(
                f"field {time_field!r} is a {logical}, which has no time zone",
                file=str(schema_path),
                field=time_field,
                fix="use logicalType timestamp-millis or timestamp-micros (UTC)",
            )
        return time_field, time_format, divisor
    wanted = _TIME_FIELD_TYPES[time_format]
    if base not in wanted:
        raise ConfigError(
            f"time_format {time_format!r} needs the field {time_field!r} to be {' or '.join(wanted)}, "
            f"but the schema says {json.dumps(fields[time_field])}",
            file=sp,
            field="time_format",
            fix="change time_format, or the field's type in schema.avsc",
        )
    return time_field, time_format, None


_TIME_FIELD_TYPES = {"epoch_millis": ("long",), "epoch_seconds": ("long", "int", "double", "float"),
                     "iso8601": ("string",)}
"""The Avro types a time field of each ``time_format`` may have (without a timestamp logical type)."""


def _id_field(fields: dict[str, Any], get_str: Callable[[str], str | None], sp: str, schema_path: Path
              ) -> str | None:
    id_field = get_str("id_field")
    if id_field is None:
        return None
    if id_field not in fields:
        raise ConfigError(
            f"no field {id_field!r} in {schema_path.name}", file=sp, field="id_field",
            fix=f"fields are: {', '.join(fields)}"
        )
    if _base_and_logical(fields[id_field])[0] not in ("string", "long", "int", "bytes", "fixed"):
        raise ConfigError(
            f"field {id_field!r} cannot identify an event: it is {json.dumps(fields[id_field])}",
            file=sp,
            field="id_field",
            fix="point id_field at a string (e.g. a UUID) or integer field",
        )
    return id_field


def _codec_and_format(schema: dict[str, Any], get_str: Callable[[str], str | None], sp: str) -> tuple[str, str]:
    """``(codec, format)``; a Parquet type's schema must map to Parquet columns (no union of two non-null types)."""
    codec = get_str("codec")
    if codec not in CODECS:
        raise ConfigError(f"unknown codec {codec!r}", file=sp, field="codec", fix=f"use one of {', '.join(CODECS)}")
    fmt = get_str("format")
    if fmt not in FORMATS:
        close = difflib.get_close_matches(str(fmt), FORMATS, n=1)
        raise ConfigError(f"unknown file format {fmt!r}", file=sp, field="format",
                          fix=(f"did you mean '{close[0]}'? " if close else "") + f"use one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        from event_etl.storage.parquetio import parquet_problems

        problems = parquet_problems(schema)
        if problems:
            raise ConfigError(
                f"the schema cannot be written as Parquet: {problems[0]}", file=sp, field="format",
                fix='keep format = "avro" for this type, or make each union ["null", T] (one non-null branch), '
                    'e.g. a record with one optional field per branch (docs/schemas.md, "Parquet columns")')
    return codec, fmt


_POLICY_EXAMPLE = '[[commit_policy]]\nkind = "pubsub"\ntopic = "projects/my-project/topics/hours"'


def _commit_policies(raw: Any, sp: str) -> tuple[dict[str, Any], ...]:
    """The ``[[commit_policy]]`` tables of an ``etl.toml``, checked, with their defaults (see :data:`POLICY_KINDS`)."""
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError("must be an array of tables", file=sp, field="commit_policy",
                          fix=f"write each policy as its own table:\n{_POLICY_EXAMPLE}")
    out: list[dict[str, Any]] = []
    for i, table in enumerate(raw):
        where = f"commit_policy[{i}]"
        kind = _policy_kind(table, where, sp)
        name = _policy_name(table, kind, [p["name"] for p in out], where, sp)
        policy: dict[str, Any] = {"kind": kind, "name": name, **_policy_values(table, kind, where, sp)}
        if kind == "pubsub":
            _check_pubsub_policy(policy, where, sp)
        out.append(policy)
    return tuple(out)


def _policy_kind(table: dict[str, Any], where: str, sp: str) -> str:
    kind = table.get("kind")
    if kind not in POLICY_KINDS:
        close = difflib.get_close_matches(str(kind), list(POLICY_KINDS), n=1)
        raise ConfigError(f"unknown policy kind {kind!r}" if kind is not None else "kind missing", file=sp,
                          field=f"{where}.kind", fix=(f"did you mean '{close[0]}'? " if close else "")
                          + f'write kind = "..." with one of: {", ".join(POLICY_KINDS)}')
    return str(kind)


def _policy_name(table: dict[str, Any], kind: str, taken: list[str], where: str, sp: str) -> str:
    name = table.get("name", kind)
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,39}", name):
        raise ConfigError(f"policy name {name!r} is not a lower-case identifier", file=sp, field=f"{where}.name",
                          fix='name it with lower-case letters, digits and _, e.g. name = "hours_topic"')
    if name in taken:
        raise ConfigError(f"two policies are named {name!r}", file=sp, field=f"{where}.name",
                          fix=f'give the second one its own name: name = "{name}_2" (the name keys its record '
                              "in the checkpoint: renaming a policy starts it afresh)")
    return name


def _policy_values(table: dict[str, Any], kind: str, where: str, sp: str) -> dict[str, Any]:
    """The kind's keys of a policy's table, defaults filled in; :class:`ConfigError` for an unknown or missing key."""
    keys = POLICY_KINDS[kind]
    for key in table:
        if key not in keys and key not in ("kind", "name"):
            close = difflib.get_close_matches(key, list(keys), n=1)
            raise ConfigError(f"unknown key for a {kind} policy", file=sp, field=f"{where}.{key}",
                              fix=(f"did you mean '{close[0]}'? " if close else "")
                              + f"a {kind} policy knows: kind, name, {', '.join(keys)}")
    values: dict[str, Any] = {}
    for key, (default, meaning) in keys.items():
        value = table.get(key, default)
        if value is None:
            raise ConfigError("missing", file=sp, field=f"{where}.{key}", fix=f"add {key} = \"...\": {meaning}")
        if not isinstance(value, str):
            raise ConfigError(f"must be a string, got {value!r}", file=sp, field=f"{where}.{key}",
                              fix=f'write {key} = "..." ({meaning})')
        values[key] = value
    return values


def _check_pubsub_policy(policy: dict[str, Any], where: str, sp: str) -> None:
    """A pubsub policy's topic path and timeout (made milliseconds)."""
    if not _TOPIC_RE.match(policy["topic"]):
        raise ConfigError(f"not a topic path: {policy['topic']!r}", file=sp, field=f"{where}.topic",
                          fix='write topic = "projects/<project>/topics/<topic>"')
    try:
        policy["timeout"] = parse_duration(policy["timeout"])
    except ValueError as err:
        raise ConfigError(str(err), file=sp, field=f"{where}.timeout",
                          fix='write for example timeout = "30s"') from err
    if policy["timeout"] <= 0:
        raise ConfigError("must be more than 0", file=sp, field=f"{where}.timeout", fix='write timeout = "30s"')
