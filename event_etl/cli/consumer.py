"""Commands for batch consumers: ``wait``, ``hours``, ``verify``, ``cat``, ``audit``.

Each command parses its options, calls one function of :mod:`event_etl.consumer` and
prints the answer (``--json``: one JSON document on stdout); the exit code says what kind of
answer it was (:mod:`event_etl.exitcodes`): 0 complete/ok, 2 usage error, 3 timeout or not
complete yet, 4 could not check the sink, 5 verification failed or audit mismatch, 6 nothing
at all at ``<sink>/<event_type>/`` (a wrong sink).

These commands read a sink only: the manifest and the files carry what they need, so they
work without the event types folder (an installation with ``pip install event_etl``, no
extras) and load no other type than the one they name.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

import click

from event_etl.cli.options import EXIT_CODES_HELP, consumer_type, event_types_option, handles_errors, sink_option
from event_etl.cli.params import DURATION, Duration
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
from event_etl.consumer.errors import ExitCode
from event_etl.consumer.hours import hour_ms, hour_text, window
from event_etl.consumer.sink import type_name
from event_etl.consumer.status import HourStatus
from event_etl.errors import UsageError
from event_etl.eventtypes import DEFAULT_ALLOWED_LATENESS_MS, EventType
from event_etl.rules.delays import AHEAD, DRAINED, MARKER_DELAY_NAME, marked_early, marker_delay_text
from event_etl.rules.manifest import Manifest
from event_etl.timeutil import DAY_MS, HOUR_MS, iso, now_millis, to_datetime, to_millis

__all__ = ["wait_cmd", "hours_cmd", "complete_cmd", "verify_cmd", "cat_cmd", "audit_cmd", "late_cmd"]

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of text.")


if TYPE_CHECKING:
    _HourParam = click.ParamType[datetime, Any]
else:  # click's ParamType is generic only in recent releases (setup.cfg takes click 8.1 on)
    _HourParam = click.ParamType


class HourType(_HourParam):
    """An hour on the command line: ISO-8601 UTC; anything else is a usage error (exit code 2)."""

    name = "HOUR"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return to_datetime(hour_ms(value))
        except UsageError as err:
            why = str(err.__cause__ or err.message)
            self.fail(why if "e.g." in why else f"{why}; write it in UTC, e.g. 2026-11-21T13 or 2026-11-21T13:00Z",
                      param, ctx)


HOUR = HourType()


def _exit(code: ExitCode) -> NoReturn:
    sys.exit(int(code))


def _when(dt: datetime | None) -> str:
    return "-" if dt is None else iso(to_millis(dt))


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else iso(to_millis(dt))


def _echo_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2))


def _marker_delay(m: Manifest) -> str:
    """A manifest's marker delay as every command says it (:mod:`event_etl.rules.delays`): ``13m40s``, or
    ``drained`` / ``ahead`` for an hour marked before it ended by the wall clock; never a negative duration."""
    return marker_delay_text(m.marker_delay_ms, m.extra.get("closed_by"))


def _marked_early(m: Manifest | None) -> str | None:
    """``--json``'s ``marked_early``: ``drained``, ``ahead``, or None (``marker_delay_seconds`` is a delay)."""
    return None if m is None else marked_early(m.marker_delay_ms, m.extra.get("closed_by"))


def manifest_json(m: Manifest) -> dict[str, Any]:
    """The summary of a complete hour's manifest, for --json.  ``marker_delay_seconds`` is the manifest's figure (wall
    clock), negative for an hour marked before it ended; ``marked_early`` says why then (``drained``, ``ahead``)."""
    return {"event_type": m.event_type, "hour": iso(m.hour), "state": "complete", "records": m.records,
            "late_records": m.late_records, "bytes": m.bytes, "completed_at": iso(m.completed_at),
            "marker_delay_seconds": m.marker_delay_ms / 1000, "marked_early": _marked_early(m),
            "watermark": iso(m.watermark),
            "files": [{"name": f.name, "records": f.records, "bytes": f.bytes, "late": f.late} for f in m.files]}


