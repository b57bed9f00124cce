"""The package's shape holds: no import cycle; the two sides of the process boundary, told apart by
their files' names, meet only in the shared files; no import runs back up the layers, and no part
imports another; every part is a folder of files named by role; no module is named by a string;
no file is too long to read at once. These read the source with `ast`: nothing is launched."""
from __future__ import annotations

import ast
import re
from pathlib import Path

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


# --- Roles: which side of the process boundary a file is on, whatever folder it is in ---------------
# In-process: what runs inside the learner's processes (the core's autograde/inprocess/, a part's
# inprocess*.py). Shared: what both sides import (protocol.py, settings.py, the list of parts, a
# part's reports.py). Checker: everything else.
PART_FILE = re.compile(r"^autograde\.parts\.(?P<part>\w+)\.(?P<role>[a-z]+)(?:_\w+)?$")
ROLES = ("items", "checks", "runs", "reports", "inprocess", "notebook", "leaderboard")  # a part's files, each role_<topic> too


def role(module: str) -> str:
    found = PART_FILE.match(module)
    if module.startswith("autograde.inprocess") or (found and found["role"] == "inprocess"):
        return "in-process"
    if module in ("autograde", "autograde.protocol", "autograde.settings", "autograde.parts") \
            or (found and found["role"] == "reports"):
        return "shared"  # "autograde": its __init__ imports nothing (what it offers is loaded on first use)
    return "checker"


def test_roles_are_read_from_names() -> None:
    assert role("autograde.parts.inside.inprocess_model_parallel") == role("autograde.inprocess.tracer") == "in-process"
    assert role("autograde.parts.talk.reports") == role("autograde.protocol") == "shared"
    assert role("autograde.parts.talk.checks") == role("autograde.engine.workspace") == "checker"


def test_in_process_files_import_only_in_process_and_shared_files() -> None:
    """Code that runs in the learner's processes reaches the checker only through the shared files."""
    wrong = {m: sorted(t for t in targets if role(t) == "checker") for m, targets in graph().items()
             if role(m) == "in-process"}
    assert not {m: w for m, w in wrong.items() if w}


def test_checker_files_import_no_in_process_file() -> None:
    wrong = {m: sorted(t for t in targets if role(t) == "in-process") for m, targets in graph().items()
             if role(m) == "checker"}
    assert not {m: w for m, w in wrong.items() if w}, "what both sides need belongs in a shared file"


def test_shared_files_import_only_shared_files() -> None:
    wrong = {m: sorted(t for t in targets if role(t) != "shared") for m, targets in graph().items()
             if role(m) == "shared"}
    assert not {m: w for m, w in wrong.items() if w}


# --- Layers: the core knows no part, and no import runs back up ------------------------------------
def layer(module: str) -> int:
    """0: what every file may import; 1: the core (the engine, clusters, in-process machinery, a part's
    shared and in-process files); 2: the grading front end and the notebooks' runtime; 3: a part's
    checker files; 4: the commands (course, tools, `python -m autograde`)."""
    if module in ("autograde", "autograde.settings", "autograde.protocol", "autograde.parts", "autograde.data"):
        return 0
    if module.startswith(("autograde.engine", "autograde.cluster", "autograde.inprocess")) or role(module) != "checker":
        return 1
    if module.startswith(("autograde.grading", "autograde.jupyter")):
        return 2
    if module.startswith("autograde.parts."):
        return 3
    return 4


def test_no_import_runs_back_up_the_layers() -> None:
    wrong = {m: sorted(t for t in targets if layer(t) > layer(m)) for m, targets in graph().items()}
    assert not {m: w for m, w in wrong.items() if w}


def test_a_part_imports_no_other_part() -> None:
    """What two parts share belongs in the core (a part's folder is the unit a change stays in)."""
    def part(module: str) -> str | None:
        return found["part"] if (found := PART_FILE.match(module)) else None

    wrong = {m: sorted(t for t in targets if part(t) not in (None, part(m))) for m, targets in graph().items()
             if part(m)}
    assert not {m: w for m, w in wrong.items() if w}


