"""The storage contract (tests/lib/storage_contract.py) against the GCS emulator through gcsfs."""

from __future__ import annotations

import pytest

from event_etl.storage import Storage
from tests.lib.storage_contract import StorageContract


@pytest.fixture
def storage(gcs_bucket):
    return Storage(f"{gcs_bucket}/prefix")


class TestGcsStorage(StorageContract):
    pass


def test_nothing_is_written_outside_the_prefix(gcs_bucket):
    st = Storage(f"{gcs_bucket}/prefix")
    st.write_atomic("a/b.avro", b"x")
    assert Storage(gcs_bucket).list_dirs("prefix") == ["a"]
    assert Storage(gcs_bucket).list_files("prefix") == {}