def status_json(s: HourStatus) -> dict[str, Any]:
    """One hour's status, for --json (``marker_delay_seconds`` and ``marked_early`` as in :func:`manifest_json`)."""
    return {"event_type": s.event_type, "hour": hour_text(s.hour), "state": str(s.state), "records": s.records,
            "late_records": s.late_records, "data_files": s.data_files, "completed_at": _iso(s.completed_at),
            "marker_delay_seconds": None if s.manifest is None else s.manifest.marker_delay_ms / 1000,
            "marked_early": _marked_early(s.manifest),
            "audit": None if s.audit is None else s.audit.result.value,
            "first_complete": _iso(s.first_complete)}


class _ChangesPrinter:
    """Prints the status of the hour waited for when it changes (to stderr: stdout is for the answer)."""

    def __init__(self) -> None:
        self.last: tuple[datetime, HourState] | None = None

    def __call__(self, status: HourStatus) -> None:
        key = (status.hour, status.state)
        if key != self.last and status.state in (HourState.OPEN, HourState.NOT_STARTED):
            click.echo(f"waiting: {status.describe()}", err=True)
        self.last = key


@click.command("wait", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR)
@click.option("--timeout", type=DURATION, default=None,
              help="Give up after this long (90s, 5m, 2h, or seconds) with exit code 3. Default: no limit; 0: look "
                   "once.")
@click.option("--poll-interval", type=DURATION, default=None,
              help="Time between two looks at the marker. Default: 2s; 60s with --subscription.")
@click.option("--subscription", default=None, metavar="projects/P/subscriptions/S",
              help="Wake on the messages of the type's pubsub commit policy (a subscription of its topic) instead of "
                   "polling; the marker is still read (at once on a message, and every --poll-interval).")
@JSON_OPTION
@sink_option
@event_types_option
@handles_errors
def wait_cmd(event_type: str, hour: datetime, timeout: float | None, poll_interval: float | None,
             subscription: str | None, as_json: bool, sink: str, event_types_dir: str | None) -> None:
    """Wait until HOUR of EVENT_TYPE is complete (its _COMPLETE marker is there), then print its summary.

    HOUR is UTC, e.g. 2026-11-21T13 or 2026-11-21T13:00Z. A storage failure that outlasts the storage
    layer's retries ends the wait with exit code 4: it is never taken for "not complete yet".
    Ctrl-C, SIGTERM or SIGHUP end the wait at once with one line and exit code 128 + the signal's number.
    """
    from event_etl.job.stopping import Interrupted, StopSignals

    et = consumer_type(event_types_dir, event_type)
    name = type_name(et)
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
            if poll_interval is None:
                poll_interval = 60.0 if subscription else 2.0
            m = wait_for_hour(sink, et, hour, timeout=timeout, poll_interval=poll_interval,
                              on_status=_ChangesPrinter(), sleep=nap, subscription=subscription)
        except _Stopped:
            from event_etl.job.stopping import signal_name

            assert stops.first is not None  # nap() raises _Stopped once a signal is recorded
            raise Interrupted(stops.first, f"interrupted ({signal_name(stops.first)}): {name} {hour_text(hour)} "
                                           "was not complete yet") from None
    if as_json:
        _echo_json(manifest_json(m))
        return
    click.echo(f"{name} {hour_text(hour)} complete: records {m.records:,} (late {m.late_records:,})  files "
               f"{len(m.files)}  completed at {_when(to_datetime(m.completed_at))}  {MARKER_DELAY_NAME} "
               f"{_marker_delay(m)}")


