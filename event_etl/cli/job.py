"""The commands of the streaming job: ``types``, ``run`` (one type or a fleet), ``drain``, ``status``, ``deadletter``
and ``warmup``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from event_etl.cli.consumer import HOUR
from event_etl.cli.options import (
    check_master,
    check_type_source,
    consumer_type,
    event_types_option,
    handles_errors,
    job_options,
    job_run_options,
    load_type,
    refuse_removed_engine,
    sink_option,
    type_names,
)
from event_etl.cli.params import require_extra
from event_etl.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType

__all__ = ["types_cmd", "run_cmd", "drain_cmd", "status_cmd", "deadletter_cmd", "warmup_cmd"]


@click.command("types")
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
            check_type_source(types[name])
        except ConfigError as err:  # shown, and the command fails at the end; the other types still list
            types.pop(name, None)
            broken[name] = err
    if as_json:
        click.echo(
            json.dumps({n: {"directory": t.directory, **t.settings_summary()} for n, t in types.items()}, indent=2)
        )
    else:
        _print_types(root, types, broken)
    if broken:
        raise next(iter(broken.values()))


def _print_types(root: Path, types: dict[str, EventType], broken: dict[str, ConfigError]) -> None:
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


@click.command("run")
@click.argument("event_types", nargs=-1, metavar="EVENT_TYPE...")
@click.option("--all", "all_types", is_flag=True, help="Run every event type of --event-types (a fleet).")
@job_options(master=click.option("--master", default=None, callback=check_master,
                                 help="Spark master. Default: local[*]."))
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
    Stop with Ctrl-C, SIGTERM or SIGHUP, sent to the process or to its whole group: the batch in
    flight finishes, the job saves and stops, exit 0, and no hour the watermark has not passed is
    marked: a restart on the same checkpoint continues where the job stopped (a deploy's restart
    brings no late events). One signal that reaches the job twice within 0.5 s (`timeout` signals
    the process and its group) is one stop; a second Ctrl-C or SIGTERM after that stops at once
    (exit 130 or 143). To stop for good and close every hour holding data (a drain): start it with
    --drain-on-stop (SIGTERM and SIGHUP then drain), or ask the running job with `event-etl drain
    EVENT_TYPE` (SIGUSR1). The last line says the exit code: `[TYPE] run finished: exit 0 (...)`.

    Several types (or --all) run as a fleet in one Spark application, through one shared
    micro-batch loop (one Spark job per trigger for every type with input). Each type keeps its
    own source (its `source` setting), checkpoint (DIR/<type> of --checkpoint-root DIR, which a
    fleet also takes as --checkpoint DIR), watermark, markers, dead-letter area and metrics; a
    type that fails is quarantined and tried again with backoff while the others go on.
    `event-etl status` shows every type.
    """
    refuse_removed_engine(job)  # --engine queries: removed in 0.4
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
    from event_etl.job.driver import run
    from event_etl.job.stopping import say

    if all_types:
        from event_etl.eventtypes import load_event_types, resolve_event_types_dir

        types = list(load_event_types(resolve_event_types_dir(event_types_dir)).values())
    else:
        types = [load_type(event_types_dir, name) for name in event_types]
    summaries = run(types, job_run_options(**job), fleet=fleet, echo=say)
    if fleet:
        from event_etl.job.fleet import report_fleet

        report_fleet(summaries, again="run the fleet again", echo=click.echo)


@click.command("drain")
@click.argument("event_types", nargs=-1, required=True, metavar="EVENT_TYPE...")
@click.option("--checkpoint", default=None, metavar="DIR",
              help="The job's checkpoint, as `run` was given it (a fleet's --checkpoint ROOT: ROOT/<type>).")
@click.option("--checkpoint-root", "checkpoint_root", default="./checkpoints", show_default=True, metavar="DIR",
              help="Without --checkpoint: the folder of the checkpoints, one per type (DIR/<type>).")
