"""The JVM class archive (event_etl.job.jvmarchive): which archive a job maps, and when none."""

from __future__ import annotations

import os

import pytest

from event_etl.job import jvmarchive


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVENT_ETL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def java(tmp_path):
    j = tmp_path / "jdk" / "bin" / "java"
    j.parent.mkdir(parents=True)
    j.write_bytes(b"#!/bin/sh\n")
    return str(j)


def test_no_archive_no_options(cache, java):
    assert jvmarchive.jvm_options(java) == []


def test_a_built_archive_is_mapped_quietly(cache, java):
    path = jvmarchive.archive_path(java)
    assert path.parent == cache / "jvm"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 10)
    opts = jvmarchive.jvm_options(java)
    assert f"-XX:SharedArchiveFile={path}" in opts
    assert "-Xlog:cds=off" in opts and "-Xlog:cds+dynamic=off" in opts, "a mismatch is the JVM's business, not noise"


def test_an_empty_file_is_not_an_archive(cache, java):
    path = jvmarchive.archive_path(java)
    path.parent.mkdir(parents=True)
    path.touch()
    assert jvmarchive.jvm_options(java) == []


def test_another_java_gets_another_archive(cache, java, tmp_path):
    other = tmp_path / "jdk21" / "bin" / "java"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"#!/bin/sh\n# another build\n")
    assert jvmarchive.archive_path(java) == jvmarchive.archive_path(java)
    assert jvmarchive.archive_path(str(other)) != jvmarchive.archive_path(java)
    os.utime(java, (1, 1))  # the same path, upgraded in place
    before = jvmarchive.archive_path(java)
    os.utime(java, (2_000_000_000, 2_000_000_000))
    assert jvmarchive.archive_path(java) != before


def test_the_cache_defaults_to_the_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("EVENT_ETL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jvmarchive.cache_dir() == tmp_path / "xdg" / "event_etl"


def test_a_build_forgets_unused_archives_and_killed_builds_files(tmp_path):
    now = 2_000_000_000.0
    files = {"spark-aaaa.jsa": 40, "spark-bbbb.jsa": 2, ".spark-cccc.jsa.77.tmp": 2, ".spark-dddd.jsa.78.tmp": 0.01}
    for name, days in files.items():
        p = tmp_path / name
        p.write_bytes(b"x")
        os.utime(p, (now - days * 86400,) * 2)
    keep = tmp_path / "spark-eeee.jsa"
    keep.write_bytes(b"x")
    os.utime(keep, (now - 400 * 86400,) * 2)
    gone = jvmarchive.forget_unused(tmp_path, keep=keep, now=now)
    assert sorted(p.name for p in gone) == [".spark-cccc.jsa.77.tmp", "spark-aaaa.jsa"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".spark-dddd.jsa.78.tmp", "spark-bbbb.jsa", "spark-eeee.jsa"]
