"""The light install's GCS file system (event_etl/storage/gcs_light.py), without a server: which of its errors are
retried, and that it is what a gs:// sink opens when gcsfs is not installed.  Against fake-gcs-server:
integration/test_gcs_light.py."""

from __future__ import annotations

import pytest

from event_etl.errors import StorageError
from event_etl.storage import Storage, gcs, sink
from event_etl.storage.gcs_light import GCSHTTPError, GCSLightFileSystem


@pytest.fixture
def without_gcsfs(monkeypatch):
    """As in the light install: gcsfs cannot be imported."""
    monkeypatch.setattr(gcs, "gcsfs_installed", lambda: False)
    monkeypatch.setattr(sink, "_CACHE", {})


def test_a_gs_sink_opens_the_light_file_system_without_gcsfs(without_gcsfs, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9")
    st = Storage("gs://bucket/prefix/")
    assert isinstance(st.fs, GCSLightFileSystem) and not st.local
    assert (st.root, st.fs.endpoint, st.path("t/a.avro")) == ("bucket/prefix", "http://127.0.0.1:9",
                                                              "bucket/prefix/t/a.avro")
    assert GCSLightFileSystem.split_path("gs://b/k/x.avro") == ("b", "k/x.avro", None)


def test_which_answers_are_retried():
    from google.auth.exceptions import RefreshError, TransportError

    for code in (408, 429, 500, 502, 503):
        assert gcs.is_transient(GCSHTTPError(code, "x")), code
    for code in (400, 409):
        assert not gcs.is_transient(GCSHTTPError(code, "x")), code
    assert not gcs.is_transient(FileNotFoundError("gone"))
    assert not gcs.is_transient(FileExistsError("412"))
    assert not gcs.is_transient(PermissionError("403"))
    import requests

    assert gcs.is_transient(requests.ConnectionError("refused"))
    assert gcs.is_transient(requests.Timeout("slow"))
    assert gcs.is_transient(TransportError("metadata server unreachable"))
    assert gcs.is_transient(RefreshError("token endpoint hiccup"))


def test_an_unreachable_bucket_is_retried_within_the_budget(without_gcsfs, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("EVENT_ETL_STORAGE_RETRY_SECONDS", "1")
    st = Storage("gs://bucket/prefix")
    with pytest.raises(StorageError, match="unreachable for 1s"):
        st.exists("page_view/2026/11/25/00/_COMPLETE")
