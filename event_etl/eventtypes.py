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
``max_events_per_file`` ``500000``       a larger group is split into several files
``max_payload_bytes``   ``1048576``      larger payloads go to dead-letter as ``oversized``
``codec``               ``"snappy"``     Avro codec of data files: ``null``, ``deflate`` or ``snappy``
``source``              ``"generate:"``  source used when ``run`` gets no ``--source``
``description``         ``""``           one line shown by ``event-etl types``
``[generator]``                          value pools for synthetic events (see below)
======================  ===============  =====================================================

``[generator.values]`` maps a field name to a list of values the generator picks from;
fields without a pool get values derived from their Avro type and name.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from event_etl.errors import ConfigError
from event_etl.rules.buckets import validate_event_type_name
from event_etl.timeutil import parse_duration

__all__ = [
    "EventType",
    "load_event_type",
    "load_event_types",
    "resolve_event_types_dir",
    "TIME_FORMATS",
    "ENV_EVENT_TYPES",
]

ENV_EVENT_TYPES = "EVENT_ETL_EVENT_TYPES"
TIME_FORMATS = ("epoch_millis", "epoch_seconds", "iso8601")
CODECS = ("null", "deflate", "snappy")

_DURATION_KEYS = {
    "out_of_orderness": "2m",
    "allowed_lateness": "24h",
    "idle_timeout": "5m",
    "max_future_skew": "10m",
    "dedupe_window": "10m",
}
_INT_KEYS = {
    "max_events_per_file": (500_000, 1, 10_000_000),
    "max_payload_bytes": (1_048_576, 16, 64 * 1_048_576),
}
_STR_KEYS = {
    "time_field": None,
    "time_format": "epoch_millis",
    "id_field": None,
    "codec": "snappy",
    "source": "generate:",
    "description": "",
    "time_attribute": None,
}
_BOOL_KEYS = {"publish_time_fallback": False}
_TABLE_KEYS = {"generator", "pubsub"}
KNOWN_KEYS = set(_DURATION_KEYS) | set(_INT_KEYS) | set(_STR_KEYS) | set(_BOOL_KEYS) | _TABLE_KEYS

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
    generator: dict[str, Any] = field(default_factory=dict)
    pubsub: dict[str, Any] = field(default_factory=dict)

    @property
    def schema_file(self) -> str:
        return os.path.join(self.directory, "schema.avsc")

    @property
    def settings_file(self) -> str:
        return os.path.join(self.directory, "etl.toml")

    def parsed_schema(self) -> dict[str, Any]:
        from fastavro import parse_schema

        return parse_schema(self.schema)

    @property
    def fingerprint(self) -> str:
        """CRC-64-AVRO fingerprint of the schema, as the 8 little-endian bytes in hex (as in single-object encoding)."""
        from fastavro.schema import fingerprint, to_parsing_canonical_form

        return fingerprint(to_parsing_canonical_form(self.schema), "CRC-64-AVRO")

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
            "max_events_per_file": self.max_events_per_file,
            "codec": self.codec,
        }


def resolve_event_types_dir(option: str | os.PathLike[str] | None = None) -> Path:
    """Where event types live: ``--event-types``, else ``$EVENT_ETL_EVENT_TYPES``, else the project's ``event_types/``."""
    if option:
        return Path(option)
    env = os.environ.get(ENV_EVENT_TYPES)
    if env:
        return Path(env)
    return _project_event_types()


