"""A power cut on a local disk: what reached the disk survives, a rename whose folder was not synced may not.

:class:`Disk` wraps the calls that change folders (``os.replace``, ``os.rename``, ``os.link``,
``os.unlink``/``os.remove``, ``os.rmdir``, ``os.mkdir``) and ``os.fsync`` of folders under its root, and keeps a
journal of the changes no sync of their folder has made durable yet; :meth:`Disk.power_cut` undoes them, newest
first (see tests/test_power_loss.py's docstring for the model).  A call after the cut raises :class:`PowerCut`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Change", "Disk", "PowerCut"]


class PowerCut(BaseException):
    """The power went: nothing after this point runs (no ``except Exception`` of the code catches it)."""


@dataclass
class Change:
    """A change of a folder entry not yet made durable by a sync of its folder."""

    op: str  # "put" (a rename or link made ``path``), "del" (unlink), "rmdir", "mkdir"
    path: str
    folder: str
    old: bytes | None = None  # the bytes ``path`` held before (a replace over a file, an unlink)


_WRAPPED = ("replace", "rename", "link", "unlink", "remove", "rmdir", "mkdir", "fsync")


class Disk:
    """The local disk under ``root`` as a power cut would leave it (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = os.path.realpath(root)
        self.journal: list[Change] = []
        self.calls = 0  # folder changes and folder syncs under root so far
        self.kinds: list[str] = []  # the kind of each call
        self.cut_at: int | None = None  # cut the power before this call
        self.dead = False
        self.passthrough = False  # undoing: the real calls, unrecorded
        self.real = {name: getattr(os, name) for name in _WRAPPED}
        for name in _WRAPPED:
            monkeypatch.setattr(os, name, getattr(self, f"_{name}"))

    # -- bookkeeping -----------------------------------------------------------------------
    def _where(self, path: Any, dir_fd: int | None = None) -> str:
        path = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.abspath(path)  # the code's paths all start from root, which is a real path

    def _tracked(self, path: str) -> bool:
        return not self.passthrough and path.startswith(self.root + os.sep)

    def _tick(self, kind: str) -> None:
        if self.dead:
            raise PowerCut("the power is off")
        self.calls += 1
        self.kinds.append(kind)
        if self.cut_at is not None and self.calls >= self.cut_at:
            self.dead = True
            raise PowerCut(f"power cut before call {self.calls}")

    @staticmethod
    def _content(path: str) -> bytes | None:
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as fh:
                return fh.read()
        return None

    # -- the wrapped calls -----------------------------------------------------------------
    def _put(self, name: str, src, dst, **kw) -> Any:
        d = self._where(dst, kw.get("dst_dir_fd"))
        if not self._tracked(d):
            return self.real[name](src, dst, **kw)
        assert os.path.dirname(self._where(src, kw.get("src_dir_fd"))) == os.path.dirname(d), \
            "a rename from another folder (not simulated: the code renames temporaries next to their target)"
        self._tick("put")
        old = None if name == "link" else self._content(d)
        out = self.real[name](src, dst, **kw)
        self.journal.append(Change("put", d, os.path.dirname(d), old))
        return out

    def _replace(self, src, dst, **kw):
        return self._put("replace", src, dst, **kw)

    def _rename(self, src, dst, **kw):
        return self._put("rename", src, dst, **kw)

    def _link(self, src, dst, **kw):
        return self._put("link", src, dst, **kw)

    def _del(self, name: str, path, dir_fd=None) -> None:
        p = self._where(path, dir_fd)
        if not self._tracked(p):
            return self.real[name](path, dir_fd=dir_fd)
        self._tick("del")
        old = self._content(p)
        self.real[name](path, dir_fd=dir_fd)
        self.journal.append(Change("del", p, os.path.dirname(p), old))

    def _unlink(self, path, *, dir_fd=None):
        return self._del("unlink", path, dir_fd)

    def _remove(self, path, *, dir_fd=None):
        return self._del("remove", path, dir_fd)

    def _rmdir(self, path, *, dir_fd=None):
        p = self._where(path, dir_fd)
        if not self._tracked(p):
            return self.real["rmdir"](path, dir_fd=dir_fd)
        self._tick("rmdir")
        self.real["rmdir"](path, dir_fd=dir_fd)
        self.journal.append(Change("rmdir", p, os.path.dirname(p)))

    def _mkdir(self, path, mode=0o777, *, dir_fd=None):
        p = self._where(path, dir_fd)
        if not self._tracked(p):
            return self.real["mkdir"](path, mode, dir_fd=dir_fd)
        self._tick("mkdir")
        self.real["mkdir"](path, mode, dir_fd=dir_fd)
        self.journal.append(Change("mkdir", p, os.path.dirname(p)))

    def _fsync(self, fd):
        n = fd if isinstance(fd, int) else fd.fileno()
        if not stat.S_ISDIR(os.fstat(n).st_mode):
            return None  # a file's bytes: taken as durable once written (see the docstring)
        folder = os.path.realpath(os.readlink(f"/proc/self/fd/{n}"))
        if not self._tracked(folder + os.sep + "x"):
            return self.real["fsync"](fd)
        self._tick("sync")  # no real sync: this disk is simulated (and real ones take milliseconds)
        self.journal = [c for c in self.journal if c.folder != folder]

    # -- the cut -----------------------------------------------------------------------------
    def power_cut(self, reached_disk: Callable[[Change], bool] = lambda c: False) -> list[Change]:
        """Undo every change not synced (newest first), except those ``reached_disk`` keeps.  Returns the undone."""
        self.passthrough = True
        undone = []
        try:
            for c in reversed(self.journal):
                if reached_disk(c):
                    continue
                undone.append(c)
                if c.op == "put":
                    if c.old is None:
                        if os.path.isdir(c.path) and not os.path.islink(c.path):
                            shutil.rmtree(c.path)
                        elif os.path.lexists(c.path):
                            os.unlink(c.path)
                    else:
                        _write(c.path, c.old)
                elif c.op == "del" and c.old is not None and os.path.isdir(c.folder):
                    _write(c.path, c.old)
                elif c.op == "rmdir":
                    os.makedirs(c.path, exist_ok=True)
                elif c.op == "mkdir" and os.path.isdir(c.path):
                    shutil.rmtree(c.path)  # with all it holds: its entry in its parent is gone
        finally:
            self.passthrough = False
        self.journal = []
        self.dead = False
        self.cut_at = None
        return undone

    def unsynced(self) -> list[str]:
        return [f"{c.op} {os.path.relpath(c.path, self.root)}" for c in self.journal]

    def settle(self) -> None:
        """Time passes: the file system writes out everything so far (as ext4 does every few seconds)."""
        self.journal = []

    @contextlib.contextmanager
    def untracked(self):
        """Calls made as if long ago: durable, and no cut point."""
        self.passthrough = True
        try:
            yield
        finally:
            self.passthrough = False


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
