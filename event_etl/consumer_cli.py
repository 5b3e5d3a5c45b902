"""Commands for batch consumers: ``wait``, ``hours``, ``verify``, ``cat``, ``audit``.

Each command parses its options, calls one function of :mod:`event_etl.consumer` and
prints the answer; the exit code says what kind of answer it was
(:class:`event_etl.consumer.errors.ExitCode`): 0 complete/ok, 2 usage error, 3 timeout or
not complete yet, 4 could not check the sink, 5 verification failed or audit mismatch.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click

from event_etl.cli import _load_type, event_types_option, handles_errors, main, sink_option
from event_etl.consumer import (
    AuditResult,
    HourState,
    audit_hour,
    hour_statuses,
    read_count_file,
    verify_hour,
    verify_hours,
    wait_for_hour,
    write_avro,
    write_jsonl,
)
from event_etl.consumer.errors import EXIT_CODE_MEANINGS, ExitCode
from event_etl.consumer.hours import hour_ms, hour_text, window
from event_etl.errors import UsageError
from event_etl.timeutil import format_duration, iso, now_millis, parse_duration, to_datetime, to_millis

__all__ = ["wait_cmd", "hours_cmd", "verify_cmd", "cat_cmd", "audit_cmd"]

EXIT_CODES_HELP = "\b\nExit codes:\n" + "\n".join(f"  {int(c)}  {m}" for c, m in EXIT_CODE_MEANINGS.items())


class HourType(click.ParamType):
    """An hour on the command line: ISO-8601 UTC; anything else is a usage error (exit code 2)."""

    name = "HOUR"

    def convert(self, value: Any, param, ctx) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return to_datetime(hour_ms(value))
        except UsageError as err:
            why = str(err.__cause__ or err.message)
            self.fail(why if "e.g." in why else f"{why}; write it in UTC, e.g. 2026-11-21T13 or 2026-11-21T13:00Z",
                      param, ctx)


class DurationType(click.ParamType):
    """A duration such as 90s, 5m or 2h, in seconds."""

    name = "DURATION"

    def convert(self, value: Any, param, ctx) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(value) / 1000
        except ValueError as err:
            self.fail(str(err), param, ctx)


HOUR = HourType()
DURATION = DurationType()


def _exit(code: ExitCode) -> None:
    sys.exit(int(code))


def _when(dt: datetime | None) -> str:
    return "-" if dt is None else iso(to_millis(dt))


class _ChangesPrinter:
    """Prints the status of the hour waited for when it changes (to stderr: stdout is for the answer)."""

    def __init__(self) -> None:
        self.last: tuple | None = None

    def __call__(self, status) -> None:
        key = (status.hour, status.state)
        if key != self.last and status.state in (HourState.OPEN, HourState.NOT_STARTED):
            click.echo(f"waiting: {status.describe()}", err=True)
        self.last = key


@main.command("wait", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR)
@click.option("--timeout", type=DURATION, default=None,
              help="Give up after this long (90s, 5m, 2h) with exit code 3. Default: no limit; 0: look once.")
@click.option("--poll-interval", type=DURATION, default="2s", show_default=True, help="Time between two looks.")
@sink_option
@event_types_option
@handles_errors
def wait_cmd(event_type: str, hour: datetime, timeout: float | None, poll_interval: float, sink: str,
             event_types_dir: str | None) -> None:
    """Wait until HOUR of EVENT_TYPE is complete (its _COMPLETE marker is there), then print its summary.

    HOUR is UTC, e.g. 2026-11-21T13 or 2026-11-21T13:00Z. A storage failure that outlasts the storage
    layer's retries ends the wait with exit code 4: it is never taken for "not complete yet".
    Ctrl-C, SIGTERM or SIGHUP end the wait at once with one line and exit code 128 + the signal's number.
    """
    from event_etl.stopping import Interrupted, StopSignals

    et = _load_type(event_types_dir, event_type)
    stops = StopSignals()

    class _Stopped(Exception):
        pass

    def nap(seconds: float) -> None:  # the main loop acts on a signal: handlers only record it
        if not stops.requested:
            stops.sleep(seconds)
        if stops.requested:
            raise _Stopped

    with stops:
        try:
            m = wait_for_hour(sink, et, hour, timeout=timeout, poll_interval=poll_interval,
                              on_status=_ChangesPrinter(), sleep=nap)
        except _Stopped:
            from event_etl.stopping import signal_name

            raise Interrupted(stops.first, f"interrupted ({signal_name(stops.first)}): {et.name} {hour_text(hour)} "
                                           "was not complete yet") from None
    click.echo(f"{et.name} {hour_text(hour)} complete: records {m.records:,} (late {m.late_records:,})  files "
               f"{len(m.files)}  completed at {_when(to_datetime(m.completed_at))}  marker delay "
               f"{format_duration(m.marker_delay_ms)}")


@main.command("hours", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.option("--since", type=HOUR, default=None, help="First hour shown. Default: 23 hours before the current hour.")
@click.option("--until", type=HOUR, default=None,
              help="First hour NOT shown (ranges are half-open). Default: the hour after the current one.")
@sink_option
@event_types_option
@handles_errors
def hours_cmd(event_type: str, since: datetime | None, until: datetime | None, sink: str,
              event_types_dir: str | None) -> None:
    """Show the state of the hours of EVENT_TYPE: complete, audited, mismatch, open, not started or never.

    "never": before the first hour the job marked, so no marker will come. HOUR values are UTC.
    """
    et = _load_type(event_types_dir, event_type)
    since, until = _window(since, until, include_current=True)
    rows = [("hour", "status", "records", "late", "files", "completed at", "marker delay")]
    for s in hour_statuses(sink, et, since, until):
        rows.append((
            hour_text(s.hour), str(s.state), _count(s.records), _count(s.late_records), str(s.data_files),
            _when(s.completed_at), "-" if s.manifest is None else format_duration(s.manifest.marker_delay_ms),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) if i in (0, 1, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                   .rstrip())


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _window(since: datetime | None, until: datetime | None, *, include_current: bool) -> tuple[datetime, datetime]:
    lo, hi = window(None if since is None else to_millis(since), None if until is None else to_millis(until),
                    now=now_millis(), include_current=include_current)
    return to_datetime(lo), to_datetime(hi)


@main.command("verify", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR, required=False)
@click.option("--since", type=HOUR, default=None, help="Verify the complete hours from this one on (instead of HOUR).")
@click.option("--until", type=HOUR, default=None,
              help="With --since: the first hour NOT verified (half-open). Default: the current hour.")
@sink_option
@event_types_option
@handles_errors
def verify_cmd(event_type: str, hour: datetime | None, since: datetime | None, until: datetime | None, sink: str,
               event_types_dir: str | None) -> None:
    """Check that complete hours hold exactly what their manifests list: no missing, extra or corrupted file.

    Sizes, sha256 and record counts of every listed file are recomputed. Give one HOUR (UTC, e.g.
    2026-11-21T13), or a range with --since [--until]. In a range, hours that are not complete are shown
    and not verified; exit code 3 if any of them (other than "never" hours) is still open, 5 if any hour
    failed.
    """
    if (hour is None) == (since is None):
        raise click.UsageError("give either HOUR or --since (with an optional --until)")
    if until is not None and since is None:
        raise click.UsageError("--until goes with --since")
    et = _load_type(event_types_dir, event_type)
    if hour is not None:
        reports = [verify_hour(sink, et, hour)]
    else:
        reports = verify_hours(sink, et, *_window(since, until, include_current=False))
    for r in reports:
        click.echo(r.describe())
    if any(r.checked and not r.ok for r in reports):
        _exit(ExitCode.FAILED)
    if any(not r.checked and r.state is not HourState.NEVER for r in reports):
        _exit(ExitCode.NOT_COMPLETE)


@main.command("cat", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR)
@click.option("--format", "fmt", type=click.Choice(["jsonl", "avro"]), default="jsonl", show_default=True,
              help="jsonl: one JSON object per record (timestamps as ISO-8601 UTC, bytes as base64); "
              "avro: one Avro container file.")
@click.option("--late/--no-late", default=True, show_default=True,
              help="Include the late records the hour holds (records of earlier hours that arrived after those "
              "were complete).")
@click.option("--until", type=HOUR, default=None,
              help="Print every hour from HOUR up to this one (not included); each must be complete.")
@click.option("--reader-schema", "reader_schema", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Read every record into this Avro schema (.avsc), by Avro's resolution rules. Default: the "
              "event type's current schema.avsc, so hours written before and after a schema change read alike.")
@sink_option
@event_types_option
@handles_errors
def cat_cmd(event_type: str, hour: datetime, fmt: str, late: bool, until: datetime | None, reader_schema: str | None,
            sink: str, event_types_dir: str | None) -> None:
    """Print the records of a complete HOUR of EVENT_TYPE: exactly the files its manifest lists.

    HOUR is UTC, e.g. 2026-11-21T13. An hour that is not complete is not read (exit code 3): run
    `event-etl wait` first. Records come in the type's current schema (or --reader-schema FILE),
    also from files written in an earlier version of it.
    """
    et = _load_type(event_types_dir, event_type)
    schema = None
    if reader_schema is not None:
        from event_etl.eventtypes import load_schema_file

        schema = load_schema_file(reader_schema)
    if fmt == "avro":
        out = sys.stdout.buffer
        if out.isatty():
            raise UsageError("--format avro writes binary data", fix="redirect it: event-etl cat ... --format avro > hour.avro")
        write_avro(sink, et, hour, out, include_late=late, until=until, reader_schema=schema)
        out.flush()
    else:
        write_jsonl(sink, et, hour, sys.stdout, include_late=late, until=until, reader_schema=schema)


@main.command("audit", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR)
@click.option("--expected", type=click.IntRange(0), default=None, help="The number of events the source sent for HOUR.")
@click.option("--count-file", default=None,
              help='Take the expected number from a count file the publisher wrote (local path or gs:// URL): '
              '{"event_type": ..., "counts": {"2026-11-21T13:00:00Z": 1234}}.')
@sink_option
@event_types_option
@handles_errors
def audit_cmd(event_type: str, hour: datetime, expected: int | None, count_file: str | None, sink: str,
              event_types_dir: str | None) -> None:
    """Compare a complete HOUR of EVENT_TYPE with the source's count and record the result (_AUDIT).

    The sink's count is the hour's timely records plus its late records found in later hours (up to
    the lateness horizon); the hour's late files, which hold earlier hours' records, do not count.
    A match or a final mismatch is recorded next to the marker, and `event-etl hours` then shows the
    hour as "audited" or "mismatch". Fewer records than expected while late records can still arrive
    is not recorded (exit code 3): audit again later.
    """
    if (expected is None) == (count_file is None):
        raise click.UsageError("give either --expected N or --count-file PATH")
    et = _load_type(event_types_dir, event_type)
    if count_file is not None:
        expected = read_count_file(count_file, event_type=et, hour=hour)
    rec = audit_hour(sink, et, hour, expected=expected, source=count_file or "--expected")
    late = "not attributable" if rec.late_records_found is None else (
        f"{rec.late_records_found:,} found in {rec.late_hours_checked} later hours")
    click.echo(f"{et.name} {hour_text(hour)} {rec.result}: counted {rec.counted:,} (timely {rec.timely_records:,}, late "
               f"{late}), expected {rec.expected:,}, difference {rec.difference:+,}")
    if rec.result is AuditResult.INCONCLUSIVE:
        click.echo(f"not recorded: late records of this hour can still arrive until the hour "
                   f"{hour_text(rec.lateness_horizon)} is complete; audit again later", err=True)
        _exit(ExitCode.NOT_COMPLETE)
    click.echo(f"recorded in _AUDIT at {_when(rec.audited_at)}")
    if rec.result is AuditResult.MISMATCH:
        _exit(ExitCode.FAILED)
