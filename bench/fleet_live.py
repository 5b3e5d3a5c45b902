"""The live scenario's publisher and its figures (bench/fleet_scale.py ``--scenarios live``).

A publisher process (``python -m bench.fleet_live publish ...``, several of them, each with a few threads) publishes
to its share of the topics ``rate`` events a second each, in one request per topic every ``tick`` seconds
(``rate * tick`` page views, their event time the wall clock when the request is made), from ``start`` (epoch
seconds) for ``seconds``.  The topics of a thread take their turns evenly spread over the tick, so the emulator
sees a steady stream of requests, not bursts.  For every UTC hour boundary ``H`` inside the window it records,
per topic, when the first event stamped at or after ``H + out_of_orderness`` was sent: the moment the type's
watermark (largest event time - out_of_orderness) can pass ``H``, from which the hour's marker delay is measured.
It also records how far behind its schedule each request went out (did it keep up?), and how many events of each
hour every topic got (what each marker must hold).  Its figures go to ``--out`` as JSON.

The rest are the figures the bench draws from them: marker delays, percentiles.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOUR_MS = 3_600_000


def percentile(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``xs``, nearest rank; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))
    return s[k]


def spread(xs: list[float]) -> dict:
    return {"n": len(xs), "p50": percentile(xs, 0.5), "p99": percentile(xs, 0.99), "max": max(xs, default=None),
            "min": min(xs, default=None)}


def publish_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench.fleet_live publish")
    ap.add_argument("--host", required=True)
    ap.add_argument("--topics", type=Path, required=True, help="a file: one 'name topic' a line")
    ap.add_argument("--start", type=float, required=True, help="epoch seconds of the first tick")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--rate", type=int, default=10)
    ap.add_argument("--tick", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=6)
    ap.add_argument("--ooo-ms", type=int, required=True)
    ap.add_argument("--seed", type=int, default=58)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    os.environ["PUBSUB_EMULATOR_HOST"] = a.host
    import orjson
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import PublishRequest, PubsubMessage

    from bench.datagen import make_record

    rows = [line.split() for line in a.topics.read_text().splitlines() if line.strip()]
    per_tick = max(1, round(a.rate * a.tick))
    ticks = int(a.seconds / a.tick)
    end_ms = int((a.start + a.seconds) * 1000)
    boundaries = [h for h in range((int(a.start * 1000) // HOUR_MS + 1) * HOUR_MS, end_ms + 1, HOUR_MS)]
    api = pubsub_v1.PublisherClient().api
    lock = threading.Lock()
    per_type: dict[str, dict] = {}
    behind: list[float] = []  # seconds each request went out after its schedule
    errors: list[str] = []

    def worker(w: int, mine: list[tuple[str, str]]) -> None:
        rng = random.Random(a.seed * 1000 + w)
        stats = {name: {"sent": 0, "by_hour": {}, "crossed": {}, "requests": 0} for name, _ in mine}
        lag: list[float] = []
        seq = 0
        for k in range(ticks):
            for j, (name, topic) in enumerate(mine):
                sched = a.start + k * a.tick + j * a.tick / len(mine)
                d = sched - time.time()
                if d > 0:
                    time.sleep(d)
                sent = time.time()
                lag.append(sent - sched)
                et = int(sent * 1000)
                msgs = []
                for _ in range(per_tick):
                    seq += 1
                    msgs.append(PubsubMessage(data=orjson.dumps(make_record("page_view", seq, et, rng))))
                try:
                    ids = api.publish(request=PublishRequest(topic=topic, messages=msgs), timeout=60).message_ids
                except Exception as e:  # noqa: BLE001 - counted and reported, the run goes on
                    with lock:
                        errors.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                acked = time.time()
                st = stats[name]
                st["sent"] += len(ids)
                st["requests"] += 1
                hk = str(et // HOUR_MS * HOUR_MS)
                st["by_hour"][hk] = st["by_hour"].get(hk, 0) + len(ids)
                for h in boundaries:
                    if et >= h + a.ooo_ms and str(h) not in st["crossed"]:
                        st["crossed"][str(h)] = {"event_ms": et, "sent": sent, "acked": acked}
        with lock:
            per_type.update(stats)
            behind.extend(lag)

    groups = [rows[i::a.threads] for i in range(a.threads)]
    threads = [threading.Thread(target=worker, args=(i, [(n, t) for n, t in g]), daemon=True)
               for i, g in enumerate(groups) if g]
    t0 = time.time()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t1 = time.time()
    cpu = os.times()
    a.out.write_text(json.dumps({
        "types": per_type, "started": t0, "ended": t1, "planned_start": a.start, "seconds": a.seconds,
        "per_tick": per_tick, "tick": a.tick, "threads": len(threads), "errors": errors[:50],
        "error_count": len(errors), "behind": spread(behind), "behind_over_tick": sum(1 for x in behind if x > a.tick),
        "requests": len(behind), "cpu": cpu.user + cpu.system}))


def merge_publishers(parts: list[dict]) -> dict:
    """The publishers' figures as one: every type's, the sum of what was sent, the achieved rate."""
    types: dict[str, dict] = {}
    for p in parts:
        types.update(p["types"])
    sent = sum(t["sent"] for t in types.values())
    start = min(p["planned_start"] for p in parts)
    ended = max(p["ended"] for p in parts)
    seconds = parts[0]["seconds"]
    return {"types": types, "sent": sent, "planned": int(round(seconds / parts[0]["tick"])) * parts[0]["per_tick"]
            * len(types), "planned_start": start, "ended": ended, "span": ended - start,
            "rate": sent / (ended - start) if ended > start else None,
            "rate_per_type": sent / (ended - start) / max(1, len(types)) if ended > start else None,
            "behind_p50": max((p["behind"]["p50"] or 0) for p in parts),
            "behind_p99": max((p["behind"]["p99"] or 0) for p in parts),
            "behind_max": max((p["behind"]["max"] or 0) for p in parts),
            "behind_over_tick": sum(p["behind_over_tick"] for p in parts),
            "requests": sum(p["requests"] for p in parts), "errors": sum(p["error_count"] for p in parts),
            "error_lines": [e for p in parts for e in p["errors"]][:10], "cpu": sum(p["cpu"] for p in parts),
            "processes": len(parts), "threads": sum(p["threads"] for p in parts)}


def marker_delays(sink: Path, names: list[str], pub: dict, ooo_ms: int) -> dict:
    """Every marker of an hour whose end the publishing crossed: its delay, in seconds, from the moment the type's
    watermark could pass the hour's end (the first event stamped at or after end + out_of_orderness was sent:
    ``from_event``) and from end + out_of_orderness itself (``from_nominal``, the issue's definition: event time =
    wall time); the marker's moment is its file's mtime (the local sink) and, beside it, its ``completed_at``.
    Also: boundaries crossed without a marker, and every marker's records against what was published to its hour."""
    from_event, from_nominal, from_completed, rows = [], [], [], []
    missing, wrong, late = [], [], 0
    for name in names:
        crossed = pub["types"].get(name, {}).get("crossed", {})
        by_hour = pub["types"].get(name, {}).get("by_hour", {})
        for h_end_s, c in crossed.items():
            h_end = int(h_end_s)
            hour = h_end - HOUR_MS
            t = time.gmtime(hour / 1000)
            marker = sink / name / f"dt={time.strftime('%Y-%m-%d', t)}" / f"hour={t.tm_hour:02d}" / "_COMPLETE"
            try:
                st = marker.stat()
                m = json.loads(marker.read_text())
            except (OSError, ValueError):
                missing.append(f"{name} {time.strftime('%H:%M', t)}")
                continue
            appeared = st.st_mtime
            completed = _iso_s(m.get("completed_at"))
            from_event.append(appeared - c["sent"])
            from_nominal.append(appeared - (h_end + ooo_ms) / 1000)
            if completed is not None:
                from_completed.append(completed - (h_end + ooo_ms) / 1000)
            want = by_hour.get(str(hour), 0)
            if int(m.get("records", -1)) - int(m.get("late_records", 0)) != want:
                wrong.append(f"{name}: {m.get('records')} records ({m.get('late_records')} late), published {want}")
            late += int(m.get("late_records", 0))
            rows.append({"type": name, "hour": hour, "mtime": appeared, "first_past": c["sent"],
                         "completed_at": m.get("completed_at"), "watermark": m.get("watermark")})
    return {"from_event": spread(from_event), "from_nominal": spread(from_nominal),
            "completed_at_from_nominal": spread(from_completed), "missing": missing[:20],
            "missing_count": len(missing), "wrong": wrong[:20], "wrong_count": len(wrong), "late_records": late,
            "first_marker": min((r["mtime"] for r in rows), default=None),
            "last_marker": max((r["mtime"] for r in rows), default=None), "rows": rows}


def _iso_s(text: str | None) -> float | None:
    """``2026-11-21T14:00:07.402Z`` as epoch seconds."""
    if not text:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "publish":
        publish_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m bench.fleet_live publish --host H --topics FILE --start EPOCH --seconds S ...")
