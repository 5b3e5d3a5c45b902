"""The suite's layout (CONTRIBUTING.md, "The tests"): no module of tests/ or integration/ imports a test module.

What two test modules share lives in :mod:`tests.lib` (or a sweep's or the campaign's own module), never in a
``test_*.py`` module another one imports: a test module is a list of scenarios, and importing one runs its
module-level code, registers its fixtures a second time and ties the two modules' edits together.  The check parses
every module of tests/ and integration/ (the test modules, the library, the sweeps, the campaign, the conftests)
with :mod:`ast` and looks at every import, at the top of a module or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITES = ("tests", "integration")


def _modules() -> list[Path]:
    return sorted(p for suite in SUITES for p in (ROOT / suite).rglob("*.py")
                  if "__pycache__" not in p.parts and "fixtures" not in p.relative_to(ROOT).parts)


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_test_module(dotted: str) -> bool:
    """``tests.test_x``, ``integration.test_x``, ``tests.sub.test_x``: a module pytest collects tests from."""
    parts = dotted.split(".")
    return parts[0] in SUITES and len(parts) > 1 and parts[-1].startswith("test_")


def test_modules_imported(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """The test modules ``source`` (the text of module ``module``) imports, with their lines: ``import tests.test_x``,
    ``from tests.test_x import y``, ``from tests import test_x``, ``from . import test_x`` and ``from .test_x import
    y``, anywhere in the module."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if is_test_module(name):
                out.append((node.lineno, name))
            else:
                out += [(node.lineno, f"{name}.{a.name}") for a in node.names if is_test_module(f"{name}.{a.name}")]
    return out


test_modules_imported.__test__ = False  # type: ignore[attr-defined]  # a helper named test_*, not a test


def test_no_module_of_the_suites_imports_a_test_module():
    found = []
    for path in _modules():
        module = _dotted(path)
        for line, name in test_modules_imported(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            found.append(f"{path.relative_to(ROOT)}:{line} imports the test module {name}")
    assert found == [], ("a test module is imported; move what it shares into tests/lib/ (a module named for what "
                         "it holds) and import it from there:\n" + "\n".join(found))


@pytest.mark.parametrize("source", [
    "from tests.test_metrics import value",
    "import tests.test_metrics",
    "from tests import test_metrics as tm",
    "from integration.test_pubsub_gcs import scenario",
    "def f():\n    from tests.test_fastpath import dump\n",
    "from . import test_metrics",
    "from .test_metrics import value",
])
def test_the_check_finds_a_test_module_imported(source):
    assert test_modules_imported(source, "tests.test_x") != []


@pytest.mark.parametrize("source", [
    "from tests.lib.harness import t",
    "from tests.sweeps import crash_sweep",
    "from integration.conftest import SLOW_MODULES",
    "import tests.lib.waiting",
    "from event_etl.testing.transcripts import hour",
    "from . import conftest",
])
def test_the_check_lets_the_library_and_the_rest_through(source):
    assert test_modules_imported(source, "tests.test_x") == []
