"""What every command of the command line shares: the error handling (one ``error:`` line, one
``fix:`` line, an exit code of :mod:`event_etl.exitcodes`), the options of several commands
(``--event-types``, ``--sink``, the options of a streaming job) and loading the event type a
command names.  The command modules (:mod:`event_etl.cli`) import these; nothing here imports
a command module.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from event_etl.cli.params import DURATION, missing_extra, to_duration
from event_etl.cli.params import sink_option as sink_option
from event_etl.errors import ConfigError, EventEtlError, UsageError
from event_etl.exitcodes import ExitCode, exit_codes_help
from event_etl.job.session import parse_conf as parse_conf
from event_etl.settings import ENV_DEBUG, ENV_EVENT_TYPES, current_settings, settings_in_force

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType
    from event_etl.job.setup import RunOptions

__all__ = ["ENV_DEBUG", "EXIT_CODES_HELP", "fail", "translate_error", "handles_errors", "quiet_libraries",
           "event_types_option", "sink_option", "type_names", "load_type", "consumer_type", "parse_conf",
           "JOB_OPTIONS", "job_options", "job_run_options", "refuse_removed_engine", "end_on_closed_pipe"]

"""Set to 1: an unexpected error shows its Python traceback (and libraries' logs) instead of one line."""

EXIT_CODES_HELP = exit_codes_help()


def fail(err: EventEtlError) -> None:
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


def end_on_closed_pipe() -> None:
    """The reader of the output stopped reading (``| head``): end quietly, as ``cat`` and ``grep`` do.

    Standard output is pointed at /dev/null first, so that the interpreter's last flush does not fail
    again on the closed pipe; the exit code is the shell's for a process that SIGPIPE ended (141)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(128 + signal.SIGPIPE)


Command = Callable[..., Any]
"""A click command's function (or a decorator's result)."""


def handles_errors(fn: Command) -> Command:
    """Every failure of a command becomes one ``error:`` line and one ``fix:`` line, and an exit code
    of :mod:`event_etl.exitcodes`; ``EVENT_ETL_DEBUG=1`` shows the traceback of an unexpected one."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from event_etl.job.stopping import Interrupted, StoppedAtOnce, end_at_once

        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            end_on_closed_pipe()
        except EventEtlError as err:
            fail(err)
        except StoppedAtOnce as stop:  # stopped where nothing can be finished: ended now, no cleanup
            end_at_once(stop.exit_code, stop.message)
        except Interrupted as stop:  # asked to stop at once (a second signal): one line, exit 128+N
            click.echo(stop.message, err=True)
            sys.exit(stop.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as err:  # a library's exception: one line, not a traceback
            if current_settings().debug:
                raise
            known = translate_error(err, f"`event-etl {click.get_current_context().info_name}`")
            if known is not None:
                fail(known)
            fail(EventEtlError(f"unexpected {type(err).__name__}: {str(err).strip()[:500]}",
                                fix=f"run it again with {ENV_DEBUG}=1 for the traceback, and report it"))

    return wrapper


def quiet_libraries() -> None:
    """gcsfs logs a traceback for each request that ran out of retries; the command says it in one line."""
    if current_settings().debug:
        return
    for name in ("gcsfs", "fsspec", "google.auth", "google.api_core", "urllib3", "aiohttp", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def event_types_option(fn: Command) -> Command:
    return click.option(
        "--event-types",
        "event_types_dir",
        envvar=ENV_EVENT_TYPES,
        type=click.Path(file_okay=False),
        default=None,
        help="Folder of event types (<name>/schema.avsc + <name>/etl.toml). "
        "Default: $EVENT_ETL_EVENT_TYPES, else the project's event_types/.",
    )(fn)


def type_names(root: Path) -> list[str]:
    """The names of the event type folders under ``root``, without loading them."""
    if not root.is_dir():
        raise ConfigError("no such folder of event types", file=str(root),
                          fix=f"pass --event-types DIR (or set {ENV_EVENT_TYPES}) to a folder holding "
                          "<name>/schema.avsc and <name>/etl.toml")
    return sorted(c.name for c in root.iterdir() if c.is_dir() and not c.name.startswith((".", "_")))


def load_type(event_types_dir: str | None, name: str) -> EventType:
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


def consumer_type(event_types_dir: str | None, name: str) -> EventType | str:
    """The event type of a command that only reads a sink: loaded if it can be, else its name.

    The manifest and the files carry what such a command needs, so an installation without the
    event types folder (``pip install event_etl``) works with the name.  ``--event-types`` (or
    ``$EVENT_ETL_EVENT_TYPES``) given: the type must be there.  Not given: the project's folder is
    used when it holds the type, and the name otherwise.
    """
    from event_etl.consumer.sink import type_name
    from event_etl.eventtypes import load_event_type, resolve_event_types_dir

    if event_types_dir is not None:
        return load_type(event_types_dir, name)
    type_name(name)
    folder = resolve_event_types_dir(None) / name
    if (folder / "etl.toml").is_file() and (folder / "schema.avsc").is_file():
        return load_event_type(folder)
    return name


# The options of a streaming job, in the order `run --help` shows them; shared by `run`, `submit`
# and the driver that `submit` starts on the cluster (event_etl.cli.submitted).
JOB_OPTIONS: dict[str, Callable[[Command], Command] | None] = {
    "source": click.option("--source", default=None,
                           help="generate:[k=v,...], dir:PATH or a folder, pubsub:..., kafka:TOPIC. Default: the "
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
                                         help="At most this many events per micro-batch of a type (generator, "
                                              "Pub/Sub, Kafka; a bus reads up to this times its types in a "
                                              "round)."),
    "once": click.option("--once", is_flag=True, help="Process what is available now, in as many micro-batches as "
                         "the limits make, then stop."),
    "drain": click.option("--drain", is_flag=True, help="Treat the end of input as the end of time: process what is "
                          "available, mark every hour up to the last one holding data complete, then stop."),
    "drain_on_stop": click.option("--drain-on-stop", is_flag=True, help="SIGTERM and SIGHUP also drain (mark every "
                                  "hour holding data complete before the job stops), for a job stopped for good. "
                                  "Without it a stop marks no hour the watermark has not passed (the next run "
                                  "continues); `event-etl drain TYPE` asks a running job to drain and stop."),
    "master": None,  # each command brings its own (see job_options)
    "conf": click.option("--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting; repeat for more."),
    "quiet": click.option("--quiet", is_flag=True, help="No progress lines; only the summary of errors."),
    "metrics_port": click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                                 help="Serve Prometheus metrics on this port (0: any free port)."),
    "metrics_host": click.option("--metrics-host", default="127.0.0.1", show_default=True,
                                 help="Address the metrics endpoint binds to (0.0.0.0 to expose it)."),
    "otlp_endpoint": click.option("--otlp-endpoint", default=None,
                                  help="Also push metrics over OTLP to this endpoint."),
    "metrics_history": click.option("--metrics-history", default=None, type=click.Path(dir_okay=False),
                                    help="Append the metrics history (a line per batch and marker, for `event-etl "
                                    "graphs` without Prometheus) to this local file. Default: "
                                    "<checkpoint>/metrics-history.jsonl. Rotated to FILE.1 past 8 MiB."),
    "engine": click.option("--engine", type=click.Choice(["shared", "queries"]), default=None,
                           help="Kept for scripts of 0.3: shared, the one engine, changes nothing; queries (one Spark "
                           "streaming query per type) was removed in 0.4 and is refused (docs/upgrading.md)."),
}


def refuse_removed_engine(job: dict[str, Any]) -> None:
    """Take ``--engine`` out of a job's parsed options: ``shared`` (or none) is the one engine, and changes nothing;
    ``queries`` was removed in 0.4: a :class:`UsageError` (exit 2), before anything starts."""
    if job.pop("engine", None) == "queries":
        raise UsageError("--engine queries was removed in 0.4: every job runs through the shared engine, which goes "
                         "on from the checkpoint a query left (docs/upgrading.md)",
                         fix="drop --engine (the shared engine is the one engine)")


def job_options(*, master: Callable[[Command], Command] | None) -> Callable[[Command], Command]:
    """Decorate a command with every option of a streaming job (the command adds EVENT_TYPE and --event-types).

    ``master`` is the command's own ``--master`` option (optional for `run`, required for
    `submit`), or None for the driver of a submitted job, whose master comes from spark-submit.
    """
    decorators = [master if name == "master" else opt for name, opt in JOB_OPTIONS.items()]

    def apply(fn: Command) -> Command:
        for decorate in reversed([d for d in decorators if d is not None]):
            fn = decorate(fn)
        return fn

    return apply


def job_run_options(*, conf: tuple[str, ...] = (), **values: Any) -> RunOptions:
    """The :class:`~event_etl.job.setup.RunOptions` of the values parsed by :func:`job_options`."""
    from event_etl.job.setup import RunOptions

    refuse_removed_engine(values)
    if values.get("trigger_interval") is not None:
        values["trigger_interval"] = to_duration(values["trigger_interval"]).text  # "5000ms"
    return RunOptions(conf=parse_conf(conf), **values)


def reads_settings_once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A command run outside ``event-etl``'s group (the driver of a submitted job): its ``EVENT_ETL_*`` settings
    read once as it starts, as the group does for its commands (:func:`event_etl.settings.settings_in_force`)."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        with settings_in_force():
            return fn(*args, **kwargs)

    return command


def check_type_source(et: EventType) -> None:
    """A type's ``source`` setting of a kind a job knows (:class:`ConfigError` naming its etl.toml and the field), so
    that ``check`` and ``types`` report a misspelt scheme instead of listing the type as fine; the rest of it (a
    cluster's address, a folder) is the job's to check where it runs."""
    from event_etl.sources.registry import type_source_kind

    type_source_kind(et)


_MASTER = re.compile(r"^(local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|"
                     r"spark://[^\s/]+(:\d+)?(,[^\s/]+(:\d+)?)*|k8s://\S+)$")
"""The master URLs Spark 4 takes (``SparkContext``'s forms; Mesos is gone from Spark 4)."""


def check_master(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--master``: one of Spark's forms, said before Spark starts (a bad one killed its JVM with a Java trace)."""
    if value is not None and not _MASTER.match(value.strip()):
        raise click.BadParameter(
            f"{value!r} is not a Spark master: write local, local[N], local[*], local[N,F], spark://HOST:PORT, yarn or "
            "k8s://https://HOST:PORT, e.g. --master 'local[2]' or your cluster's spark://HOST:7077")
    return value.strip() if value is not None else None
