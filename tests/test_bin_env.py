"""bin/_env.sh's first-run install: quiet when it works, everything shown when it fails.

A stand-in ``python`` in a throwaway environment plays pip: it prints what pip and setuptools print on an editable
install (the "Editable installation" box) and succeeds or fails as the test asks.  The real install is what every
command of bin/ runs on a fresh clone (CI's first minutes)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
# pip's stand-in: an editable install prints the setuptools box on stderr, then succeeds unless told to fail
case "$*" in
  *"pip install --quiet -e"*)
    echo "  !!" >&2
    echo "          ********************************************************************************" >&2
    echo "  BuildBackendWarning: Editable installation." >&2
    [ -n "${FAKE_PIP_FAILS:-}" ] && { echo "ERROR: No matching distribution found for pyspark" >&2; exit 1; }
    exit 0 ;;
  *"-c import pyspark"*) exit 1 ;;  # no Spark here: no JVM archive to build
  *) exit 0 ;;
esac
"""


def _install(tmp_path: Path, *, fails: bool) -> subprocess.CompletedProcess[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "EVENT_ETL_VENV": str(venv), **({"FAKE_PIP_FAILS": "1"} if fails else {})}
    return subprocess.run(["bash", "-c", f"source {ROOT / 'bin' / '_env.sh'}; ensure_venv all"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_first_install_that_works_says_one_line_and_no_build_backend_box(tmp_path):
    r = _install(tmp_path, fails=False)
    assert r.returncode == 0, r.stderr
    assert "installing event_etl with [all]" in r.stderr
    assert "Editable installation" not in r.stderr + r.stdout and "*****" not in r.stderr
    assert "Editable installation" in (tmp_path / "venv" / ".event_etl-install.log").read_text()


def test_a_first_install_that_fails_shows_pips_output_and_the_fix(tmp_path):
    r = _install(tmp_path, fails=True)
    assert r.returncode == 1
    assert "No matching distribution found for pyspark" in r.stderr
    assert "error: installing the dependencies failed" in r.stderr and "fix: check the network access" in r.stderr
