"""Upgrades keep every checkpoint and sink (issue 23): what release 165ca81 wrote, taken over by this code.

The fixtures in ``tests/fixtures/release-165ca81/`` were written by that release's own code
(``tests/fixtures/make_release_fixtures.py``; ``tests/fixtures/README.md`` says what each
holds): a directory-source job stopped mid-stream with an hour still open, a Pub/Sub job
killed after it spooled a batch and before Spark committed it, and a fleet of two types.

Each test copies a fixture to its own folder, resumes it with the current code as a user
does after an upgrade (the same ``event-etl run`` command: as a subprocess for the Pub/Sub
job, whose source needs the emulator in its environment, and through ``run_job`` and
``run_fleet``, what the command calls, on the session's Spark for the others), adds input
(with a producer retry inside the dedupe window), drains, and checks what users rely on:
hours marked before are byte-identical, every event is in exactly one data file and none is
lost, the retry is dropped, ``verify`` passes over old and new markers, and the consumer
commands and the Python API read both.  The rollback tests run release 165ca81 itself,
from its code archive, on a checkpoint this code wrote: it must either work or refuse
clearly, and never leave anything the current code cannot continue from.

Nothing here reads the checkpoint's files: its layout is free to change, what it does is not.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import fastavro
import pytest

from tests.fixtures.release_fixtures import archive, expected, materialize

RELEASE = "165ca81"
EXE = str(Path(sys.executable).with_name("event-etl"))
DAY = "2026-11-20"


# -- time ----------------------------------------------------------------------------------------
def at(hhmm: str) -> datetime:
    """``"13:36"`` on :data:`DAY`, UTC."""
    return datetime.fromisoformat(f"{DAY}T{hhmm}:00+00:00")


def millis(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def hour_key(dt: datetime) -> str:
    """The hour holding ``dt`` as expected.json names it: ``2026-11-20T13:00:00Z``."""
    return dt.astimezone(UTC).replace(minute=0, second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_hour(key: str) -> datetime:
    return datetime.fromisoformat(key.replace("Z", "+00:00"))


def hour_arg(key: str) -> str:
    """``2026-11-20T13:00:00Z`` -> ``2026-11-20T13`` (the consumer commands' HOUR)."""
    return key[:13]


def hours_between(first: str, last: str) -> list[str]:
    h, end, out = parse_hour(first), parse_hour(last), []
    while h <= end:
        out.append(hour_key(h))
        h += timedelta(hours=1)
    return out


# -- input ---------------------------------------------------------------------------------------
class Input:
    """Events a test adds to a fixture's input, and what it expects of them."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.n = 0
        self.events: dict[str, datetime] = {}  # valid, unique events this test sent
        self.lines: dict[str, bytes] = {}      # their payloads
        self.retries: list[str] = []           # ids sent again, inside the dedupe window
        self.invalid: list[bytes] = []

    def event(self, when: datetime) -> bytes:
        self.n += 1
        eid = f"{self.prefix}-{self.n:04d}"
        self.events[eid] = when
        self.lines[eid] = json.dumps({"id": eid, "ts": millis(when), "page": f"/new/{self.n}"},
                                     separators=(",", ":")).encode()
        return self.lines[eid]

    def spread(self, start: str, end: str, count: int) -> list[bytes]:
        a, b = at(start), at(end)
        return [self.event(a + (b - a) * k / (count - 1)) for k in range(count)]

    def retry(self, eid: str, line: bytes | str) -> bytes:
        self.retries.append(eid)
        return line.encode() if isinstance(line, str) else line

    def bad(self, payload: bytes) -> bytes:
        self.invalid.append(payload)
        return payload

    def latest(self) -> tuple[str, bytes]:
        """The id and payload of the latest event sent so far (a retry of it is inside the dedupe window)."""
        eid = max(self.events, key=lambda i: self.events[i])
        return eid, self.lines[eid]


def drop_file(folder: Path, name: str, lines: list[bytes]) -> None:
    """A complete input file, as producers should make one appear: written under a dot name, then renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_bytes(b"\n".join(lines) + b"\n")
    tmp.rename(folder / name)


# -- commands ------------------------------------------------------------------------------------
def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENT_ETL_FAULT")}
    env.update({"PYSPARK_PYTHON": sys.executable, **extra})
    return env


def cli(*args, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *map(str, args)], env=env or job_env(), capture_output=True, text=True,
                          timeout=timeout)


