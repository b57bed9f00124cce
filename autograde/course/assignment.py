"""The source assignment of a part, built afresh from a commit (HEAD unless told otherwise): its
notebooks/, and the learner's files its items read, never from a working copy an instructor may
have tried the lab in; the graders' hidden tests (each item's `hidden` layouts in
autograde/grading/registry.py) written into its grade cells only. Also where the course's folders are.
"""
from __future__ import annotations

import fnmatch
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from autograde import settings
from autograde.engine import processes
from autograde.grading import registry
from autograde.grading.registry import Layout
from autograde.settings import REPO

HERE = Path(__file__).resolve().parent  # nbgrader runs here: it reads nbgrader_config.py from here only
COURSE_ID = "ddp-lab"  # as in nbgrader_config.py; the learners' nbgrader commands name it with --course
NOTEBOOKS = "notebooks"
WORKING_COPY = "files"  # `--from files`: build from the files as they are (outside a git checkout)
# nbgrader's own default exchange, the one a learner's nbgrader (and JupyterLab's Assignments tab)
# uses when nothing configures another: `make ... EXCHANGE=/path` or --exchange chooses one.
EXCHANGE_DEFAULT = "/usr/local/share/nbgrader/exchange"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


class CourseError(RuntimeError):
    """What stops a course command, in one line that says what to do."""


# The hidden tests, item -> the extra layouts its grade cell checks when grading: the registry's.
HIDDEN_TESTS: dict[str, list[Layout]] = {item.id: list(item.hidden) for item in registry.ITEMS if item.hidden}


def hidden_layouts() -> dict[str, tuple[list[str], Layout]]:
    """The hidden tests by layout ("1x3": 1 node of 3 processes): the steps each layout checks."""
    layouts: dict[str, tuple[list[str], Layout]] = {}
    for step, extra in HIDDEN_TESTS.items():
        for layout in extra:
            layouts.setdefault(f"{layout.nodes}x{layout.procs_per_node}", ([], layout))[0].append(step)
    return layouts


def root() -> Path:
    return settings.course_dir()


def grade_id(step: str) -> str:
    """The grade cell's id of an item (the registry's: step_6_5, step_lr_scaling)."""
    return registry.item(step).grade_id


def step_of(grade_id: str) -> str:
    """The item a grade cell grades (an id may hold "_" itself: step_lr_scaling is lr_scaling)."""
    return {item.grade_id: item.id for item in registry.ITEMS}[grade_id]


def hidden_test_block(step: str) -> str:
    """The hidden tests of `step`'s grade cell, between nbgrader's delimiters."""
    argument = step if step.isdigit() else f'"{step}"'  # as the grade cells write it: assert_step("6.5")
    calls = [f"autograde.assert_step({argument}, procs_per_node={layout.procs_per_node}, nodes={layout.nodes})"
             f"  # {layout.why}" for layout in HIDDEN_TESTS[step]]
    return "\n".join([BEGIN_HIDDEN, *calls, END_HIDDEN])


