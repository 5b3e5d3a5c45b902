"""``event-etl``: the command line.  Each command parses its options and calls one library function."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from event_etl import __version__
from event_etl.cli_types import DURATION, missing_extra, require_extra, to_duration
from event_etl.cli_types import sink_option as sink_option
from event_etl.errors import ConfigError, EventEtlError, UsageError
from event_etl.exitcodes import ExitCode, exit_codes_help

EXIT_USAGE = 2
ENV_DEBUG = "EVENT_ETL_DEBUG"
"""Set to 1: an unexpected error shows its Python traceback (and libraries' logs) instead of one line."""

EXIT_CODES_HELP = exit_codes_help()


def _fail(err: EventEtlError) -> None:
    from event_etl.errors import redact

    click.echo(f"error: {redact(err.message) or type(err).__name__}", err=True)
    fix = redact(err.fix) if err.fix else f"run it again with {ENV_DEBUG}=1 to see more"
    click.echo(f"  fix: {fix}", err=True)
    sys.exit(err.exit_code)


def translate_error(err: BaseException, what: str = "this command") -> EventEtlError | None:
    """The :class:`EventEtlError` (one ``error:`` line, one ``fix:`` line) for an exception from a library."""
    if isinstance(err, EventEtlError):
        return err
    if isinstance(err, ModuleNotFoundError):
        return missing_extra(err, what)
    kind = f"{type(err).__module__}.{type(err).__name__}"
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if kind.startswith("google.auth.exceptions") or "DefaultCredentialsError" in kind:
        err_out = EventEtlError(
            f"no Google Cloud credentials: {text[:300]}",
            fix="on a workstation run `gcloud auth application-default login`; on GCP give the machine a service "
            "account; or set GOOGLE_APPLICATION_CREDENTIALS=key.json (against the emulators: set "
            "PUBSUB_EMULATOR_HOST / STORAGE_EMULATOR_HOST, no credentials needed)")
        err_out.exit_code = ExitCode.ERROR
        return err_out
    if kind.startswith(("google.api_core.exceptions", "grpc")):
        return EventEtlError(f"the Google Cloud API refused or failed: {type(err).__name__}: {text[:300]}",
                             fix="check the project, the resource's name, the account's permissions and the network")
    return None


def handles_errors(fn: Callable) -> Callable:
    """Every failure of a command becomes one ``error:`` line and one ``fix:`` line, and an exit code
    of :mod:`event_etl.exitcodes`; ``EVENT_ETL_DEBUG=1`` shows the traceback of an unexpected one."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from event_etl.stopping import Interrupted

        try:
            return fn(*args, **kwargs)
        except EventEtlError as err:
            _fail(err)
        except Interrupted as stop:  # asked to stop at once (a second signal): one line, exit 128+N
            click.echo(stop.message, err=True)
            sys.exit(stop.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as err:  # noqa: BLE001 - a library's exception: one line, not a traceback
            if os.environ.get(ENV_DEBUG):
                raise
            known = translate_error(err, f"`event-etl {click.get_current_context().info_name}`")
            if known is not None:
                _fail(known)
            _fail(EventEtlError(f"unexpected {type(err).__name__}: {str(err).strip()[:500]}",
                                fix=f"run it again with {ENV_DEBUG}=1 for the traceback, and report it"))

    return wrapper


def _quiet_libraries() -> None:
    """gcsfs logs a traceback for each request that ran out of retries; the command says it in one line."""
    if os.environ.get(ENV_DEBUG):
        return
    for name in ("gcsfs", "fsspec", "google.auth", "google.api_core", "urllib3", "aiohttp", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def event_types_option(fn: Callable) -> Callable:
    return click.option(
        "--event-types",
        "event_types_dir",
        envvar="EVENT_ETL_EVENT_TYPES",
        type=click.Path(file_okay=False),
        default=None,
        help="Folder of event types (<name>/schema.avsc + <name>/etl.toml). "
        "Default: $EVENT_ETL_EVENT_TYPES, else the project's event_types/.",
    )(fn)


def type_names(root: Path) -> list[str]:
    """The names of the event type folders under ``root``, without loading them."""
    from event_etl.eventtypes import ENV_EVENT_TYPES

    if not root.is_dir():
        raise ConfigError("no such folder of event types", file=str(root),
                          fix=f"pass --event-types DIR (or set {ENV_EVENT_TYPES}) to a folder holding "
                          "<name>/schema.avsc and <name>/etl.toml")
    return sorted(c.name for c in root.iterdir() if c.is_dir() and not c.name.startswith((".", "_")))


def _load_type(event_types_dir: str | None, name: str):
    """The event type ``name``, loaded alone: a broken type elsewhere in the folder does not matter."""
    from event_etl.eventtypes import load_event_type, resolve_event_types_dir

    root = resolve_event_types_dir(event_types_dir)
    known = type_names(root)
    if name not in known:
        raise UsageError(
            f"no event type {name!r} in {root}",
            fix=f"known types: {', '.join(known) or '(none)'}; or point --event-types at another folder",
        )
    return load_event_type(root / name)


def consumer_type(event_types_dir: str | None, name: str):
    """The event type of a command that only reads a sink: loaded if it can be, else its name.

    The manifest and the files carry what such a command needs, so an installation without the
    event types folder (``pip install event_etl``) works with the name.  ``--event-types`` (or
    ``$EVENT_ETL_EVENT_TYPES``) given: the type must be there.  Not given: the project's folder is
    used when it holds the type, and the name otherwise.
    """
    from event_etl.consumer.sink import type_name
    from event_etl.eventtypes import load_event_type, resolve_event_types_dir

    if event_types_dir is not None:
        return _load_type(event_types_dir, name)
    type_name(name)
    folder = resolve_event_types_dir(None) / name
    if (folder / "etl.toml").is_file() and (folder / "schema.avsc").is_file():
        return load_event_type(folder)
    return name


def _name(event_type) -> str:
    return event_type if isinstance(event_type, str) else event_type.name


def _parse_conf(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise UsageError(f"--conf {p!r} is not key=value", fix="write --conf spark.executor.memory=2g")
        k, _, v = p.partition("=")
        out[k.strip()] = v.strip()
    return out


class EtlGroup(click.Group):
    """click's own usage errors, like every other failure, as one ``error:`` line and one ``fix:`` line."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
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
    _quiet_libraries()


@main.command("types")
@event_types_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handles_errors
def types_cmd(event_types_dir: str | None, as_json: bool) -> None:
    """List the event types and their main settings."""
    from event_etl.eventtypes import load_event_type, resolve_event_types_dir

    root = resolve_event_types_dir(event_types_dir)
    types, broken = {}, {}
    for name in type_names(root):
        try:
            types[name] = load_event_type(root / name)
        except ConfigError as err:  # shown, and the command fails at the end; the other types still list
            broken[name] = err
    if as_json:
        click.echo(json.dumps({n: {"directory": t.directory, **t.settings_summary()} for n, t in types.items()}, indent=2))
    else:
        _print_types(root, types, broken)
    if broken:
        raise next(iter(broken.values()))


def _print_types(root, types, broken) -> None:
    click.echo(f"event types in {root}:")
    if not types and not broken:
        click.echo("  (none)")
    for name in broken:
        click.echo(f"  {name:<24} BROKEN (see the error below)")
    for name, t in types.items():
        s = t.settings_summary()
        click.echo(
            f"  {name:<24} time {s['time_field']} ({s['time_format']})  id {s['id_field'] or '-'}  "
            f"out-of-orderness {s['out_of_orderness']}  lateness {s['allowed_lateness']}  idle {s['idle_timeout']}"
        )
        if t.description:
            click.echo(f"  {'':<24} {t.description}")


# The options of a streaming job, in the order `run --help` shows them; shared by `run`, `submit`
# and the driver that `submit` starts on the cluster (event_etl.submit_main).
_JOB_OPTIONS: dict[str, Callable] = {
    "source": click.option("--source", default=None, help="generate:[k=v,...], dir:PATH or a folder. Default: the "
                           "type's `source` setting (the built-in generator)."),
    "sink": sink_option,
    "checkpoint": click.option("--checkpoint", default=None,
                               help="Checkpoint folder (local). Default: ./checkpoints/<EVENT_TYPE>."),
    "trigger_interval": click.option("--trigger-interval", type=DURATION, default="5s", show_default=True,
                                     help="Time between micro-batches (90s, 5m, or seconds)."),
    "max_files_per_batch": click.option("--max-files-per-batch", default=64, show_default=True, type=click.IntRange(1),
                                        help="At most this many input files per micro-batch (directory source)."),
    "max_events_per_batch": click.option("--max-events-per-batch", default=500_000, show_default=True,
                                         type=click.IntRange(1),
                                         help="At most this many events per micro-batch (generator source)."),
    "once": click.option("--once", is_flag=True, help="Process what is available now, in as many micro-batches as "
                         "the limits make, then stop."),
    "drain": click.option("--drain", is_flag=True, help="Treat the end of input as the end of time: process what is "
                          "available, mark every hour up to the last one holding data complete, then stop."),
    "master": None,  # each command brings its own (see job_options)
    "conf": click.option("--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting; repeat for more."),
    "quiet": click.option("--quiet", is_flag=True, help="No progress lines; only the summary of errors."),
    "metrics_port": click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                                 help="Serve Prometheus metrics on this port (0: any free port)."),
    "metrics_host": click.option("--metrics-host", default="127.0.0.1", show_default=True,
                                 help="Address the metrics endpoint binds to (0.0.0.0 to expose it)."),
    "otlp_endpoint": click.option("--otlp-endpoint", default=None, help="Also push metrics over OTLP to this endpoint."),
    "metrics_history": click.option("--metrics-history", default=None, type=click.Path(dir_okay=False),
                                    help="Also append a snapshot of the metrics to this local file after every batch "
                                    "(for `event-etl graphs` without Prometheus)."),
}


