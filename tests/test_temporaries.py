"""Temporary files a killed run leaves are found and removed by the next run, before anything is judged.

A kill is modelled at the file-system call itself: the rename (or link, or unlink) that would
have finished a write raises, as if the process died just before it, leaving the temporary
behind.  The real executor and controller, without Spark (tests.lib.harness)."""

from __future__ import annotations

import os

import pytest

from tests.lib.harness import (
    FakeClock,
    LocalPipeline,
    check_manifest_matches_folder,
    click,
    make_event_type,
    read_sink,
    t,
)

SETTINGS = {"out_of_orderness": "2m", "allowed_lateness": "24h", "idle_timeout": "5m", "max_future_skew": "10m"}
# a job's first batch: the two old events are too late against the batch's own reference, so the splits holding
# them are written again (their first run wrote them into hour 10 of 2026-11-19)
FIRST_LINES = [click("old", "2026-11-19T10:00"), click("a", "13:10"), click("old2", "2026-11-19T10:05"),
               click("b", "13:20"), click("c", "13:25"), click("d", "13:26")]


class Killed(BaseException):
    """The process died here."""


@pytest.fixture
def die_at(monkeypatch):
    """``die_at("replace", "hour=10/part-")``: the process dies just before the first such call on such a path."""

    def arm(call: str, fragment: str) -> None:
        real = getattr(os, call)

        def fake(*args, **kwargs):
            target = str(args[1] if call in ("replace", "link") else args[0])
            if fragment in target:
                monkeypatch.setattr(os, call, real)
                raise Killed(f"killed before os.{call} onto {target}")
            return real(*args, **kwargs)

        monkeypatch.setattr(os, call, fake)

    return arm


def pipeline(tmp_path) -> LocalPipeline:
    return LocalPipeline(tmp_path, make_event_type(tmp_path / "types", **SETTINGS), FakeClock(t("13:30")))


def temporaries(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp"))


def test_a_kill_before_a_data_files_rename_in_an_hour_only_a_first_batch_rewrite_wrote(tmp_path, die_at):
    """Reproduced end to end in the audit: the folder held a hidden temporary, could not be removed, and was
    never marked, while the drain reported every hour holding data complete."""
    p = pipeline(tmp_path)
    die_at("replace", "hour=10/part-")
    with pytest.raises(Killed):
        p.batch(FIRST_LINES, shards=3)
    assert temporaries(p.sink), "the kill left a temporary in hour 10 of 2026-11-19"
    p.restart()
    assert not temporaries(p.sink) and p.controller.swept
    p.batch(FIRST_LINES, batch_id=0, shards=3)
    p.controller.drain()
    hours = read_sink(p.sink, "click")
    assert all(hc.marker is not None for hc in hours.values()), "every hour folder left is marked"
    assert not (p.sink / "click" / "dt=2026-11-19").exists(), "no folder for the too-late events' hour"
    for h in hours:
        check_manifest_matches_folder(p.sink, "click", h)


def test_a_kill_between_a_markers_link_and_the_unlink_of_its_temporary(tmp_path, die_at):
    p = pipeline(tmp_path)
    p.batch([click("a", "13:10")])
    die_at("unlink", "._COMPLETE.")
    p.clock.now = t("14:30")
    with pytest.raises(Killed):
        p.batch([click("b", "14:20")])  # the watermark passes 14:00: hour 13's marker
    assert temporaries(p.sink)
    p.restart()
    assert not temporaries(p.sink)
    p.batch([click("b", "14:20")], batch_id=1)
    for h, hc in read_sink(p.sink, "click").items():
        if hc.marker is not None:
            check_manifest_matches_folder(p.sink, "click", h)


def test_a_kill_during_a_dead_letter_write(tmp_path, die_at):
    p = pipeline(tmp_path)
    die_at("replace", "/_deadletter/")
    with pytest.raises(Killed):
        p.batch([click("a", "13:10"), b"{not json"])
    assert [n for n in temporaries(p.sink) if "_deadletter" in n]
    p.restart()
    assert not temporaries(p.sink)
    p.batch([click("a", "13:10"), b"{not json"], batch_id=0)
    assert len(list((p.sink / "click" / "_deadletter").rglob("dl-*.avro"))) == 1


def test_temporaries_in_the_checkpoint_go_too(tmp_path, die_at):
    p = pipeline(tmp_path)
    die_at("replace", "state.json")
    with pytest.raises(Killed):
        p.batch([click("a", "13:10")])
    assert temporaries(p.ckpt.root)
    p.restart()
    assert not temporaries(p.ckpt.root)
