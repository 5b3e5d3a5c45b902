"""One storage contract, run against every backend (local disk here, the GCS emulator in integration/).

A backend test module subclasses :class:`StorageContract` and provides a ``storage``
fixture holding an empty :class:`event_etl.storage.Storage`.
"""

from __future__ import annotations

import threading

import pytest

from event_etl.errors import StorageError


class StorageContract:
    def test_write_atomic_then_read_and_list(self, storage):
        storage.write_atomic("t/dt=2026-11-21/hour=13/a.avro", b"hello")
        assert storage.read("t/dt=2026-11-21/hour=13/a.avro") == b"hello"
        assert storage.list_files("t/dt=2026-11-21/hour=13") == {"a.avro": 5}
        assert storage.list_dirs("t/dt=2026-11-21") == ["hour=13"]
        assert storage.exists("t/dt=2026-11-21/hour=13/a.avro")

    def test_write_atomic_replaces_whole(self, storage):
        storage.write_atomic("t/x.avro", b"1" * 1000)
        storage.write_atomic("t/x.avro", b"22")
        assert storage.read("t/x.avro") == b"22"
        assert storage.list_files("t") == {"x.avro": 2}, "no temporary file is left behind"

    def test_missing_is_not_an_error(self, storage):
        assert not storage.exists("t/none")
        assert storage.list_files("t/none") == {}
        assert storage.list_dirs("t/none") == []
        with pytest.raises(FileNotFoundError):
            storage.read("t/none")

    def test_create_only_never_overwrites(self, storage):
        assert storage.create_only("t/_COMPLETE", b"first") is True
        assert storage.create_only("t/_COMPLETE", b"second") is False
        assert storage.read("t/_COMPLETE") == b"first"

    def test_create_only_race_has_one_winner(self, storage):
        results = []

        def attempt(i):
            results.append((storage.create_only("race/_COMPLETE", f"writer {i}".encode()), i))

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        winners = [i for ok, i in results if ok]
        assert len(winners) == 1
        assert storage.read("race/_COMPLETE") == f"writer {winners[0]}".encode()

    def test_files_another_process_writes_are_seen_after_a_listing(self, storage):
        """The driver lists a folder, executors (other processes) add files to it: exists() and a later
        listing must see them, and delete() must remove them (a cached listing once hid them: files a
        batch emptied of duplicates stayed, and were counted twice)."""
        import subprocess
        import sys

        storage.write_atomic("t/h/a.avro", b"a")
        assert storage.list_files("t/h") == {"a.avro": 1}
        assert not storage.exists("t/h/b.avro")
        code = ("import sys; from event_etl.storage import Storage; "
                "Storage(sys.argv[1]).write_atomic('t/h/b.avro', b'bb')")
        subprocess.run([sys.executable, "-c", code, storage.url], check=True, timeout=120)
        assert storage.exists("t/h/b.avro")
        assert storage.list_files("t/h") == {"a.avro": 1, "b.avro": 2}
        storage.delete("t/h/b.avro")
        assert not storage.exists("t/h/b.avro")
        subprocess.run([sys.executable, "-c", code, storage.url], check=True, timeout=120)
        assert storage.exists("t/h/b.avro"), "a file written again after a delete"

    def test_delete(self, storage):
        storage.write_atomic("t/d.avro", b"x")
        storage.delete("t/d.avro")
        storage.delete("t/d.avro")  # twice is fine
        assert not storage.exists("t/d.avro")

    @pytest.mark.parametrize("bad", ["../outside", "/etc/passwd", "a/../../b", "a//b", "./a", "", "C:/x"])
    def test_paths_cannot_leave_the_root(self, storage, bad):
        with pytest.raises(ValueError):
            storage.write_atomic(bad, b"x")
        with pytest.raises(ValueError):
            storage.create_only(bad, b"x")
        with pytest.raises(ValueError):
            storage.list_files(bad)

    def test_storage_error_type_exists(self):
        assert issubclass(StorageError, Exception)
