"""One writer per event type and sink: the checkpoint lock and the sink lease."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from event_etl.errors import LeaseHeldError
from event_etl.storage import Storage
from event_etl.storage.lease import Lease
from tests.lib.harness import FakeClock, t


def lease(tmp_path, ck="ck1", clock=None, ttl=60_000):
    return Lease(Storage(str(tmp_path / "sink")), "click", tmp_path / ck, clock or FakeClock(t("13:00")), ttl_ms=ttl)


def test_a_second_job_on_the_same_sink_is_refused_naming_the_holder(tmp_path):
    first = lease(tmp_path, "ck1").acquire()
    try:
        with pytest.raises(LeaseHeldError) as info:
            lease(tmp_path, "ck2").acquire()
        msg = str(info.value)
        assert "already being written" in msg and str(tmp_path / "ck1") in msg and "pid" in msg
        assert info.value.exit_code == 7
    finally:
        first.release()
    lease(tmp_path, "ck2").acquire().release()  # released: free again


def test_an_expired_lease_is_taken_over(tmp_path):
    clock = FakeClock(t("13:00"))
    dead = lease(tmp_path, "ck1", clock)
    dead.acquire()
    dead._stop.set()  # its holder "dies": no more renewals (its process would hold no lock either)
    dead._unlock()
    clock.now = t("13:00:30")
    with pytest.raises(LeaseHeldError, match="valid for 30s more"):
        lease(tmp_path, "ck2", clock).acquire()
    clock.now = t("13:01:10")  # expired, but not for the margin (ttl / 4) yet: the old holder may still write
    with pytest.raises(LeaseHeldError, match="ran out 10s ago and may be taken over in 5s"):
        lease(tmp_path, "ck2", clock).acquire()
    with pytest.raises(LeaseHeldError, match="could not be renewed in time"):
        dead.guard()  # while nobody may take it yet, the old holder has already stopped writing
    clock.now = t("13:01:16")
    new = lease(tmp_path, "ck2", clock).acquire()
    with pytest.raises(LeaseHeldError, match="now held by"):
        dead.check()  # the old holder, if it comes back, stops
    new.release()


def test_a_restart_on_the_same_checkpoint_takes_over_at_once(tmp_path):
    clock = FakeClock(t("13:00"))
    crashed = lease(tmp_path, "ck1", clock).acquire()
    crashed._stop.set()
    crashed._unlock()  # what the kernel does when the process dies
    lease(tmp_path, "ck1", clock).acquire().release()


def test_a_renewal_killed_before_its_rename_leaves_nothing_once_the_lease_is_taken_again(tmp_path):
    """A SIGKILL during a renewal leaves ``._LEASE.<id>.tmp`` next to the lease (seen once in the directory
    campaign: "temporary files left"); the start's sweep of the sink keeps that folder (a running job renews there),
    so the job that takes the lease next removes it, and nothing else there."""
    clock = FakeClock(t("13:00"))
    crashed = lease(tmp_path, "ck1", clock).acquire()
    crashed._stop.set()
    crashed._unlock()
    folder = tmp_path / "sink" / "click"
    stale = folder / "._LEASE.0123456789ab.tmp"
    stale.write_bytes(b'{"holder": "half written')
    other = folder / "notes.txt"
    other.write_text("not the lease's")
    with pytest.raises(LeaseHeldError):
        lease(tmp_path, "ck2", clock).acquire()  # refused: it may not touch the holder's folder
    assert stale.exists()
    taken = lease(tmp_path, "ck1", clock).acquire()
    try:
        assert not stale.exists() and other.exists()
        names = {p.name for p in folder.iterdir()}
        assert {"_LEASE", "notes.txt"} <= names and not any(n.endswith(".tmp") for n in names), names
    finally:
        taken.release()


def test_the_checkpoint_lock_is_held_by_the_process(tmp_path):
    """A second process on the same checkpoint is refused while the first lives, and not after."""
    first = lease(tmp_path, "ck1").acquire()
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {repr(str(__import__('pathlib').Path(__file__).resolve().parent.parent))})
        from event_etl.storage.lease import Lease
        from event_etl.storage import Storage
        from event_etl.errors import LeaseHeldError
        try:
            Lease(Storage({str(tmp_path / 'other-sink')!r}), "click", {str(tmp_path / 'ck1')!r}, lambda: 0).acquire()
            print("acquired")
        except LeaseHeldError as e:
            print("refused:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("refused:") and "checkpoint" in out and "in use" in out
    first.release()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("acquired")


def test_lease_file_says_who_holds_it(tmp_path):
    ls = lease(tmp_path).acquire()
    doc = json.loads((tmp_path / "sink" / "click" / "_LEASE").read_text())
    assert {"host", "pid", "checkpoint", "started_at", "expires_at"} <= set(doc)
    ls.release()
    assert not (tmp_path / "sink" / "click" / "_LEASE").exists()


def test_the_same_checkpoint_path_on_another_host_is_another_job(tmp_path, monkeypatch):
    """A shared mount: a second host with the same --checkpoint does not take over a live lease."""
    clock = FakeClock(t("13:00"))
    first = lease(tmp_path, "ck1", clock).acquire()
    first._unlock()  # the other host does not see this host's flock
    other = lease(tmp_path, "ck1", clock)
    other.host = "another-host"
    with pytest.raises(LeaseHeldError, match="already being written"):
        other.acquire()
    first._stop.set()


def test_a_takeover_between_read_and_write_loses_the_race(tmp_path):
    """Renewals and takeovers are compare-and-swap: a lease changed after it was read is not overwritten."""
    storage = Storage(str(tmp_path / "sink"))
    storage.write_atomic("click/_LEASE", b'{"holder": "a"}')
    data, version = storage.read_versioned("click/_LEASE")
    storage.write_atomic("click/_LEASE", b'{"holder": "b"}')  # someone else, meanwhile
    assert storage.write_if("click/_LEASE", b'{"holder": "c"}', version) is False
    assert json.loads(storage.read("click/_LEASE"))["holder"] == "b"
    _, now_version = storage.read_versioned("click/_LEASE")
    assert storage.write_if("click/_LEASE", b'{"holder": "c"}', now_version) is True


def test_a_job_that_lost_its_lease_writes_nothing(tmp_path):
    """Fencing: once another job holds the lease, the driver's guard and every executor's fence refuse."""
    from event_etl.storage.lease import Fence

    clock = FakeClock(t("13:00"))
    old = lease(tmp_path, "ck1", clock).acquire()
    old._stop.set()
    old._unlock()
    fence = Fence(old.fence(), old.storage, clock)
    fence.check()  # holds it now
    clock.now = t("13:01:16")
    new = lease(tmp_path, "ck2", clock).acquire()
    with pytest.raises(LeaseHeldError):
        old.guard()
    with pytest.raises(LeaseHeldError, match="no longer holds"):
        fence.check()
    with pytest.raises(LeaseHeldError, match="now held by"):
        old.renew()
    new.release()


def test_a_fence_trusts_the_lease_until_its_expiry_minus_the_margin(tmp_path):
    from event_etl.storage.lease import Fence

    clock = FakeClock(t("13:00"))
    ls = lease(tmp_path, "ck1", clock).acquire()
    ls._stop.set()  # no renewals
    fence = Fence(ls.fence(), ls.storage, clock)
    fence.check()
    clock.now = t("13:00:44")
    fence.check()
    clock.now = t("13:00:45")  # expires 13:01:00, margin 15 s
    with pytest.raises(LeaseHeldError, match="runs out"):
        fence.check()
    ls.release()


def test_a_restart_on_the_same_host_fences_the_dead_jobs_tasks_at_their_next_file(tmp_path):
    """The restart takes over at once; a task of the dead job (an orphaned worker) trusted its cached fence for
    up to ~45 s and could write over a file the new run's replay rewrote.  On local disk it now reads the lease
    before every file, and stops."""
    import pytest

    from event_etl.errors import LeaseHeldError
    from event_etl.storage import Storage
    from event_etl.storage.lease import Fence, Lease
    from event_etl.timeutil import now_millis

    storage = Storage(str(tmp_path / "sink"))
    old = Lease(storage, "click", tmp_path / "ck", now_millis).acquire()
    task = Fence(old.fence(), storage)
    task.check()  # the dead job's task wrote a file: its fence looked at the lease
    old._stop.set()
    old._unlock()  # the job died: the kernel released its checkpoint lock (its lease is still valid)
    new = Lease(storage, "click", tmp_path / "ck", now_millis).acquire()
    try:
        assert new.old_tasks_until > now_millis(), "taken over before the dead job's lease ran out"
        with pytest.raises(LeaseHeldError):
            task.check()  # its next file
        assert new.wait_for_old_tasks() == 0.0, "local disk: no need to wait"
    finally:
        new.release()


def test_on_an_object_store_the_restart_waits_for_the_dead_jobs_lease_before_replaying(tmp_path, monkeypatch):
    from event_etl.storage import Storage
    from event_etl.storage.lease import Lease

    storage = Storage(str(tmp_path / "sink"))
    lease = Lease(storage, "click", tmp_path / "ck", lambda: 1_000_000)
    lease.old_tasks_until = 1_045_000
    monkeypatch.setattr(storage, "local", False)  # as on gs://, where a task trusts its fence until that expiry
    slept, said = [], []
    assert lease.wait_for_old_tasks(said.append, slept.append) == 45.0
    assert slept == [45.0] and "waiting 45s" in said[0]
