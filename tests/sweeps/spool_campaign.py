"""The spool campaign (issue 47): the Pub/Sub fetcher broken at every call of its spool path, then restarted.

:mod:`tests.sweeps.crash_sweep` kills the job's write path before every file-system call; this sweep does the same for
the path from a pull to its acknowledgement, where the spool is the only copy of what was acknowledged.  The real
:class:`~event_etl.sources.pubsub_fetch.Fetcher` pulls from a fake of the real service
(:class:`tests.lib.pubsub_service.CappedService`: 20 messages a pull, leases that run out, ``DeadlineExceeded`` on an
empty pull); a consumer plays the planner and the batches (reads each closed segment, tells the fetcher it was
saved, deletes it).  A :class:`Tap` wraps the calls the fetcher's threads make (``os.open``, ``os.write``,
``os.fdatasync``, ``os.fsync``, ``os.ftruncate``, ``os.replace`` and the service's ``pull``, ``acknowledge`` and
``modify_ack_deadline``) and, at call ``k`` of a clean run's sequence, does one of:

- ``kill``: the process dies there (:class:`Killed`, a ``BaseException``; every later call of its threads raises
  too, so no ``finally`` of a dead process touches the disk or the service); then a new fetcher on the same spool
  (a restart: it finishes the open segments and settles for the leases the dead one may have left);
- ``torn``: a write dies half done (half its bytes written, then killed): the torn tail of a power cut or a kill;
- ``enospc``: that write, open or sync fails with ``ENOSPC`` once (a disk that fills, then has room again);
- ``eio``: that sync fails with ``EIO``: the stream dies, the job stops with the error and is restarted.

After every case, by message id: every message published was consumed (``lost``: acknowledged to the service and
never consumed, the spool's promise; ``missing``: any other), none twice except in batches the fetcher reported as
not all acknowledged (``unexpected duplicates``: a redelivery the dedupe window would not be waiting for), no
restart raised (``failed restarts``), and (``premature``) once the restarted fetcher stops settling, every message
the dead one acknowledged is consumed or in the spool: no hour could be marked before it was read.

``.venv/bin/python -m tests.sweeps.spool_campaign`` runs every case and prints a table per window (the kind of call and
the fault); ``--every N`` runs every N-th call of each kind (``tests/test_spool_campaign.py`` runs a sample).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from event_etl.sources import pubsub_run
from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings
from event_etl.sources.spool.segment import _HEAD, MAGIC, _parse, _scan, read_messages
from tests.lib.harness import t
from tests.lib.pubsub_service import CappedService

__all__ = ["Killed", "Tap", "Case", "run_case", "cases", "main"]

MESSAGES = 240
SUBSCRIPTION = "projects/campaign/subscriptions/spool"
FAULTS = ("kill", "torn", "enospc", "eio")
_OS_CALLS = ("open", "write", "fdatasync", "fsync", "ftruncate", "replace")
_SERVICE_CALLS = ("pull", "acknowledge", "modify_ack_deadline")


class Killed(BaseException):
    """The process died here."""


@dataclass
class Case:
    fault: str  # kill, torn, enospc, eio, or "" for the clean run
    at: int  # the index of the call in the clean run's sequence


@dataclass
class Outcome:
    case: Case
    window: str
    lost: int = 0
    missing: int = 0
    unexpected_duplicates: int = 0
    expected_duplicates: int = 0
    failed_restart: str | None = None
    premature: int = 0
    restarted: bool = False

    @property
    def ok(self) -> bool:
        return not (self.lost or self.missing or self.unexpected_duplicates or self.failed_restart or self.premature)


@dataclass
class Tap:
    """Counts and breaks the calls of one generation of fetcher threads (see the module docstring)."""

    case: Case | None = None
    gen: int = 0
    calls: list[str] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)  # generations that died
    fired: bool = False
    window: str = ""
    _local: threading.local = field(default_factory=threading.local)

    def adopt(self, fetcher: Fetcher) -> None:
        for th in fetcher._threads:
            th._spool_gen = self.gen  # type: ignore[attr-defined]

    def _gen(self) -> int | None:
        th = threading.current_thread()
        if not th.name.startswith("pubsub-"):
            return None
        return getattr(th, "_spool_gen", self.gen)

    def before(self, kind: str, *, data: bytes | memoryview | None = None, fd: int | None = None) -> None:
        g = self._gen()
        if g is None:
            return
        if g in self.dead:
            raise Killed(f"generation {g} is dead")
        if g != 0:
            return
        k = len(self.calls)
        self.calls.append(kind)
        case = self.case
        if case is None or self.fired or case.at != k:
            return
        if case.fault == "kill":
            self.fired, self.window = True, f"kill before {kind}"
            self.dead.add(g)
            raise Killed(kind)
        if case.fault == "torn" and kind == "write" and data is not None and fd is not None and len(data) > 1:
            self.fired, self.window = True, "torn write"
            self.dead.add(g)
            _REAL["write"](fd, bytes(data[:len(data) // 2]))
            raise Killed("torn write")
        if case.fault == "enospc" and kind in ("open", "write", "fdatasync"):
            self.fired, self.window = True, f"ENOSPC on {kind}"
            raise OSError(errno.ENOSPC, "No space left on device")
        if case.fault == "eio" and kind in ("fdatasync", "fsync"):
            self.fired, self.window = True, f"EIO on {kind}"
            raise OSError(errno.EIO, "Input/output error")


_REAL: dict[str, object] = {}
TAP_CLEAN: list[str] = []  # the clean run's calls, as the sweep last found them
TAP = Tap()


def _quiet_killed_threads(args) -> None:
    """A thread of a dead generation ends with :class:`Killed`: that is the death, not an error to print."""
    if not issubclass(args.exc_type, Killed):
        _EXCEPTHOOK(args)


_EXCEPTHOOK = threading.excepthook


def _install() -> None:
    if _REAL:
        return
    threading.excepthook = _quiet_killed_threads
    for name in _OS_CALLS:
        _REAL[name] = getattr(os, name)

    def wrap(name):
        real = _REAL[name]

        def call(*args, **kwargs):
            if name == "write":
                TAP.before(name, data=args[1], fd=args[0])
            elif name == "open":
                flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
                if flags & (os.O_WRONLY | os.O_RDWR):
                    TAP.before(name)
            else:
                TAP.before(name)
            return real(*args, **kwargs)

        return call

    for name in _OS_CALLS:
        setattr(os, name, wrap(name))


class TappedClient:
    """The service as the fetcher's threads see it: each call goes through the :class:`Tap` first."""

    def __init__(self, svc: CappedService) -> None:
        self.svc = svc

    def __getattr__(self, name):
        real = getattr(self.svc, name)
        if name not in _SERVICE_CALLS:
            return real

        def call(**kw):
            TAP.before(name)
            return real(**kw)

        return call


