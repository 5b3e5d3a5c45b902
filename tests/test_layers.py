"""The packages are layers (see event_etl/__init__.py): no module imports one of a higher layer,
at the top of the module or inside a function, and nothing outside event_etl.cli imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "event_etl"

# Lowest first; a module belongs to the layer of the longest prefix of its name listed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("event_etl", "event_etl.errors", "event_etl.exitcodes", "event_etl.timeutil", "event_etl.settings",
              "event_etl.faults", "event_etl.util")),
    ("rules", ("event_etl.rules",)),
    ("storage", ("event_etl.storage", "event_etl.eventtypes", "event_etl.bundled", "event_etl.payloads")),
    ("sources/task/consumer", ("event_etl.sources", "event_etl.task", "event_etl.consumer", "event_etl.recipes",
                               "event_etl.airflow", "event_etl.bus")),
    ("metrics", ("event_etl.metrics",)),
    ("job", ("event_etl.job",)),
    ("cluster", ("event_etl.cluster",)),
    ("testing", ("event_etl.testing",)),
    ("cli", ("event_etl.cli", "event_etl.__main__", "event_etl.submit_main")),
]
CLI = len(LAYERS) - 1


def layer_of(module: str) -> int:
    best, rank = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, rank = p, i
    if rank is None:
        raise KeyError(module)
    return rank


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


MODULES = _modules()


def imports_of(module: str, path: Path) -> set[str]:
    """Every event_etl module ``module`` imports, anywhere in it (``from event_etl import x`` counts as event_etl.x
    when x is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "event_etl"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "event_etl":
                continue
            subs = {f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in MODULES}
            out |= subs or {name}
            if subs and len(subs) < len(node.names):
                out.add(name)
    return out


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    mine = layer_of(module)
    higher = sorted(f"{target} ({LAYERS[layer_of(target)][0]})" for target in imports_of(module, MODULES[module])
                    if layer_of(target) > mine)
    assert not higher, f"{module} ({LAYERS[mine][0]}) imports a higher layer: {', '.join(higher)}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) != CLI))
def test_only_the_command_line_imports_the_cli(module):
    cli = sorted(
        t for t in imports_of(module, MODULES[module]) if t == "event_etl.cli" or t.startswith("event_etl.cli.")
    )
    assert not cli, f"{module} imports the command line: {', '.join(cli)}"


# The job layer uses a source only through its face (event_etl.sources.face) and the registry of kinds; these modules
# of event_etl.sources are not a source's, each with its reason:
JOB_MAY_IMPORT_FROM_SOURCES: dict[str, str] = {
    "event_etl.sources": "the package: SourceSpec, a parsed --source",
    "event_etl.sources.face": "the face",
    "event_etl.sources.registry": "the kinds: parsing, identity, checks, opening a session",
    "event_etl.sources.pubsub": "the pubsub commit policy publishes notices with its publisher client (not a source)",
}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("event_etl.job.")))
def test_the_job_layer_uses_sources_only_through_their_face(module):
    reached = sorted(t for t in imports_of(module, MODULES[module])
                     if (t == "event_etl.sources" or t.startswith("event_etl.sources."))
                     and t not in JOB_MAY_IMPORT_FROM_SOURCES)
    assert not reached, f"{module} reaches past the source face: {', '.join(reached)}"
    source = MODULES[module].read_text(encoding="utf-8")
    assert "hasattr(" not in source, f"{module} probes an object with hasattr: ask the face"


CLASS_LINES = 420
"""The most lines a class of the package spans (CONTRIBUTING.md, "Size")."""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_class_is_longer_than_the_limit(module):
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and n.end_lineno is not None and n.end_lineno - n.lineno + 1 > CLASS_LINES]
    assert not long, f"{module}: {', '.join(long)}: split it by what each part owns"


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    """The test itself: an import inside a function, and a relative one, are seen."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from event_etl.job.driver import run\n\nfrom ..cli import options\n")
    found = imports_of("event_etl.storage.mod", path)
    assert "event_etl.job.driver" in found and "event_etl.cli.options" in found


def test_every_package_has_an_init():
    """``packages = find:`` (setup.cfg) and a job bundle's zip import see only folders with an ``__init__.py``."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(PACKAGE.parent)) for f in folders if not (f / "__init__.py").is_file()) == []