def _project_event_types() -> Path:
    """``event_types/`` next to the package; when the package is imported from a job bundle
    (``event-etl submit``, :mod:`event_etl.bundle`), the bundle's copy, extracted to a local folder."""
    from event_etl.bundle import bundled_event_types, package_archive

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
            fix=f"pass --event-types DIR (or set {ENV_EVENT_TYPES}) to a folder holding <name>/schema.avsc and <name>/etl.toml",
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
    for p, what in ((schema_path, "an Avro record schema"), (settings_path, "the type's settings")):
        if not p.is_file():
            raise ConfigError(
                "file missing", file=str(p), fix=f"create {p.name} with {what} (see event_types/page_view for an example)"
            )
    schema = _load_schema(schema_path)
    settings = _load_settings(settings_path)
    return _build(name, directory, schema, schema_path, settings, settings_path)


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
    sp = str(settings_path)

    def get_str(key: str) -> str | None:
        v = s.get(key, _STR_KEYS[key])
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"must be a string, got {v!r}", file=sp, field=key, fix=f'write {key} = "..."')
        return v

    durations = {}
    for key, default in _DURATION_KEYS.items():
        raw = s.get(key, default)
        try:
            durations[key] = parse_duration(raw)
        except ValueError as err:
            raise ConfigError(str(err), file=sp, field=key, fix=f'write for example {key} = "{default}"') from err
    ints = {}
    for key, (default, lo, hi) in _INT_KEYS.items():
        v = s.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ConfigError(
                f"must be a whole number from {lo} to {hi}, got {v!r}", file=sp, field=key, fix=f"write {key} = {default}"
            )
        ints[key] = v
    for key, default in _BOOL_KEYS.items():
        if not isinstance(s.get(key, default), bool):
            raise ConfigError("must be true or false", file=sp, field=key, fix=f"write {key} = {str(default).lower()}")
    for key in _TABLE_KEYS:
        if not isinstance(s.get(key, {}), dict):
            raise ConfigError("must be a table", file=sp, field=key, fix=f"write it as a [{key}] section")

    fields = _field_types(schema)
    time_field = get_str("time_field")
    if not time_field:
        raise ConfigError(
            "missing", file=sp, field="time_field", fix='name the schema field holding the event time: time_field = "event_time"'
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
            f"unknown time format {time_format!r}", file=sp, field="time_format", fix=f"use one of {', '.join(TIME_FORMATS)}"
        )
    base, logical = _base_and_logical(fields[time_field])
    divisor = None
    if logical in _TIMESTAMP_LOGICAL:
        divisor = _TIMESTAMP_LOGICAL[logical]
        if divisor is None:
            raise ConfigError(
                f"field {time_field!r} is a {logical}, which has no time zone",
                file=str(schema_path),
                field=time_field,
                fix="use logicalType timestamp-millis or timestamp-micros (UTC)",
            )
    else:
        wanted = {"epoch_millis": ("long",), "epoch_seconds": ("long", "int", "double", "float"), "iso8601": ("string",)}[
            time_format
        ]
        if base not in wanted:
            raise ConfigError(
                f"time_format {time_format!r} needs the field {time_field!r} to be {' or '.join(wanted)}, "
                f"but the schema says {json.dumps(fields[time_field])}",
                file=sp,
                field="time_format",
                fix="change time_format, or the field's type in schema.avsc",
            )
    id_field = get_str("id_field")
    if id_field is not None:
        if id_field not in fields:
            raise ConfigError(
                f"no field {id_field!r} in {schema_path.name}", file=sp, field="id_field", fix=f"fields are: {', '.join(fields)}"
            )
        if _base_and_logical(fields[id_field])[0] not in ("string", "long", "int", "bytes", "fixed"):
            raise ConfigError(
                f"field {id_field!r} cannot identify an event: it is {json.dumps(fields[id_field])}",
                file=sp,
                field="id_field",
                fix="point id_field at a string (e.g. a UUID) or integer field",
            )
    codec = get_str("codec")
    if codec not in CODECS:
        raise ConfigError(f"unknown codec {codec!r}", file=sp, field="codec", fix=f"use one of {', '.join(CODECS)}")
    source = get_str("source") or "generate:"
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
        max_events_per_file=ints["max_events_per_file"],
        max_payload_bytes=ints["max_payload_bytes"],
        codec=codec,
        source=source,
        description=get_str("description") or "",
        time_attribute=get_str("time_attribute"),
        publish_time_fallback=bool(s.get("publish_time_fallback", False)),
        generator=dict(s.get("generator", {})),
        pubsub=dict(s.get("pubsub", {})),
    )
