"""The light install's GCS file system (event_etl/storage/gcs_light.py, what a gs:// sink opens without gcsfs)
against fake-gcs-server: the storage contract, the lease's compare-and-swap, the same answers as gcsfs over a sink
the job wrote, and the consumer's API.  The light install itself (no gcsfs at all): test_consumer_install.py."""

from __future__ import annotations

import datetime as dt

import pytest

from event_etl.storage import Storage, gcs, sink
from event_etl.storage.gcs_light import GCSLightFileSystem
from tests.lib.consumer_scenario import build_hours
from tests.lib.storage_contract import StorageContract


@pytest.fixture
def without_gcsfs(monkeypatch):
    """As in the light install: gcsfs cannot be imported (a child process this test starts still has it)."""
    monkeypatch.setattr(gcs, "gcsfs_installed", lambda: False)
    monkeypatch.setattr(sink, "_CACHE", {})


@pytest.fixture
def storage(gcs_bucket, without_gcsfs):
    st = Storage(f"{gcs_bucket}/prefix")
    assert isinstance(st.fs, GCSLightFileSystem)
    return st


class TestLightGcsStorage(StorageContract):
    pass


def test_compare_and_swap(storage):
    assert storage.read_versioned("t/_LEASE") is None
    assert storage.write_if("t/_LEASE", b"one", None)
    data, version = storage.read_versioned("t/_LEASE")
    assert data == b"one" and version
    assert storage.write_if("t/_LEASE", b"two", version)
    assert not storage.write_if("t/_LEASE", b"three", version), "a stale version writes nothing"
    assert storage.read("t/_LEASE") == b"two"
    assert not storage.write_if("t/_GONE", b"x", "12345")


def test_nothing_is_written_outside_the_prefix(gcs_bucket, without_gcsfs):
    Storage(f"{gcs_bucket}/prefix").write_atomic("a/b.avro", b"x")
    assert Storage(gcs_bucket).list_dirs("prefix") == ["a"]
    assert Storage(gcs_bucket).list_files("prefix") == {}


def _walk(fs, path, out):
    for e in fs.ls(path, detail=True):
        out.append((e["name"], e["type"], e["size"], str(e.get("generation") or "")))
        if e["type"] == "directory":
            _walk(fs, e["name"], out)
    return out


def test_the_same_answers_as_gcsfs_over_a_sink_the_job_wrote(tmp_path, gcs_bucket):
    sc = build_hours(tmp_path, sink_url=f"{gcs_bucket}/events")
    options = gcs.fs_options(sc.sink)
    theirs, root = gcs.open_fs(sc.sink, options)
    ours = GCSLightFileSystem(**options)
    tree = _walk(theirs, root, [])
    assert _walk(ours, root, []) == tree and sum(t == "file" for _, t, _, _ in tree) >= 5
    for name, kind, size, generation in tree:
        theirs.invalidate_cache()
        a, b = theirs.info(name), ours.info(name)
        assert (a["type"], a["size"], str(a.get("generation") or "")) == (kind, size, generation), name
        assert (b["type"], b["size"], str(b.get("generation") or "")) == (kind, size, generation), name
        if kind == "file":
            assert ours.cat_file(name) == ours.cat_file(name, generation=generation) == theirs.cat_file(name)
    for fs in (theirs, ours):
        for call in (fs.ls, fs.info, fs.cat_file):
            with pytest.raises(FileNotFoundError):
                call(f"{root}/nothing")


def test_the_consumer_api_on_gcs_without_gcsfs(tmp_path, gcs_bucket, monkeypatch):
    from event_etl.consumer import (
        AuditResult,
        HourState,
        audit_hour,
        hour_status,
        hour_statuses,
        read_records,
        verify_hour,
        wait_for_hour,
    )

    sc = build_hours(tmp_path, sink_url=f"{gcs_bucket}/events")  # the job's writes, through gcsfs
    monkeypatch.setattr(gcs, "gcsfs_installed", lambda: False)
    monkeypatch.setattr(sink, "_CACHE", {})
    states = [s.state for s in hour_statuses(sc.sink, "click", "2026-11-21T12", "2026-11-21T17")]
    assert states == [HourState.NEVER, HourState.COMPLETE, HourState.COMPLETE, HourState.OPEN, HourState.NOT_STARTED]
    assert wait_for_hour(sc.sink, "click", "2026-11-21T14", timeout=5).records == 2
    assert verify_hour(sc.sink, "click", "2026-11-21T13").ok
    assert sorted(r["id"] for r in read_records(sc.sink, "click", "2026-11-21T13", until="2026-11-21T15")) == [
        "a", "b", "c", "d"]
    rec = audit_hour(sc.sink, sc.et, "2026-11-21T13", expected=3, now=dt.datetime(2026, 11, 21, 17, tzinfo=dt.UTC))
    assert rec.result is AuditResult.MATCH and rec.recorded  # its record written create-only, by the light fs
    assert hour_status(sc.sink, "click", "2026-11-21T13").state is HourState.AUDITED
    assert isinstance(sink.open_storage(sc.sink).fs, GCSLightFileSystem)