FLAT_MODULES_AT_MOST = 12


def test_at_most_twelve_modules_lie_flat_in_the_package():
    """A module belongs to a package of its layer; the top level keeps the base layer, the entry points and
    the public paths of earlier releases (thin re-exports), no more than twelve in all."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= FLAT_MODULES_AT_MOST, (
        f"{len(flat)} modules lie flat in event_etl/ ({', '.join(flat)}): move the new one into the package of "
        f"its layer (LAYERS above)")


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (``{module: modules it imports}``): its strongly connected components of
    more than one module, each sorted (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_import_circle():
    """Two modules that import each other (at any depth, also inside functions) cannot be read one before the
    other: a newcomer reads a layer from its lowest module up."""
    graph = {m: {t for t in imports_of(m, p) if t in MODULES and t != m} for m, p in MODULES.items()}
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle_through_three_modules_and_none_in_a_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


# Only the command line prints for people (CONTRIBUTING.md): elsewhere a line goes through the ``echo`` it passes in
# (``event_etl.job.stopping.Echo``; its ``say``, which writes to the streams, is the echo of a caller that gives
# none, and the last line of ``end_at_once``).  The modules that still print, each with its reason:
PRINTS_ALLOWED: dict[str, str] = {
    "event_etl.job.sparkdaemon": "runs in PySpark's daemon process on a worker, where no command line is: its stderr "
                                 "is the executor's log",
    "event_etl.eventtypes": "`_stderr`: the default of `warn` (an unregistered schema) when a library caller gives "
                            "none",
    "event_etl.consumer.notices": "the default of `warn` when a library caller gives none",
    # not yet routed (issue 49 item 2 leftovers, modules outside job/): each should take an echo
    "event_etl.metrics.job": "leftover: `job_metrics` prints its endpoints' URLs; to take the job's echo",
    "event_etl.cluster.submit": "leftover: submit's supervision prints why a drain request cannot reach the driver",
}


def prints_in(path: Path) -> list[str]:
    """Where a module prints for people: calls of ``print`` and ``click.echo``/``secho``, and any use of
    ``event_etl.job.stopping.say`` other than as a default (a parameter's, a dataclass field's:
    ``echo: Echo = say``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defaults = {id(d) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None}
    defaults |= {id(n.value) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)  # a dataclass field's
                 for n in node.body if isinstance(n, ast.AnnAssign) and n.value is not None}
    says = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").endswith("stopping") for a in node.names if a.name == "say"}
    echoes = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              and node.module == "click" for a in node.names if a.name in ("echo", "secho")}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ({"print"} | echoes):
                found.append(f"line {node.lineno}: {f.id}(...)")
            elif isinstance(f, ast.Attribute) and f.attr in ("echo", "secho") and isinstance(f.value, ast.Name) \
                    and f.value.id == "click":
                found.append(f"line {node.lineno}: click.{f.attr}(...)")
        if isinstance(node, ast.Name) and node.id in says and isinstance(node.ctx, ast.Load) \
                and id(node) not in defaults:
            found.append(f"line {node.lineno}: say")
        if isinstance(node, ast.Attribute) and node.attr == "say" and isinstance(node.value, ast.Name) \
                and node.value.id == "stopping" and id(node) not in defaults:
            found.append(f"line {node.lineno}: stopping.say")
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) != CLI))
def test_only_the_command_line_prints_for_people(module):
    found = prints_in(MODULES[module])
    if module in PRINTS_ALLOWED:
        assert found, f"{module} prints no more: take it off PRINTS_ALLOWED"
        return
    assert not found, (f"{module} prints for people ({'; '.join(found)}): take an `echo: Echo` "
                       f"(event_etl.job.stopping) and call it; the command line passes its own")


def test_the_print_checker_sees_print_click_and_say_but_not_a_default(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("import click\nfrom event_etl.job.stopping import say\n\n"
                    "def f(echo=say):\n    echo('ok')\n\n"
                    "def g(quiet):\n    print('a')\n    click.echo('b')\n    run(None if quiet else say)\n")
    assert sorted(prints_in(path)) == ["line 10: say", "line 8: print(...)", "line 9: click.echo(...)"]
