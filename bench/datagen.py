"""Benchmark input: page views of about 225 bytes as JSON lines, the same for every contender.

Events cover ``hours`` hours of event time in arrival order with mild disorder (up to 90 s
behind, within the types' 2-minute out-of-orderness bound, so every event is timely), spread
over ``files`` files named in order.  Each file's modification time (its arrival, for
event_etl's directory source) is the event time its last events reach.  Same options, same
bytes: every contender reads exactly the same input.

Shapes and sizes (for the scale notes):

- ``shape="page_view"`` (default): the ``page_view`` type's required fields with realistic
  values, about 225 bytes a line.  Nothing smaller is possible with this schema (its
  required field names alone take ~100 bytes).
- ``shape="small_view"``: the bench-only type ``bench/event_types/small_view`` (``event_id``,
  ``event_time``, ``page_url``, optional ``referrer_url``): about 100 bytes a line.
- ``event_bytes=N``: every line is padded to exactly ``N`` bytes (newline included) with an
  optional ``referrer_url`` field, for 1 KB or 10 KB events.  ``pad=N`` (older option) adds a
  ``referrer_url`` of ``N`` filler characters instead.
"""

from __future__ import annotations

import argparse
import os
import random
import uuid
from pathlib import Path

import orjson

START_MS = 1_795_225_200_000  # 2026-11-21T01:40:00Z
SHAPES = ("page_view", "small_view")
_DEVICES = ("DESKTOP", "MOBILE", "TABLET")
_PAD_PREFIX = "https://www.example.org/"
_PAD_KEY_BYTES = len(b',"referrer_url":""') + len(_PAD_PREFIX)


def make_record(shape: str, i: int, t: int, rng: random.Random) -> dict:
    """Event ``i`` of ``shape`` with event time ``t`` (the random draws are the same as before shapes existed)."""
    event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if shape == "small_view":
        return {"event_id": event_id, "event_time": t, "page_url": f"/p/{rng.randint(1000, 9999)}"}
    return {
        "event_id": event_id,
        "event_time": t,
        "anonymous_id": f"a{rng.randint(1, 10**9)}",
        "session_id": f"s{rng.randint(1, 10**8)}",
        "product_id": f"sku-{rng.randint(1, 99999)}",
        "page_url": f"https://shop.example.com/p/{rng.randint(1, 99999)}",
        "device_type": _DEVICES[i % 3],
    }


def encode_line(rec: dict, *, pad: int = 0, event_bytes: int | None = None) -> bytes:
    """``rec`` as one JSON line (no newline), padded as ``pad`` or ``event_bytes`` say (see the module docstring)."""
    if pad:
        rec["referrer_url"] = _PAD_PREFIX + "x" * pad
    line = orjson.dumps(rec)
    if event_bytes is not None:
        fill = event_bytes - 1 - len(line) - _PAD_KEY_BYTES  # 1: the newline
        if fill >= 0:
            rec["referrer_url"] = _PAD_PREFIX + "x" * fill
            line = orjson.dumps(rec)
    return line


def generate(folder: Path, events: int, *, files: int = 12, hours: int = 6, seed: int = 7, pad: int = 0,
             shape: str = "page_view", event_bytes: int | None = None) -> dict:
    """Write ``events`` events as ``files`` JSON-lines files into ``folder``; returns a description.

    Deterministic: the same arguments give the same bytes.  Returns ``events``, ``bytes``,
    ``bytes_per_event``, ``first_ms``, ``hours``, ``files``, ``shape``.
    """
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, not {shape!r}")
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    span = hours * 3_600_000
    per_file = -(-events // files)
    total_bytes = written = 0
    for k in range(files):
        lo, hi = k * per_file, min(events, (k + 1) * per_file)
        if lo >= hi:
            break
        lines = []
        for i in range(lo, hi):
            t = START_MS + i * span // events - rng.randint(0, 90_000)
            lines.append(encode_line(make_record(shape, i, t, rng), pad=pad, event_bytes=event_bytes))
        data = b"\n".join(lines) + b"\n"
        total_bytes += len(data)
        f = folder / f"events-{k:05d}.jsonl"
        f.write_bytes(data)
        written += 1
        arrival = (START_MS + hi * span // events) / 1000
        os.utime(f, (arrival, arrival))
    return {"events": events, "bytes": total_bytes, "bytes_per_event": total_bytes / max(events, 1),
            "first_ms": START_MS, "hours": hours, "files": written, "shape": shape}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--hours", type=int, default=6, help="hours of event time the events cover")
    ap.add_argument("--shape", choices=SHAPES, default="page_view")
    ap.add_argument("--event-bytes", type=int, default=None, help="pad every line to this many bytes")
    a = ap.parse_args(argv)
    print(generate(a.folder, a.events, files=a.files, seed=a.seed, hours=a.hours, shape=a.shape,
                   event_bytes=a.event_bytes))


if __name__ == "__main__":
    main()
