"""A type left at Avro writes, byte for byte, what event_etl wrote before Parquet came (issue 51's done-when).

Consumers and replays rely on the bytes: a batch replayed after an upgrade must write the same files under the
same names (``_store_once`` compares them), and a manifest's sha256 of each file must stay what it was. So the
real executor and controller (``tests.lib.harness.LocalPipeline``: process_split on local disk, the controller's
ledgers, merges, markers and drain; no Spark) write a fixed input of the shipped ``page_view`` and
``payment_authorization`` types on a fake clock, and every file of the sink (data files, ``late-`` files,
merged files, dead letters, ``_COMPLETE`` manifests) must have the sha256 recorded below.

The input covers the fast path (page_view's chunks of valid JSON lines), the record path (a page_view chunk
holding an invalid line; payment_authorization, whose ISO time and non-null default keep it off the fast path),
late events (written into the open hour's ``late-`` files), too-late ones and invalid lines (dead letters), a
batch cut into two splits, and the hours closed by the watermark and by a drain.

Where the digests come from: the tree before the Parquet work (main at db421e4, before issue 51 and the
driver/collaborator refactors), run as a script with that tree first on the path::

    cd <checkout of db421e4>
    PYTHONHASHSEED=0 PYTHONPATH=$PWD python <this checkout>/tests/test_avro_bytes_unchanged.py

(it prints ``EXPECTED`` as JSON; the tests package and event_etl then both come from that checkout; the hash
seed is 0 as in Spark's executors: see ``written``). Main's
tree gave the same digests. Record them again only when a format version changes on purpose (a new
``manifest_version``, a new Avro writer setting: docs/upgrading.md's rule), with that release's code, and
say so in the commit; a difference found any other way is a regression of the Avro bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from event_etl.eventtypes import load_event_type
from tests.lib.harness import FakeClock, LocalPipeline

EVENT_TYPES = Path(__file__).resolve().parents[1] / "event_types"
MINUTE = 60_000
HOUR = 60 * MINUTE
BASE = 1_795_132_800_000  # 2026-11-20T00:00:00Z
DEVICES = ["DESKTOP", "MOBILE", "TABLET", "OTHER"]
STATUSES = ["APPROVED", "DECLINED", "ERROR", "PENDING"]


def _uuid(kind: int, n: int) -> str:
    return str(uuid.UUID(int=(kind << 64) | n))


def page_view(n: int, t: int) -> dict[str, Any]:
    return {"event_id": _uuid(1, n), "event_time": t, "user_id": None if n % 3 == 0 else f"user-{n % 97}",
            "anonymous_id": f"anon-{n}", "session_id": f"sess-{n % 13}", "product_id": f"sku-{n % 501}",
            "product_category": ["shoes", "bags", None, "home"][n % 4], "price_minor": None if n % 5 == 0 else n * 7,
            "currency": "EUR", "page_url": f"https://shop.example.com/p/{n}", "referrer_url": None,
            "device_type": DEVICES[n % 4], "country": "DE" if n % 2 else None}


def payment_authorization(n: int, t: int) -> dict[str, Any]:
    at = datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+00:00"
    return {"authorization_id": _uuid(2, n), "authorized_at": at, "order_id": f"ord-{n}", "merchant_id": "m-1001",
            "customer_id": None if n % 4 == 0 else f"cus-{n}", "amount_minor": 100 + n, "currency": "EUR",
            "status": STATUSES[n % 4], "decline_code": None, "gateway": "ADYEN", "instrument_type": "CARD",
            "card_network": "VISA", "three_ds": bool(n % 2), "latency_ms": 100 + n % 50}


MAKERS = {"page_view": page_view, "payment_authorization": payment_authorization}


def write_fixed_input(tmp: Path, name: str) -> dict[str, str]:
    """Run the fixed batches of type ``name`` through the executor and controller; every sink file's sha256."""
    make = MAKERS[name]
    n = 0

    def events(start: int, count: int, step: int) -> list[bytes]:
        nonlocal n
        out = []
        for i in range(count):
            out.append(json.dumps(make(n, start + i * step - (i % 7) * 1000)).encode())
            n += 1
        return out

    clock = FakeClock(BASE + 40 * MINUTE + 5_000)
    p = LocalPipeline(tmp, load_event_type(EVENT_TYPES / name), clock)
    p.batch(events(BASE, 300, 8_000))  # 00:00-00:40, every line valid (page_view: the fast path)
    clock.now = BASE + 80 * MINUTE + 5_000
    lines = events(BASE + 40 * MINUTE, 300, 8_000)  # 00:40-01:20, and two bad lines: this chunk takes the record path
    lines[10:10] = [b"{not json"]
    lines[20:20] = [b"[1, 2]"]
    p.batch(lines)  # the watermark passes 01:00: hour 00 is marked
    clock.now = BASE + 120 * MINUTE + 5_000
    p.batch(events(BASE + 80 * MINUTE, 300, 12_000)  # 01:20-02:20
            + events(BASE + 5 * MINUTE, 12, 60_000)  # late: hour 00 is marked, into hour 01's late- files
            + events(BASE - 72 * HOUR, 3, 1), shards=2)  # too late: dead letters
    clock.now = BASE + 150 * MINUTE
    p.controller.drain()  # hour 02 is closed by the drain
    sink = tmp / "sink"
    return {os.path.relpath(os.path.join(d, f), sink): hashlib.sha256(Path(d, f).read_bytes()).hexdigest()
            for d, _, files in os.walk(sink) for f in files}


