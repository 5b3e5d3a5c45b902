"""Benchmark input: page views of about 200 bytes as JSON lines, the same for every contender.

Events cover ``hours`` hours of event time in arrival order with mild disorder (up to 90 s
behind), spread over ``files`` files named in order.  Same size and seed, same bytes.
"""

from __future__ import annotations

import argparse
import os
import random
import uuid
from pathlib import Path

import orjson

START_MS = 1_795_225_200_000  # 2026-11-21T00:00:00Z


def generate(folder: Path, events: int, *, files: int = 12, hours: int = 6, seed: int = 7, pad: int = 0) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    span = hours * 3_600_000
    per_file = -(-events // files)
    total_bytes = 0
    devices = ("DESKTOP", "MOBILE", "TABLET")
    for k in range(files):
        lo, hi = k * per_file, min(events, (k + 1) * per_file)
        if lo >= hi:
            break
        lines = []
        for i in range(lo, hi):
            t = START_MS + i * span // events - rng.randint(0, 90_000)
            rec = {
                "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "event_time": t,
                "anonymous_id": f"a{rng.randint(1, 10**9)}",
                "session_id": f"s{rng.randint(1, 10**8)}",
                "product_id": f"sku-{rng.randint(1, 99999)}",
                "page_url": f"https://shop.example.com/p/{rng.randint(1, 99999)}",
                "device_type": devices[i % 3],
            }
            if pad:
                rec["referrer_url"] = "https://www.example.org/" + "x" * pad
            lines.append(orjson.dumps(rec))
        data = b"\n".join(lines) + b"\n"
        total_bytes += len(data)
        f = folder / f"events-{k:05d}.jsonl"
        f.write_bytes(data)
        arrival = (START_MS + hi * span // events) / 1000
        os.utime(f, (arrival, arrival))
    return {"events": events, "bytes": total_bytes, "bytes_per_event": total_bytes / max(events, 1),
            "first_ms": START_MS, "hours": hours}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    print(generate(a.folder, a.events, files=a.files, seed=a.seed))