def run_cli(root: Path, *types_and_flags: str, source: str | None = "dir", env: dict | None = None
            ) -> subprocess.CompletedProcess:
    """``event-etl run`` on a fixture copy, as its release ran it (its types, sink and checkpoint)."""
    src = [] if source is None else ["--source", f"dir:{root / 'in'}" if source == "dir" else source]
    r = cli("run", *types_and_flags, "--event-types", root / "types", *src, "--sink", root / "sink",
            "--checkpoint", root / "ck", "--master", "local[2]", env=env)
    assert r.returncode == 0, f"event-etl run failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def run_here(spark, root: Path, event_type: str, **options) -> dict:
    """What ``event-etl run EVENT_TYPE --source dir:IN --sink SINK --checkpoint CK`` does, on the session's Spark."""
    from event_etl.eventtypes import load_event_types
    from event_etl.job.driver import run_job
    from event_etl.job.setup import RunOptions

    et = load_event_types(root / "types")[event_type]
    return run_job(et, RunOptions(source=f"dir:{root / 'in'}", sink=str(root / "sink"), checkpoint=str(root / "ck"),
                                  quiet=True, **options), spark=spark, install_signals=False)


def consumer(root: Path, *args) -> subprocess.CompletedProcess:
    return cli(*args, "--sink", root / "sink", "--event-types", root / "types", timeout=120)


# -- the sink, as a consumer sees it ---------------------------------------------------------------
def sink_files(sink: Path) -> dict[str, bytes]:
    """Every data file, marker and dead-letter file (not the lease, not temporary files)."""
    return {str(p.relative_to(sink)): p.read_bytes() for p in sorted(sink.rglob("*"))
            if p.is_file() and p.name != "_LEASE" and not p.name.startswith(".")}


def hour_folder(sink: Path, event_type: str, key: str) -> Path:
    h = parse_hour(key)
    return sink / event_type / f"dt={h:%Y-%m-%d}" / f"hour={h:%H}"


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def avro_ids(data: bytes) -> list[str]:
    return [str(r["id"]) for r in fastavro.reader(io.BytesIO(data))]


def placement(sink: Path, event_type: str) -> dict[str, list[str]]:
    """Each id -> every data file holding it (over the whole sink)."""
    out: dict[str, list[str]] = {}
    base = sink / event_type
    for p in sorted(base.glob("dt=*/hour=*/*.avro")):
        for i in avro_ids(p.read_bytes()):
            out.setdefault(i, []).append(str(p.relative_to(sink)))
    return out


def hours_in_sink(sink: Path, event_type: str) -> dict[str, bool]:
    """Each hour folder -> whether it holds its ``_COMPLETE`` marker."""
    out = {}
    for d in sorted((sink / event_type).glob("dt=*/hour=*")):
        key = f"{d.parent.name[3:]}T{d.name[5:]}:00:00Z"
        out[key] = (d / "_COMPLETE").is_file()
    return out


def deadletter_payloads(sink: Path, event_type: str) -> Counter:
    c: Counter = Counter()
    for p in sorted((sink / event_type / "_deadletter").rglob("*.avro")):
        c.update(r["payload"] for r in fastavro.reader(io.BytesIO(p.read_bytes())))
    return c


def input_ids(folder: Path) -> set[str]:
    """The ids of every valid JSON object in a fixture's input files."""
    out = set()
    for p in sorted(folder.rglob("*.jsonl")):
        for ln in p.read_bytes().splitlines():
            try:
                doc = json.loads(ln)
            except ValueError:
                continue
            if isinstance(doc, dict) and "id" in doc:
                out.add(doc["id"])
    return out