@click.option("--wait", is_flag=True, help="Wait until the job has drained and stopped.")
@handles_errors
def drain_cmd(event_types: tuple[str, ...], checkpoint: str | None, checkpoint_root: str, wait: bool) -> None:
    """Ask the running job of EVENT_TYPE to drain and stop: for a job stopped for good.

    A plain stop (Ctrl-C, SIGTERM, SIGHUP) leaves the hours the watermark has not passed open for
    the next run. A drain finishes the batch in flight, reads what the source has already taken
    (a Pub/Sub spool), marks every hour holding data complete and stops (exit 0). This command
    sends SIGUSR1 to the job's process, found by the checkpoint lock it holds (as `event-etl
    status` finds it), on this host; `kill -USR1 PID` does the same. A fleet drains all its
    types. A job that is not running: `event-etl run EVENT_TYPE --once --drain`.
    """
    from event_etl.job.drainrequest import ask_to_drain, checkpoint_of, lock_holder

    asked: dict[int, list[tuple[str, Any]]] = {}
    for name in event_types:
        ck = checkpoint_of(name, checkpoint=checkpoint, checkpoint_root=checkpoint_root)
        holder = lock_holder(ck)
        if holder is not None and holder.get("pid") in asked:  # a fleet: asked once already
            asked[holder["pid"]].append((name, ck))
            continue
        holder = ask_to_drain(name, ck)
        asked[holder["pid"]] = [(name, ck)]
        click.echo(f"[{name}] asked pid {holder['pid']} (running since {holder.get('started_at')}, checkpoint {ck}) "
                   "to drain and stop")
    if not wait:
        return
    from event_etl.job.stopping import Interrupted, StopSignals, signal_name

    with StopSignals() as stops:
        while any(lock_holder(ck) is not None for types in asked.values() for _, ck in types):
            if stops.first is not None:
                raise Interrupted(stops.first, f"interrupted ({signal_name(stops.first)}): stopped waiting; the job "
                                  "goes on draining")
            stops.sleep(0.5)
    for pid, types in asked.items():
        click.echo(f"[{', '.join(n for n, _ in types)}] pid {pid} has stopped; its last line says how it ended")


@click.command("status")
@click.argument("event_types", nargs=-1, metavar="[EVENT_TYPE]...")
@sink_option
@click.option("--checkpoint-root", "--checkpoint", "checkpoint_root", default="./checkpoints", show_default=True,
              metavar="DIR", help="Folder holding the checkpoints of the types (DIR/<type>), as `run` was given it "
              "(--checkpoint-root, or a fleet's --checkpoint).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@event_types_option
@handles_errors
def status_cmd(event_types: tuple[str, ...], sink: str, checkpoint_root: str, as_json: bool,
               event_types_dir: str | None) -> None:
    """Show every event type's job (or those named): running or not, watermark, lag, last marker, restarts, last
    error.

    A sink that holds nothing for any type, or nothing for a type whose checkpoint exists, is a
    wrong --sink (exit code 6), not "never run".

    A job with no watermark yet whose type's dead letters hold events dead-lettered for max_backfill
    (before_backfill: a backfill older than the bound) says how many and how to take them (before_backfill
    in --json).

    For a Pub/Sub type also how far back a seek of its subscription must go for Pub/Sub to deliver
    again everything the job has not committed ("Pub/Sub: a seek must go back to T"; seek_to in
    --json): the earlier of the oldest open hour's start minus out_of_orderness and the oldest
    publish time the spool holds (docs/runbook.md, "Seek a subscription back").
    """
    from event_etl.eventtypes import resolve_event_types_dir
    from event_etl.job.status import job_statuses

    types_dir = resolve_event_types_dir(event_types_dir)
    names = type_names(types_dir)
    unknown = [n for n in event_types if n not in names]
    if unknown:
        raise UsageError(f"no event type {unknown[0]!r} in {types_dir}",
                         fix=f"known types: {', '.join(names) or '(none)'}; or point --event-types at another folder")
    if event_types:
        names = [n for n in names if n in event_types]
    rows = job_statuses(names, sink=sink, checkpoint_root=checkpoint_root, types_dir=types_dir)
    _check_status_sink(sink, rows)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'event type':<24} {'state':<11} {'watermark':<25} {'lag':>8}  {'last marker':<21} {'restarts':>8}")
    said_buses: set[str] = set()
    for r in rows:
        click.echo(f"{r['event_type']:<24} {r['state']:<11} {r['watermark'] or '-':<25} {r['lag'] or '-':>8}  "
                   f"{r['last_marker'] or '-':<21} {r['restarts'] if r['restarts'] is not None else '-':>8}"
                   + (f"  last error: {r['last_error']}" if r.get("last_error") else ""))
        if r.get("source_down"):
            click.echo(f"  source DOWN: {r['source_down']}")
        if r.get("before_backfill"):  # a backfill older than max_backfill went to the dead letters, all of it
            click.echo(f"  {r['before_backfill']['line']}")
        if r.get("seek_to"):
            click.echo(f"  Pub/Sub: a seek must go back to {r['seek_to']} ({r['seek_to_by']}; from "
                       f"{r['seek_to_from']}): gcloud pubsub subscriptions seek SUBSCRIPTION --time={r['seek_to']}")
        if r.get("bus") and r["bus"]["bus"] not in said_buses:  # once per bus, under its first type
            b = r["bus"]
            said_buses.add(b["bus"])
            click.echo(f"  bus {b['bus']}: {b['unclaimed']} unclaimed message(s) kept in {b['unclaimed_at']}"
                       + (" (what a type claims of them: event-etl deadletter TYPE --unclaimed)"
                          if b["unclaimed"] else ""))
        for name, pol in (r.get("policies") or {}).items():
            click.echo(f"  policy {name} ({pol['kind']}): done through {pol['done_through'] or '-'}, "
                       f"{pol['pending']} pending, {pol['failures']} failures"
                       + (f"; last error at {pol['last_error_at']}: {pol['last_error']}" if pol["last_error"] else ""))


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


