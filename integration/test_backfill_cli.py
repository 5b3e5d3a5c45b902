"""Issue 50 item 1, end to end: a folder of page views 60 days old, run as a user would.

`event-etl run page_view --source dir:... --once --drain` (a separate process, real Spark): every event is more
than max_backfill (30d) before its arrival while the job has no watermark, so all go to the dead letters as
``before_backfill``, and the run says so, with the count, the setting and the fix; `event-etl status` says it too.
Then docs/runbook.md, "A backfill went to the dead letters": max_backfill raised in the type's etl.toml, a run on
the same checkpoint reads nothing again, and on a new checkpoint the folder's events are written to their hours.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.lib.harness import read_sink

EXE = str(Path(sys.executable).with_name("event-etl"))
ROOT = Path(__file__).resolve().parents[1]
N = 2000
DAY_MS = 86_400_000


def _env():
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "EVENT_ETL_SPARK_LOG_LEVEL": "ERROR"}


def _page_views(folder: Path, n: int, start_ms: int) -> None:
    rng = random.Random(50)
    folder.mkdir(parents=True)
    lines = []
    for i in range(n):
        lines.append(json.dumps({
            "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "event_time": start_ms + i * 1_000,
            "user_id": f"user-{i % 97}", "anonymous_id": f"anon-{i}", "session_id": f"sess-{i % 13}",
            "product_id": f"sku-{i % 50}", "product_category": "shoes", "price_minor": 1999, "currency": "EUR",
            "page_url": f"https://shop.example.com/p/{i}", "referrer_url": None, "device_type": "MOBILE",
            "country": "DE"}))
    (folder / "views.jsonl").write_text("\n".join(lines) + "\n")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, env=_env(), timeout=300)


def test_a_backfill_older_than_max_backfill_is_said_and_the_runbook_gets_it_back(tmp_path):
    types = tmp_path / "types"
    shutil.copytree(ROOT / "event_types" / "page_view", types / "page_view")
    settings = types / "page_view" / "etl.toml"
    start = (int(time.time() * 1000) - 60 * DAY_MS) // 3_600_000 * 3_600_000
    _page_views(tmp_path / "views", N, start)
    sink, ckroot = tmp_path / "data", tmp_path / "checkpoints"
    common = ["--sink", str(sink), "--event-types", str(types)]
    run = ["run", "page_view", "--source", f"dir:{tmp_path / 'views'}", "--checkpoint-root", str(ckroot), "--once",
           "--drain", "--master", "local[2]", *common]

    r = _run(*run)
    assert r.returncode == 0, r.stdout + r.stderr
    said = [line for line in r.stdout.splitlines() if "before_backfill" in line]
    assert len(said) == 1, r.stdout
    assert said[0].startswith(f"[page_view] {N:,} events dead-lettered as before_backfill (event times ")
    assert "more than max_backfill (30d) before their arrival" in said[0]
    assert f'set max_backfill = "0" (no bound) or a longer bound in {settings}' in said[0]
    assert "docs/runbook.md#a-backfill-went-to-the-dead-letters" in said[0]
    assert f"  before backfill {N:,} (" in r.stdout, r.stdout
    assert not list((sink / "page_view").glob("dt=*/hour=*")), "nothing written to the sink"

    r = _run("deadletter", "page_view", "--counts", *common)
    assert r.returncode == 0 and f"before_backfill      {N}" in r.stdout, r.stdout

    r = _run("status", "--checkpoint-root", str(ckroot), *common)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"  {N:,} events sit in the dead letters as before_backfill" in r.stdout, r.stdout

    # the runbook: a longer bound, and the same checkpoint reads nothing again (its source consumed the folder)
    settings.write_text('max_backfill = "90d"\n' + settings.read_text())  # before its first [table]
    r = _run(*run)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run finished: 0 batches" in r.stdout, r.stdout
    assert (f"[page_view] {N:,} events sit in the dead letters as before_backfill (event times ") in r.stdout, r.stdout
    assert "(max_backfill is 90d now); this checkpoint does not read them again" in r.stdout, r.stdout
    r = _run("status", "--checkpoint-root", str(ckroot), "--json", *common)
    (row,) = [row for row in json.loads(r.stdout) if row["event_type"] == "page_view"]
    assert row["watermark"] is None and row["before_backfill"]["events"] == N
    assert row["before_backfill"]["max_backfill"] == "90d"

    # no watermark, a folder source: the checkpoint moved aside, the same command reads the folder again
    (ckroot / "page_view").rename(ckroot / "page_view.before-backfill")
    r = _run(*run)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "before_backfill" not in r.stdout and f"timely         {N:,}" in r.stdout, r.stdout
    content = read_sink(sink, "page_view", "event_id")
    assert sum(len(hc.timely) for hc in content.values()) == N
    assert all(hc.marker is not None for hc in content.values()), "drained: every hour complete"
    assert min(content) == start