# -- checks shared by every fixture ----------------------------------------------------------------
def settled(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files of a sink snapshot that may never change: those of marked hours, and dead letters."""
    def marked(rel: str) -> bool:
        return rel.rsplit("/", 1)[0] + "/_COMPLETE" in files

    return {rel: data for rel, data in files.items() if "/_deadletter/" in rel or marked(rel)}


def assert_unchanged(before: dict[str, bytes], after: dict[str, bytes], what: str) -> None:
    gone = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not gone and not changed, f"{what}: files removed {gone}, files changed {changed}"


def assert_marked_hours_identical(fixture_sink: dict[str, bytes], sink: Path, event_type: str,
                                  marked: list[str]) -> None:
    """Every hour the old release marked holds exactly its files and marker, byte for byte."""
    for key in marked:
        folder = hour_folder(sink, event_type, key)
        rel = str(folder.relative_to(sink))
        old = {k.rsplit("/", 1)[1]: v for k, v in fixture_sink.items() if k.rsplit("/", 1)[0] == rel}
        assert "_COMPLETE" in old, f"the fixture marked {key}"
        now = folder_files(folder)
        assert sorted(now) == sorted(old), f"{rel}: files {sorted(old)} became {sorted(now)}"
        changed = sorted(n for n in old if old[n] != now[n])
        assert not changed, f"{rel}: changed after its marker: {changed}"


def assert_every_event_once(sink: Path, event_type: str, wanted: set[str]) -> None:
    placed = placement(sink, event_type)
    twice = {i: files for i, files in placed.items() if len(files) > 1}
    assert not twice, f"written more than once: {twice}"
    missing = sorted(wanted - set(placed))
    extra = sorted(set(placed) - wanted)
    assert not missing and not extra, f"lost {missing}; not expected {extra}"


def assert_all_marked(sink: Path, event_type: str, first: str, last: str) -> None:
    got = hours_in_sink(sink, event_type)
    want = hours_between(first, last)
    assert sorted(got) == want and all(got.values()), f"hours and markers: {got}, expected every hour of {want}"


def assert_verify_passes(root: Path, event_type: str, first: str, last: str) -> subprocess.CompletedProcess:
    until = hour_arg(hour_key(parse_hour(last) + timedelta(hours=1)))
    r = consumer(root, "verify", event_type, "--since", hour_arg(first), "--until", until)
    assert r.returncode == 0, f"verify failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


# -- the directory-source fixture ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def dir_upgrade(tmp_path_factory, spark):
    """The dir fixture resumed by the current code, given new input, and drained."""
    exp = expected(RELEASE, "dir")
    root = materialize(RELEASE, "dir", tmp_path_factory.mktemp("upgrade") / "dir")
    assert input_ids(root / "in") == set(exp["events"]) | set(exp["dropped_duplicates"]), \
        "fixture input and expected.json agree"
    fixture_sink = sink_files(root / "sink")
    # 1. the upgrade itself: same command, nothing new to read
    r1 = run_here(spark, root, "click", once=True)
    after_resume = sink_files(root / "sink")
    # 2. new input: later events, a producer retry of the last event the old release wrote (inside the
    #    dedupe window), a late event for an hour the old release marked, and an invalid line
    new = Input("u")
    latest = exp["latest_event"]
    lines = new.spread("13:36", "14:30", 12)
    lines[3:3] = [new.retry(latest["id"], latest["line"]), new.event(at("12:20")), new.bad(b'"just a string"')]
    drop_file(root / "in", "f0005.jsonl", lines)
    r2 = run_here(spark, root, "click", drain=True)
    return SimpleNamespace(exp=exp, root=root, sink=root / "sink", fixture_sink=fixture_sink,
                           after_resume=after_resume, new=new, r1=r1, r2=r2)


def test_dir_resume_without_input_changes_nothing(dir_upgrade):
    u = dir_upgrade
    assert u.after_resume == u.fixture_sink, "a resume with nothing to read left the sink as the old release did"


def test_dir_marked_hours_and_every_old_file_are_byte_identical(dir_upgrade):
    u = dir_upgrade
    assert_marked_hours_identical(u.fixture_sink, u.sink, "click", u.exp["marked_hours"])
    # the open hour's files (part and late) were taken over as they were, and its new marker lists them
    assert_unchanged(u.fixture_sink, sink_files(u.sink), "files the old release wrote")
    for key in u.exp["open_hours"]:
        folder = hour_folder(u.sink, "click", key)
        listed = {f["name"] for f in json.loads((folder / "_COMPLETE").read_text())["files"]}
        assert set(u.exp["files_by_hour"][key]) <= listed, f"{key}: the new marker lists the old release's files"


def test_dir_every_event_once_nothing_lost(dir_upgrade):
    u = dir_upgrade
    assert_every_event_once(u.sink, "click", set(u.exp["events"]) | set(u.new.events))
    want = Counter(p.encode() for p in u.exp["invalid_payloads"]) + Counter(u.new.invalid)
    assert deadletter_payloads(u.sink, "click") == want, "every invalid line dead-lettered once, with its bytes"
    # the late event went to the hour open when it came, which the new code then marked
    late_id = next(i for i, t in u.new.events.items() if t == at("12:20"))
    (where,) = placement(u.sink, "click")[late_id]
    assert "/hour=13/late-" in where, where


def test_dir_retry_within_the_dedupe_window_dropped(dir_upgrade):
    u = dir_upgrade
    (retry,) = u.new.retries
    files = placement(u.sink, "click")[retry]
    assert len(files) == 1 and u.fixture_sink.get(files[0]) is not None, \
        f"the retry of {retry} was dropped: it stays in the old release's file only ({files})"
    assert u.r2["totals"].get("duplicate") == 1, u.r2["totals"]


def test_dir_every_hour_marked_and_verify_passes_over_old_and_new_markers(dir_upgrade):
    u = dir_upgrade
    assert_all_marked(u.sink, "click", "2026-11-20T10:00:00Z", "2026-11-20T14:00:00Z")
    r = assert_verify_passes(u.root, "click", "2026-11-20T10:00:00Z", "2026-11-20T14:00:00Z")
    for key in hours_between("2026-11-20T10:00:00Z", "2026-11-20T14:00:00Z"):
        assert f"{key}: ok" in r.stdout, r.stdout


def test_consumers_read_markers_of_both_releases(dir_upgrade, tmp_path):
    """wait, hours, verify, cat, audit and the Python API on a sink with markers of 165ca81 and of today."""
    from event_etl.consumer import hour_status, read_records, read_table, verify_hours, wait_for_hour

    u = dir_upgrade
    root = tmp_path / "copy"
    shutil.copytree(u.root / "types", root / "types")
    shutil.copytree(u.sink, root / "sink")  # audit records its verdict beside the marker: not in the shared sink
    sink = root / "sink"
    old_hours = u.exp["marked_hours"]
    new_hours = ["2026-11-20T13:00:00Z", "2026-11-20T14:00:00Z"]
    everything = old_hours + new_hours

    r = consumer(root, "hours", "click", "--since", "2026-11-20T10", "--until", "2026-11-20T15")
    assert r.returncode == 0, r.stdout + r.stderr
    for key in everything:
        (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith(key)]
        assert row.split()[1] == "complete", row
    for key in (old_hours[0], new_hours[-1]):
        r = consumer(root, "wait", "click", hour_arg(key), "--timeout", "10s", "--poll-interval", "1s")
        assert r.returncode == 0 and "complete" in r.stdout, r.stdout + r.stderr
    r = consumer(root, "verify", "click", "--since", "2026-11-20T10", "--until", "2026-11-20T15")
    assert r.returncode == 0, r.stdout + r.stderr

    by_hour = {}
    for key in everything:
        folder = hour_folder(sink, "click", key)
        by_hour[key] = Counter(i for name, data in folder_files(folder).items() if name.endswith(".avro")
                               for i in avro_ids(data))
        r = consumer(root, "cat", "click", hour_arg(key), "--format", "jsonl")
        assert r.returncode == 0, r.stderr
        assert Counter(json.loads(ln)["id"] for ln in r.stdout.splitlines()) == by_hour[key], key
        # the Python API
        assert Counter(rec["id"] for rec in read_records(sink, "click", key)) == by_hour[key], key
        table = read_table(sink, "click", key)
        assert Counter(table.column("id").to_pylist()) == by_hour[key], key
        own = read_table(sink, "click", key, include_late=False).column("id").to_pylist()
        late_here = Counter(i for name, data in folder_files(hour_folder(sink, "click", key)).items()
                            if name.startswith("late-") for i in avro_ids(data))
        assert Counter(own) == by_hour[key] - late_here, key
        ts = next(iter(read_records(sink, "click", key)))["ts"]
        assert ts.tzinfo is not None and ts.utcoffset() == timedelta(0), "timestamps are aware UTC"
        status = hour_status(sink, "click", key)
        assert status.state.value == "complete" and status.records == sum(by_hour[key].values()), status
    assert wait_for_hour(sink, "click", old_hours[0], timeout=5).records == sum(by_hour[old_hours[0]].values())
    reports = verify_hours(sink, "click", "2026-11-20T10", "2026-11-20T15")
    assert len(reports) == 5 and all(rep.ok for rep in reports), [rep.describe() for rep in reports]

    # audit an hour marked by 165ca81 whose late record sits in an hour marked by today's code
    times = {**{i: parse_hour(t) for i, t in u.exp["events"].items()}, **u.new.events}
    hour12 = sum(1 for t in times.values() if hour_key(t) == "2026-11-20T12:00:00Z")
    r = consumer(root, "audit", "click", "2026-11-20T12", "--expected", hour12)
    assert r.returncode == 0 and "match" in r.stdout, r.stdout + r.stderr
    r = consumer(root, "audit", "click", "2026-11-20T12", "--expected", hour12 + 1)
    assert r.returncode != 0, "a recorded verdict is not changed by another count"


# -- the Pub/Sub fixture -----------------------------------------------------------------------------
def test_pubsub_spooled_batch_is_replayed_once_after_the_upgrade_and_a_rollback(tmp_path, pubsub_server):
    from google.api_core import exceptions as gexc
    from google.cloud import pubsub_v1

    exp = expected(RELEASE, "pubsub")
    root = materialize(RELEASE, "pubsub", tmp_path / "pubsub")
    fixture_sink = sink_files(root / "sink")
    os.environ["PUBSUB_EMULATOR_HOST"] = pubsub_server.host
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    try:
        try:  # the same subscription as before the upgrade: the checkpoint belongs to it
            publisher.create_topic(name=exp["topic"])
        except gexc.AlreadyExists:
            pass
        try:
            subscriber.create_subscription(name=exp["subscription"], topic=exp["topic"], ack_deadline_seconds=10)
        except gexc.AlreadyExists:
            pass

        def publish(payloads: list[bytes]) -> None:
            for f in [publisher.publish(exp["topic"], p) for p in payloads]:
                f.result(timeout=30)

        env = job_env(PUBSUB_EMULATOR_HOST=pubsub_server.host)
        source = f"pubsub:{exp['subscription']}"
        # Pub/Sub delivers the batch the killed job never acknowledged again: published again here (the
        # emulator of the fixture is gone), inside the dedupe window of the spooled batch
        publish([m["payload"].encode() for m in exp["spooled"]])
        run_cli(root, "click", "--once", "--trigger-interval", "1s", source=source, env=env)
        placed = placement(root / "sink", "click")
        for i in exp["spooled_ids"]:
            assert len(placed.get(i, [])) == 1, f"spooled event {i} is in {placed.get(i)}: the replay wrote it once"
        assert_unchanged(fixture_sink, sink_files(root / "sink"),
                         "files the old release wrote (the killed batch's too)")
        assert_marked_hours_identical(fixture_sink, root / "sink", "click", exp["marked_hours"])

        # rolling back to 165ca81 on the checkpoint the current code has just written: it works or refuses
        new = Input("q")
        spooled_latest = max(exp["spooled"], key=lambda m: exp["events_ms"][m["id"]])
        publish(new.spread("12:56", "13:00", 5) + [new.retry(spooled_latest["id"], spooled_latest["payload"])])
        worked, problems = roll_back(tmp_path, root, "--source", source, "--trigger-interval", "1s",
                                     env={**env, "EVENT_ETL_PUBSUB_ACK_DEADLINE": "10"})
        if not worked:
            time.sleep(12)  # what it pulled before refusing comes back once its ack deadline (10 s) runs out

        # and upgrading again: the current code takes over whatever the old release left.  Event time stays
        # within the dedupe window of everything since the replay: release 165ca81 acknowledges a batch only
        # when the next one starts, so what it pulled last comes again, in whichever batch Pub/Sub delivers it
        lines = new.spread("13:01", "13:05", 10)
        latest_id, latest_line = new.latest()
        lines += [new.retry(latest_id, latest_line), new.bad(b"[1]")]
        publish(lines)
        run_cli(root, "click", "--drain", "--trigger-interval", "1s", source=source, env=env)
        assert not problems, "the rollback broke its rule:\n" + "\n".join(problems)

        sink = root / "sink"
        assert_marked_hours_identical(fixture_sink, sink, "click", exp["marked_hours"])
        assert_unchanged(fixture_sink, sink_files(sink), "files the old release wrote")
        assert_every_event_once(sink, "click", set(exp["committed_ids"]) | set(exp["spooled_ids"]) | set(new.events))
        want = Counter(p.encode() for p in exp["invalid_payloads"]) + Counter(new.invalid)
        assert deadletter_payloads(sink, "click") == want
        assert_all_marked(sink, "click", "2026-11-20T10:00:00Z", "2026-11-20T13:00:00Z")
        assert_verify_passes(root, "click", "2026-11-20T10:00:00Z", "2026-11-20T13:00:00Z")
    finally:
        publisher.stop()
        subscriber.close()


# -- the fleet fixture ------------------------------------------------------------------------------
def test_fleet_checkpoint_root_is_taken_over(tmp_path, spark):
    exp = expected(RELEASE, "fleet")
    root = materialize(RELEASE, "fleet", tmp_path / "fleet")
    fixture_sink = sink_files(root / "sink")
    r = cli("status", "--checkpoint", root / "ck", "--sink", root / "sink", "--event-types", root / "types", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "alpha" in r.stdout and "beta" in r.stdout, r.stdout
    news = {}
    for name in exp["event_types"]:
        t = exp["types"][name]
        new = news[name] = Input(f"n{name[0]}")
        start = "12:31" if name == "alpha" else "12:11"
        lines = new.spread(start, "13:20", 8)
        lines.insert(2, new.retry(t["latest_event"]["id"], t["latest_event"]["line"]))
        drop_file(root / "in" / name, f"{name[0]}9000.jsonl", lines)
    # `event-etl run alpha beta --checkpoint ROOT --sink SINK --drain`, on the session's Spark
    from event_etl.eventtypes import load_event_types
    from event_etl.job.driver import run_fleet
    from event_etl.job.setup import RunOptions

    types = load_event_types(root / "types")
    summary = run_fleet([types[n] for n in exp["event_types"]],
                        RunOptions(sink=str(root / "sink"), checkpoint=str(root / "ck"), drain=True, quiet=True),
                        spark=spark, install_signals=False)
    sink = root / "sink"
    assert_unchanged(fixture_sink, sink_files(sink), "files the old release wrote")
    for name in exp["event_types"]:
        t = exp["types"][name]
        assert_marked_hours_identical(fixture_sink, sink, name, t["marked_hours"])
        assert_every_event_once(sink, name, set(t["events"]) | set(news[name].events))
        (retry,) = news[name].retries
        assert fixture_sink.get(placement(sink, name)[retry][0]) is not None, f"{name}: the retry was dropped"
        assert summary[name]["totals"].get("duplicate") == 1, summary[name]
        assert_all_marked(sink, name, "2026-11-20T10:00:00Z", "2026-11-20T13:00:00Z")
        assert_verify_passes(root, name, "2026-11-20T10:00:00Z", "2026-11-20T13:00:00Z")


# -- rolling back --------------------------------------------------------------------------------------
def old_release(tmp_path: Path) -> Path:
    """Release 165ca81's own code, from its archive; checked to be what ``python -m event_etl`` imports."""
    code = tmp_path / f"event_etl-{RELEASE}"
    code.mkdir()
    with tarfile.open(archive(RELEASE)) as tf:
        # the "data" filter (no links out, no devices) where this Python has it (3.11.4 and later; Debian's 3.11.2 not)
        tf.extractall(code, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    probe = subprocess.run([sys.executable, "-c", "import event_etl; print(event_etl.__version__, event_etl.__file__)"],
                           env=job_env(PYTHONPATH=str(code)), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.stdout.split()[1].startswith(str(code) + os.sep), \
        f"the old release's code runs: {probe.stdout}{probe.stderr}"
    return code


def roll_back(tmp_path: Path, root: Path, *flags: str, env: dict | None = None) -> tuple[bool, list[str]]:
    """Run release 165ca81 (``event-etl run click ... --once``) on a checkpoint the current code wrote.

    It must either work, changing none of the files already in the sink and writing no event
    twice, or refuse with a clear error (non-zero exit, ``error:`` and ``fix:``, no traceback)
    without touching the sink.  Returns whether it worked, and how it broke that rule (nothing
    if it kept it), so that a test can still see what the current code makes of the result."""
    code = old_release(tmp_path)
    sink = root / "sink"
    before = sink_files(sink)
    old = subprocess.run([sys.executable, "-m", "event_etl", "run", "click", "--event-types", str(root / "types"),
                          "--sink", str(sink), "--checkpoint", str(root / "ck"), "--once", "--master", "local[2]",
                          *flags],
                         env={**(env or job_env()), "PYTHONPATH": str(code)}, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    after = sink_files(sink)
    out = old.stdout + old.stderr
    problems = []
    if old.returncode == 0:  # it worked: it continued without changing or duplicating anything
        changed = sorted(k for k in before if after.get(k) != before[k])
        if changed:
            problems.append(f"release {RELEASE} changed or removed files already in the sink: {changed}")
        twice = {i: f for i, f in placement(sink, "click").items() if len(f) > 1}
        if twice:
            problems.append(f"release {RELEASE} ran on the new checkpoint and wrote events twice: {twice}")
    else:  # it refused: clearly, and before writing anything
        if not ("error:" in old.stderr and "fix:" in old.stderr and "Traceback" not in out):
            problems.append(f"release {RELEASE} failed on the new checkpoint without a clear error ({old.returncode})")
        if after != before:
            problems.append(f"release {RELEASE} refused, yet changed the sink")
    if problems:
        problems.append(f"its output:\n{out[-3000:]}")
    return old.returncode == 0, problems


def test_rolling_back_to_165ca81_works_or_refuses_but_never_corrupts(tmp_path, spark):
    exp = expected(RELEASE, "dir")
    root = materialize(RELEASE, "dir", tmp_path / "dir")
    sink = root / "sink"
    fixture_sink = sink_files(sink)
    new = Input("r")
    # 1. upgrade: the current code resumes the fixture and writes its own checkpoint and markers
    lines = new.spread("13:36", "14:10", 8)
    lines.insert(4, new.retry(exp["latest_event"]["id"], exp["latest_event"]["line"]))
    drop_file(root / "in", "f0005.jsonl", lines)
    run_here(spark, root, "click", once=True)
    assert hours_in_sink(sink, "click").get("2026-11-20T13:00:00Z"), "the current code marked an hour of its own"
    upgraded = sink_files(sink)

    # 2. roll back: release 165ca81 on that checkpoint, with more input
    latest_id, latest_line = new.latest()
    lines = new.spread("14:11", "14:40", 8)
    lines[2:2] = [new.retry(latest_id, latest_line), new.bad(b'["rolled back"]')]
    drop_file(root / "in", "f0006.jsonl", lines)
    _, problems = roll_back(tmp_path, root, "--source", f"dir:{root / 'in'}")
    rolled_back = sink_files(sink)

    # 3. upgrade again: the current code continues from whatever the old release left
    latest_id, latest_line = new.latest()
    lines = new.spread("14:41", "15:10", 8)
    lines[1:1] = [new.retry(latest_id, latest_line), new.event(at("13:30"))]
    drop_file(root / "in", "f0007.jsonl", lines)
    run_here(spark, root, "click", drain=True)
    assert not problems, "the rollback broke its rule:\n" + "\n".join(problems)

    final = sink_files(sink)
    assert_marked_hours_identical(fixture_sink, sink, "click", exp["marked_hours"])
    assert_unchanged(fixture_sink, final, "files release 165ca81 wrote first")
    # files of hours still open at a step may since have been merged into larger ones (by the current code:
    # every event once is checked below); what was marked, and the dead letters, stay byte for byte
    assert_unchanged(settled(upgraded), final, "files the current code wrote before the rollback")
    assert_unchanged(settled(rolled_back), final, "files present after the rollback")
    assert_every_event_once(sink, "click", set(exp["events"]) | set(new.events))
    for retry in new.retries:
        assert len(placement(sink, "click")[retry]) == 1, f"retry of {retry} dropped"
    want = Counter(p.encode() for p in exp["invalid_payloads"]) + Counter(new.invalid)
    assert deadletter_payloads(sink, "click") == want
    assert_all_marked(sink, "click", "2026-11-20T10:00:00Z", "2026-11-20T15:00:00Z")
    assert_verify_passes(root, "click", "2026-11-20T10:00:00Z", "2026-11-20T15:00:00Z")