def job_options(*, master: Callable | None) -> Callable[[Callable], Callable]:
    """Decorate a command with every option of a streaming job (the command adds EVENT_TYPE and --event-types).

    ``master`` is the command's own ``--master`` option (optional for `run`, required for
    `submit`), or None for the driver of a submitted job, whose master comes from spark-submit.
    """
    decorators = [master if name == "master" else opt for name, opt in _JOB_OPTIONS.items()]

    def apply(fn: Callable) -> Callable:
        for decorate in reversed([d for d in decorators if d is not None]):
            fn = decorate(fn)
        return fn

    return apply


def job_run_options(*, conf: tuple[str, ...] = (), **values: Any):
    """The :class:`~event_etl.runner.RunOptions` of the values parsed by :func:`job_options`."""
    from event_etl.runner import RunOptions

    if values.get("trigger_interval") is not None:
        values["trigger_interval"] = to_duration(values["trigger_interval"]).text  # "5000ms"
    return RunOptions(conf=_parse_conf(conf), **values)


@main.command("run")
@click.argument("event_types", nargs=-1, metavar="EVENT_TYPE...")
@click.option("--all", "all_types", is_flag=True, help="Run every event type of --event-types (a fleet).")
@job_options(master=click.option("--master", default=None, help="Spark master. Default: local[*]."))
@click.option("--checkpoint-root", "checkpoint_root", default=None, metavar="DIR",
              help="Folder of the checkpoints, one per type (DIR/<type>); a fleet's --checkpoint means the same. "
              "Default: ./checkpoints.")
