"""``bench/RESULTS.md``: one file, one section per benchmark script, each rewritten in place.

Each script owns the text between ``<!-- bench:NAME:begin -->`` and ``<!-- bench:NAME:end -->``
and replaces only that; a section not yet in the file is appended.  So the comparison,
latency, memory, scale and profile figures can be refreshed one at a time, and anything a
person wrote outside the markers stays.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RESULTS", "update_section", "markdown_table", "machine_lines"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_HEADER = ("# Benchmark results\n\nWritten by the scripts in `bench/` (see the README, section Benchmarks); "
           "each section is replaced when its script runs again.\n")


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def update_section(name: str, body: str, path: Path = RESULTS) -> Path:
    """Replace section ``name`` of ``path`` with ``body`` (append it if absent); returns ``path``."""
    begin, end = _markers(name)
    block = f"{begin}\n{body.rstrip()}\n{end}\n"
    text = path.read_text() if path.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
    return path


def publish(name: str, body: str, results: Path | None) -> Path:
    """Write section ``name`` to ``results`` (default ``bench/RESULTS.md``) and say where."""
    path = update_section(name, body, results or RESULTS)
    print(f"written to {path}")
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table: the first column (names) left-aligned, the figures right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine_lines(machine: dict[str, str], command: str, load: float | None = None) -> str:
    """The machine and the command, as a Markdown list (opening every section)."""
    lines = [f"- **{k}**: {v}" for k, v in machine.items()]
    if load is not None:
        lines.append(f"- **load average** (1 min) when it started: {load:.2f}")
    lines.append(f"- **command**: `{command}`")
    return "\n".join(lines)
