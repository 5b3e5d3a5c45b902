"""The consumers' recipes of docs/consumers.md and README.md, as the tests run them: byte for byte, read from the
pages (issue 60 item 1: a recipe copied into a test drifted from the page, and the page's failed as written).

A fenced block is a recipe when the line before its fence is ``<!-- recipe: NAME -->`` (an HTML comment: the page
shows nothing of it); a Python block of those pages that no test runs says why on that line instead,
``<!-- not run: WHY -->`` (tests/test_docs_recipes.py fails on a Python block with neither).  :func:`run_recipe`
executes a recipe's text as it stands, compiled under the page's name and line (a failure points into the page),
with only the names the page's prose gives it: ``sink`` (the first example sets it from ``$EVENT_ETL_SINK``),
``spark`` (a SparkSession), and the names an earlier recipe of the same section defined (``table``).

:func:`build_docs_sink` writes the hours the recipes read, with the real executor and controller
(:class:`tests.lib.harness.LocalPipeline`), on local disk or a ``gs://`` sink::

    click      2026-11-21T13  complete   a0 a1 a2
               2026-11-21T14  complete   c0 c1 c2, and the late d0 d1 (events of 13:30 that arrived at 14:11)
               2026-11-21T15  open       e0
    page_view  2026-11-21T13  complete   three page views
               2026-11-21T14  open       one page view

(``page_view`` with the demo's schema, event_types/page_view/schema.avsc; ``fmt="parquet"`` writes both types as
Parquet, for the Parquet recipe.)
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lib.harness import FakeClock, LocalPipeline, click, make_event_type, t

ROOT = Path(__file__).resolve().parents[2]
CONSUMERS = ROOT / "docs" / "consumers.md"
README = ROOT / "README.md"

CLICK_13 = 3
CLICK_14 = 3 + 2  # its own and the two late records of 13:30
PAGE_VIEW_13 = 3

_MARK = re.compile(r"^<!-- (recipe|not run): (.+?) -->$")
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, its text (without the fences), where it starts (the line after the
    opening fence, 1-based) and its mark: ``("recipe", NAME)``, ``("not run", WHY)`` or None."""

    path: Path
    line: int
    lang: str
    text: str
    mark: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        mark = _MARK.match(lines[i - 1]) if i else None
        out.append(Block(path, i + 2, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                         (mark.group(1), mark.group(2)) if mark else None))
        i = end + 1
    return out


def recipe(path: Path, name: str) -> Block:
    """The block of ``path`` marked ``<!-- recipe: NAME -->`` (exactly one)."""
    found = [b for b in blocks(path) if b.mark == ("recipe", name)]
    assert len(found) == 1, f"{path.name}: {len(found)} blocks marked <!-- recipe: {name} -->"
    return found[0]


def run_recipe(path: Path, name: str, **names: Any) -> dict[str, Any]:
    """Run the Python recipe ``name`` of ``path`` as the page has it, with ``names`` bound (``sink``, ``spark``,
    ...): the names it defines, for the test to check."""
    block = recipe(path, name)
    assert block.lang == "python", f"{block.where}: recipe {name} is not a Python block"
    namespace: dict[str, Any] = {"__name__": f"recipe_{name.replace('-', '_')}", **names}
    exec(compile(block.text, block.where, "exec"), namespace)  # the page's recipe is the test
    return namespace


def _page_view(n: str, at: str) -> bytes:
    return json.dumps({
        "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, n)), "event_time": t(at), "user_id": f"user-{n}",
        "anonymous_id": f"anon-{n}", "session_id": "sess-1", "product_id": f"sku-{n}", "product_category": "shoes",
        "price_minor": 4999, "currency": "EUR", "page_url": f"https://shop.example.com/p/{n}", "referrer_url": None,
        "device_type": "MOBILE", "country": "DE",
    }).encode()


def build_docs_sink(tmp: Path, *, sink_url: str | None = None, fmt: str = "avro") -> str:
    """The hours the recipes read (see the module's docstring), at ``sink_url`` (default ``tmp/sink``): the sink."""
    tmp = Path(tmp)
    sink = sink_url or str(tmp / "sink")
    types = tmp / "types"
    et = make_event_type(types, "click", allowed_lateness="30m", format=fmt)
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp / "click", et, clock, sink_url=sink)
    p.batch([click(f"a{i}", f"13:0{i + 5}", page=f"/a/{i}") for i in range(CLICK_13)])
    clock.now = t("14:10")
    p.batch([click(f"c{i}", "14:05", page="/c") for i in range(3)])  # the watermark passes 14:00: 13 complete
    clock.now = t("14:11")
    p.batch([click("d0", "13:30", page="/late"), click("d1", "13:31")])  # late: into hour 14
    clock.now = t("15:10")
    p.batch([click("e0", "15:05", page="/e")])  # 14 complete, 15 open

    schema = json.loads((ROOT / "event_types" / "page_view" / "schema.avsc").read_text())
    pv = make_event_type(types, "page_view", schema=schema, time_field="event_time", id_field="event_id",
                         allowed_lateness="30m", format=fmt)
    clock = FakeClock(t("13:10"))
    p = LocalPipeline(tmp / "page_view", pv, clock, sink_url=sink)
    p.batch([_page_view(f"p{i}", f"13:0{i + 5}") for i in range(PAGE_VIEW_13)])
    clock.now = t("14:10")
    p.batch([_page_view("q0", "14:05")])  # 13 complete, 14 open
    return sink