@click.command("deadletter")
@click.argument("event_type")
@sink_option
@click.option("--reason", default=None, help="Only records with this reason (e.g. invalid_json, too_late).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(0), help="At most this many (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record, payload in base64.")
@click.option("--counts", is_flag=True, help="Only the number of records per reason.")
@click.option("--replay-to", "replay_to", default=None, metavar="TARGET",
              help="Send the selected dead letters back through the live job's source: dir:PATH (a file in the folder "
              "the job reads), pubsub (the type's topic) or pubsub:projects/P/topics/T, kafka:TOPIC. Selection: "
              "--reason, --since/--until, --limit (default with --replay-to: all).")
@click.option("--since", type=HOUR, default=None, help="With --replay-to: only events of this hour or later (UTC).")
@click.option("--until", type=HOUR, default=None,
              help="With --replay-to: only events of hours before this one (half-open).")
@click.option("--again", is_flag=True, help="With --replay-to: send also what an earlier replay sent.")
@click.option("--too-late", "too_late", is_flag=True,
              help="With --replay-to: send also the events the live job would dead-letter as too_late again.")
@click.option("--future", is_flag=True,
              help="With --replay-to: send also the events whose event time is still more than the type's "
              "max_future_skew ahead of now (the job dead-letters them as future again).")
@click.option("--dry-run", "dry_run", is_flag=True, help="With --replay-to: say what would be sent; send nothing.")
@click.option("--checkpoint", default=None, metavar="DIR",
              help="With --replay-to: the live job's checkpoint (its watermark), as `run` was given it (a fleet's "
              "--checkpoint ROOT: ROOT/<EVENT_TYPE>).")
@click.option("--checkpoint-root", "checkpoint_root", default=None, metavar="DIR",
              help="With --replay-to, without --checkpoint: the folder of the checkpoints, one per type (DIR/<type>), "
              "as `run` was given it. Default: ./checkpoints.")
@click.option("--unclaimed", is_flag=True,
              help="The messages EVENT_TYPE's bus kept because no type claimed them (<sink>/_unclaimed/<bus id>/) "
              "that EVENT_TYPE claims now (its route_attribute/route_field and route_value), instead of its own dead "
              "letters; with --replay-to, sent back with the attributes they came with.")
@event_types_option
@handles_errors
def deadletter_cmd(event_type: str, sink: str, reason: str | None, limit: int, as_json: bool, counts: bool,
                   replay_to: str | None, since: Any, until: Any, again: bool, too_late: bool, future: bool,
                   dry_run: bool, checkpoint: str | None, checkpoint_root: str | None, unclaimed: bool,
                   event_types_dir: str | None) -> None:
    """Show the records of EVENT_TYPE that went to the dead-letter area, with their reasons.

    With --replay-to, send them back through the live job's source instead (docs/runbook.md, "Replaying dead
    letters"): the job takes them as new input, through its rules (timely into their hour, late into the open
    hour). Each replay is recorded in <sink>/<type>/_deadletter/_replays/; what an earlier replay sent is not sent
    again unless --again. Events whose hours the live job's watermark (read from its checkpoint: --checkpoint or
    --checkpoint-root; none found is an error unless --too-late) has passed by more than allowed_lateness would be
    too late again: counted before sending and left out unless --too-late. Events still more than max_future_skew
    ahead of now would be future again: counted and left out unless --future.

    With --unclaimed, the same for the messages EVENT_TYPE's bus kept unclaimed (docs/event-types.md, "One bus, many
    types") that EVENT_TYPE claims now: a type added to claim them, or a route_value widened, takes them back through
    the bus (each replay recorded in <sink>/_unclaimed/<bus id>/_replays/).
    """
    import base64
    from collections import Counter

    from event_etl.consumer.sink import open_sink, require_type_data, type_name
    from event_etl.timeutil import iso

    _check_reason(reason)
    et = consumer_type(event_types_dir, event_type)
    event_type = type_name(et)
    storage = open_sink(sink)
    bus = _bus_of(et, event_type) if unclaimed else None
    if bus is None:
        require_type_data(storage, event_type)
    replay_only = {"since": since, "until": until, "again": again, "too_late": too_late, "future": future,
                   "dry_run": dry_run, "checkpoint": checkpoint, "checkpoint_root": checkpoint_root}
    if replay_to is None:
        given = [n for n, v in replay_only.items() if v not in (None, False)]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} is an option of a replay",
                             fix="add --replay-to TARGET, or leave it out to list the dead letters")
    else:
        if as_json or counts:
            raise UsageError("--replay-to sends; --json and --counts list", fix="give one or the other")
        from event_etl.consumer.replay import Criteria
        from event_etl.timeutil import to_millis

        limit_given = click.get_current_context().get_parameter_source("limit") != click.core.ParameterSource.DEFAULT
        criteria = Criteria(reasons=[reason] if reason else [], since=None if since is None else to_millis(since),
                            until=None if until is None else to_millis(until),
                            limit=(limit or None) if limit_given else None, again=again, too_late=too_late,
                            future=future)
        _replay(storage, et, event_type, replay_to, criteria, dry_run=dry_run, checkpoint=checkpoint,
                checkpoint_root=checkpoint_root, bus=bus)
        return
    records = _letters(storage, event_type, reason, bus)
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