@click.command("hours", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.option("--since", type=HOUR, default=None,
              help="First hour shown. Default: 23 hours before the last one shown, and not before the job's first.")
@click.option("--until", type=HOUR, default=None,
              help="First hour NOT shown (ranges are half-open). Default: the hour after the current one, or after "
              "the latest hour holding data when that is later (a generator's event clock runs ahead).")
@JSON_OPTION
@sink_option
@event_types_option
@handles_errors
def hours_cmd(event_type: str, since: datetime | None, until: datetime | None, as_json: bool, sink: str,
              event_types_dir: str | None) -> None:
    """Show the state of the hours of EVENT_TYPE: complete, audited, mismatch, open, not started or never.

    "never": before the first hour the job marked, so no marker will come. HOUR values are UTC. The marker
    delay is when the marker was written minus the end of its hour, on the wall clock (as the job's
    COMPLETE lines and `wait` say it): "drained" or "ahead" for an hour marked before it ended.
    """
    et = consumer_type(event_types_dir, event_type)
    if since is None and until is None:  # the hours that matter: up to the latest holding data, none before the first
        from event_etl.consumer.status import default_window

        lo, hi = default_window(sink, et, now=now_millis())
        since, until = to_datetime(lo), to_datetime(hi)
    else:
        since, until = _window(since, until, include_current=True)
    statuses = hour_statuses(sink, et, since, until)
    if as_json:
        _echo_json([status_json(s) for s in statuses])
        return
    rows = [("hour", "status", "records", "late", "files", "completed at", MARKER_DELAY_NAME)]
    early: dict[str, int] = {}
    for s in statuses:
        why = _marked_early(s.manifest)
        if why is not None:
            early[why] = early.get(why, 0) + 1
        rows.append((
            hour_text(s.hour), str(s.state), _count(s.records), _count(s.late_records), str(s.data_files),
            _when(s.completed_at), "-" if s.manifest is None else _marker_delay(s.manifest),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.ljust(w) if i in (0, 1, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                   .rstrip())
    if early.get(AHEAD):
        n = early[AHEAD]
        click.echo(f"ahead: {_hours_were(n)} marked before {_they(n)} ended by the wall clock: their event time "
                   "runs ahead of it (a generator's clock, as in the demo), so a marker delay says nothing there")
    if early.get(DRAINED):
        n = early[DRAINED]
        click.echo(f"drained: {_hours_were(n)} marked before {_they(n)} ended by the wall clock, by a drain (a "
                   "job stopped for good closes the hours holding data at once); records of them that arrive later "
                   "are late")


@click.command("complete", epilog=EXIT_CODES_HELP)
@click.argument("event_types", nargs=-1, metavar="[EVENT_TYPE]...")
@click.option("--day", default=None, metavar="YYYY-MM-DD",
              help="The UTC day to look at. Default: yesterday (UTC); or a range with --since/--until.")
@click.option("--since", type=HOUR, default=None, help="First hour looked at (instead of --day).")
@click.option("--until", type=HOUR, default=None,
              help="First hour NOT looked at (ranges are half-open). Default with --since: the current hour.")
@click.option("--never-final", is_flag=True,
              help="Count the hours before a type's first hour (\"never\": no marker will come, no data there) as "
                   "final. Without it they make the answer exit code 2, as `wait` on such an hour.")
@JSON_OPTION
@sink_option
@handles_errors
def complete_cmd(event_types: tuple[str, ...], day: str | None, since: datetime | None, until: datetime | None,
                 never_final: bool, as_json: bool, sink: str) -> None:
    """Is everything complete? The hours of several event types at once (all the sink's types when none is named),
    yesterday by default: a grid of one character per hour, and the verdict in the exit code, as `wait`'s: 0 every
    hour is complete, 3 not yet, 2 hours before a type's first hour ("never": the type has no data there, e.g. a
    type created today asked for yesterday) unless --never-final counts them as final.
    """
    from event_etl.consumer.grid import completeness, grid_lines, never_error, summarise

    if day is not None and (since is not None or until is not None):
        raise UsageError("--day and --since/--until both given", fix="pass a day, or a range of hours, not both")
    names = [type_name(n) for n in event_types]
    if since is not None:
        lo = to_millis(since)
        hi = to_millis(until) if until is not None else hour_ms(to_datetime(now_millis()))
    elif until is not None:
        raise UsageError("--until without --since", fix="pass --since too (or --day for a whole day)")
    else:
        lo = _day_ms(day) if day is not None else (now_millis() // DAY_MS - 1) * DAY_MS
        hi = lo + DAY_MS
    rows = completeness(sink, names, lo, hi, never_final=never_final)
    if as_json:
        _echo_json(summarise(rows, lo, hi))
    else:
        for line in grid_lines(rows, lo, hi):
            click.echo(line)
    error = never_error(rows)
    if error is not None:
        raise error
    if not rows or not all(r.is_complete for r in rows):
        sys.exit(int(ExitCode.NOT_COMPLETE))


def _hours_were(n: int) -> str:
    """``1 hour was`` / ``3 hours were``."""
    return f"{n} hour was" if n == 1 else f"{n} hours were"


def _they(n: int) -> str:
    return "it" if n == 1 else "they"


def _day_ms(day: str) -> int:
    try:
        return to_millis(datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC))
    except ValueError:
        raise UsageError(f"--day {day!r} is not a day", fix="write it as YYYY-MM-DD, e.g. 2026-11-27 (UTC)") from None


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _window(since: datetime | None, until: datetime | None, *, include_current: bool) -> tuple[datetime, datetime]:
    now = now_millis()
    lo, hi = window(None if since is None else to_millis(since), None if until is None else to_millis(until),
                    now=now, include_current=include_current)
    if include_current and since is not None and until is None and lo >= hi:  # --until defaulted to now's hour
        # (`hours`; `verify` names the complete hours it leaves out): say so, not "until ... is not after since"
        raise UsageError(f"--since {iso(lo)} is after the current hour by the wall clock ({iso(hi - HOUR_MS)}): no "
                         "hour from it on has begun yet",
                         fix=f"give --since {iso(hi - HOUR_MS)} or earlier, or an --until after --since to ask "
                             "for hours to come")
    return to_datetime(lo), to_datetime(hi)


@click.command("verify", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR, required=False)
@click.option("--since", type=HOUR, default=None, help="Verify the complete hours from this one on (instead of HOUR).")
@click.option("--until", type=HOUR, default=None,
              help="With --since: the first hour NOT verified (half-open). Default: the current hour by the wall "
              "clock; complete hours from it on are named on stderr (`left out: ...`), not verified.")
@JSON_OPTION
@sink_option
@event_types_option
@handles_errors
def verify_cmd(event_type: str, hour: datetime | None, since: datetime | None, until: datetime | None, as_json: bool,
               sink: str, event_types_dir: str | None) -> None:
    """Check that complete hours hold exactly what their manifests list: no missing, extra or corrupted file.

    Sizes, sha256 and record counts of every listed file are recomputed. Give one HOUR (UTC, e.g.
    2026-11-21T13), or a range with --since [--until]. In a range, hours that are not complete are shown
    and not verified; exit code 3 if any of them (other than "never" hours) is still open, 5 if any hour
    failed. Without --until the range ends at the current hour by the wall clock: complete hours from it
    on (event time ahead of the wall clock, or a drain) are named in a `left out:` line on stderr.
    """
    if (hour is None) == (since is None):
        raise click.UsageError("give either HOUR or --since (with an optional --until)")
    if until is not None and since is None:
        raise click.UsageError("--until goes with --since")
    et = consumer_type(event_types_dir, event_type)
    if hour is not None:
        reports = [verify_hour(sink, et, hour)]
    else:
        from event_etl.consumer.verify import complete_hours_from, left_out_text

        lo, hi = _window(since, until, include_current=False)
        # without --until the wall clock's hour ends the range: complete hours after it are named, never left out
        # in silence (a generator's event time runs ahead of the wall clock; a drain marks the open hour)
        left_out = complete_hours_from(sink, et, max(lo, hi)) if until is None else []
        reports = verify_hours(sink, et, lo, hi) if hi > lo or not left_out else []
        if left_out:
            click.echo(left_out_text(left_out, max(lo, hi)), err=True)
    if as_json:
        _echo_json([{"event_type": r.event_type, "hour": hour_text(r.hour), "state": str(r.state), "checked": r.checked,
                     "ok": r.ok, "files": r.files, "records": r.records, "missing": list(r.missing),
                     "extra": list(r.extra), "corrupted": [{"name": p.name, "what": p.what, "expected": p.expected,
                                                            "found": p.found} for p in r.corrupted]}
                    for r in reports])
    else:
        for r in reports:
            click.echo(r.describe())
    if any(r.checked and not r.ok for r in reports):
        _exit(ExitCode.FAILED)
    if any(not r.checked and r.state is not HourState.NEVER for r in reports):
        _exit(ExitCode.NOT_COMPLETE)


@click.command("cat", epilog=EXIT_CODES_HELP)
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
    """Print the records of a complete HOUR of EVENT_TYPE: exactly the files its manifest lists, the hour's own
    records first, then its late records (records of earlier hours; --no-late leaves them out; a line on stderr
    says how many).

    HOUR is UTC, e.g. 2026-11-21T13. An hour that is not complete is not read (exit code 3): run
    `event-etl wait` first. Records come in the type's current schema (or --reader-schema FILE),
    also from files written in an earlier version of it.
    """
    et = consumer_type(event_types_dir, event_type)
    schema = None
    if reader_schema is not None:
        from event_etl.eventtypes import load_schema_file

        schema = load_schema_file(reader_schema)
    if fmt == "avro":
        out = sys.stdout.buffer
        if out.isatty():
            raise UsageError("--format avro writes binary data",
                             fix="redirect it: event-etl cat ... --format avro > hour.avro")
        count = write_avro(sink, et, hour, out, include_late=late, until=until, reader_schema=schema)
        out.flush()
    else:
        count = write_jsonl(sink, et, hour, sys.stdout, include_late=late, until=until, reader_schema=schema)
    if late:  # said on stderr (stdout is the records): late records are in by default, and where they come
        statuses = hour_statuses(sink, et, hour, until if until is not None else to_datetime(to_millis(hour) + HOUR_MS))
        late_records = sum(s.late_records or 0 for s in statuses)
        if late_records:
            click.echo(f"{count:,} records, the last {late_records:,} of them late records of earlier hours that "
                       "arrived after those were complete (--no-late leaves them out)", err=True)


@click.command("late", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR)
@click.option("--allowed-lateness", type=DURATION, default=None,
              help="How long after HOUR late records of it can land (etl.toml's allowed_lateness). Default: the "
              "type's when the event types folder has it, else 24h.")
@JSON_OPTION
@sink_option
@event_types_option
@handles_errors
def late_cmd(event_type: str, hour: datetime, allowed_lateness: Duration | None, as_json: bool, sink: str,
             event_types_dir: str | None) -> None:
    """Where the late records of HOUR of EVENT_TYPE went: the later hours that hold some, with how many.

    A record whose hour was already complete is written into the hour open when it arrived; that hour's
    manifest counts it under HOUR (`late_event_hours`). A consumer that processed HOUR revisits those hours.
    The answer is final once every hour where they could land (up to allowed_lateness after HOUR) is complete.
    """
    from event_etl.consumer.late import describe, late_records_of

    et = consumer_type(event_types_dir, event_type)
    report = late_records_of(sink, et, hour, allowed_lateness_ms=None if allowed_lateness is None
                             else allowed_lateness.millis)
    if as_json:
        _echo_json(report.to_json())
        return
    for line in describe(report):
        click.echo(line)


@click.command("audit", epilog=EXIT_CODES_HELP)
@click.argument("event_type")
@click.argument("hour", type=HOUR)
@click.option("--expected", type=click.IntRange(0), default=None, help="The number of events the source sent for HOUR.")
@click.option("--count-file", default=None,
              help='Take the expected number from a count file the publisher wrote (local path or gs:// URL): '
              '{"event_type": ..., "counts": {"2026-11-21T13:00:00Z": 1234}}.')
@click.option("--time-field", default=None, metavar="FIELD",
              help="Without the event types folder: the field holding the event time (etl.toml's time_field).")
@click.option("--time-format", type=click.Choice(["epoch_millis", "epoch_seconds", "iso8601"]), default=None,
              help="Without the event types folder: etl.toml's time_format (default epoch_millis; a timestamp-millis "
              "field is read as such).")
@click.option("--allowed-lateness", type=DURATION, default=None,
              help="Without the event types folder: etl.toml's allowed_lateness (default 24h).")
@JSON_OPTION
@sink_option
@event_types_option
@handles_errors
def audit_cmd(event_type: str, hour: datetime, expected: int | None, count_file: str | None, time_field: str | None,
              time_format: str | None, allowed_lateness: Duration | None, as_json: bool, sink: str,
              event_types_dir: str | None) -> None:
    """Compare a complete HOUR of EVENT_TYPE with the source's count and record the result (_AUDIT).

    The sink's count is the hour's timely records plus its late records found in later hours (up to
    the lateness horizon); the hour's late files, which hold earlier hours' records, do not count.
    A match or a final mismatch is recorded next to the marker, and `event-etl hours` then shows the
    hour as "audited" or "mismatch". Fewer records than expected while late records can still arrive
    is not recorded (exit code 3): audit again later.

    The rule needs the type's time field and allowed lateness: from its etl.toml when the event types
    folder has the type, else from --time-field [--time-format] [--allowed-lateness] (the schema comes
    from the hour's files).
    """
    if (expected is None) == (count_file is None):
        raise click.UsageError("give either --expected N or --count-file PATH")
    et = _audit_type(consumer_type(event_types_dir, event_type), sink, hour, time_field, time_format,
                     allowed_lateness)
    if count_file is not None:
        expected = read_count_file(count_file, event_type=et, hour=hour)
    assert expected is not None  # one of --expected and --count-file, checked above
    rec = audit_hour(sink, et, hour, expected=expected, source=count_file or "--expected")
    if as_json:
        _echo_json({**rec.to_json(), "difference": rec.difference, "recorded": rec.recorded})
        if rec.result is AuditResult.INCONCLUSIVE:
            _exit(ExitCode.NOT_COMPLETE)
        if rec.result is AuditResult.MISMATCH:
            _exit(ExitCode.FAILED)
        return
    late = "not attributable" if rec.late_records_found is None else (
        f"{rec.late_records_found:,} found in {rec.late_hours_checked} later hours")
    click.echo(f"{et.name} {hour_text(hour)} {rec.result}: counted {rec.counted:,} (timely {rec.timely_records:,}, "
               f"late "
               f"{late}), expected {rec.expected:,}, difference {rec.difference:+,}")
    if rec.result is AuditResult.INCONCLUSIVE:
        click.echo(f"not recorded: late records of this hour can still arrive until the hour "
                   f"{hour_text(rec.lateness_horizon)} is complete; audit again later", err=True)
        _exit(ExitCode.NOT_COMPLETE)
    click.echo(f"recorded in _AUDIT at {_when(rec.audited_at)}")
    if rec.result is AuditResult.MISMATCH:
        _exit(ExitCode.FAILED)


def _audit_type(et: EventType | str, sink: str, hour: datetime, time_field: str | None, time_format: str | None,
                allowed_lateness: Duration | None) -> EventType:
    """The loaded event type, or one made of the files' schema and the command's settings."""
    from event_etl.consumer.read import writer_schema
    from event_etl.eventtypes import event_type_from_settings
    from event_etl.timeutil import HOUR_MS

    given = {k: v for k, v in (("time_field", time_field), ("time_format", time_format),
                               ("allowed_lateness", None if allowed_lateness is None else allowed_lateness.text))
             if v is not None}
    if not isinstance(et, str):
        if given:
            option = next(iter(given)).replace("_", "-")
            raise UsageError(f"{et.name}'s settings come from {et.settings_file}; --{option} "
                             "is for a sink read without the event types folder",
                             fix="leave out --time-field, --time-format and --allowed-lateness")
        return et
    if "time_field" not in given:
        raise UsageError(f"auditing {et} needs its time field and allowed lateness, and no event types folder has {et}",
                         fix="pass --time-field FIELD (and --time-format, --allowed-lateness if not the defaults), "
                         "or --event-types DIR")
    lateness = allowed_lateness if allowed_lateness is not None else DEFAULT_ALLOWED_LATENESS_MS / 1000
    h = hour_ms(hour)
    schema = None
    for later in range(h, h + HOUR_MS + int(lateness * 1000) + HOUR_MS, HOUR_MS):
        from event_etl.consumer import hour_status

        if not hour_status(sink, et, hour_text(later)).is_complete:
            break
        schema = writer_schema(sink, et, hour_text(later))
        if schema is not None:
            break
    if schema is None:  # no file to take a schema from: nothing late can be attributed either
        schema = {"type": "record", "name": et, "fields": [{"name": given["time_field"], "type": "long"}]}
        if given.get("time_format") == "iso8601":
            schema["fields"][0]["type"] = "string"
    return event_type_from_settings(et, schema, given, origin="--time-field/--time-format/--allowed-lateness")
