"""``event-etl schema``: an event type's schema versions, and whether a change is compatible.

``schema list TYPE`` shows the registered versions (``event_types/TYPE/schemas/v<N>.avsc``),
``schema check TYPE [NEW.avsc]`` compares a new schema (default: the current ``schema.avsc``)
with every registered version by Avro's resolution rules and names each field that breaks
and why (:mod:`event_etl.rules.compat`), ``schema register TYPE`` records the current schema
as the next version.  See docs/schemas.md.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from event_etl.cli.options import event_types_option, handles_errors, load_type

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType
    from event_etl.rules.compat import Compatibility

__all__ = ["schema_group"]

EXIT_INCOMPATIBLE = 1

_LEVELS = {
    "backward": "the new schema reads data written with each of them, as `run` needs",
    "forward": "readers of each of them read data written with the new schema",
    "full": "the new schema reads their data, and their readers read new data",
}


@click.group("schema")
def schema_group() -> None:
    """An event type's schema versions (event_types/TYPE/schemas/v1.avsc, v2.avsc, ...) and their compatibility.

    schema.avsc stays the current schema, the one data files are written in; Avro single-object
    payloads of every registered version are accepted and resolved to it. `run` refuses a current
    schema that cannot read every registered version.
    """


def _fp(fingerprint_hex: str) -> str:
    return f"crc64avro:{fingerprint_hex}"


@schema_group.command("list")
@click.argument("event_type")
@event_types_option
@handles_errors
def list_cmd(event_type: str, event_types_dir: str | None) -> None:
    """List the registered schema versions of EVENT_TYPE and which one is current."""
    from event_etl.eventtypes import schema_fingerprint

    et = load_type(event_types_dir, event_type)
    if not et.schema_versions:
        click.echo(f"{et.name}: no schema history ({et.schemas_dir} does not exist): its only version is "
                   f"schema.avsc ({_fp(et.fingerprint)})")
        click.echo(f"  keep one before changing the schema: event-etl schema register {et.name}")
        return
    click.echo(f"{'version':<8} {'fingerprint':<28} {'fields':>6}  current")
    for name, s in et.schema_versions:
        fp = schema_fingerprint(s)
        click.echo(f"{name:<8} {_fp(fp):<28} {len(s.get('fields', [])):>6}  {'yes' if fp == et.fingerprint else ''}")
    if et.version_of(et.fingerprint) is None:
        click.echo(f"schema.avsc ({_fp(et.fingerprint)}) is not registered yet: event-etl schema register {et.name}")


@schema_group.command("check")
@click.argument("event_type")
@click.argument("new_schema", required=False, metavar="[NEW.avsc]", type=click.Path(dir_okay=False))
@click.option("--require", "required", type=click.Choice(list(_LEVELS)), default="backward", show_default=True,
              help="The compatibility the new schema must have with every registered version: backward (the new "
              "schema reads their data: what `run` needs), forward (their readers read new data), full (both).")
@event_types_option
@handles_errors
def check_cmd(event_type: str, new_schema: str | None, required: str, event_types_dir: str | None) -> None:
    """Check a new schema of EVENT_TYPE against every registered version: backward, forward, full, with reasons.

    NEW.avsc defaults to the type's schema.avsc (the current schema). For each registered version it
    says whether the new schema reads that version's data (backward), whether that version's readers
    read the new schema's data (forward), or both (full); when not, which field and why. The new schema
    must also fit the type's settings (time_field, id_field).

    \b
    Exit codes:
      0  compatible as --require asks (default backward: what `run` needs)
      1  not compatible: the reasons are printed
      2  a broken schema file or event type, or a usage error
    """
    from event_etl.eventtypes import load_schema_file, schema_fingerprint, with_schema

    et = load_type(event_types_dir, event_type)
    if new_schema is None:
        new, label = et.schema, "schema.avsc"
    else:
        new, label = load_schema_file(new_schema), new_schema
        with_schema(et, new, new_schema)  # the settings must fit the new schema
    new_fp = schema_fingerprint(new)
    versions = list(et.schema_versions)
    implicit = not versions
    if implicit:  # no history: the current schema is the only version
        versions = [("schema.avsc", et.schema)]
    click.echo(f"{et.name}: {label} ({_fp(new_fp)}) against {len(versions)} "
               f"{'registered version' if not implicit else 'version (no schemas/ folder: the current schema.avsc)'}"
               f"{'s' if len(versions) > 1 else ''}")
    failed: list[str] = []
    notes: list[str] = []
    for name, old in versions:
        c = _show_version(name, old, new, new_fp)
        notes.extend(f"{name}: {p}" for p in c.notes)
        if not _meets(c, required):
            failed.append(name)
    for n in notes:
        click.echo(f"  note: {n}")
    if failed:
        _incompatible(et.name, required, failed)
    click.echo(f"ok: {required} compatible with every {'registered ' if not implicit else ''}version: "
               f"{_LEVELS[required]}")
    _say_next(et, new_schema, new_fp, implicit=implicit)


_VERDICTS = {
    "full": "FULL: the new schema reads its data, and its readers read new data",
    "backward": "BACKWARD only: the new schema reads its data; its readers cannot read new data",
    "forward": "FORWARD only: its readers read new data; the new schema cannot read its data",
    "none": "NOT compatible either way",
}
"""A compatibility level -> what ``schema check`` says of a version of another fingerprint."""


def _show_version(name: str, old: dict[str, Any], new: dict[str, Any], new_fp: str) -> Compatibility:
    """Print one registered version's verdict and the problems of each direction; return its compatibility."""
    from event_etl.eventtypes import schema_fingerprint
    from event_etl.rules.compat import compatibility

    old_fp = schema_fingerprint(old)
    c = compatibility(new, old)
    if old_fp == new_fp:
        verdict = "the same schema" if old == new else (
            "the same fingerprint: it differs only in docs, defaults, aliases or logical types")
    else:
        verdict = _VERDICTS[c.level]
    click.echo(f"  {name:<11} {_fp(old_fp)}  {verdict}")
    for p in c.backward:
        click.echo(f"      new cannot read {name}: {p}")
    for p in c.forward:
        click.echo(f"      {name} readers cannot read new: {p}")
    return c


