"""Pub/Sub at the rates producers send (issue 22): backlog, backfill, live, soak, restart, API requests.

    .venv/bin/python bench/pubsub.py --scenarios backlog,backfill --messages 1000000
    .venv/bin/python bench/pubsub.py --scenarios live --live-rate 10000 --live-seconds 60
    .venv/bin/python bench/pubsub.py --scenarios soak --soak-rate 20000 --soak-minutes 10
    .venv/bin/python bench/pubsub.py --scenarios restart --messages 1000000

Everything runs against Google's Pub/Sub emulator, which the script starts itself on
127.0.0.1 (a free port) and stops at the end (its process group), and the real
``event-etl run page_view --source pubsub:...`` as users run it (a separate process with
``PUBSUB_EMULATOR_HOST``; ``--master spark://...`` runs it with ``event-etl submit``).

Messages are page views of about 225 bytes (:func:`bench.datagen.make_record`, every one valid
and with its own UUID), published by ``--publishers`` separate processes (so the publisher does
not share a GIL with anything measured), each sending publish requests of up to 1,000 messages,
the service's limit per request (what the client library's batching sends with
``max_messages=1000``), built as raw protocol buffers.  Paced publishers send what is due every
50 ms.  Event time is one of:

- **now** (a backlog after downtime, a restart): the producer's clock when the message is made,
  0-1 s behind it (client buffering), never ahead of the publish time;
- **backfill**: events of ``--backfill-days`` ago (default 21), ``--backfill-hours`` (default 12)
  of event time in publish order with up to 90 s of disorder, published now;
- **fast** (live, soak): event time runs ``--speedup`` times faster than the clock from a start far
  enough in the past that it never passes the publish time, so event-time hours close during the
  run.  By default an hour takes 3 trigger intervals + 1 s of wall time (225x with the 5-s
  trigger), so hours close at every phase of the trigger's cycle, as ``bench/latency.py`` does.

Scenarios (``--scenarios``, comma-separated):

- **backlog**, **backfill**: ``--messages`` published to a topic with two subscriptions; first
  a bare ``google-cloud-pubsub`` loop drains one (synchronous pull of up to 1,000, acknowledge
  what came, until a pull finds nothing: its time runs from the first pull to the last
  acknowledgement), then ``event-etl run --once --drain`` drains the other, measured as a whole
  process (JVM start included, :func:`bench.procstats.run_measured`: wall, CPU, peak PSS).
  Goal: the job at >= 0.5x the bare loop.  With ``--drain-readers bare,saving`` a third
  subscription is drained by the **saving loop** (off by default since the job acknowledges what
  is spooled, ``EVENT_ETL_PUBSUB_ACK=spooled``, and holds nothing leased while it pulls),
  the fastest reader that keeps ``committed``'s contract: it pulls the same way, but acknowledges only
  what it has saved (every ``--save-every`` messages, default 5,000 = one spool segment, written
  to a file and fsync'd), so it always holds up to that many messages while it pulls.  On the
  emulator that costs much more than on the real service (``bench/emulator_pull.py``: with one
  message outstanding, every pull costs time in proportion to the backlog not yet delivered); the
  job's ratio to the saving loop is what ``committed`` would add.
- **live**: a job with default settings runs live; ``--prime`` messages start it (its first
  batch); then a publisher sends ``--live-rate`` messages/s for ``--live-seconds``.  Figures:
  how long after the publisher stopped the job had saved every message (the batch line that
  brings its count to the total; goal <= 15 s), and for every hour closed by the watermark, the
  marker delay: from the moment the watermark passed the hour's end (the completion of the
  first publish request holding an event at or beyond hour end + out-of-orderness, as
  ``bench/latency.py`` takes a file's arrival) to the first 0.1-s listing of the sink that shows
  its ``_COMPLETE`` (:mod:`bench.sinkwatch`); bound: 1 trigger interval + 2 s.
- **soak**: the same at ``--soak-rate`` for ``--soak-minutes``, the job's process tree sampled
  every 5 s as ``bench/memory.py`` does (PSS by part; flat: no part grows more than 10 %).
- **readers**: the ceiling of this machine for the live and soak rates, without Spark: a paced
  publisher sends ``--soak-rate`` messages/s for ``--live-seconds`` while the bare loop reads (a
  subscription of its own), then again while the saving loop reads; for each, how long after the
  publisher stopped it had read everything.  A reader that ends well after the publisher cannot
  sustain that rate here, whatever reads behind it.  ``--readers saving`` runs the saving loop
  alone, against an emulator nothing has warmed up (as a job meets it); at 20,000 msg/s the
  outcome differs from run to run (see RESULTS.md): repeat it.
- **restart**: a live job is started on ``--prime`` messages and stopped (SIGINT: no drain); while
  it is down ``--messages`` are published (event time now); the same command is run again and the
  catch-up rate is taken from its start (JVM included) and from its first batch to the batch line
  that brings its count to ``--messages``.

Every job's Pub/Sub requests (pull, acknowledge, modifyAckDeadline, getSubscription) come from the
line it prints at its end; on the emulator a pull returns at most 100 messages (the real service:
up to 1,000), so pulls per 1,000 messages are >= 10 here.  Every job ends drained, and the sum of
``records`` over its manifests must equal the messages published, else ``WRONG OUTPUT`` stops the
benchmark.  Each scenario writes its own section of ``bench/RESULTS.md`` (``pubsub-<scenario>``,
with ``--label`` appended when given, e.g. for a cluster), with the machine, the load average and
the command.  No process is left behind: the jobs are stopped (SIGTERM, then SIGKILL of their tree),
the publishers joined, the emulator's process group killed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.contenders import count_manifests
from bench.figures import percentile
from bench.livejob import BATCH_LINE, LiveJob, kill_tree, run_main
from bench.machine import describe, load_average
from bench.results import machine_lines, markdown_table, publish

EVENT_TYPE = "page_view"
PROJECT = "event-etl-bench"
HOUR_MS = 3_600_000
PULL_MAX = 1000
REQUEST_MAX = 1000  # messages per publish request: the service's limit
EMULATOR = os.environ.get(
    "PUBSUB_EMULATOR_BIN", "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
STATS_LINE = re.compile(r"\] Pub/Sub: pulled ([\d,]+), acknowledged ([\d,]+), ([\d,]+) requests \(([\d.,]+) per 1,000 "
                        r"messages: pull ([\d,]+), acknowledge ([\d,]+), modifyAckDeadline ([\d,]+), "
                        r"getSubscription ([\d,]+)\)")
BATCH_SECONDS = re.compile(r"\s([\d.]+)s\s+[\d,]+ ev/s")


class BenchError(SystemExit):
    pass


# -- the emulator ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Emulator:
    """Google's Pub/Sub emulator on 127.0.0.1, in a process group of its own (stopped as a group)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "pubsub-emulator.log"
        self.proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> Emulator:
        if not (os.path.exists(EMULATOR) or shutil.which(EMULATOR)):
            raise BenchError(f"the Pub/Sub emulator is missing ({EMULATOR}); install it with 'gcloud components "
                             "install pubsub-emulator', or point PUBSUB_EMULATOR_BIN at its cloud-pubsub-emulator")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([EMULATOR, "--host=127.0.0.1", f"--port={self.port}"], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the emulator exited with {self.proc.returncode}: see {self.log}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v1/projects/{PROJECT}/topics", timeout=2).close()
                return self
            except urllib.error.HTTPError:
                return self  # it answers
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise BenchError(f"the emulator did not answer within {timeout:.0f} s: see {self.log}")

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None


def create(topic: str, subscriptions: list[str], ack_deadline: int = 60) -> None:
    """The topic and its subscriptions, as ``event-etl setup`` creates them."""
    from event_etl.sources.publisher import setup_pubsub

    for s in subscriptions:
        setup_pubsub(topic, s, ack_deadline=ack_deadline)


# -- publishing (in separate processes) -------------------------------------------------------------
@dataclass
class Clock:
    """How event time is made (see the module docstring)."""

    kind: str  # now | backfill | fast
    start_ms: int = 0  # backfill: first event; fast: event time at ``origin`` (wall, s)
    span_ms: int = 0  # backfill: event time the whole set covers
    origin: float = 0.0
    speedup: float = 1.0

    def event_time(self, i: int, total: int, now: float, rng) -> int:
        now_ms = int(now * 1000)
        if self.kind == "backfill":
            return self.start_ms + i * self.span_ms // max(1, total) - rng.randint(0, 90_000)
        if self.kind == "fast":
            t = self.start_ms + int((now - self.origin) * 1000 * self.speedup) - rng.randint(0, 1000)
            return min(t, now_ms)
        return now_ms - rng.randint(0, 1000)


@dataclass
class PubPlan:
    host: str
    topic: str
    worker: int
    workers: int
    count: int  # messages over all workers
    seed: int
    clock: Clock
    rate: float | None = None  # messages/s over all workers; None: as fast as possible
    start_at: float = 0.0  # wall time the workers start at together
    first_index: int = 0  # event indexes are first_index .. first_index + count - 1
    log: list = field(default_factory=list)


def publish_worker(plan: PubPlan) -> dict:
    """Publish this worker's share; returns its count and every request as ``(t done, max event time, n)``."""
    import random

    os.environ["PUBSUB_EMULATOR_HOST"] = plan.host
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops its workers itself
    import orjson
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import PublishRequest, PubsubMessage

    from bench.datagen import make_record

    api = pubsub_v1.PublisherClient().api
    msg_pb, req_pb = PubsubMessage.pb(), PublishRequest.pb()
    rng = random.Random(plan.seed * 1_000_003 + plan.first_index * 7 + plan.worker)
    indexes = range(plan.first_index + plan.worker, plan.first_index + plan.count, plan.workers)
    mine = len(indexes)
    per_s = None if plan.rate is None else plan.rate / plan.workers
    requests: list[tuple[float, int, int]] = []
    while time.time() < plan.start_at:
        time.sleep(min(0.01, plan.start_at - time.time()))
    t0 = max(time.time(), plan.start_at)
    sent = 0
    while sent < mine:
        now = time.time()
        due = mine if per_s is None else min(mine, int((now - t0) * per_s) + 1)
        while sent < due:
            n = min(REQUEST_MAX, due - sent)
            req = req_pb(topic=plan.topic)
            top = None
            made = time.time()
            for i in indexes[sent:sent + n]:
                t = plan.clock.event_time(i - plan.first_index, plan.count, made, rng)
                top = t if top is None or t > top else top
                req.messages.append(msg_pb(data=orjson.dumps(make_record("page_view", i, t, rng))))
            for attempt in range(20):
                try:
                    api.publish(request=PublishRequest.wrap(req), timeout=60)
                    break
                except Exception:  # the emulator is busy: try again (message ids are its own)
                    if attempt == 19:
                        raise
                    time.sleep(0.5)
            requests.append((time.time(), top, n))
            sent += n
        if per_s is not None and sent < mine:
            time.sleep(max(0.0, 0.05 - (time.time() - now)))
    return {"published": sent, "requests": requests, "t0": t0, "t1": time.time()}


class Publishers:
    """``workers`` publisher processes for one phase; :meth:`join` collects what they sent."""

    def __init__(self, host: str, topic: str, *, count: int, workers: int, seed: int, clock: Clock,
                 rate: float | None = None, first_index: int = 0, start_in: float = 1.0) -> None:
        self.ctx = mp.get_context("spawn")
        self.pool = self.ctx.Pool(workers)
        self.start_at = time.time() + start_in + (2.0 if workers > 1 else 0.5)  # spawned interpreters import first
        plans = [PubPlan(host, topic, k, workers, count, seed, clock, rate, self.start_at, first_index)
                 for k in range(workers)]
        self.result = self.pool.map_async(publish_worker, plans)
        self.count = count

    def join(self, timeout: float | None = None) -> dict:
        try:
            parts = self.result.get(timeout)
        finally:
            self.pool.terminate()
            self.pool.join()
        requests = sorted(r for p in parts for r in p["requests"])
        published = sum(p["published"] for p in parts)
        if published != self.count:
            raise BenchError(f"published {published:,} of {self.count:,} messages")
        return {"published": published, "requests": requests, "t0": min(p["t0"] for p in parts),
                "t1": max(p["t1"] for p in parts)}

    def stop(self) -> None:
        self.pool.terminate()
        self.pool.join()


def publish_all(host: str, topic: str, count: int, args, clock: Clock, *, first_index: int = 0) -> dict:
    print(f"publishing {count:,} messages ({clock.kind} event time) from {args.publishers} processes ...", flush=True)
    pubs = Publishers(host, topic, count=count, workers=args.publishers, seed=args.seed, clock=clock,
                      first_index=first_index, start_in=0.0)
    r = pubs.join()
    secs = r["t1"] - r["t0"]
    print(f"  published {r['published']:,} in {secs:.1f} s ({r['published'] / secs:,.0f} msg/s)", flush=True)
    r["seconds"] = secs
    return r


# -- the bare loop and the saving loop ----------------------------------------------------------------
def bare_loop(subscription: str, expected: int, *, quiet: float = 3.0) -> dict:
    """Synchronous pull of up to 1,000 and acknowledge, until the subscription stays empty ``quiet`` seconds."""
    return _read_loop(subscription, expected, quiet=quiet)


def saving_loop(subscription: str, expected: int, spool: Path, *, save_every: int = 5000, save_age: float = 0.5,
                quiet: float = 3.0) -> dict:
    """The bare loop keeping the job's contract: acknowledge only what is saved (written and fsync'd).

    It saves every ``save_every`` messages, when what it holds is ``save_age`` seconds old (as a spool
    segment is written), and once it has every message it expects (a pull on an empty subscription can wait
    for its whole timeout on the emulator)."""
    r = _read_loop(subscription, expected, quiet=quiet, spool=spool, save_every=save_every, save_age=save_age)
    r["save_every"] = save_every
    return r


def _read_loop(subscription: str, expected: int, *, quiet: float, spool: Path | None = None,
               save_every: int = 0, save_age: float = 0.0) -> dict:
    """Pull until ``expected`` messages came and a pull found nothing, or nothing came for ``quiet`` seconds.
    Without ``spool``, each pull is acknowledged at once; with it, held until saved (see :func:`saving_loop`).
    Returns counts, the seconds from the first pull to the last acknowledgement and that acknowledgement's
    wall time (``last_at``)."""
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import PullResponse

    client = pubsub_v1.SubscriberClient()
    ids: set[str] = set()
    got = pulls = acks = saves = 0
    first = last = last_at = None
    opened = 0.0
    empty_since = None
    held: list[str] = []
    buf: list[bytes] = []

    def acknowledge(ack_ids: list[str]) -> None:
        nonlocal acks, last, last_at
        for i in range(0, len(ack_ids), 2500):
            client.acknowledge(subscription=subscription, ack_ids=ack_ids[i:i + 2500], timeout=60)
            acks += 1
        last, last_at = time.monotonic(), time.time()

    def save() -> None:
        nonlocal saves
        if not held:
            return
        with open(spool, "ab") as fh:
            fh.write(b"".join(buf))
            fh.flush()
            os.fsync(fh.fileno())
        saves += 1
        acknowledge(held)
        held.clear()
        buf.clear()

    try:
        while True:
            resp = PullResponse.pb(client.pull(subscription=subscription, max_messages=PULL_MAX, timeout=30))
            pulls += 1
            now = time.monotonic()
            if first is None:
                first = now
            if not resp.received_messages:
                save()
                if got >= expected:
                    break
                empty_since = empty_since or now
                if now - empty_since > quiet:
                    break
                continue
            empty_since = None
            got += len(resp.received_messages)
            ids.update(rm.message.message_id for rm in resp.received_messages)
            if spool is None:
                acknowledge([rm.ack_id for rm in resp.received_messages])
                continue
            if not held:
                opened = now
            buf.append(resp.SerializeToString())
            held.extend(rm.ack_id for rm in resp.received_messages)
            if len(held) >= save_every or now - opened >= save_age or len(ids) >= expected:
                save()
        save()
    finally:
        client.close()
        if spool is not None:
            spool.unlink(missing_ok=True)
    secs = (last or time.monotonic()) - (first or time.monotonic())
    if len(ids) != expected:
        which = "bare" if spool is None else "saving"
        raise BenchError(f"WRONG OUTPUT: the {which} loop got {len(ids):,} distinct messages, {expected:,} published")
    return {"received": got, "distinct": len(ids), "seconds": secs, "rate": len(ids) / secs if secs else None,
            "pulls": pulls, "acks": acks, "saves": saves, "last_at": last_at}


# -- the job ------------------------------------------------------------------------------------------
def job_env(host: str) -> dict:
    return {**os.environ, "PUBSUB_EMULATOR_HOST": host, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}


def job_command(subscription: str, sink: Path, ckpt: Path, args, *extra: str) -> list[str]:
    exe = str(Path(sys.executable).with_name("event-etl"))
    verb = ["submit", EVENT_TYPE] if args.master.startswith("spark://") else ["run", EVENT_TYPE]
    return [exe, *verb, "--source", f"pubsub:{subscription}", "--sink", str(sink), "--checkpoint", str(ckpt),
            "--master", args.master, *args.job_arg, *extra]


def pubsub_stats(output: str) -> dict | None:
    found = list(STATS_LINE.finditer(output))
    m = found[-1] if found else None  # the last one
    if m is None:
        return None
    n = [int(x.replace(",", "")) for x in m.groups()[:3]] + [int(x.replace(",", "")) for x in m.groups()[4:]]
    return {"pulled": n[0], "acked": n[1], "requests": n[2], "per_1000": float(m.group(4).replace(",", "")),
            "pull": n[3], "acknowledge": n[4], "modify_ack_deadline": n[5], "get_subscription": n[6]}


def batch_lines(lines: list[str]) -> list[tuple[int, float]]:
    out = []
    for line in lines:
        m = BATCH_LINE.search(line)
        if m:
            d = BATCH_SECONDS.search(line)
            out.append((int(m.group(2).replace(",", "")), float(d.group(1)) if d else 0.0))
    return out


def check_output(sink: Path, expected: int, what: str) -> tuple[int, int]:
    records, files, hours = count_manifests(sink, EVENT_TYPE)
    if records != expected:
        raise BenchError(f"WRONG OUTPUT ({what}): {records:,} records in the manifests, {expected:,} published")
    return files, hours


def totals_of(output: str) -> dict:
    out = {}
    for key in ("timely", "late", "too_late", "future", "invalid", "duplicate"):
        m = re.search(rf"^\s+{key}\s+([\d,]+)", output, re.M)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


# -- scenarios ------------------------------------------------------------------------------------------
def scenario_drain(kind: str, emu: Emulator, args, work: Path) -> dict:
    """backlog / backfill: the bare loop, then ``run --once --drain``, on the same messages."""
    from bench.procstats import run_measured

    n = args.messages
    name = f"{kind}-{int(time.time())}"
    topic = f"projects/{PROJECT}/topics/{name}"
    bare_sub, saving_sub, job_sub = (f"projects/{PROJECT}/subscriptions/{name}-{s}" for s in ("bare", "saving", "job"))
    with_saving = "saving" in args.drain_readers
    create(topic, [bare_sub, *([saving_sub] if with_saving else []), job_sub])
    now_ms = int(time.time() * 1000)
    clock = (Clock("now") if kind == "backlog" else
             Clock("backfill", start_ms=now_ms - args.backfill_days * 24 * HOUR_MS,
                   span_ms=args.backfill_hours * HOUR_MS))
    pub = publish_all(emu.host, topic, n, args, clock)
    print("bare loop ...", flush=True)
    bare = bare_loop(bare_sub, n)
    print(f"  bare loop: {bare['distinct']:,} in {bare['seconds']:.1f} s = {bare['rate']:,.0f} msg/s "
          f"({bare['pulls']:,} pulls)", flush=True)
    saving = None
    if with_saving:
        print("saving loop ...", flush=True)
        saving = saving_loop(saving_sub, n, work / f"{kind}-saving.spool", save_every=args.save_every,
                             save_age=args.save_age)
        print(f"  saving loop: {saving['distinct']:,} in {saving['seconds']:.1f} s = {saving['rate']:,.0f} msg/s "
              f"({saving['pulls']:,} pulls, {saving['saves']:,} saves)", flush=True)
    sink, ckpt = work / f"{kind}-sink", work / f"{kind}-ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    cmd = job_command(job_sub, sink, ckpt, args, "--once", "--drain")
    print("job: " + " ".join(cmd), flush=True)
    load = load_average()
    r = run_measured(cmd, env=job_env(emu.host), interval=0.5)
    (work / f"{kind}-job.log").write_text(r["output"])
    if r["returncode"] != 0:
        raise BenchError(f"event-etl exited with {r['returncode']}:\n{r['output'][-3000:]}")
    files, hours = check_output(sink, n, kind)
    lines = r["output"].splitlines()
    batches = batch_lines(lines)
    run = re.search(r"run finished: (\d+) batches in ([\d.]+)s", r["output"])
    res = {"kind": kind, "messages": n, "load": load, "publish": {"seconds": pub["seconds"]}, "bare": bare,
           "saving": saving,
           "job": {"wall": r["wall"], "rate": n / r["wall"], "cpu": r["cpu"], "peak_pss": r["peak_pss"],
                   "peak_rss": r["peak_rss"], "batches": len(batches),
                   "query_seconds": float(run.group(2)) if run else None,
                   "largest_batch": max(batches, default=(0, 0.0)), "files": files, "hours": hours,
                   "stats": pubsub_stats(r["output"]), "totals": totals_of(r["output"]), "load": load}}
    res["ratio"] = res["job"]["rate"] / bare["rate"] if bare["rate"] else None
    res["ratio_saving"] = res["job"]["rate"] / saving["rate"] if saving and saving["rate"] else None
    j = res["job"]
    vs_saving = f", {res['ratio_saving']:.2f}x the saving loop" if res["ratio_saving"] else ""
    print(f"  job: {n:,} in {j['wall']:.1f} s = {j['rate']:,.0f} msg/s whole process ({res['ratio']:.2f}x the bare "
          f"loop{vs_saving}), {j['batches']} batches, CPU {j['cpu']:.0f} s, "
          f"peak PSS {j['peak_pss'] / 2**20:,.0f} MiB; "
          f"{j['stats']}", flush=True)
    return res


def scenario_readers(emu: Emulator, args, work: Path) -> dict:
    """readers: the bare and the saving loop, each against a publisher at ``--soak-rate`` (no Spark)."""
    rate, seconds = args.soak_rate, args.live_seconds
    count = int(rate * seconds)
    load = load_average()
    res: dict = {"kind": "readers", "rate": rate, "seconds": seconds, "load": load}
    for reader in args.readers:
        name = f"readers-{reader}-{int(time.time())}"
        topic, sub = f"projects/{PROJECT}/topics/{name}", f"projects/{PROJECT}/subscriptions/{name}"
        create(topic, [sub])
        clock = fast_clock(seconds + 60, default_speedup(_trigger_s(args)), time.time() + 5)
        pubs = Publishers(emu.host, topic, count=count, workers=args.publishers, seed=args.seed, clock=clock, rate=rate)
        try:
            print(f"readers: {reader} loop against {rate:,} msg/s for {seconds:.0f} s ...", flush=True)
            if reader == "bare":
                r = bare_loop(sub, count, quiet=30.0)
            else:
                r = saving_loop(sub, count, work / "readers-saving.spool", save_every=args.save_every,
                                save_age=args.save_age, quiet=30.0)
            done = r["last_at"]  # its last acknowledgement (its last pull, on an empty subscription, may wait 30 s)
            sent = pubs.join()
            pubs = None
        finally:
            if pubs is not None:
                pubs.stop()
        res[reader] = {"after": done - sent["t1"], "published_in": sent["t1"] - sent["t0"], "count": r["distinct"]}
        print(f"  {reader} loop: read all {r['distinct']:,} {done - sent['t1']:.1f} s after the publisher stopped "
              f"(it published for {sent['t1'] - sent['t0']:.1f} s)", flush=True)
    return res


def default_speedup(trigger_s: float) -> float:
    """An hour of event time every 3 trigger intervals + 1 s (see the module docstring)."""
    return 3600 / (3 * trigger_s + 1)


def fast_clock(seconds: float, speedup: float, origin: float) -> Clock:
    """Event time ``speedup`` times the clock, from far enough back that it never passes the publish time."""
    lead_ms = int(speedup * seconds * 1000) + HOUR_MS  # behind by at least an hour at the end
    start = int(origin * 1000) - lead_ms
    return Clock("fast", start_ms=start - start % HOUR_MS + 30 * 60_000, origin=origin, speedup=speedup)


def marker_rows(sink: Path, seen: dict[str, float], requests: list[tuple[float, int, int]], ooo_ms: int,
                since: float) -> list[dict]:
    """Per hour closed by the watermark after ``since``: when the watermark passed its end, when the marker showed."""
    rows = []
    for marker in sorted(sink.glob(f"{EVENT_TYPE}/dt=*/hour=*/_COMPLETE")):
        m = json.loads(marker.read_text())
        if m.get("closed_by", "watermark") != "watermark":
            continue
        end = _parse_ms(m["hour"]) + HOUR_MS
        passed = next((t for t, top, _ in requests if top is not None and top - ooo_ms >= end), None)
        if passed is None or passed < since:
            continue
        rel = str(marker.relative_to(sink))
        rows.append({"hour": m["hour"], "passed": passed, "visible": seen.get(rel),
                     "written": _parse_ms(m["completed_at"]) / 1000})
    return rows


def _parse_ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _ooo_ms() -> int:
    from event_etl.eventtypes import load_event_types, resolve_event_types_dir

    return load_event_types(resolve_event_types_dir(None))[EVENT_TYPE].out_of_orderness


def _trigger_s(args) -> float:
    from event_etl.timeutil import parse_duration

    for i, a in enumerate(args.job_arg):
        if a == "--trigger-interval" and i + 1 < len(args.job_arg):
            return parse_duration(args.job_arg[i + 1]) / 1000
    return 5.0


def consumed_at(job: LiveJob, total: int, timeout: float) -> float | None:
    """Wall time of the batch line that brought the job's count to ``total`` (waits up to ``timeout``)."""
    if not job.wait_events(total, timeout=timeout):
        return None
    count = 0
    for t, line in list(job.lines):
        m = BATCH_LINE.search(line)
        if m:
            count += int(m.group(2).replace(",", ""))
            if count >= total:
                return t
    return None


def warm_emulator(emu: Emulator, args) -> None:
    """``--warm-emulator N``: N messages published to a topic of their own and drained by the bare loop before the
    job starts, so that the emulator's JVM has compiled its publish, pull and acknowledge paths: a fresh emulator
    serves the first tens of seconds several times slower, which the real service never does."""
    if not args.warm_emulator:
        return
    name = f"warm-{int(time.time())}"
    topic, sub = f"projects/{PROJECT}/topics/{name}", f"projects/{PROJECT}/subscriptions/{name}"
    create(topic, [sub])
    print(f"warming the emulator with {args.warm_emulator:,} messages", flush=True)
    publish_all(emu.host, topic, args.warm_emulator, args, Clock("now"))
    r = bare_loop(sub, args.warm_emulator)
    print(f"  the bare loop read them at {r['rate']:,.0f} msg/s", flush=True)


def scenario_live(kind: str, emu: Emulator, args, work: Path) -> dict:
    """live / soak: a job with default settings, a publisher at a fixed rate, event time sped up."""
    import psutil

    from bench.memory import summarize as memory_summary
    from bench.memory import take_sample
    from bench.sinkwatch import SinkWatcher

    rate, seconds = (args.live_rate, args.live_seconds) if kind == "live" else (args.soak_rate, args.soak_minutes * 60)
    trigger = _trigger_s(args)
    speedup = args.speedup or default_speedup(trigger)
    name = f"{kind}-{int(time.time())}"
    topic, sub = f"projects/{PROJECT}/topics/{name}", f"projects/{PROJECT}/subscriptions/{name}-job"
    create(topic, [sub])
    sink, ckpt = work / f"{kind}-sink", work / f"{kind}-ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    warm_emulator(emu, args)
    origin = time.time() + 60  # about when the feed starts: the clock is fixed before the priming messages
    clock = fast_clock(seconds + 120, speedup, origin)
    print(f"{kind}: priming with {args.prime:,} messages", flush=True)
    publish_all(emu.host, topic, args.prime, args, clock)
    job = LiveJob(job_command(sub, sink, ckpt, args), log=work / f"{kind}-job.log")
    samples: list[dict] = []
    watcher = SinkWatcher(sink)
    pubs = None
    try:
        job.wait_for(BATCH_LINE, timeout=300)
        watcher.start()
        root = psutil.Process(job.pid)
        t_job = time.monotonic()
        load = load_average()
        print(f"{kind}: job ready; publishing {rate:,} msg/s for {seconds:.0f} s (event time {speedup:g}x)", flush=True)
        total = args.prime + int(rate * seconds)
        pubs = Publishers(emu.host, topic, count=int(rate * seconds), workers=args.publishers, seed=args.seed,
                          clock=clock, rate=rate, first_index=args.prime)
        next_print = time.time() + 30
        while not pubs.result.ready():
            s = take_sample(root, t_job) if kind == "soak" else None
            if s is not None:
                samples.append(s)
            if time.time() >= next_print:
                next_print += 30
                print(f"  {time.time() - pubs.start_at:5.0f} s: job has read {job.events_in():,}"
                      + (f", PSS {s['pss'] / 2**20:,.0f} MiB" if s else ""), flush=True)
            pubs.result.wait(args.sample_every if kind == "soak" else 1.0)
        sent = pubs.join()
        pubs = None
        stopped = sent["t1"]
        done = consumed_at(job, total, timeout=max(120.0, seconds))
        time.sleep(0.5)
    finally:
        if pubs is not None:
            pubs.stop()
        code = job.stop()
        watcher.stop()
        if job.running():
            kill_tree(job.pid)
    if code != 0:
        raise BenchError(f"event-etl exited with {code}:\n{job.tail()}")
    files, hours = check_output(sink, total, kind)
    since = sent["t0"] + args.warmup
    rows = marker_rows(sink, watcher.seen, sent["requests"], _ooo_ms(), since)
    delays = [r["visible"] - r["passed"] for r in rows if r["visible"] is not None]
    written = [r["written"] - r["passed"] for r in rows]
    text = "\n".join(line for _, line in job.lines)
    batches = batch_lines([line for t, line in job.lines if t >= sent["t0"]])
    res = {"kind": kind, "rate": rate, "seconds": seconds, "speedup": speedup, "total": total, "trigger": trigger,
           "published_in": sent["t1"] - sent["t0"], "consumed_after": None if done is None else done - stopped,
           "marker": {q: percentile(delays, q) for q in (50, 99, 100)}, "marker_hours": len(delays),
           "marker_written": {q: percentile(written, q) for q in (50, 99, 100)}, "bound": trigger + 2,
           "files": files, "hours": hours, "stats": pubsub_stats(text), "totals": totals_of(text), "load": load,
           "batches": len(batches), "events_per_batch": sum(b for b, _ in batches) / max(1, len(batches)),
           "mean_batch_s": sum(s for _, s in batches) / max(1, len(batches)),
           "max_batch_s": max((s for _, s in batches), default=0.0)}
    if kind == "soak" and len(samples) >= 3:
        warm = max(30.0, 0.1 * (samples[-1]["t"]))
        res["memory"] = memory_summary(samples, warmup=warm, tolerance=10.0)
        (work / "soak-samples.json").write_text(json.dumps(samples))
    m = res["marker"]
    print(f"  {kind}: consumed {_s(res['consumed_after'])} after the publisher stopped (published in "
          f"{res['published_in']:.1f} s); marker delay p50 {_s(m[50])} p99 {_s(m[99])} max {_s(m[100])} over "
          f"{len(delays)} hours (bound {res['bound']:.0f} s); {res['stats']}", flush=True)
    return res


def scenario_restart(emu: Emulator, args, work: Path) -> dict:
    n = args.messages
    name = f"restart-{int(time.time())}"
    topic, sub = f"projects/{PROJECT}/topics/{name}", f"projects/{PROJECT}/subscriptions/{name}-job"
    create(topic, [sub])
    sink, ckpt = work / "restart-sink", work / "restart-ckpt"
    for d in (sink, ckpt):
        shutil.rmtree(d, ignore_errors=True)
    publish_all(emu.host, topic, args.prime, args, Clock("now"))
    cmd = job_command(sub, sink, ckpt, args)
    job = LiveJob(cmd, log=work / "restart-job-1.log")
    try:
        job.wait_for(BATCH_LINE, timeout=300)
        if not job.wait_events(args.prime, timeout=120):
            raise BenchError(f"the first run did not read the {args.prime:,} priming messages:\n{job.tail()}")
        job.proc.send_signal(signal.SIGINT)  # stop without draining: the downtime begins
        code = job.proc.wait(timeout=180)
    finally:
        if job.running():
            kill_tree(job.pid)
    if code != 0:
        raise BenchError(f"the first run exited with {code}:\n{job.tail()}")
    publish_all(emu.host, topic, n, args, Clock("now"), first_index=args.prime)
    print(f"restart: the same command again, {n:,} messages waiting", flush=True)
    load = load_average()
    t0 = time.time()
    job = LiveJob(cmd, log=work / "restart-job-2.log")
    try:
        done = consumed_at(job, n, timeout=max(600.0, n / 500))
        first = next((t for t, line in job.lines if BATCH_LINE.search(line)), None)
        code = job.stop()
    finally:
        if job.running():
            kill_tree(job.pid)
    if code != 0:
        raise BenchError(f"the second run exited with {code}:\n{job.tail()}")
    if done is None:
        raise BenchError(f"the job did not catch up:\n{job.tail()}")
    files, hours = check_output(sink, args.prime + n, "restart")
    text = "\n".join(line for _, line in job.lines)
    batches = batch_lines([line for _, line in job.lines])
    first_batch_s = batches[0][1] if batches else 0.0
    res = {"kind": "restart", "messages": n, "load": load, "seconds": done - t0, "rate": n / (done - t0),
           "from_first_batch": (done - (first - first_batch_s)) if first else None, "batches": len(batches),
           "largest_batch": max(batches, default=(0, 0.0)), "stats": pubsub_stats(text), "totals": totals_of(text),
           "files": files, "hours": hours}
    res["rate_batches"] = n / res["from_first_batch"] if res["from_first_batch"] else None
    print(f"  restart: {n:,} caught up in {res['seconds']:.1f} s from the start ({res['rate']:,.0f} msg/s), "
          f"{_rate(res['rate_batches'])} msg/s from the first batch; {res['stats']}", flush=True)
    return res


# -- the report ------------------------------------------------------------------------------------------
def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _req(st: dict | None) -> str:
    if not st:
        return "-"
    return (f"{st['per_1000']:.1f} (pull {st['pull']:,}, ack {st['acknowledge']:,}, modack "
            f"{st['modify_ack_deadline']:,}, get {st['get_subscription']:,})")


def _mib(x: float) -> str:
    return f"{x / 2**20:,.0f} MiB"


def report(res: dict, args, machine: dict, command: str) -> str:
    kind = res["kind"]
    title = {"backlog": "backlog after downtime", "backfill": "backfill of weeks-old events",
             "live": "live at a fixed rate", "soak": "soak", "restart": "restart after a downtime",
             "readers": "what plain readers sustain against a paced publisher"}[kind]
    head = [f"## Pub/Sub: {title} (bench/pubsub.py{', ' + args.label if args.label else ''})", "",
            machine_lines(machine, command, res["load"]), ""]
    emu_note = ("Google's Pub/Sub emulator on the same machine (it returns at most 100 messages a pull; the real "
                "service up to 1,000), page views of ~225 B, `" + args.master + "`.")
    if kind in ("backlog", "backfill"):
        j, b, sv = res["job"], res["bare"], res["saving"]
        what = ("event time = publish time (0-1 s behind)" if kind == "backlog" else
                f"event time {args.backfill_days} days ago, {args.backfill_hours} hours of it in publish order")
        rows = [["bare loop (pull 1,000, acknowledge)", f"{b['seconds']:.1f}", _rate(b["rate"]), "-", "-", "-", "-",
                 f"{b['pulls']:,} pulls, {b['acks']:,} acks"]]
        if sv is not None:
            rows.append([f"saving loop (pull 1,000, acknowledge every {sv['save_every']:,} once fsync'd)",
                         f"{sv['seconds']:.1f}", _rate(sv["rate"]), f"{sv['rate'] / b['rate']:.2f}×", "-", "-", "-",
                         f"{sv['pulls']:,} pulls, {sv['acks']:,} acks"])
        rows.append(["event-etl run --once --drain (whole process)", f"{j['wall']:.1f}", _rate(j["rate"]),
                     f"{res['ratio']:.2f}×", f"{res['ratio_saving']:.2f}×" if res["ratio_saving"] else "-",
                     f"{j['cpu']:.0f}", _mib(j["peak_pss"]), _req(j["stats"])])
        lb = j["largest_batch"]
        return "\n".join(head + [
            f"{res['messages']:,} messages, {what}, published before any reader starts; one topic, "
            f"{len(rows)} subscriptions, drained one after the other in this order. " + emu_note, "",
            markdown_table(["reader", "s", "msg/s", "× bare", "× saving", "CPU s", "peak PSS",
                            "requests per 1,000 messages"], rows), "",
            "The job acknowledges each pull once it is durable in its spool (`EVENT_ETL_PUBSUB_ACK=spooled`, one "
            "pull stream against the emulator), so it holds nothing leased while it pulls. The saving loop "
            "(`--drain-readers bare,saving`) holds up to a segment's worth until it is saved, as "
            "`EVENT_ETL_PUBSUB_ACK=committed` does; on the emulator, every pull made while a message is "
            "outstanding costs time in proportion to the backlog not yet delivered (`bench/emulator_pull.py`).", "",
            f"Goal ≥ 0.5× the bare loop: **{'MET' if res['ratio'] and res['ratio'] >= 0.5 else 'NOT MET'}**. "
            f"The job: {j['batches']} batches (largest {lb[0]:,} messages in {lb[1]:.2f} s), query time "
            f"{_s(j['query_seconds'])}; outcomes {j['totals']}; {j['hours']} hours marked, {j['files']} files, "
            f"records checked against the messages published."])
    if kind == "readers":
        rows = [[f"{key} loop", f"{res[key]['published_in']:.1f}", f"{res[key]['after']:.1f}",
                 "kept up" if res[key]["after"] <= 15 else "fell behind"]
                for key in args.readers]
        what = {"bare": "the bare loop (acknowledges each pull)",
                "saving": f"the saving loop (acknowledges what it holds once fsync'd, every {args.save_every:,} "
                          f"messages or {args.save_age:g} s)"}
        return "\n".join(head + [
            f"No Spark: a publisher ({args.publishers} processes) at {res['rate']:,} messages/s for "
            f"{res['seconds']:.0f} s, read by " + ", then, on a topic of its own, by ".join(
                what[r] for r in args.readers) + ". " + emu_note, "",
            markdown_table(["reader", "publisher ran (s)", "read everything, s after the publisher stopped", ""],
                           rows), "",
            "A reader that ends well after the publisher cannot sustain the rate here: a job that reads as it does "
            "cannot either."])
    if kind in ("live", "soak"):
        m, w = res["marker"], res["marker_written"]
        ok_consumed = res["consumed_after"] is not None and res["consumed_after"] <= 15
        ok_marker = m[99] is not None and m[99] <= res["bound"]
        rows = [["all messages saved, after the publisher stopped", "-", "-", _s(res["consumed_after"]), "≤ 15 s",
                 "MET" if ok_consumed else "NOT MET"],
                ["watermark passes hour end → `_COMPLETE` visible", _s(m[50]), _s(m[99]), _s(m[100]),
                 f"≤ {res['bound']:.0f} s", "MET" if ok_marker else "NOT MET"],
                ["… to `completed_at` in the manifest", _s(w[50]), _s(w[99]), _s(w[100]), "", ""]]
        body = head + [
            f"A job with default settings (trigger {res['trigger']:g} s) live; {args.prime:,} priming messages "
            f"start it; then {res['rate']:,} messages/s for {res['seconds']:.0f} s from {args.publishers} publisher "
            f"processes (sent in {res['published_in']:.1f} s), event time {res['speedup']:g}× the clock; "
            f"{res['marker_hours']} hours closed by the watermark after {args.warmup:g} s of warm-up. "
            + (f"Before the job started, {args.warm_emulator:,} messages warmed the emulator (published and read by "
               "the bare loop). " if args.warm_emulator else "") + emu_note, "",
            markdown_table(["figure", "p50", "p99", "max", "goal", ""], rows), "",
            f"Batches while publishing and after: {res['batches']}, {res['events_per_batch']:,.0f} messages each on "
            f"average, {res['mean_batch_s']:.2f} s mean / {res['max_batch_s']:.2f} s longest. Requests per 1,000 "
            f"messages: {_req(res['stats'])}. Outcomes {res['totals']}; {res['hours']} hours marked, "
            f"{res['total']:,} records checked."]
        if "memory" in res:
            from bench.memory import table as memory_table

            mem = res["memory"]
            body += ["", memory_table(mem), "",
                     f"Memory (PSS/RSS of the job's process tree, medians over {mem['window_s']:.0f} s): "
                     f"**{'flat' if mem['flat'] else 'GROWING'}** (no part may grow more than 10 %)."]
        return "\n".join(body)
    lb = res["largest_batch"]
    return "\n".join(head + [
        f"A live job (default settings) read {args.prime:,} messages and was stopped with Ctrl-C (no drain); "
        f"{res['messages']:,} messages (event time = publish time) were published while it was down; then the "
        "same command ran again. " + emu_note, "",
        markdown_table(["catch-up", "s", "msg/s"],
                       [["from the command's start (JVM included) to the batch that saved the last one",
                         f"{res['seconds']:.1f}", _rate(res["rate"])],
                        ["from its first batch's start", _s(res["from_first_batch"]).replace(" s", ""),
                         _rate(res["rate_batches"])]]), "",
        f"{res['batches']} batches (largest {lb[0]:,} messages in {lb[1]:.2f} s); requests per 1,000 messages: "
        f"{_req(res['stats'])}; outcomes {res['totals']}; {res['hours']} hours marked, records checked."])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="backlog,backfill,live,soak,restart",
                    help="comma-separated: backlog, backfill, live, soak, restart, readers "
                         "(default: all but readers)")
    ap.add_argument("--messages", type=int, default=1_000_000, help="backlog, backfill, restart (default 1,000,000)")
    ap.add_argument("--drain-readers", default="bare",
                    help="backlog, backfill: the loops drained before the job (bare; bare,saving adds the saving loop, "
                         "which holds what it has not saved: slow on the emulator)")
    ap.add_argument("--save-every", type=int, default=5000,
                    help="messages the saving loop holds before it saves and acknowledges (default 5,000)")
    ap.add_argument("--save-age", type=float, default=0.5,
                    help="seconds the saving loop holds messages before it saves and acknowledges (default 0.5)")
    ap.add_argument("--readers", default="bare,saving",
                    type=lambda v: list(dict.fromkeys(r for r in v.split(",") if r)),
                    help="readers: which loops run, in order (default bare,saving; 'saving' alone meets a cold "
                         "emulator, as a job does)")
    ap.add_argument("--backfill-days", type=int, default=21)
    ap.add_argument("--backfill-hours", type=int, default=12)
    ap.add_argument("--live-rate", type=int, default=10_000)
    ap.add_argument("--live-seconds", type=float, default=60)
    ap.add_argument("--soak-rate", type=int, default=20_000)
    ap.add_argument("--soak-minutes", type=float, default=10)
    ap.add_argument("--speedup", type=float, default=None,
                    help="event time per wall time in live and soak (default: an hour every 3 trigger intervals + 1 s)")
    ap.add_argument("--prime", type=int, default=1000, help="messages that start a live job (default 1,000)")
    ap.add_argument("--warm-emulator", type=int, default=0,
                    help="live, soak: messages published and drained by the bare loop before the job starts, to warm "
                         "the emulator's JVM (default 0: none)")
    ap.add_argument("--warmup", type=float, default=10, help="seconds of feed before markers count (default 10)")
    ap.add_argument("--sample-every", type=float, default=5.0, help="soak: seconds between memory samples")
    ap.add_argument("--publishers", type=int, default=2, help="publisher processes (default 2)")
    ap.add_argument("--master", default="local[2]", help="local[N], or spark://HOST:PORT (runs event-etl submit)")
    ap.add_argument("--job-arg", action="append", default=[],
                    help="an extra argument for the job, e.g. --job-arg=--trigger-interval --job-arg=2s")
    ap.add_argument("--label", default="", help="appended to the section names (e.g. 'cluster, 2 workers')")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=None, help="keep sinks, checkpoints and job logs here")
    ap.add_argument("--results", type=Path, default=None, help="results file (default bench/RESULTS.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = set(args.scenarios) - {"backlog", "backfill", "live", "soak", "restart", "readers"}
    if set(args.readers) - {"bare", "saving"} or not args.readers:
        ap.error("--readers takes bare, saving or both (comma-separated)")
    if bad:
        ap.error(f"unknown scenarios: {', '.join(sorted(bad))}")
    return args


def section_name(kind: str, label: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return f"pubsub-{kind}" + (f"-{slug}" if slug else "")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/pubsub.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="event_etl-pubsub-"))
    work.mkdir(parents=True, exist_ok=True)
    emu = Emulator(work)
    results = []
    try:
        machine = describe()
        emu.start()
        os.environ["PUBSUB_EMULATOR_HOST"] = emu.host  # this process's clients and every child's
        print(f"emulator on {emu.host}; load average {load_average():.2f}", flush=True)
        for kind in args.scenarios:
            if kind in ("backlog", "backfill"):
                res = scenario_drain(kind, emu, args, work)
            elif kind in ("live", "soak"):
                res = scenario_live(kind, emu, args, work)
            elif kind == "readers":
                res = scenario_readers(emu, args, work)
            else:
                res = scenario_restart(emu, args, work)
            results.append(res)
            (work / f"{kind}.json").write_text(json.dumps(res, indent=1, default=str))
            if not args.no_write:
                publish(section_name(kind, args.label), report(res, args, machine, command), args.results)
    finally:
        emu.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