def digests() -> dict[str, dict[str, str]]:
    """Every type's sink digests, each written in a temporary folder."""
    out = {}
    for name in sorted(MAKERS):
        with tempfile.TemporaryDirectory() as d:
            out[name] = write_fixed_input(Path(d), name)
    return out


# Recorded from db421e4 with PYTHONHASHSEED=0 (see the module's docstring); main's tree gives the same.
EXPECTED: dict[str, dict[str, str]] = {
    "page_view": {
        "page_view/_deadletter/dt=2026-11-20/dl-b0000000001-s0000.avro":
            "9391f645497ede4911a88dbfce1c359546a5de0ae8f93377c9efc9c3c1f5bf47",
        "page_view/_deadletter/dt=2026-11-20/dl-b0000000002-s0001.avro":
            "67839f9a8bf0acaa8da47ee0ff6580d6fc491307b580eaad00c7331644fb4269",
        "page_view/dt=2026-11-20/hour=00/_COMPLETE":
            "e37d2eac54e477d90a773627a2ce81289a387b185e272af9b73d0dd3d3eb37c8",
        "page_view/dt=2026-11-20/hour=00/part-2026112000-b0000000000-s0000-0000.avro":
            "8d2c1bd5a6c26d22b17517c6393932359e6a20bd7b01e16a2633e6904626f57f",
        "page_view/dt=2026-11-20/hour=00/part-2026112000-b0000000001-s0000-0000.avro":
            "fc9bb9cd779d7013a54528e14c48eafeaf92f741fa2625f7f5c3a30efe4dd76b",
        "page_view/dt=2026-11-20/hour=01/_COMPLETE":
            "51e677c529196c1a9d88e52d8032d2e8067bd9b9b258122609982923c46098b6",
        "page_view/dt=2026-11-20/hour=01/late-2026112001-b0000000002-s0001-0000.avro":
            "76b7051cc37d3c1990bb77d4da91f87740f5bfb724a1bb86d9aa78890cce5b7d",
        "page_view/dt=2026-11-20/hour=01/part-2026112001-b0000000002-s9000-0000.avro":
            "023bfbbad905c7cd54ab06ceaf21e8c6acc6972f5071d9c130ac25e55e58b565",
        "page_view/dt=2026-11-20/hour=02/_COMPLETE":
            "23cbe7626b1d30d67223348895527bb6216475beb9ca518aca668a30c6e4d253",
        "page_view/dt=2026-11-20/hour=02/part-2026112002-b0000000002-s0001-0000.avro":
            "86abf6802144f2334f4e16282e359787c8885dfdfe540b5d6c869aba07347333",
    },
    "payment_authorization": {
        "payment_authorization/_deadletter/dt=2026-11-20/dl-b0000000001-s0000.avro":
            "655f8c60f4b49087dca63706f7ee14d330d0bacfd0deac8609ed6892db15926a",
        "payment_authorization/_deadletter/dt=2026-11-20/dl-b0000000002-s0001.avro":
            "b129609f3dd92ff3748ccc3f152d4447e0c084130baf43a0ff703b75b3ef8e3d",
        "payment_authorization/dt=2026-11-20/hour=00/_COMPLETE":
            "d8d1d54e2cabde77763d5df53a68305d94b996f11c9ac92af96d107ba46ac72e",
        "payment_authorization/dt=2026-11-20/hour=00/part-2026112000-b0000000000-s0000-0000.avro":
            "61d7c556ff0e38ed13ab560adb8f6e27c6030891b8369f42a3b5a4645b5e1435",
        "payment_authorization/dt=2026-11-20/hour=00/part-2026112000-b0000000001-s0000-0000.avro":
            "cca7d62e0b939ffd59b3af287e12b753831d57cb47a665fbcf08ba8f540a2f42",
        "payment_authorization/dt=2026-11-20/hour=01/_COMPLETE":
            "3695dccb4dab915d62e934a616bf96e0223d719b916b8cb64d405da3ba3036ba",
        "payment_authorization/dt=2026-11-20/hour=01/late-2026112001-b0000000002-s0001-0000.avro":
            "d6e55b54eca905d8842b8564580a9f1e8929df44be7b7720aecb96ae4840ad85",
        "payment_authorization/dt=2026-11-20/hour=01/part-2026112001-b0000000002-s9000-0000.avro":
            "17cda3731ed4da053c0c2b47a3bfebda86a3fe7e4608a6867c5bfeffb7e48bce",
        "payment_authorization/dt=2026-11-20/hour=02/_COMPLETE":
            "646c712c9a93cc11d3031552579fe4136fcbfa06234b565be6f6f182e61ab7bd",
        "payment_authorization/dt=2026-11-20/hour=02/part-2026112002-b0000000002-s0001-0000.avro":
            "2ba41f20538d1835f53e30fa9cc57ce900d3d62f3b70a6ec7877de422b07c29e",
    },
}


