"""The source assignment of a part, built afresh from a commit (HEAD unless told otherwise): its
notebooks/, and the learner's files its items read, never from a working copy an instructor may
have tried the lab in; the graders' hidden tests (each item's `hidden` layouts in
autograde/grading/registry.py) written into its grade cells only. Also where the course's folders are.
"""
from __future__ import annotations

import fnmatch
import json
import re
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
HIDDEN_GRADE_IDS = {registry.item(step).grade_id for step in HIDDEN_TESTS}  # the grade cells they go into


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


def step_of(grade_id: str) -> str | None:
    """The item a grade cell grades (an id may hold "_" itself: step_lr_scaling is lr_scaling); None
    for an answer cell, which no item grades (a grade id that is neither raises KeyError)."""
    if is_answer(grade_id):
        return None
    return {item.grade_id: item.id for item in registry.ITEMS}[grade_id]


# An answer cell: the learner's free-text answer to a question no code can judge (a prediction made
# before a run, what a trace shows), graded by hand in nbgrader's formgrader. Every other grade
# cell is an item's check (autograded). This is the one place that says what an answer cell is.
ANSWER_PREFIX = "answer_"
ANSWER_TEXT = "YOUR ANSWER HERE"  # nbgrader's own placeholder for a markdown solution cell
ANSWER_ID = re.compile(r"answer_(?P<notebook>\d\d)_[a-z0-9]+(_[a-z0-9]+)*")  # answer_23_where_ranks_wait


def is_answer(grade_id: str) -> bool:
    """Whether a grade cell's id names an answer cell (graded by hand) rather than an item's."""
    return grade_id.startswith(ANSWER_PREFIX)


def answer_ids(notebook: dict) -> list[str]:
    """The grade ids of the answer cells of `notebook` (JSON), in order."""
    ids = [cell["metadata"].get("nbgrader", {}).get("grade_id", "") for cell in notebook["cells"]
           if cell["metadata"].get("nbgrader", {}).get("grade")]
    return [i for i in ids if is_answer(i)]


def answer_metadata(notebook: str, topic: str, points: int = 1) -> dict:
    """The nbgrader metadata of an answer cell in `notebook` ("23_debugging_hangs") about `topic`."""
    return {"nbgrader": {"grade": True, "grade_id": f"{ANSWER_PREFIX}{notebook[:2]}_{topic}", "locked": False,
                         "points": points, "schema_version": 3, "solution": True, "task": False}}


def answer_cell(notebook: str, topic: str, points: int = 1) -> dict:
    """A new answer cell, as the learner's notebook holds it before they write in it."""
    metadata = answer_metadata(notebook, topic, points)
    return {"cell_type": "markdown", "id": metadata["nbgrader"]["grade_id"], "metadata": metadata, "source": [ANSWER_TEXT]}


def answer_faults(cell: dict, notebook: str) -> list[str]:
    """What keeps `cell`, a grade cell of `notebook` whose id says answer_, from being an answer cell
    (none: it is one): markdown, the learner's to write (unlocked, a solution), graded for points,
    its id answer_<the notebook's number>_<topic>, the placeholder as its text in notebooks/."""
    meta = cell["metadata"].get("nbgrader", {})
    grade_id = str(meta.get("grade_id", ""))
    found = ANSWER_ID.fullmatch(grade_id)
    wanted = {"markdown cell": cell["cell_type"] == "markdown",
              f"id {ANSWER_PREFIX}{notebook[:2]}_<topic> (snake_case)": bool(found and found["notebook"] == notebook[:2]),
              "graded (grade: true)": meta.get("grade") is True,
              "the learner's to write (solution: true)": meta.get("solution") is True,
              "unlocked (locked: false)": not meta.get("locked"),
              "points > 0": isinstance(meta.get("points"), (int, float)) and meta["points"] > 0,
              f"text {ANSWER_TEXT!r}": "".join(cell["source"]).strip() == ANSWER_TEXT}
    return [f"{notebook}: answer cell {grade_id or '(no id)'} is not {what}" for what, ok in wanted.items() if not ok]


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
        if is_answer(meta["grade_id"]):  # graded by hand: no tests, hidden or not
            faults = answer_faults(cell, Path(name).stem)
            if faults:
                raise CourseError(faults[0])
            continue
        if meta["grade_id"] not in {i.grade_id for i in registry.ITEMS}:
            raise CourseError(f"{name}: grade cell {meta['grade_id']} grades no item of autograde/grading/registry.py "
                              f"and is no answer cell ({ANSWER_PREFIX}<NN>_<topic>)")
        if BEGIN_HIDDEN in source:
            raise CourseError(f"{name}: grade cell {meta['grade_id']} has hidden tests of its own: "
                              f"they belong in autograde/grading/registry.py (an item's `hidden`), not in {NOTEBOOKS}/")
        step = step_of(meta["grade_id"])
        if step in HIDDEN_TESTS:
            cell["source"] = f"{source}\n{hidden_test_block(step)}".splitlines(keepends=True)
            added.append(step)
    return added


def git(repo: Path, *args: str) -> list[str]:
    """A git command in the course's checkout, which an instructor may not own (a class's, root's):
    git reads another user's repository only when told it is safe."""
    return ["git", "-c", f"safe.directory={repo}", "-C", str(repo), *args]


def _git(repo: Path, *args: str) -> str:
    try:
        done = processes.run(git(repo, *args), timeout=120)
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


def committed(repo: Path, rev: str, paths: list[str]) -> dict[str, bytes]:
    """Each of `paths` as committed in `rev` of `repo`; CourseError naming the first that is not there."""
    files = {}
    for path in paths:
        done = processes.run(git(repo, "show", f"{rev}:./{path}"), timeout=120)
        if done.returncode != 0:
            raise CourseError(f"no {path} in {rev[:12]} of {repo}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        files[path] = done.stdout.encode()
    return files


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
    files = committed(repo, commit, paths)
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
            if answer_ids(notebook) and not fnmatch.fnmatch(target.stem, registry.PART[part].graded):
                raise CourseError(f"{path} has answer cells, but grading runs only {part}'s notebooks "
                                  f"{registry.PART[part].graded!r} (its Part's `graded` in autograde/parts/)")
            contents = (json.dumps(notebook, indent=1, ensure_ascii=False) + "\n").encode()
        target.write_bytes(contents)
    unplaced = sorted({s for s in HIDDEN_TESTS if registry.item(s).part == part} - set(with_hidden), key=float)
    if unplaced:
        raise CourseError(f"HIDDEN_TESTS names step(s) {', '.join(unplaced)}, but no notebook has their grade cell")
    return release