def _spool_ids(segdir: Path) -> set[str]:
    """The message ids of every frame the spool holds whole (closed, open and fenced segments).  A segment renamed
    while it is read (a fetcher finishing or fencing it: the new run's, or a stop's close still going on in its
    thread) makes the listing stale: it is read again."""
    for _ in range(50):
        try:
            return _spool_ids_once(segdir)
        except FileNotFoundError:
            time.sleep(0.02)
    return _spool_ids_once(segdir)


def _spool_ids_once(segdir: Path) -> set[str]:
    out: set[str] = set()
    for p in segdir.iterdir():
        if p.suffix == ".seg":
            out.update(m for _, m, _, _, _ in read_messages(p))
        elif p.suffix in (".open", ".fenced"):
            data = p.read_bytes()
            good, pos = _scan(data).good, len(MAGIC)
            while pos < good:
                n = _HEAD.unpack_from(data, pos)[0]
                out.update(rm.message.message_id for rm in _parse(data[pos + _HEAD.size:pos + _HEAD.size + n])
                           .received_messages)
                pos += _HEAD.size + n
    return out


def run_case(case: Case, workdir: Path, *, messages: int = MESSAGES) -> Outcome:
    """One case from scratch (see the module docstring)."""
    _install()
    TAP.case, TAP.calls, TAP.dead, TAP.fired, TAP.window, TAP.gen = case, [], set(), False, "", 0
    svc = CappedService(cap=20)
    svc.subscription_deadline = 1  # a killed run's leases: 1 s (+ the margin) of settling
    svc.deadline_s = 1.0  # and the service redelivers what was leased 1 s later
    published = {svc.publish(b"%06d" % i, t("13:00") + i) for i in range(messages)}
    spool = workdir / "spool"
    settings = dict(streams=1, segment_messages=60, segment_age=0.05, pull_timeout=0.1, outage_timeout=2.0,
                    once_quiet=0.3)
    consumed: Counter = Counter()
    expected: set[str] = set()  # in a batch the fetcher said was not all acknowledged: may come again

    def consume(f: Fetcher) -> None:
        for p in sorted((spool / "segments").glob("*.seg")):
            ids = [m for _, m, _, _, _ in read_messages(p)]
            if not f.ack({p.name}):
                expected.update(ids)
            consumed.update(ids)
            p.unlink()

    out = Outcome(case, "")
    f = Fetcher(SUBSCRIPTION, spool, settings=FetchSettings(**settings), client_factory=lambda: TappedClient(svc))
    f.start()
    TAP.adopt(f)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not TAP.dead and f.error is None and set(consumed) != published:
        consume(f)
        time.sleep(0.02)
    acked_by_first = set(svc.acked)
    if TAP.dead or f.error is not None:
        if f.error is not None and not TAP.dead:  # the job stops with the error: its fetcher stopped as it exits
            f.stop(timeout=2.0)
            consume(f)  # what the last batch saved
        out.restarted = True
        TAP.gen = 1
        try:
            f = Fetcher(SUBSCRIPTION, spool, settings=FetchSettings(**settings),
                        client_factory=lambda: TappedClient(svc))
            f.start()
        except Exception as err:  # noqa: BLE001 - a restart that fails is a finding
            out.failed_restart = f"{type(err).__name__}: {err}"
            out.window = TAP.window or "clean"
            return out
        TAP.adopt(f)
        while f.settling() and time.monotonic() < deadline + 10:
            consume(f)
            time.sleep(0.02)
        # no longer settling: an hour may be marked from now on; what the dead run acknowledged must be in hand
        out.premature = len(acked_by_first - set(consumed) - _spool_ids(spool / "segments"))
        until = time.monotonic() + 15
        while time.monotonic() < until and set(consumed) != published:
            consume(f)
            time.sleep(0.02)
    f.stop(timeout=2.0)
    consume(f)
    out.window = TAP.window or ("clean" if case.fault == "" else f"{case.fault}: not reached")
    out.lost = len(set(svc.acked) - set(consumed))
    out.missing = len(published - set(consumed))
    dups = {m for m, n in consumed.items() if n > 1}
    out.unexpected_duplicates = len(dups - expected)
    out.expected_duplicates = len(dups & expected)
    return out