def _check_reason(reason: str | None) -> None:
    """``--reason`` must be a dead-letter reason (a typo listed nothing, exit 0, as if there were none)."""
    if reason is None:
        return
    import difflib

    from event_etl.rules.reasons import Reason

    known = [r.value for r in Reason]
    if reason not in known:
        close = difflib.get_close_matches(reason, known, n=1)
        raise UsageError(f"--reason {reason}: not a dead-letter reason",
                         fix=(f"did you mean '{close[0]}'? " if close else "") + f"reasons: {', '.join(known)}")


def _replay_checkpoint(event_type: str, checkpoint: str | None, checkpoint_root: str | None, *,
                       too_late: bool) -> Path | None:
    """The live job's checkpoint for ``deadletter --replay-to``, as ``run`` was given it: ``--checkpoint DIR`` (a
    fleet's ``--checkpoint ROOT``: ``ROOT/<type>``) or ``--checkpoint-root DIR`` (``DIR/<type>``, default
    ``./checkpoints``).  None found is an error: without the job's watermark nothing could be counted as too late
    again; only ``--too-late`` (send them all) does without it, and then None."""
    if checkpoint is not None and checkpoint_root is not None:
        raise UsageError("--checkpoint-root and --checkpoint say the same thing twice",
                         fix="give --checkpoint-root DIR (the type's checkpoint is DIR/<type>), or --checkpoint")
    if checkpoint is not None:
        ck = Path(checkpoint)
        if not (ck / "etl").is_dir() and (ck / event_type / "etl").is_dir():
            ck = ck / event_type  # a fleet's --checkpoint ROOT
        if not (ck / "etl").is_dir():
            raise UsageError(f"--checkpoint {checkpoint}: no job's checkpoint there",
                             fix="give the live job's checkpoint (as `run` was given it), or --checkpoint-root DIR")
        return ck
    ck = Path(checkpoint_root or "checkpoints") / event_type
    if (ck / "etl").is_dir():
        return ck
    if too_late and checkpoint_root is None:
        return None
    where = f"--checkpoint-root {checkpoint_root}" if checkpoint_root is not None else "the default, ./checkpoints"
    raise UsageError(
        f"no checkpoint of {event_type}'s job at {ck} ({where}): the live job's watermark there says which dead "
        "letters would be too late again",
        fix="give the live job's checkpoint as `run` was given it: --checkpoint DIR, or --checkpoint-root DIR (its "
            "DIR/<type>); or --too-late to send them all, too late or not")


