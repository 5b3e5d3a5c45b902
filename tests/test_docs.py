"""The docs say what the code does: the command reference is generated from click, every EVENT_ETL_*
variable the code reads is in docs/environment.md, the README links the pages, no dangling references."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_committed_command_reference_is_what_click_says():
    r = subprocess.run([sys.executable, str(DOCS / "make_commands.py"), "--check"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, (r.stderr or r.stdout) + "\nrun: .venv/bin/python docs/make_commands.py"


def _env_table() -> set[str]:
    rows = [line for line in (DOCS / "environment.md").read_text().splitlines() if line.startswith("| `EVENT_ETL_")]
    return {line.split("`")[1] for line in rows}


def test_every_event_etl_variable_the_code_reads_is_in_the_one_table():
    names: set[str] = set()
    for base in ("event_etl", "bin"):
        for path in (ROOT / base).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh") and "__pycache__" not in path.parts:
                names |= set(
                    re.findall(r"EVENT_ETL_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*{])", path.read_text(errors="replace"))
                )
    # the Pub/Sub fetcher builds its names from its settings' fields: EVENT_ETL_PUBSUB_<FIELD>
    from dataclasses import fields

    from event_etl.sources.pubsub_settings import FetchSettings

    names |= {"EVENT_ETL_PUBSUB_OUTAGE_SECONDS" if f.name == "outage_timeout" else f"EVENT_ETL_PUBSUB_{f.name.upper()}"
              for f in fields(FetchSettings)}
    table = _env_table()
    assert names - table == set(), "document these in docs/environment.md"
    assert table - names == set(), "docs/environment.md lists variables the code no longer reads"


def test_only_the_settings_object_names_the_variables_it_reads():
    """event_etl/settings.py reads every EVENT_ETL_* variable; elsewhere no code spells one out to read it
    (a docstring or help text may name it).  Exceptions: the fault points of the test campaigns
    (faults.py) and the Pub/Sub fetcher's settings, named after their fields (EVENT_ETL_PUBSUB_<FIELD>)."""
    import ast

    allowed = {"settings.py", "faults.py", "pubsub_settings.py"}
    spelled = []
    for path in sorted((ROOT / "event_etl").rglob("*.py")):
        if path.name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"EVENT_ETL_\w+",
                                                                                               node.value):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert spelled == [], "read it through event_etl.settings.Settings"
    from event_etl import settings

    constants = {v for k, v in vars(settings).items() if k.startswith("ENV_")}
    documented = {n for n in _env_table() if not n.startswith(("EVENT_ETL_PUBSUB_", "EVENT_ETL_FAULT_"))}
    assert documented - constants == {"EVENT_ETL_PYTHON", "EVENT_ETL_VENV"}, \
        "every variable but the bin/ scripts' is a constant of event_etl.settings"


def test_no_dangling_pitfalls_reference():
    for path in [ROOT / "event_etl" / "storage" / "gcs.py", *DOCS.glob("*.md"), ROOT / "README.md"]:
        for m in re.finditer(r'see ([^,()]*?), "Pitfalls"', path.read_text()):
            page = ROOT / m.group(1).strip()
            assert page.is_file(), f"{path}: {m.group(0)}"
            assert re.search(r"^#+ Pitfalls", page.read_text(), re.M), f"{page} has no Pitfalls section"


def test_the_file_names_the_readme_shows_are_what_a_job_writes():
    """A reader copies these names into globs and checks: they must have today's form (the writer id included)."""
    from event_etl.rules.buckets import data_file_name, deadletter_file_path, parse_data_file_name
    from event_etl.timeutil import parse_rfc3339_millis

    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"\b(?:part|late)-\d{10}-[\w-]+\.avro", readme)
    assert shown, "the README shows data file names"
    for name in shown:
        meta = parse_data_file_name(name)
        assert meta.writer, f"{name}: a job's files carry their writer id"
        assert data_file_name(meta.hour_start, meta.batch_id, meta.shard, meta.seq, late=meta.late,
                              writer=meta.writer) == name
    for path in re.findall(r"_deadletter/dt=\d{4}-\d{2}-\d{2}/dl-[\w-]+\.avro", readme):
        day = parse_rfc3339_millis(path.split("dt=")[1][:10] + "T00:00:00Z")
        batch, shard = re.search(r"-b(\d{10})-s(\d{4})", path).groups()
        writer = re.search(r"dl-w([0-9a-f]{6})-", path).group(1)
        assert deadletter_file_path("page_view", day, int(batch), int(shard), writer=writer).endswith(path)