def cases(calls: list[str], every: int = 1) -> list[Case]:
    """The cases of a clean run's call sequence ``calls``: a kill before each call, and the faults each kind of
    call can meet (only every ``every``-th call of each kind)."""
    out = []
    seen: Counter = Counter()
    for k, kind in enumerate(calls):
        seen[kind] += 1
        if (seen[kind] - 1) % every:
            continue
        out.append(Case("kill", k))
        if kind == "write":
            out.append(Case("torn", k))
        if kind in ("open", "write", "fdatasync"):
            out.append(Case("enospc", k))
        if kind in ("fdatasync", "fsync"):
            out.append(Case("eio", k))
    return out


def clean_calls(workdir: Path) -> list[str]:
    """The call sequence of a clean run."""
    run_case(Case("", -1), workdir)
    return list(TAP.calls)


def table(outcomes: list[Outcome]) -> str:
    rows: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        rows[o.window].append(o)
    lines = ["| window | cases | restarts | lost | missing | duplicated (unexpected) | duplicated (waited for) | "
             "premature | failed restarts |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for window, os_ in sorted(rows.items()):
        lines.append(f"| {window} | {len(os_)} | {sum(o.restarted for o in os_)} | {sum(o.lost for o in os_)} | "
                     f"{sum(o.missing for o in os_)} | {sum(o.unexpected_duplicates for o in os_)} | "
                     f"{sum(o.expected_duplicates for o in os_)} | {sum(o.premature for o in os_)} | "
                     f"{sum(1 for o in os_ if o.failed_restart)} |")
    return "\n".join(lines)


def sweep(every: int = 1, workroot: Path | None = None) -> list[Outcome]:
    margin = pubsub_run.SETTLE_MARGIN_SECONDS
    pubsub_run.SETTLE_MARGIN_SECONDS = 0.2  # the settling: the lease (1 s) and a little; put back at the end
    try:
        root = Path(workroot or tempfile.mkdtemp(prefix="spool-campaign-"))
        calls = clean_calls(root / "clean")
        TAP_CLEAN[:] = calls
        outcomes = []
        for i, case in enumerate(cases(calls, every)):
            work = root / f"case-{i:04d}"
            outcomes.append(run_case(case, work))
            shutil.rmtree(work, ignore_errors=True)
        return outcomes
    finally:
        pubsub_run.SETTLE_MARGIN_SECONDS = margin


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=1, help="only every N-th call of each kind (default: all)")
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.ERROR)  # the fetcher's warnings of each case (cut tails, full disks...)
    started = time.monotonic()
    outcomes = sweep(args.every)
    print(table(outcomes))
    bad = [o for o in outcomes if not o.ok]
    print(f"{len(outcomes)} cases ({len(TAP_CLEAN)} calls in a clean run) in {time.monotonic() - started:.0f} s; "
          f"{len(bad)} with a finding")
    for o in bad[:20]:
        print(f"  {o.case}: {o}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