def add_hidden_tests(notebook: dict, name: str) -> list[str]:
    """Append the hidden tests to the grade cells of `notebook` (JSON) that have some; return their steps."""
    added = []
    for cell in notebook["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        source = "".join(cell["source"])
        if not meta.get("grade"):
            continue
        if BEGIN_HIDDEN in source:
            raise CourseError(f"{name}: grade cell {meta['grade_id']} has hidden tests of its own: "
                              f"they belong in autograde/grading/registry.py (an item's `hidden`), not in {NOTEBOOKS}/")
        step = step_of(meta["grade_id"])
        if step in HIDDEN_TESTS:
            cell["source"] = f"{source}\n{hidden_test_block(step)}".splitlines(keepends=True)
            added.append(step)
    return added


def _git(repo: Path, *args: str) -> str:
    try:
        done = processes.run(["git", "-C", str(repo), *args], timeout=120)
    except FileNotFoundError:
        raise CourseError("git is not installed") from None
    if done.returncode != 0:
        raise CourseError((done.stderr.strip().splitlines() or ["(no message)"])[-1])
    return done.stdout


@dataclass
class Release:
    """The course files one release is built from: their contents, and where they came from."""
    files: dict[str, bytes]  # path relative to the repository -> contents
    origin: str  # one line: the commit, or the working copy
    notes: list[str]


def course_files(repo: Path | None = None, rev: str = "HEAD", part: str = registry.FIRST) -> Release:
    """The part's notebooks and learner's files in the repository as committed in `rev` (or, with
    rev "files", as they are)."""
    repo = repo or REPO
    notebooks, learner_files = registry.PART[part].notebooks, registry.PART[part].files
    if rev == WORKING_COPY:
        paths = [f"{NOTEBOOKS}/{p.name}" for p in sorted((repo / NOTEBOOKS).glob(notebooks))] + learner_files
        missing = [p for p in paths if not (repo / p).is_file()]
        if missing:
            raise CourseError(f"{repo} has no {', '.join(missing)}")
        return Release({p: (repo / p).read_bytes() for p in paths}, f"the files in {repo} as they are (--from files)", [])
    if shutil.which("git") is None:
        raise CourseError(f"git is not installed: `make release` builds from a commit; "
                          f"`make release FROM={WORKING_COPY}` builds from the files as they are")
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except CourseError:
        try:
            _git(repo, "rev-parse", "--git-dir")
        except CourseError:
            raise CourseError(f"{repo} is not a git checkout: `make release` builds from a commit; "
                              f"`make release FROM={WORKING_COPY}` builds from the files as they are") from None
        raise CourseError(f"no commit {rev!r} in {repo}: name a commit, branch or tag (FROM=...)") from None
    names = _git(repo, "ls-tree", "--name-only", commit, "--", f"{NOTEBOOKS}/").split()
    paths = [p for p in names if fnmatch.fnmatch(Path(p).name, notebooks)] + learner_files
    files = {}
    for path in paths:
        done = processes.run(["git", "-C", str(repo), "show", f"{commit}:./{path}"], timeout=120)
        if done.returncode != 0:
            raise CourseError(f"commit {commit[:12]} has no {path}")
        files[path] = done.stdout.encode()
    summary = _git(repo, "log", "-1", "--format=%h %ad %s", "--date=short", commit).strip()
    summary = summary if len(summary) <= 100 else summary[:97] + "..."  # a long subject: its start
    # what the working copy has that the release does not: edits, and notebooks never committed
    changed = _git(repo, "diff", "--name-only", "--relative", commit, "--", f"{NOTEBOOKS}/{notebooks}", *learner_files).split()
    changed += _git(repo, "ls-files", "--others", "--exclude-standard", "--", f"{NOTEBOOKS}/{notebooks}").split()
    notes = [f"note: the working copy differs from {commit[:12]} in {', '.join(sorted(set(changed)))}: "
             f"released as committed (commit the changes to release them)"] if changed else []
    label = f"commit {summary}" + ("" if rev == "HEAD" else f" ({rev})")
    return Release(files, label, notes)


def build_source(repo: Path | None = None, rev: str = "HEAD", part: str = registry.FIRST) -> Release:
    """source/<part>/: the part's committed notebooks, with the hidden tests added, and its files."""
    release = course_files(repo, rev, part)
    source = root() / "source" / part
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    with_hidden: list[str] = []
    for path, contents in release.files.items():
        target = source / Path(path).name if path.startswith(f"{NOTEBOOKS}/") else source / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix == ".ipynb":
            notebook = json.loads(contents)
            with_hidden += add_hidden_tests(notebook, path)
            contents = (json.dumps(notebook, indent=1, ensure_ascii=False) + "\n").encode()
        target.write_bytes(contents)
    unplaced = sorted({s for s in HIDDEN_TESTS if registry.item(s).part == part} - set(with_hidden), key=float)
    if unplaced:
        raise CourseError(f"HIDDEN_TESTS names step(s) {', '.join(unplaced)}, but no notebook has their grade cell")
    return release