@event_types_option
@handles_errors
def run_cmd(event_types: tuple[str, ...], all_types: bool, checkpoint_root: str | None, event_types_dir: str | None,
            **job: Any) -> None:
    """Run the streaming job of EVENT_TYPE.

    With no options: local Spark, the built-in generator (event time runs 120x faster than the
    clock, so hours close every 30 s), sink ./data, checkpoint ./checkpoints/EVENT_TYPE.
    Stop with Ctrl-C (stops at the next batch boundary, exit 0) or SIGTERM/SIGHUP (also drains: closes
    every hour holding data, exit 0), sent to the process or to its whole group; a second Ctrl-C or
    SIGTERM stops at once (exit 130 or 143). A restart on the same checkpoint continues where the job
    stopped.

    Several types (or --all) run as a fleet: one query per type in one Spark application, each
    with its own source (its `source` setting), checkpoint (DIR/<type> of --checkpoint-root DIR, which a
    fleet also takes as --checkpoint DIR), watermark,
    markers and metrics; a failing query is restarted with backoff without stopping the others.
    `event-etl status` shows every type.
    """
    if all_types == bool(event_types):
        raise UsageError("name the event types to run, or --all (not both)",
                         fix="e.g. event-etl run page_view, event-etl run page_view db_change, or event-etl run --all")
    if checkpoint_root is not None and job.get("checkpoint") is not None:
        raise UsageError("--checkpoint-root and --checkpoint say the same thing twice",
                         fix="give --checkpoint-root DIR (each type's checkpoint is DIR/<type>), or --checkpoint")
    fleet = all_types or len(event_types) > 1
    if checkpoint_root is not None:
        job["checkpoint"] = checkpoint_root if fleet else os.path.join(checkpoint_root, event_types[0])
    require_extra("job", "`event-etl run`")
    if job.get("otlp_endpoint"):
        require_extra("otlp", "--otlp-endpoint")
    from event_etl.runner import run_job

    if all_types:
        from event_etl.eventtypes import load_event_types, resolve_event_types_dir

        types = list(load_event_types(resolve_event_types_dir(event_types_dir)).values())
    else:
        types = [_load_type(event_types_dir, name) for name in event_types]
    options = job_run_options(**job)
    if len(types) == 1 and not all_types:
        run_job(types[0], options)
        return
    from event_etl.fleet import run_fleet, summary_lines

    summary = run_fleet(types, options)
    for line in summary_lines(summary or {}):
        click.echo(line)
    undrained = sorted(name for name, s in (summary or {}).items() if s.get("state") == "drain failed")
    if undrained:
        raise EventEtlError(f"{', '.join(undrained)} could not be drained (the other types were)",
                            fix="run the fleet again so Spark replays what was left unfinished, then stop it with "
                                "SIGTERM; `event-etl status` shows each type's last error")


