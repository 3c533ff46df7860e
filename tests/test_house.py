"""The direction of the house, checked so that it cannot rot (docs/pages/architecture/index.md).

actors/ (the actors and their wiring) may import spark/ and persistence/; spark/ (Spark as plain
functions and classes) may import persistence/ only; persistence/ (the SQLite stores) imports
neither; pykka is imported only in actors/. And no module imports itself back through others.
Read from the source with `ast`: every import, at the top or inside a function, counts; one under
`if TYPE_CHECKING:` too (it states a dependency all the same).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "persistence", "spark")
# What each package may import of the others (and of pykka).
ALLOWED = {
    "actors": {"actors", "spark", "persistence", "pykka"},
    "spark": {"spark", "persistence"},
    "persistence": {"persistence"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(path: Path) -> set[str]:
    """Every module name `path` imports (absolute imports; the project uses no relative ones)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            names.add(node.module)
            # `from actors import ledger` imports the module actors.ledger.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def project_edges() -> dict[str, set[str]]:
    known = modules()
    return {
        module: {name for name in imports_of(path) if name in known and name != module}
        for module, path in known.items()
    }


def upward(package: str, imports: dict[str, set[str]]) -> list[str]:
    """The imports of `package`'s modules (module -> names) that point up the house."""
    return [
        f"{module} imports {name}"
        for module, names in sorted(imports.items())
        if module.split(".")[0] == package
        for name in sorted(names)
        if name.split(".")[0] in (*ALLOWED, "pykka") and name.split(".")[0] not in ALLOWED[package]
    ]


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """Every import cycle met by a depth-first walk, as 'a -> b -> a'."""
    found = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    trail: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        trail.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                found.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target)
        trail.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_downward(package):
    imports = {module: imports_of(path) for module, path in modules().items()}
    wrong = upward(package, imports)
    assert wrong == [], "imports that point up the house:\n" + "\n".join(wrong)


def test_no_module_imports_itself_back_through_others():
    found = cycles(project_edges())
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_the_checks_above_can_fail(tmp_path):
    """The same functions find an upward import and a cycle where there are some."""
    bad = tmp_path / "bad.py"
    bad.write_text("from actors.ledger import InboundLedger\nimport pykka\n")
    assert upward("persistence", {"persistence.bad": imports_of(bad)}) == [
        "persistence.bad imports actors.ledger",
        "persistence.bad imports actors.ledger.InboundLedger",
        "persistence.bad imports pykka",
    ]
    assert upward("spark", {"spark.ok": {"persistence.records", "pyarrow"}}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]


def waits_without_timeout(path: Path) -> list[str]:
    """Calls in `path` that wait for an actor's answer with no bound: `future.get()` with no
    argument (a dict's get always has one) and `ref.ask(...)` without `timeout=`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        keywords = {k.arg for k in node.keywords}
        if node.func.attr == "get" and not node.args and "timeout" not in keywords:
            found.append(f"{path.name}:{node.lineno} .get() without a timeout")
        if node.func.attr == "ask" and "timeout" not in keywords:
            found.append(f"{path.name}:{node.lineno} .ask() without a timeout")
    return found


def test_every_ask_of_an_actor_has_a_timeout(tmp_path):
    """A blocked sink must not hang an actor forever (an answer that does not come in time is
    a failed attempt, retried)."""
    found = [
        line
        for module, path in modules().items()
        if module.startswith("actors")
        for line in waits_without_timeout(path)
    ]
    assert found == []
    sample = tmp_path / "sample.py"
    sample.write_text("x = ledger.stats().get()\ny = ref.ask(m)\nz = d.get('k')\n")
    assert waits_without_timeout(sample) == [
        "sample.py:1 .get() without a timeout",
        "sample.py:2 .ask() without a timeout",
    ]
