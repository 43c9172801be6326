"""labkit's layout: no two modules import each other, directly or around a circle (imports
inside functions count: they only put the circle off until the call), and the recipe at the
top of the package stays short enough to read at a glance."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "labkit"
TOP_LEVEL_MAX = 16  # modules at the top of labkit/, __init__ and __main__ included


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules that the file at `path` (module `name`) imports, anywhere in it.
    `from a import b` names the module a.b when there is one, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imported(path, name, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_itself_around_a_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def subpackage_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Which sub-packages import which (any module of one, any module of the other)."""
    subs = {f"{root.name}.{p.name}" for p in root.iterdir() if (p / "__init__.py").exists()}

    def subpackage(module: str) -> str | None:
        head = ".".join(module.split(".")[:2])
        return head if head in subs else None

    graph: dict[str, set[str]] = {}
    for name, targets in import_graph(root).items():
        for target in targets:
            a, b = subpackage(name), subpackage(target)
            if a and b and a != b:
                graph.setdefault(a, set()).add(b)
    return graph


def test_sub_packages_build_on_one_another_one_way():
    """serving/ is the router and its client; engines/ builds on it, and so on: no two parts
    of the system import each other, directly or around a circle."""
    cycle = find_cycle(subpackage_graph())
    assert cycle is None, "sub-packages import each other: " + " -> ".join(cycle)


def test_the_sub_package_scan_sees_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "engine.py").write_text("from pkg.low.client import Client\n")
    (pkg / "low" / "client.py").write_text("class Client:\n    pass\n")
    assert find_cycle(subpackage_graph(pkg)) is None
    (pkg / "low" / "client.py").write_text("def f():\n    from pkg.high import engine\n")
    assert find_cycle(subpackage_graph(pkg)) == ["pkg.high", "pkg.low", "pkg.high"]


def test_the_top_level_is_short():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MAX, f"{len(top)} modules at the top of labkit/: {top}"


def test_the_scan_sees_every_kind_of_import(tmp_path):
    """The checker finds a circle made of a function-level import, a relative import and a
    `from package import module`, and passes the same modules once the circle is cut."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("def f():\n    import pkg.sub\n")
    assert find_cycle(import_graph(pkg)) is None


def code_map(readme: Path) -> dict[str, str]:
    """README's code map: {first column: second column} of its table."""
    text = readme.read_text()
    table = text[text.index("## Code map"):]
    table = table[: table.index("\n## ")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`labkit/"):
            rows[cells[0]] = cells[1]
    return rows


def test_the_readme_code_map_names_every_module_once():
    rows = code_map(PACKAGE.parent / "README.md")
    missing, twice = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) == 1:  # a top-level module: its own row, or a name in the face's row
            hits = sum(f"`labkit/{rel.name}`" in place or f"`{rel.name}`" in place
                       or f", `{rel.name}`" in place for place in rows)
        else:  # a module of a sub-package: named in its package's row
            row = rows.get(f"`labkit/{rel.parts[0]}/`", "")
            if rel.name == "__init__.py":
                hits = 1 if row else 0
            else:
                hits = row.count(f"`{rel.stem}`")
        if hits == 0:
            missing.append(str(rel))
        elif hits > 1:
            twice.append(str(rel))
    assert not missing, f"README's code map misses {missing}"
    assert not twice, f"README's code map names {twice} more than once"