@pytest.fixture(scope="module")
def written() -> dict[str, dict[str, str]]:
    """The digests, written in a Python of PYTHONHASHSEED=0, as Spark's executors are (PySpark gives them the
    driver's PYTHONHASHSEED, else 0): fastavro orders a field's ``doc`` and ``default`` in the header's schema by
    iterating a set, so the header of a type whose fields have both depends on the hash seed."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, __file__], env=env, cwd=root, capture_output=True, text=True, check=True)
    result: dict[str, dict[str, str]] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_type_left_at_avro_writes_the_bytes_it_wrote_before_parquet(written: dict[str, dict[str, str]],
                                                                       name: str) -> None:
    got, expected = written[name], EXPECTED[name]
    assert sorted(got) == sorted(expected), "the sink's files are not the ones written before"
    changed = sorted(rel for rel in expected if got[rel] != expected[rel])
    assert not changed, f"files whose bytes changed: {changed}"


def test_the_input_reaches_what_it_is_meant_to_cover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digests above only guard what the input makes the job write: both paths ran, every kind of file is there."""
    from event_etl.task.fastpath import FastPlan

    decoded: list[bool] = []  # per chunk the fast path was offered: decoded on columns (True) or refused (False)
    real = FastPlan.decode

    def spy(self: FastPlan, data: bytes) -> Any:
        fc = real(self, data)
        decoded.append(fc is not None)
        return fc

    monkeypatch.setattr(FastPlan, "decode", spy)
    got = write_fixed_input(tmp_path, "page_view")
    assert True in decoded and False in decoded  # the fast path and, for the chunk with bad lines, the record path
    names = [os.path.basename(rel) for rel in got]
    assert sum(n == "_COMPLETE" for n in names) == 3  # hours 00, 01 by the watermark, 02 by the drain
    assert any(n.startswith("late-") for n in names)
    assert any("_deadletter" in rel for rel in got)
    assert any("-s9" in n for n in names)  # a merged file
    assert all(n.endswith(".avro") for n in names if n.startswith(("part-", "late-")))
    manifests = [json.loads((tmp_path / "sink" / rel).read_text()) for rel in got if rel.endswith("_COMPLETE")]
    assert {m["manifest_version"] for m in manifests} == {3}  # an Avro type's manifests stay at version 3


if __name__ == "__main__":  # record: prints the digests the event_etl on the path writes (see the docstring)
    print(f"event_etl from {__import__('event_etl').__file__}", file=sys.stderr)
    print(json.dumps(digests(), indent=4, sort_keys=True))
