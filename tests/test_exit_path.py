"""Signals end the process through one exit path: library code raises, the command line's error handler ends it."""

from __future__ import annotations

import ast
import pathlib
import signal

import click
from click.testing import CliRunner

from event_etl.cli.options import handles_errors
from event_etl.job import stopping
from event_etl.job.stopping import StoppedAtOnce

PACKAGE = pathlib.Path(stopping.__file__).resolve().parents[1]


def _calls(tree: ast.AST) -> set[str]:
    """The dotted names a module calls (``os._exit``, ``end_at_once``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                out.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Name):
                out.add(f.id)
    return out


def test_only_the_stop_module_ends_the_process_and_only_the_command_line_asks_it_to():
    ends, asks = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        calls = _calls(ast.parse(path.read_text(encoding="utf-8")))
        if "os._exit" in calls:
            ends.append(module)
        if "end_at_once" in calls:
            asks.append(module)
    assert ends == ["event_etl.job.stopping"], ends
    assert asks == ["event_etl.cli.options"], asks


def test_a_job_stopped_at_once_ends_the_process_with_its_line_and_128_plus_the_signal(monkeypatch):
    ended = []

    def fake_exit(code: int) -> None:
        ended.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(stopping.os, "_exit", fake_exit)

    @click.command()
    @handles_errors
    def cmd() -> None:
        raise StoppedAtOnce(signal.SIGTERM, "[page_view] drain cut short (SIGTERM again)")

    r = CliRunner().invoke(cmd)
    assert ended == [128 + signal.SIGTERM]
    assert "[page_view] drain cut short (SIGTERM again) (exit 143)" in r.output + (r.stderr if r.stderr_bytes else "")
