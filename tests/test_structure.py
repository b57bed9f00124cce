"""The package's shape holds: no import cycle, the two sides of the process boundary meet only in
autograde/protocol.py, and each part has its checks, in-process code and notebook helpers in files
named after it. These read the source with `ast`: nothing is imported or launched."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from autograde import registry
from conftest import ROOT

PACKAGE = ROOT / "autograde"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, package: str = "") -> set[str]:
    """Every dotted name `tree` imports, at any level (a function's own imports count too): a
    module, and for `from m import x` both m and m.x (x may be a module); relative imports are
    resolved against `package`, the package the importing module is in (an __init__'s own)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def imports(path: Path) -> set[str]:
    """The autograde modules `path` imports."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in imported(ast.parse(path.read_text()), package) if name in modules and name != here}


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


def test_relative_imports_are_read_from_their_package() -> None:
    assert imported(ast.parse("from . import x\nfrom ..y import z\nimport a.q"), "a.b") == {
        "a.b", "a.b.x", "a.y", "a.y.z", "a.q"}


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
SHARED = {"checks": set(), "learner_processes": {"tracer", "tasks", "warm"}, "notebook": {"runtime", "figure"}}


# --- The package never reaches into tests/: no module of autograde/ imports a test module, nor builds
# a path into tests/ to load code from it (the tests' catalogues, recorder and probe are theirs alone).
# The one path into tests/ that the package may name is a test file it runs through pytest, in a
# process of its own (`make gpu-check`: tests/test_gpu_mistakes.py).

TESTS = ROOT / "tests"
# What pytest may be asked to run: a test file (never imported by the package, only named on a command line)
PYTEST_TARGET = re.compile(r"tests/test_\w+\.py(::\w+)?")
# A string that is a path into tests/ or a dotted name in it: "tests", "tests/x.py", "../tests", "tests.mistakes"
INTO_TESTS = re.compile(r"(^|/)tests($|/|\.)")


def modules_of_tests() -> set[str]:
    """The names a module of tests/ is imported by (pytest puts tests/ on sys.path): conftest, mistakes, ..."""
    return {p.stem for p in TESTS.glob("*.py")} | {"tests"}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes (they may name tests/ files: they are prose)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def paths_into_tests(tree: ast.AST) -> list[str]:
    """String constants (f-strings' parts included) that name tests/ as a path or a module, except a
    pytest target and prose."""
    prose = docstrings(tree)
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            and INTO_TESTS.search(node.value) and not PYTEST_TARGET.fullmatch(node.value)]


def test_no_module_of_the_package_imports_from_tests() -> None:
    ours = modules_of_tests()
    wrong = {str(p.relative_to(ROOT)): names for p in sorted(PACKAGE.rglob("*.py"))
             if (names := [n for n in imported(ast.parse(p.read_text())) if n.split(".")[0] in ours])}
    assert not wrong, f"the package imports test modules: {wrong}"


def test_no_module_of_the_package_builds_a_path_into_tests() -> None:
    wrong = {str(p.relative_to(ROOT)): found for p in sorted(PACKAGE.rglob("*.py")) if (found := paths_into_tests(ast.parse(p.read_text())))}
    assert not wrong, f"paths into tests/ in the package (code there is the tests' own): {wrong}"


def test_the_checks_find_what_they_look_for() -> None:
    """Each rule catches the ways it names, and lets a pytest target, prose and messages be."""
    caught = ast.parse('import mistakes\nfrom tests.record_runs import OUT\nfrom conftest import ROOT\nimport autograde.paths\n')
    assert sorted(n for n in imported(caught) if n.split(".")[0] in modules_of_tests()) == [
        "conftest", "conftest.ROOT", "mistakes", "tests.record_runs", "tests.record_runs.OUT"]
    source = ('"""See tests/mistakes.py."""\n'
              'a = REPO / "tests" / "mistakes.py"\n'
              'b = Path(__file__).parent.parent / "tests/exercise_styles.py"\n'
              'c = f"{REPO}/tests/{name}.py"\n'
              'd = runpy.run_module("tests.record_runs")\n'
              'e = [PYTHON, "-m", "pytest", "tests/test_gpu_mistakes.py"]\n'
              'f = "record it again (.venv/bin/python tests/record_runs.py)"\n')
    assert sorted(paths_into_tests(ast.parse(source))) == ["/tests/", "tests", "tests.record_runs",
                                                           "tests/exercise_styles.py"]