def _letters(storage: Any, event_type: str, reason: str | None,
             bus: tuple[str, Callable[[Any], bool]] | None) -> Iterator[Any]:
    """What ``deadletter`` lists: the type's dead letters, or (``bus``) what its bus kept unclaimed that it claims."""
    from event_etl.consumer.sink import could_not_check
    from event_etl.storage.deadletter import iter_deadletters

    with could_not_check():
        if bus is None:
            yield from iter_deadletters(storage, event_type, reason=reason)
            return
        from event_etl.consumer.replay import load_unclaimed

        yield from (e.letter for e in load_unclaimed(storage, bus[0], bus[1])
                    if reason is None or e.letter.reason == reason)


def _bus_of(et: Any, event_type: str) -> tuple[str, Callable[[Any], bool]]:
    """``deadletter --unclaimed``: the type's bus id and what the type claims now of what its bus kept unclaimed."""
    from event_etl.bus.records import record_namer
    from event_etl.eventtypes import EventType
    from event_etl.rules.routing import bus_id, claimed_by
    from event_etl.sources.registry import job_source
    from event_etl.timeutil import now_millis

    if not isinstance(et, EventType):
        raise UsageError(f"--unclaimed needs the event type {event_type}'s settings (its source and route)",
                         fix="give the folder of the event types: --event-types DIR (or $EVENT_ETL_EVENT_TYPES)")
    route = et.route
    if route is None:
        raise UsageError(f"{event_type} reads no bus: it has no route_attribute, route_field or topic pattern",
                         fix="--unclaimed is for a type that shares its source with others (docs/event-types.md, "
                             "\"One bus, many types\"); leave it out to see the type's own dead letters")
    source = job_source(et, None, now=now_millis()).identity()
    namer = record_namer([et]) if route.by == "field" else None  # a framed payload: by its record's name
    return bus_id(source), lambda dl: claimed_by(route, dl.payload, dl.detail, dl.source, namer)


