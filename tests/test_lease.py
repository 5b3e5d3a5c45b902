"""One writer per event type and sink: the checkpoint lock and the sink lease."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from event_etl.errors import LeaseHeldError
from event_etl.lease import Lease
from event_etl.storage import Storage
from tests.harness import FakeClock, t


def lease(tmp_path, ck="ck1", clock=None, ttl=60_000):
    return Lease(Storage(str(tmp_path / "sink")), "click", tmp_path / ck, clock or FakeClock(t("13:00")), ttl_ms=ttl)


def test_a_second_job_on_the_same_sink_is_refused_naming_the_holder(tmp_path):
    first = lease(tmp_path, "ck1").acquire()
    try:
        with pytest.raises(LeaseHeldError) as info:
            lease(tmp_path, "ck2").acquire()
        msg = str(info.value)
        assert "already being written" in msg and str(tmp_path / "ck1") in msg and "pid" in msg
        assert info.value.exit_code == 3
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
    with pytest.raises(LeaseHeldError):
        lease(tmp_path, "ck2", clock).acquire()
    clock.now = t("13:01:01")
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


def test_the_checkpoint_lock_is_held_by_the_process(tmp_path):
    """A second process on the same checkpoint is refused while the first lives, and not after."""
    first = lease(tmp_path, "ck1").acquire()
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {repr(str(__import__('pathlib').Path(__file__).resolve().parent.parent))})
        from event_etl.lease import Lease
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
