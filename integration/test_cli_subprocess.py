"""`event-etl` as users run it: a separate process, the demo defaults, signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lib.harness import check_manifest_matches_folder, read_sink

EXE = str(Path(sys.executable).with_name("event-etl"))


def _env():
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}


def wait_for(predicate, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_once_drain_then_deadletter(tmp_path):
    sink, ck = tmp_path / "data", tmp_path / "ck"
    r = subprocess.run([EXE, "run", "payment_authorization", "--source", "generate:count=4000,rate=2000,invalid=0.02",
                        "--sink", str(sink), "--checkpoint", str(ck), "--drain", "--master", "local[2]"],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run finished" in r.stdout and "events in      4,000" in r.stdout
    for noise in ("WARNING: Using incubator modules", "Setting default log level", "sc.setLogLevel"):
        assert noise not in r.stderr, f"the JVM's start-up noise reached the user: {r.stderr}"
    content = read_sink(sink, "payment_authorization", "authorization_id")
    assert content and all(hc.marker is not None for hc in content.values())
    for h in content:
        check_manifest_matches_folder(sink, "payment_authorization", h)
    r = subprocess.run([EXE, "deadletter", "payment_authorization", "--sink", str(sink), "--counts"],
                       capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 0 and "total" in r.stdout


def test_demo_defaults_mark_hours_within_a_minute_and_sigterm_drains_with_drain_on_stop(tmp_path):
    """The README's demo command (`run page_view`, no other options) from a fresh folder, stopped for good: SIGTERM
    drains under --drain-on-stop (a plain stop does not: integration/test_signals.py)."""
    proc = subprocess.Popen([EXE, "run", "page_view", "--drain-on-stop"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = time.monotonic()
        markers = lambda: list((tmp_path / "data" / "page_view").glob("dt=*/hour=*/_COMPLETE"))  # noqa: E731
        wait_for(lambda: len(markers()) >= 1, 90, "the first _COMPLETE marker", proc)
        first_marker_after = time.monotonic() - started
        assert first_marker_after < 60 + 15, f"first marker after {first_marker_after:.0f}s (JVM start included)"
        assert (tmp_path / "checkpoints" / "page_view" / "spark").is_dir(), "checkpoint in the predictable place"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "[page_view] batch" in out and "COMPLETE" in out and "drain: watermark" in out and "run finished" in out
    assert out.strip().splitlines()[-1] == ("[page_view] run finished: exit 0 (stopped by SIGTERM, drained: every hour "
                                            "holding data is complete)"), out[-2000:]
    assert not re.search(r"Traceback|(^|\s)ERROR\s|Exception in thread", out), "an ordinary stop logs no error"
    # the generator runs event time 120x faster than the clock: lag and delays are read on its own clock
    # (a drain closes the open hour before its end: only the markers before it are after their hour's end)
    assert "(generator clock)" in out and not re.search(r"lag -\d", out), out
    assert not re.search(r"marker delay -\d", out[:out.rindex("] batch ")]), out
    sink = tmp_path / "data"
    content = read_sink(sink, "page_view", "event_id")
    assert all(hc.marker is not None for hc in content.values()), \
        "SIGTERM drained (--drain-on-stop): every hour holding data is complete"
    for h in content:
        check_manifest_matches_folder(sink, "page_view", h)


def test_the_demo_keeps_a_history_in_its_checkpoint_and_graphs_draw_it_with_no_options(tmp_path):
    """Issue 41's first ten minutes: `run page_view` (the generator, 120x), stopped, then `graphs page_view` with no
    options draws the history the run kept in ./checkpoints/page_view, its lag on the generator's clock, its rate
    the run's."""
    import json

    history = tmp_path / "checkpoints" / "page_view" / "metrics-history.jsonl"
    # --drain-on-stop: the summary (its rate is compared below) comes with a drain; a plain stop says one line
    proc = subprocess.Popen([EXE, "run", "page_view", "--trigger-interval", "2s", "--master", "local[2]",
                             "--drain-on-stop"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        batches = lambda: history.read_text().count('"kind":"batch"') if history.exists() else 0  # noqa: E731
        wait_for(lambda: batches() >= 4, 90, "four batches in the history", proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    lines = [json.loads(x) for x in history.read_text().splitlines()]
    # (a drain moves the watermark past the last hour holding data, ahead of any clock: not a lag to check)
    lagged = [(x["kind"], x["clock"], x["watermark_lag_seconds"]) for x in lines
              if x.get("watermark_lag_seconds") is not None and x.get("why") != "drain"]
    assert lagged and all(c == "generator" and 0 <= lag < 3600 for _, c, lag in lagged), \
        lagged  # the generator's lag, minutes (on the wall clock: hours, then negative)
    batches_in = sum(x["events"]["timely"] + x["events"]["late"] for x in lines if x["kind"] == "batch")
    run_rate = float(re.search(r"events in +[\d,]+ +\(([\d,]+) ev/s\)", out).group(1).replace(",", ""))
    r = subprocess.run([EXE, "graphs", "page_view"], cwd=tmp_path, capture_output=True, text=True, env=_env(),
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"history {history}" in r.stdout and r.stdout.count("wrote") == 6 and "no data" not in r.stdout
    assert len(list((tmp_path / "graphs").glob("page_view-*.png"))) == 6
    from event_etl.metrics.graphs import HistorySource, history_range

    src = HistorySource(str(history))
    charts = src.charts("page_view", history_range(src.of_type("page_view")))
    assert charts[0].panels[0].quantity == "watermark lag (generator clock)"
    timely, late = (dict(p.series[0].points) for p in charts[1].panels)
    last = max(timely)
    drawn = timely[last] + late.get(last, 0.0)  # the rate over the whole run: every batch in the 5-minute window
    assert batches_in > 0 and drawn == pytest.approx(run_rate, rel=0.1), (drawn, run_rate)


def test_sigkill_then_restart_loses_and_duplicates_nothing(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    sink, ck = tmp_path / "data", tmp_path / "ck"
    from tests.lib.harness import make_event_type

    et = make_event_type(tmp_path / "types", "click", max_backfill="0")
    lines = []
    base = 1_795_266_000_000  # 2026-11-21T09:00Z
    for k in range(6):
        f = src / f"f{k}.jsonl"
        batch = [f'{{"id": "e{k}-{i}", "ts": {base + k * 900_000 + i * 100}}}' for i in range(500)]
        lines += batch
        f.write_text("\n".join(batch) + "\n")
        os.utime(f, ((base + (k + 1) * 900_000) / 1000,) * 2)
    args = [EXE, "run", "click", "--event-types", str(tmp_path / "types"), "--source", f"dir:{src}", "--sink",
            str(sink),
            "--checkpoint", str(ck), "--max-files-per-batch", "1", "--trigger-interval", "1s", "--master", "local[2]"]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(list((ck / "spark" / "commits").glob("[0-9]*"))) >= 2, 120, "two committed batches", proc)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    r = subprocess.run([*args, "--drain"], capture_output=True, text=True, env=_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    content = read_sink(sink, "click", "id")
    got = [i for hc in content.values() for i in hc.timely + hc.late]
    assert sorted(got) == sorted(f"e{k}-{i}" for k in range(6) for i in range(500))
    assert all(hc.marker is not None for hc in content.values())
    del et


def test_a_second_writer_is_refused_at_once_and_a_killed_one_does_not_block_its_restart(tmp_path):
    from tests.lib.harness import make_event_type

    make_event_type(tmp_path / "types", "click", max_backfill="0")
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"id": "a", "ts": 1795266000000}\n')
    base = [EXE, "run", "click", "--event-types", str(tmp_path / "types"), "--source", f"dir:{src}",
            "--sink", str(tmp_path / "data"), "--master", "local[1]"]
    first = subprocess.Popen([*base, "--checkpoint", str(tmp_path / "ck1")], env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (tmp_path / "ck1" / "spark" / "commits" / "0").exists(), 120, "the first job's first batch",
                 first)
        started = time.monotonic()
        r = subprocess.run([*base, "--checkpoint", str(tmp_path / "ck2")], capture_output=True, text=True, env=_env(),
                           timeout=120)
        assert r.returncode == 7, r.stdout + r.stderr
        assert time.monotonic() - started < 30, "refused at once, before Spark starts"
        assert "already being written" in r.stderr and f"pid {first.pid}" in r.stderr and "ck1" in r.stderr
        r = subprocess.run([*base, "--checkpoint", str(tmp_path / "ck1")], capture_output=True, text=True, env=_env(),
                           timeout=120)
        assert r.returncode == 7 and "is in use by another job" in r.stderr and f"pid {first.pid}" in r.stderr
    finally:
        first.kill()
        first.communicate(timeout=30)
    r = subprocess.run([*base, "--checkpoint", str(tmp_path / "ck1"), "--drain"], capture_output=True, text=True,
                       env=_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_listening_port_of_a_running_job_is_on_loopback(tmp_path):
    import psutil

    proc = subprocess.Popen([EXE, "run", "page_view", "--sink", str(tmp_path / "data"), "--checkpoint",
                             str(tmp_path / "ck"),
                             "--metrics-port", "0", "--master", "local[2]"], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (tmp_path / "ck" / "spark" / "commits" / "0").exists(), 120, "the first batch", proc)
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        listening = []
        for p in tree:
            try:
                listening += [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                continue
        assert len(listening) >= 2, "the JVM and the metrics endpoint listen"
        assert all(a.ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for a in listening), listening
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped after batch" in out, out