def _replay(storage: Any, et: Any, event_type: str, replay_to: str, criteria: Any, *, dry_run: bool,
            checkpoint: str | None, checkpoint_root: str | None,
            bus: tuple[str, Callable[[Any], bool]] | None = None) -> None:
    """``deadletter --replay-to``: plan, say, send (event_etl.consumer.replay); ``bus``: the type's bus's unclaimed
    messages it claims (``--unclaimed``), instead of its own dead letters."""
    from event_etl.consumer.replay import (
        LiveType,
        load_entries,
        load_unclaimed,
        parse_target,
        plan_replay,
        replay_records,
        run_replay,
    )
    from event_etl.consumer.sink import could_not_check
    from event_etl.eventtypes import EventType
    from event_etl.job.checkpoint import Checkpoint
    from event_etl.timeutil import format_duration, iso, now_millis

    if not isinstance(et, EventType):
        raise UsageError(f"--replay-to needs the event type {event_type}'s settings (its allowed_lateness, topic)",
                         fix="give the folder of the event types: --event-types DIR (or $EVENT_ETL_EVENT_TYPES)")
    target = parse_target(replay_to, (et.pubsub or {}).get("topic"))
    ck = _replay_checkpoint(event_type, checkpoint, checkpoint_root, too_late=criteria.too_late)
    if ck is not None:
        _check_live_job(ck, storage, target)
    watermark = Checkpoint(ck).load_state().watermark if ck and (ck / "etl" / "state.json").exists() else None
    lateness, skew = int(et.allowed_lateness), int(et.max_future_skew)
    now = now_millis()
    with could_not_check():
        entries = load_entries(storage, event_type) if bus is None else load_unclaimed(storage, bus[0], bus[1])
        records = replay_records(storage, event_type, None if bus is None else bus[0])
    live = LiveType(watermark=watermark, allowed_lateness=lateness, max_future_skew=skew, binary=et.payload != "json")
    plan = plan_replay(entries, records, target, now=now, criteria=criteria, live=live)
    wm = (iso(watermark) if watermark is not None else "- (none yet)" if ck is not None
          else "not read (no checkpoint; --too-late: nothing is left out as too late)")
    click.echo(f"[{event_type}] live job's watermark: {wm}; allowed_lateness {format_duration(lateness)}")
    _say_plan(event_type, plan, skew)
    if not plan.send:
        click.echo(f"[{event_type}] nothing to replay")
        return
    by_reason = ", ".join(f"{k} {v:,}" for k, v in sorted(_counts(e.reason for e in plan.send).items()))
    if dry_run:
        click.echo(f"[{event_type}] would send {len(plan.send):,} dead letters to {target.url} ({by_reason}); "
                   "dry run: nothing sent")
        return
    with could_not_check():
        rec = run_replay(storage, event_type, plan, now=now, clock=now_millis, bus=None if bus is None else bus[0])
    for note in rec.get("notes", []):
        click.echo(f"[{event_type}] {note}")
    folder = f"{event_type}/_deadletter/_replays" if bus is None else f"_unclaimed/{bus[0]}/_replays"
    where = storage.display(f"{folder}/{rec['replay']}.json")
    click.echo(f"[{event_type}] replay {rec['replay']}: sent {rec['count']:,} dead letters to {rec['sent_to']} "
               f"({by_reason}); recorded in {where}")


def _say_plan(event_type: str, plan: Any, max_future_skew: int) -> None:
    """What a replay leaves out, or sends although the job will dead-letter it again, and why: a line each."""
    from event_etl.timeutil import format_duration, iso

    sel = plan.selection
    for rid in plan.unfinished:
        click.echo(f"[{event_type}] warning: replay {rid} was cut short (recorded as sending): some of its dead "
                   "letters may not have been sent; they count as sent (--again sends them once more)")
    if sel.already_sent:
        click.echo(f"[{event_type}] {sel.already_sent:,} matching dead letters were sent by an earlier replay: "
                   "left out (--again sends them again)")
    if sel.no_event_time:
        click.echo(f"[{event_type}] {sel.no_event_time:,} matching dead letters have no event time: outside any hour "
                   "range, left out")
    if sel.beyond_limit:
        click.echo(f"[{event_type}] {sel.beyond_limit:,} more match beyond --limit: left for a next replay")
    if plan.too_late:
        hours = sorted({e.event_time - e.event_time % 3_600_000 for e in plan.too_late if e.event_time is not None})
        what = ("sent anyway (--too-late): the job dead-letters them as too_late again" if plan.too_late_sent
                else "left out (--too-late sends them anyway)")
        span = f"hour {iso(hours[0])}" if len(hours) == 1 else f"hours {iso(hours[0])} to {iso(hours[-1])}"
        click.echo(f"[{event_type}] {len(plan.too_late):,} would be too late again ({span}: the live job's watermark "
                   f"passed their hour's end by more than allowed_lateness): {what}")
    if plan.future:
        last = max(e.event_time for e in plan.future if e.event_time is not None)
        what = ("sent anyway (--future): the job dead-letters them as future again" if plan.future_sent
                else "left out (--future sends them anyway; or replay them once their time has come)")
        click.echo(f"[{event_type}] {len(plan.future):,} would be future again (event time up to {iso(last)}: still "
                   f"more than max_future_skew, {format_duration(max_future_skew)}, ahead of now): {what}")
    if plan.not_a_line:
        click.echo(f"[{event_type}] {len(plan.not_a_line):,} payloads hold a newline and cannot be a line of a dir: "
                   "file: left out (replay them through pubsub or kafka)")


