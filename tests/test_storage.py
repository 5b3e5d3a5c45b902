"""The storage contract on local disk, and what only local disk does."""

from __future__ import annotations

import os
import pickle

import pytest

from event_etl.storage import Storage
from tests.lib.storage_contract import StorageContract


@pytest.fixture
def storage(tmp_path):
    return Storage(str(tmp_path / "sink"))


class TestLocalStorage(StorageContract):
    pass


def test_nothing_outside_the_root_is_touched(tmp_path):
    st = Storage(str(tmp_path / "sink"))
    st.write_atomic("a/b.avro", b"x")
    assert sorted(os.listdir(tmp_path)) == ["sink"]


def test_storage_pickles_to_the_same_root(tmp_path):
    st = Storage(str(tmp_path / "sink"))
    assert pickle.loads(pickle.dumps(st)).root == st.root


def test_a_folder_that_cannot_be_read_is_an_error_not_absent(tmp_path):
    from event_etl.errors import StorageError

    st = Storage(str(tmp_path / "sink"))
    st.write_atomic("t/hour", b"a file where a folder should be")
    with pytest.raises(StorageError, match="cannot list"):
        st.list_files("t/hour")


@pytest.mark.parametrize("secret, text", [
    ("hunter2", "cannot open https://alice:hunter2@example.com/x"),
    ("ya29.a0AfH6SMB", "401: Authorization: Bearer ya29.a0AfH6SMB failed"),
    ("ya29.zzz", '{"access_token": "ya29.zzz", "expires_in": 3599}'),
    ("s3cr3t", "gs://bucket?token=s3cr3t&x=1"),
    ("MIIEv", "-----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY-----"),
])
def test_credentials_never_reach_an_error_message(secret, text):
    from event_etl.errors import redact

    out = redact(text)
    assert secret not in out and "***" in out


def test_a_cli_error_is_redacted(tmp_path):
    from click.testing import CliRunner

    from event_etl.cli import main

    res = CliRunner().invoke(main, ["run", "page_view", "--source", "kafka://bob:pa55word@broker:9092/t",
                                    "--sink", str(tmp_path / "s")])
    assert res.exit_code != 0 and "pa55word" not in res.output and "***" in res.output


def test_an_unreachable_bucket_is_retried_by_event_etl_alone_within_its_budget(monkeypatch, caplog):
    """``EVENT_ETL_STORAGE_RETRY_SECONDS`` is the whole retry budget: gcsfs tries each request once (its own
    six retries over ~31 s would run beneath it), event_etl retries with backoff, then says the storage was
    unreachable."""
    import logging

    from event_etl.errors import StorageError

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("EVENT_ETL_STORAGE_RETRY_SECONDS", "1")
    caplog.set_level(logging.DEBUG)
    st = Storage("gs://bucket/prefix")
    with pytest.raises(StorageError, match="unreachable for 1s"):
        st.exists("page_view/2026/11/25/00/_COMPLETE")
    ours = [r for r in caplog.records if r.name == "event_etl.storage" and "retrying in" in r.getMessage()]
    theirs = [r for r in caplog.records if r.name.startswith("gcsfs") and "retrying" in r.getMessage()]
    assert len(ours) >= 2 and theirs == [], [r.getMessage() for r in caplog.records]


def test_what_gcsfs_would_retry_is_retried(monkeypatch):
    """A token that could not be refreshed, a 408, a checksum mismatch: transient, as gcsfs's own retries took
    them; a missing object or a refused precondition is not."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    Storage("gs://bucket/prefix")  # imports gcsfs
    import google.auth.exceptions
    from gcsfs.retry import ChecksumError, HttpError

    from event_etl.storage.gcs import is_transient

    assert is_transient(google.auth.exceptions.RefreshError("metadata server hiccup"))
    assert is_transient(HttpError({"code": 408, "message": "timeout"}))
    assert is_transient(HttpError({"code": 503, "message": "unavailable"}))
    assert is_transient(ChecksumError("crc32c mismatch"))
    assert not is_transient(HttpError({"code": 403, "message": "forbidden"}))
    assert not is_transient(FileNotFoundError("gone"))
    assert not is_transient(FileExistsError("precondition"))
    import aiohttp

    assert not is_transient(aiohttp.ClientResponseError(None, (), status=404))
    assert not is_transient(aiohttp.ClientResponseError(None, (), status=403))
    assert is_transient(aiohttp.ClientResponseError(None, (), status=502))
