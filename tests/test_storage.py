"""The storage contract on local disk, and what only local disk does."""

from __future__ import annotations

import os
import pickle

import pytest

from event_etl.storage import Storage
from tests.storage_contract import StorageContract


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