def test_every_part_is_a_folder_of_files_by_role() -> None:
    from autograde import parts

    folders = {p.name for p in (PACKAGE / "parts").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(parts.NAMES), "a folder of autograde/parts/ is a part: one line in parts.NAMES"
    for name in parts.NAMES:
        files = [p.stem for p in (PACKAGE / "parts" / name).glob("*.py") if p.stem != "__init__"]
        assert "items" in files, f"part {name}: no items.py"
        strays = [f for f in files if f.split("_")[0] not in ROLES and f not in ROLES]
        assert not strays, f"part {name}: files not named by a role ({', '.join(ROLES)}): {strays}"


# --- No module path crosses as a string, where this test could not follow it -------------------------
def string_modules(tree: ast.AST, modules: set[str]) -> list[str]:
    """String constants, prose aside, that are the dotted name of a module of the package."""
    prose = docstrings(tree)
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in prose and node.value in modules]


def test_no_module_is_named_by_a_string() -> None:
    """A module is named by its import (or `__name__`, or settings' path of an entry point), never
    spelled in a string: a rename would break the string unseen."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")} - {"autograde"}  # the name alone is also a command's
    wrong = {str(p.relative_to(ROOT)): found for p in sorted(PACKAGE.rglob("*.py"))
             if (found := string_modules(ast.parse(p.read_text()), modules))}
    assert not wrong
    assert string_modules(ast.parse('"""autograde.protocol"""\nx = ["-m", "autograde.protocol"]'), modules) == [
        "autograde.protocol"]


def test_the_entry_points_named_by_path_are_in_process_files() -> None:
    from autograde import settings

    for path in (settings.RUNNER, settings.WARM_START, settings.STARTUP / "sitecustomize.py"):
        assert path.is_file() and role(settings.module_of(path)) == "in-process", path


# --- Sizes: a file a reader takes in at once ---------------------------------------------------------
def test_no_file_of_the_package_is_over_450_lines_and_the_protocol_under_300() -> None:
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long
    assert len((PACKAGE / "protocol.py").read_text().splitlines()) < 300


# --- The package never reaches into tests/: no module of autograde/ imports a test module, nor builds
# a path into tests/ to load code from it (the tests' catalogues, recorder and probe are theirs alone).
# The one path into tests/ that the package may name is a test file it runs through pytest, in a
# process of its own (`make gpu-check`: tests/parts/lab/test_gpu_mistakes.py).

TESTS = ROOT / "tests"
# What pytest may be asked to run: a test file (never imported by the package, only named on a command line)
PYTEST_TARGET = re.compile(r"tests/(\w+/)*test_\w+\.py(::\w+)?")
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


# Names tests/ to close it to a class's learners (it holds correct programs), never to use it.
CLOSES_TESTS = {"autograde/course/withheld.py": ["tests"]}


def test_no_module_of_the_package_builds_a_path_into_tests() -> None:
    wrong = {str(p.relative_to(ROOT)): found for p in sorted(PACKAGE.rglob("*.py")) if (found := paths_into_tests(ast.parse(p.read_text())))
             and found != CLOSES_TESTS.get(str(p.relative_to(ROOT)))}
    assert not wrong, f"paths into tests/ in the package (code there is the tests' own): {wrong}"


def test_the_checks_find_what_they_look_for() -> None:
    """Each rule catches the ways it names, and lets a pytest target, prose and messages be."""
    caught = ast.parse('import mistakes\nfrom tests.record_runs import OUT\nfrom conftest import ROOT\nimport autograde.settings\n')
    assert sorted(n for n in imported(caught) if n.split(".")[0] in modules_of_tests()) == [
        "conftest", "conftest.ROOT", "mistakes", "tests.record_runs", "tests.record_runs.OUT"]
    source = ('"""See tests/mistakes.py."""\n'
              'a = REPO / "tests" / "mistakes.py"\n'
              'b = Path(__file__).parent.parent / "tests/exercise_styles.py"\n'
              'c = f"{REPO}/tests/{name}.py"\n'
              'd = runpy.run_module("tests.record_runs")\n'
              'e = [PYTHON, "-m", "pytest", "tests/parts/lab/test_gpu_mistakes.py"]\n'
              'f = "record it again (.venv/bin/python tests/record_runs.py)"\n')
    assert sorted(paths_into_tests(ast.parse(source))) == ["/tests/", "tests", "tests.record_runs",
                                                           "tests/exercise_styles.py"]