def _check_live_job(ck: Path, storage: Any, target: Any) -> None:
    """The live job of checkpoint ``ck`` (its etl/job.json) writes to ``storage`` and reads what ``target`` feeds:
    else its watermark is not the one that judges the replay, or the replay goes where no job reads."""
    from event_etl.errors import ConfigError

    path = ck / "etl" / "job.json"
    if not path.is_file():
        return
    job = json.loads(path.read_text())
    sink, source = str(job.get("sink") or ""), str(job.get("source") or "")
    if storage.local and sink and "://" not in sink and os.path.realpath(sink) != os.path.realpath(storage.root):
        raise ConfigError(f"the checkpoint {ck} is of a job writing to {sink}, not to {storage.url}", file=str(path),
                          fix="give the live job's checkpoint (--checkpoint DIR) or its sink (--sink)")
    kind, _, where = source.partition(":")
    if target.kind == "dir" and kind == "dir" and os.path.realpath(where) != os.path.realpath(target.where):
        raise UsageError(f"--replay-to dir:{target.where}: the live job (checkpoint {ck}) reads {source}",
                         fix=f"--replay-to {source}")
    if target.kind == "kafka" and kind == "kafka" and where != target.where:
        raise UsageError(f"--replay-to kafka:{target.where}: the live job (checkpoint {ck}) reads {source}",
                         fix=f"--replay-to {source}")
    if kind and kind != target.kind:
        raise UsageError(f"--replay-to {target.url}: the live job (checkpoint {ck}) reads {source}, not a "
                         f"{target.kind}: source", fix="send them where the live job reads: " + TARGET_FIX_HINT)


TARGET_FIX_HINT = "--replay-to dir:PATH (its --source dir:PATH), pubsub (its type's topic) or kafka:TOPIC"


def _counts(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


@click.command("warmup")
@click.option("--check", is_flag=True, help="Only say whether the archive for this Java and Spark is there "
              "(exit code 3 if not).")
@handles_errors
def warmup_cmd(check: bool) -> None:
    """Build this machine's archive of Spark's JVM classes, so every later job's JVM starts ~2.5 s sooner.

    Once per Java and Spark install (bin/ does it at its first install); ~20 s. Jobs run as
    before without it. It goes to $EVENT_ETL_CACHE_DIR (default ~/.cache/event_etl)."""
    require_extra("job", "`event-etl warmup`")
    from event_etl.job.jvmarchive import archive_path, jvm_options
    from event_etl.job.session import check_java
    from event_etl.job.warmup import build_archive

    java = check_java()
    if check:
        if jvm_options(java):
            click.echo(f"class archive: {archive_path(java)}")
            return
        click.echo(f"no class archive for this Java and Spark yet ({archive_path(java)}): run event-etl warmup")
        raise SystemExit(3)
    path = build_archive()
    click.echo(f"class archive: {path} ({path.stat().st_size / 2**20:,.0f} MiB); jobs started from now on use it")