@main.command("status")
@sink_option
@click.option("--checkpoint-root", "--checkpoint", "checkpoint_root", default="./checkpoints", show_default=True,
              metavar="DIR", help="Folder holding the checkpoints of the types (DIR/<type>), as `run` was given it "
              "(--checkpoint-root, or a fleet's --checkpoint).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@event_types_option
@handles_errors
def status_cmd(sink: str, checkpoint_root: str, as_json: bool, event_types_dir: str | None) -> None:
    """Show every event type's job: running or not, watermark, lag, last marker, restarts, last error.

    A sink that holds nothing for any type, or nothing for a type whose checkpoint exists, is a
    wrong --sink (exit code 6), not "never run".
    """
    from event_etl.eventtypes import resolve_event_types_dir
    from event_etl.jobstatus import job_statuses

    names = type_names(resolve_event_types_dir(event_types_dir))
    rows = job_statuses(names, sink=sink, checkpoint_root=checkpoint_root)
    _check_status_sink(sink, rows)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'event type':<24} {'state':<11} {'watermark':<25} {'lag':>8}  {'last marker':<21} {'restarts':>8}")
    for r in rows:
        click.echo(f"{r['event_type']:<24} {r['state']:<11} {r['watermark'] or '-':<25} {r['lag'] or '-':>8}  "
                   f"{r['last_marker'] or '-':<21} {r['restarts'] if r['restarts'] is not None else '-':>8}"
                   + (f"  last error: {r['last_error']}" if r.get("last_error") else ""))