def _meets(c: Compatibility, required: str) -> bool:
    """Whether ``c`` is the compatibility ``--require`` asks for."""
    return {"backward": c.is_backward, "forward": c.is_forward, "full": c.is_backward and c.is_forward}[required]


def _incompatible(type_name: str, required: str, failed: list[str]) -> NoReturn:
    click.echo(f"incompatible: not {required} compatible with {', '.join(failed)} "
               f"(--require {required}: {_LEVELS[required]})", err=True)
    click.echo("  fix: a new field needs a default; a type may only widen (int to long, float or double; long to "
               "float or double; float to double; string to/from bytes); an enum keeps its symbols or gets a "
               "default; a renamed record or field lists its old name in \"aliases\". A breaking change is a new "
               f"event type or a new major version in the namespace (e.g. event_types/{type_name}_v2 with "
               "namespace ...v2): run both during the switch (docs/schemas.md)", err=True)
    sys.exit(EXIT_INCOMPATIBLE)


def _say_next(et: EventType, new_schema: str | None, new_fp: str, *, implicit: bool) -> None:
    """What to do after a successful check: register the schema, or copy the new one in first."""
    if new_schema is None and implicit:
        click.echo(f"  no history is kept: register schema.avsc before changing it (event-etl schema register "
                   f"{et.name})")
    elif new_schema is None and et.version_of(new_fp) is None:
        click.echo(f"  next: event-etl schema register {et.name}, then restart the job on its checkpoint")
    elif new_schema is not None:
        click.echo(f"  next: copy {new_schema} to {et.schema_file}, event-etl schema register {et.name}, "
                   f"then restart the job on its checkpoint")


@schema_group.command("register")
@click.argument("event_type")
@event_types_option
@handles_errors
def register_cmd(event_type: str, event_types_dir: str | None) -> None:
    """Record EVENT_TYPE's schema.avsc as its next version (schemas/v<N>.avsc), after checking that it reads
    every registered version (as `run` does). A type without schemas/ gets it, with schema.avsc as v1."""
    from event_etl.eventtypes import register_current_schema

    et = load_type(event_types_dir, event_type)
    _name, what = register_current_schema(et)
    click.echo(f"{et.name}: schema.avsc ({_fp(et.fingerprint)}) {what}")
