"""``event-etl``: the command line.  Each command parses its options and calls one library function.

The group is defined here; each command lives in the module of its family and is imported
only when it runs (or when ``--help`` lists it), as pip's ``commands_dict`` does:
:data:`COMMANDS` maps a command's name to ``"module:attribute"``.  What several commands
share (error handling, common options, loading an event type) is in :mod:`event_etl.cli.options`.
The library never imports this package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import click

from event_etl import __version__
from event_etl.exitcodes import ExitCode, exit_codes_help
from event_etl.settings import settings_in_force

__all__ = ["main", "COMMANDS", "EtlGroup", "LazyCommands", "load_command"]

EXIT_CODES_HELP = exit_codes_help()

COMMANDS: dict[str, str] = {
    "types": "event_etl.cli.job:types_cmd",
    "check": "event_etl.cli.check:check_cmd",
    "run": "event_etl.cli.job:run_cmd",
    "drain": "event_etl.cli.job:drain_cmd",
    "status": "event_etl.cli.job:status_cmd",
    "deadletter": "event_etl.cli.job:deadletter_cmd",
    "warmup": "event_etl.cli.job:warmup_cmd",
    "submit": "event_etl.cli.submit:submit_cmd",
    "setup": "event_etl.cli.pubsub:setup_cmd",
    "publish": "event_etl.cli.pubsub:publish_cmd",
    "wait": "event_etl.cli.consumer:wait_cmd",
    "hours": "event_etl.cli.consumer:hours_cmd",
    "complete": "event_etl.cli.consumer:complete_cmd",
    "verify": "event_etl.cli.consumer:verify_cmd",
    "cat": "event_etl.cli.consumer:cat_cmd",
    "audit": "event_etl.cli.consumer:audit_cmd",
    "late": "event_etl.cli.consumer:late_cmd",
    "graphs": "event_etl.cli.monitoring:graphs_cmd",
    "schema": "event_etl.cli.schema:schema_group",
}
"""Every command of ``event-etl``: its name -> ``"module:attribute"`` of its click command, loaded on use."""


def _add_exit_codes(cmd: click.Command) -> click.Command:
    """Every command's --help ends with the one exit-code table (event_etl.exitcodes)."""
    if not cmd.epilog:
        cmd.epilog = EXIT_CODES_HELP
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _add_exit_codes(sub)
    return cmd


def load_command(name: str) -> click.Command:
    """The click command ``name`` of :data:`COMMANDS`, imported now."""
    module, _, attr = COMMANDS[name].partition(":")
    return _add_exit_codes(getattr(importlib.import_module(module), attr))


class LazyCommands(dict[str, click.Command]):
    """A group's ``commands``: every name of :data:`COMMANDS` is in it, and its command is imported
    the first time it is looked up (listing the names imports nothing)."""

    def __init__(self, table: dict[str, str],
                 loaded: Mapping[str, click.Command] | Iterable[tuple[str, click.Command]] = ()) -> None:
        super().__init__(loaded)
        self.table = table

    def __missing__(self, name: str) -> click.Command:
        if name not in self.table:
            raise KeyError(name)
        cmd = load_command(name)
        dict.__setitem__(self, name, cmd)
        return cmd

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def _names(self) -> list[str]:
        return sorted({*self.table, *dict.keys(self)})

    def __contains__(self, name: object) -> bool:
        return name in self.table or dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def keys(self) -> list[str]:  # type: ignore[override]  # a list (dict's own is a view): what click's listing takes
        return self._names()

    def values(self) -> list[click.Command]:  # type: ignore[override]  # as keys()
        return [self[n] for n in self._names()]

    def items(self) -> list[tuple[str, click.Command]]:  # type: ignore[override]  # as keys()
        return [(n, self[n]) for n in self._names()]


class EtlGroup(click.Group):
    """The group of :data:`COMMANDS`, loaded lazily; click's own usage errors, like every other failure,
    as one ``error:`` line and one ``fix:`` line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(COMMANDS, self.commands)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """The command, with the ``EVENT_ETL_*`` settings read once as it starts (:func:`settings_in_force`)."""
        with settings_in_force():
            return self._main(args, prog_name, complete_var, standalone_mode, **extra)

    def _main(self, args: Sequence[str] | None, prog_name: str | None, complete_var: str | None,
              standalone_mode: bool, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
            sys.stdout.flush()  # here, where a reader that stopped reading is seen, not at the interpreter's exit
        except BrokenPipeError:  # `| head`: end quietly, as cat and grep do
            from event_etl.cli.options import end_on_closed_pipe

            end_on_closed_pipe()
        except click.exceptions.NoArgsIsHelpError as e:  # `event-etl` alone: the help, as usual
            click.echo(e.ctx.get_help(), err=True)
            sys.exit(e.exit_code)
        except click.UsageError as e:
            path = e.ctx.command_path if e.ctx is not None else "event-etl"
            click.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            click.echo(f"  fix: see `{path} --help`", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            click.echo("  fix: see `event-etl --help`", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            click.echo("  fix: run the command again", err=True)
            sys.exit(int(ExitCode.ERROR))
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=EtlGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="event-etl")
def main() -> None:
    """event_etl: one streaming job per event type, writing hourly event-time buckets of Avro files
    and closing each hour with a _COMPLETE marker.

    Start with `event-etl types`, then `event-etl run page_view` (local Spark, built-in generator,
    sink ./data). Batch consumers: `event-etl wait`, `hours`, `verify`, `cat`, `audit` (these need
    no event types folder and no Spark: `pip install event_etl`).
    """
    from event_etl.cli.options import quiet_libraries

    quiet_libraries()


_MOVED = {name: "event_etl.cli.options" for name in (
    "translate_error", "handles_errors", "event_types_option", "sink_option", "type_names", "consumer_type",
    "job_options", "job_run_options", "ENV_DEBUG")}
_MOVED.update({attr: module for module, _, attr in (v.partition(":") for v in COMMANDS.values())})


def __getattr__(name: str) -> Any:
    """The helpers and commands that lived in ``event_etl/cli.py`` before it became this package, imported
    from their modules when asked for (``from event_etl.cli import handles_errors`` keeps working)."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


if __name__ == "__main__":  # pragma: no cover
    main()