def _check_status_sink(sink: str, rows: list[dict[str, Any]]) -> None:
    """A mistyped --sink reads as "never run" for every type: say it is a wrong sink instead."""
    from event_etl.consumer.sink import open_sink, require_type_data
    from event_etl.errors import NoDataError

    if not rows:
        return
    storage = open_sink(sink)
    empty = []
    for r in rows:
        try:
            require_type_data(storage, r["event_type"])
        except NoDataError as err:
            empty.append((r, err))
    ran_elsewhere = [r["event_type"] for r, _ in empty if r["state"] != "never run"]
    if ran_elsewhere:
        raise NoDataError(f"nothing at {storage.url} for {', '.join(ran_elsewhere)}, yet their checkpoints show "
                          "a job that ran: it wrote to another sink", sink=storage.url, event_type=ran_elsewhere[0],
                          fix="give the sink the job writes to: --sink (or $EVENT_ETL_SINK)")
    if len(empty) == len(rows):
        raise NoDataError(f"nothing at {storage.url} for any event type ({', '.join(r['event_type'] for r in rows)})",
                          sink=storage.url, event_type=rows[0]["event_type"],
                          fix="check --sink (or $EVENT_ETL_SINK); if no job has run yet, start one: event-etl run "
                          + rows[0]["event_type"])


@main.command("deadletter")
@click.argument("event_type")
@sink_option
@click.option("--reason", default=None, help="Only records with this reason (e.g. invalid_json, too_late).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(0), help="At most this many (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record, payload in base64.")
@click.option("--counts", is_flag=True, help="Only the number of records per reason.")
@event_types_option
@handles_errors
def deadletter_cmd(event_type, sink, reason, limit, as_json, counts, event_types_dir) -> None:
    """Show the records of EVENT_TYPE that went to the dead-letter area, with their reasons."""
    import base64
    from collections import Counter

    from event_etl.consumer.sink import could_not_check, open_sink, require_type_data
    from event_etl.deadletter import iter_deadletters
    from event_etl.timeutil import iso

    event_type = _name(consumer_type(event_types_dir, event_type))
    storage = open_sink(sink)
    require_type_data(storage, event_type)
    def checked(it):
        with could_not_check():
            yield from it

    records = checked(iter_deadletters(storage, event_type, reason=reason))
    if counts:
        c = Counter(r.reason for r in records)
        for k, v in sorted(c.items()):
            click.echo(f"{k:<20} {v}")
        click.echo(f"{'total':<20} {sum(c.values())}")
        return
    shown = 0
    for r in records:
        if limit and shown >= limit:
            click.echo("... (more; use --limit 0 for all)")
            break
        shown += 1
        if as_json:
            click.echo(json.dumps({
                "arrived_at": iso(r.arrived_at), "reason": r.reason, "detail": r.detail, "source": r.source,
                "event_time": iso(r.event_time), "batch_id": r.batch_id, "file": r.file,
                "payload_base64": base64.b64encode(r.payload).decode("ascii"),
            }))
        else:
            preview = r.payload[:120]
            click.echo(f"{iso(r.arrived_at)}  {r.reason:<16} {r.source:<28} {r.detail}")
            click.echo(f"    payload ({len(r.payload)} bytes): {preview!r}{'...' if len(r.payload) > 120 else ''}")
    if shown == 0 and not as_json:
        click.echo("no dead-letter records" + (f" with reason {reason}" if reason else ""))


# Commands that live in their own modules register themselves on `main` when imported.
from event_etl import consumer_cli as _consumer_cli  # noqa: E402,F401
from event_etl import monitoring_cli as _monitoring_cli  # noqa: E402,F401
from event_etl import pubsub_cli as _pubsub_cli  # noqa: E402,F401
from event_etl import submit_cli as _submit_cli  # noqa: E402,F401
from event_etl import schema_cli as _schema_cli  # noqa: E402,F401


def _add_exit_codes(group: click.Group) -> None:
    """Every command's --help ends with the one exit-code table (event_etl.exitcodes)."""
    for cmd in group.commands.values():
        if not cmd.epilog:
            cmd.epilog = EXIT_CODES_HELP
        if isinstance(cmd, click.Group):
            _add_exit_codes(cmd)


_add_exit_codes(main)

if __name__ == "__main__":  # pragma: no cover
    main()
