"""The type checker: what ``[tool.mypy]`` in pyproject.toml checks has no type error, and is checked strictly.

``bin/test`` runs ``mypy`` before the tests when it runs everything (CI); these tests hold the same line when
only the unit tests run (``bin/test tests``, ``tox -e unit``).  They run mypy in this process (``mypy.api``),
with its cache: a fraction of a second once the cache is warm, a few seconds without it.
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[1]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def _strict_patterns() -> list[str]:
    """The module patterns of the override that turns --strict's flags on."""
    for override in _config().get("overrides", []):
        if override.get("disallow_untyped_defs") and override.get("disallow_any_generics"):
            return list(override["module"])
    return []


def _modules(path: str) -> list[str]:
    """The dotted names of the modules of a file or package of ``files``."""
    p = ROOT / path
    files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
    names = []
    for f in files:
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def _matches(module: str, pattern: str) -> bool:
    # mypy's rule: "a.b.*" is a.b and its submodules; otherwise the exact name
    if pattern.endswith(".*"):
        return module == pattern[:-2] or module.startswith(pattern[:-1])
    return fnmatch(module, pattern)


def test_the_configured_files_have_no_type_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # mypy reads pyproject.toml and its `files` from the working directory
    out, err, status = api.run([])
    assert status == 0, f"mypy (as bin/test runs it) found type errors:\n{out}{err}"
    assert out.startswith("Success: no issues found"), out


def test_every_configured_file_is_checked_strictly() -> None:
    files, patterns = _config()["files"], _strict_patterns()
    assert files, "[tool.mypy] names no files"
    assert patterns, "no override of [tool.mypy] turns --strict's flags on (disallow_untyped_defs, ...)"
    loose = [m for f in files for m in _modules(f) if not any(_matches(m, p) for p in patterns)]
    assert not loose, f"checked by mypy but not strictly (add them to the strict override's modules): {loose}"


def test_the_whole_package_is_checked() -> None:
    """Every module of event_etl is in mypy's ``files`` (issue 49: strict over the whole package), and so, by the
    test above, checked strictly: a new module cannot stay out of the type checker by being forgotten."""
    checked = {m for f in _config()["files"] for m in _modules(f)}
    every = set(_modules("event_etl"))
    assert every, "no module found under event_etl/"
    assert every <= checked, f"modules of event_etl that mypy does not check: {sorted(every - checked)}"


def test_the_strict_override_rejects_an_unannotated_function_in_the_package_only(tmp_path: Path) -> None:
    """The configuration bites: an unannotated function is an error in a module of event_etl (the pure core as
    much as the driver), not in a module outside the package, such as a benchmark (``strict = true`` in an
    override would be global: see pyproject.toml)."""
    for package in ("event_etl", "event_etl/rules", "event_etl/job", "bench"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    unannotated = "def untyped(x):\n    return x\n"
    probes = ["event_etl/rules/probe.py", "event_etl/job/probe.py", "bench/probe.py"]
    for probe in probes:
        (tmp_path / probe).write_text(unannotated)
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                                *(str(tmp_path / probe) for probe in probes)])
    assert status == 1, out + err
    errors = sorted(line for line in out.splitlines() if ": error:" in line)
    assert len(errors) == 2, out
    assert all("[no-untyped-def]" in e for e in errors), out
    assert any("rules/probe.py:1:" in e for e in errors) and any("job/probe.py:1:" in e for e in errors), out
