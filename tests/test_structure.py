"""The package's shape holds: no import cycle, the two sides of the process boundary meet only in
autograde/protocol.py, and each part has its checks, in-process code and notebook helpers in files
named after it. These read the source with `ast`: nothing is imported or launched."""
from __future__ import annotations

import ast
from pathlib import Path

from autograde import registry
from conftest import ROOT

PACKAGE = ROOT / "autograde"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The autograde modules `path` imports, at any level (a function's own imports count too)."""
    here = module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x
                anchor = here.split(".")[: len(here.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in found if name in modules and name != here}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(graph()) == []


def test_the_learner_processes_side_imports_nothing_of_the_checker() -> None:
    """Code that runs in the learner's processes reaches the checker only through protocol.py."""
    checker_side = ("autograde.checker", "autograde.checks", "autograde.registry", "autograde.course",
                    "autograde.notebook", "autograde.tools")
    for module, targets in graph().items():
        if module.startswith("autograde.learner_processes"):
            wrong = sorted(t for t in targets if t.startswith(checker_side))
            assert not wrong, f"{module} imports {wrong}"


def test_the_checker_side_imports_no_learner_process_code() -> None:
    for module, targets in graph().items():
        if module.startswith(("autograde.checker", "autograde.checks", "autograde.registry")):
            wrong = sorted(t for t in targets if t.startswith("autograde.learner_processes"))
            assert not wrong, f"{module} imports {wrong}: what both sides need belongs in autograde/protocol.py"


def test_every_part_has_its_files_named_after_it() -> None:
    for part in registry.PARTS:
        for folder in ("checks", "learner_processes", "notebook"):
            assert (PACKAGE / folder / f"{part.short}.py").is_file(), f"{part.id}: no autograde/{folder}/{part.short}.py"
    shorts = {part.short for part in registry.PARTS}
    for folder in ("checks", "learner_processes", "notebook"):
        for path in (PACKAGE / folder).glob("*.py"):
            if path.stem != "__init__" and not path.stem.startswith("_"):
                assert path.stem.split("_")[0] in shorts | SHARED[folder], f"{path}: not named after a part"


# The modules of a side that serve every part (named for what they do, not for a part)
SHARED = {"checks": set(), "learner_processes": {"tracer", "tasks"}, "notebook": {"runtime", "figure"}}
