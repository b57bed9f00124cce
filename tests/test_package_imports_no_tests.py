"""The package never reaches into tests/: no module of autograde/ imports a test module, nor builds a
path into tests/ to load code from it (the tests' catalogues, recorder and probe are theirs alone).
The one path into tests/ that the package may name is a test file it runs through pytest, in a
process of its own (`make gpu-check`: tests/test_gpu_mistakes.py). These read the source with `ast`."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "autograde"
TESTS = ROOT / "tests"
# What pytest may be asked to run: a test file (never imported by the package, only named on a command line)
PYTEST_TARGET = re.compile(r"tests/test_\w+\.py(::\w+)?")
# A string that is a path into tests/ or a dotted name in it: "tests", "tests/x.py", "../tests", "tests.mistakes"
INTO_TESTS = re.compile(r"(^|/)tests($|/|\.)")


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def modules_of_tests() -> set[str]:
    """The names a module of tests/ is imported by (pytest puts tests/ on sys.path): conftest, mistakes, ..."""
    return {p.stem for p in TESTS.glob("*.py")} | {"tests"}


def imported(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


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
    wrong = {str(p.relative_to(ROOT)): names for p in modules()
             if (names := [n for n in imported(ast.parse(p.read_text())) if n.split(".")[0] in ours])}
    assert not wrong, f"the package imports test modules: {wrong}"


def test_no_module_of_the_package_builds_a_path_into_tests() -> None:
    wrong = {str(p.relative_to(ROOT)): found for p in modules() if (found := paths_into_tests(ast.parse(p.read_text())))}
    assert not wrong, f"paths into tests/ in the package (code there is the tests' own): {wrong}"


def test_the_checks_find_what_they_look_for() -> None:
    """Each rule catches the ways it names, and lets a pytest target, prose and messages be."""
    caught = ast.parse('import mistakes\nfrom tests.record_runs import OUT\nfrom conftest import ROOT\nimport autograde.paths\n')
    assert [n for n in imported(caught) if n.split(".")[0] in modules_of_tests()] == ["mistakes", "tests.record_runs",
                                                                                  "conftest"]
    source = ('"""See tests/mistakes.py."""\n'
              'a = REPO / "tests" / "mistakes.py"\n'
              'b = Path(__file__).parent.parent / "tests/exercise_styles.py"\n'
              'c = f"{REPO}/tests/{name}.py"\n'
              'd = runpy.run_module("tests.record_runs")\n'
              'e = [PYTHON, "-m", "pytest", "tests/test_gpu_mistakes.py"]\n'
              'f = "record it again (.venv/bin/python tests/record_runs.py)"\n')
    assert sorted(paths_into_tests(ast.parse(source))) == ["/tests/", "tests", "tests.record_runs",
                                                           "tests/exercise_styles.py"]
