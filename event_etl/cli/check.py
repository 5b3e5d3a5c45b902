"""``event-etl check``: load event types as a job would, and show what each reads and writes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from event_etl.cli.options import check_type_source, event_types_option, handles_errors, type_names
from event_etl.errors import ConfigError

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType

__all__ = ["check_cmd"]

_DIALECTS = {
    "json": "JSON objects (and single-object or Gilt-framed Avro of a registered version)",
    "protobuf": "Protobuf messages of schema.desc",
    "confluent": "Confluent's wire format (Avro or Protobuf), schemas from the registry",
    "avro": "bare Avro datums",
}


@click.command("check")
@click.argument("event_types", nargs=-1, metavar="[EVENT_TYPE]...")
@click.option("--schema", "show_schema", is_flag=True,
              help="Print each type's Avro schema (for a Protobuf type without schema.avsc: the one derived from "
                   "its message).")
@event_types_option
@handles_errors
def check_cmd(event_types: tuple[str, ...], show_schema: bool, event_types_dir: str | None) -> None:
    """Check EVENT_TYPEs (default: every type) as `run` would before it starts, and say what each reads.

    For each type: its payload (what producers write), where its Avro schema comes from, the schema
    versions it accepts, its source. A Protobuf type's schema derived from its descriptor set is
    printed in full (the schema its files are written in). A broken type is an error naming the
    file, the field and the fix (exit 2); the other types are still shown.
    """
    from event_etl.eventtypes import load_event_type, resolve_event_types_dir

    root = resolve_event_types_dir(event_types_dir)
    names = list(event_types) or type_names(root)
    broken: list[ConfigError] = []
    loaded: list[EventType] = []
    for name in names:
        try:
            et = load_event_type(root / name)
            et.check_versions(warn=lambda line: click.echo(f"  {line}"))
            check_type_source(et)
        except ConfigError as err:
            click.echo(f"{name}: BROKEN (see the error below)")
            broken.append(err)
            continue
        _show(et, show_schema)
        loaded.append(et)
    try:
        _show_buses(loaded)
    except ConfigError as err:
        broken.append(err)
    if broken:
        raise broken[0]


def _show_buses(types: list[EventType]) -> None:
    """Each bus among the types (a source several of them route: event_etl.bus), its types and what each claims;
    types that cannot share their source are the error ``run`` would give."""
    from event_etl.rules.routing import plan_buses
    from event_etl.sources.registry import job_source
    from event_etl.timeutil import now_millis

    routed = [et for et in types if et.route is not None]
    if not routed:
        return
    now = now_millis()
    plans = plan_buses([(et.name, job_source(et, None, now=now).identity(), et.route) for et in types],
                       files={et.name: et.settings_file for et in types})
    for plan in plans:
        for line in plan.describe():
            click.echo(line)


def _show(et: EventType, show_schema: bool) -> None:
    import os

    derived = et.payload == "protobuf" and not os.path.isfile(et.schema_file)
    click.echo(f"{et.name}: ok")
    click.echo(f"  payload   {et.payload}: {_DIALECTS[et.payload]}")
    if et.payload == "protobuf":
        click.echo(f"  message   {et.protobuf_message} ({et.descriptor_file})")
    if et.schema_registry:
        from event_etl.errors import redact

        click.echo(f"  registry  {redact(et.schema_registry)}")
    if et.schema_attribute:
        click.echo(f"  schema named by the attribute {et.schema_attribute!r} (a bare Avro datum then)")
    origin = f"derived from {et.protobuf_message}" if derived else "schema.avsc"
    versions = ", ".join(n for n, _ in et.schema_versions) or "none registered"
    click.echo(f"  schema    {et.schema.get('name')} (crc64avro:{et.fingerprint}), {origin}; versions: {versions}")
    click.echo(f"  time      {et.time_field} ({et.time_format if not et.time_logical_divisor else 'timestamp'})")
    click.echo(f"  source    {et.source}    format {et.format}")
    if et.route is not None:
        click.echo(f"  route     claims {et.route.describe()} (a bus: the types that read its source together)")
    if derived or show_schema:
        for line in schema_lines(et.schema):
            click.echo(f"    {line}")


def schema_lines(schema: dict[str, object]) -> list[str]:
    """An Avro record schema as JSON, one field a line: what a user pastes into schema.avsc."""
    head = {k: v for k, v in schema.items() if k != "fields"}
    fields = schema.get("fields")
    if not isinstance(fields, list):
        return [json.dumps(schema)]
    opening = json.dumps(head)[:-1] + ', "fields": ['
    return [opening, *[f"  {json.dumps(f)}{',' if i < len(fields) - 1 else ''}" for i, f in enumerate(fields)],
            "]}"]
