"""The nbgrader course: `make release` builds the assignment, `make grade` grades it, and the
exchange targets hand it out and back on a shared machine (a JupyterHub).

One source of truth: the source assignment (source/ddp_lab/) is built afresh every time from a
commit (HEAD unless told otherwise): its notebooks/, the starter fashion_mnist.py and the
exercises it uses, never from a working copy an instructor may have tried the lab in. The
graders' hidden tests live here, in HIDDEN_TESTS, not in notebooks/ (which learners of the
repository run): the release writes them into the grade cells of source/ only, and nbgrader
writes the student version (release/ddp_lab/) without them. Grading autogrades the step notebooks
of every submission in submitted/<student>/ddp_lab/, writes feedback, exports grades.csv and
prints each learner's score and the steps lost.

The course root (gradebook, source/, release/, submitted/, autograded/, feedback/, grades.csv)
is grading/ in the repository, git-ignored (or $DDP_LAB_COURSE_DIR); nbgrader always runs in autograde/course/,
the only place it reads nbgrader_config.py from. Grading runs the notebooks in quick mode
(DDP_LAB_QUICK=1): the training runs of the ungraded cells are tiny, the checks are not.

    python -m autograde.course release [--from REV|files] [--part PART]
    python -m autograde.course grade [--part PART]
    python -m autograde.course release-exchange|collect|return-feedback [--exchange DIR] [--part PART] [-- NBGRADER_ARGS]

PART is a part of the course (autograde/registry.py's PARTS), each an assignment of its own:
ddp_lab (the default) or processes_talk.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from autograde import processes, registry
from autograde.paths import REPO

HERE = Path(__file__).resolve().parent  # nbgrader runs here: it reads nbgrader_config.py from here only
GRADING = REPO / "grading"  # the course's generated folders, git-ignored: see root()
COURSE_ID = "ddp-lab"  # as in nbgrader_config.py; the learners' nbgrader commands name it with --course
NOTEBOOKS = "notebooks"
# Each part of the course (autograde/registry.py's PARTS) is an nbgrader assignment of its own,
# named by the part's id: its notebooks, and the learner's files its items read.
WORKING_COPY = "files"  # `--from files`: build from the files as they are (outside a git checkout)
# nbgrader's own default exchange, the one a learner's nbgrader (and JupyterLab's Assignments tab)
# uses when nothing configures another: `make ... EXCHANGE=/path` or --exchange chooses one.
EXCHANGE_DEFAULT = "/usr/local/share/nbgrader/exchange"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


class CourseError(RuntimeError):
    """What stops a course command, in one line that says what to do."""


@dataclass(frozen=True)
class Layout:
    """A simulated layout the grader checks a step with, besides the default 2 nodes x 2."""
    procs_per_node: int
    nodes: int
    why: str


ONE_NODE_OF_3 = Layout(procs_per_node=3, nodes=1, why="3 processes on one node")
THREE_NODES_OF_1 = Layout(procs_per_node=1, nodes=3, why="3 nodes of one process: each is local rank 0")
# The hidden tests, in one place: step -> the extra layouts its grade cell checks when grading.
# Learners never see them; `make release` adds them to the source assignment's grade cells.
HIDDEN_TESTS: dict[str, list[Layout]] = {
    "4": [ONE_NODE_OF_3],
    "5": [THREE_NODES_OF_1],
    "6": [ONE_NODE_OF_3],
    "8": [ONE_NODE_OF_3],
    "9": [ONE_NODE_OF_3],
}


def hidden_layouts() -> dict[str, tuple[list[str], Layout]]:
    """The hidden tests by layout ("1x3": 1 node of 3 processes): the steps each layout checks."""
    layouts: dict[str, tuple[list[str], Layout]] = {}
    for step, extra in HIDDEN_TESTS.items():
        for layout in extra:
            layouts.setdefault(f"{layout.nodes}x{layout.procs_per_node}", ([], layout))[0].append(step)
    return layouts


def root() -> Path:
    return Path(os.environ.get("DDP_LAB_COURSE_DIR") or GRADING).resolve()


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
                              f"they belong in autograde/course/__init__.py's HIDDEN_TESTS, not in {NOTEBOOKS}/")
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


def course_files(repo: Path | None = None, rev: str = "HEAD", part: str = registry.LAB) -> Release:
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


def build_source(repo: Path | None = None, rev: str = "HEAD", part: str = registry.LAB) -> Release:
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


# --- running nbgrader ------------------------------------------------------------------------------

# Known-harmless lines of nbgrader's log, left out of what the course commands print (and counted).
HARMLESS = {
    "sqlalchemy": re.compile(r"^\S+\.py:\d+: \w*(SAWarning|SADeprecationWarning|MovedIn20Warning): "),
    "tcp": re.compile(r"Kernel is running over TCP without encryption"),
    "alt": re.compile(r"GenerateFeedbackApp \| WARNING\] Alternative text is missing on \d+ image"),
}
CHECKSUM = re.compile(r"Attribute 'checksum' for cell (\S+) has changed! \(should be: (\w+), got: (\w+)\)")
EXPLAINED = {
    "sqlalchemy": "SQLAlchemy warnings from inside nbgrader's gradebook",
    "tcp": "kernel notices that they talk over plain TCP (on this machine only)",
    "alt": "notes that a feedback page's figures (the notebooks' plots) have no alternative text",
    "hidden": "grade cells restored with their hidden tests (nbgrader calls it 'checksum changed': the student "
              "version of a cell with hidden tests differs from the source, jupyter/nbgrader#1961)",
}


def released_checksums() -> dict[str, str]:
    """grade_id -> the checksum of that grade cell in the student version (release/)."""
    sums = {}
    for notebook in (root() / "release").glob("*/*.ipynb"):  # every part's: grade ids are unique
        for cell in json.loads(notebook.read_text())["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("grade") and "checksum" in meta:
                sums[meta["grade_id"]] = meta["checksum"]
    return sums


class LogFilter:
    """Passes nbgrader's output through, without the lines known to be harmless, which it counts.

    A "checksum changed" warning is harmless exactly when the submitted cell is the student
    version's (its hidden tests were taken out on release and are put back now); a learner's
    edit to a locked cell gives another checksum, and that warning is shown.
    """

    def __init__(self) -> None:
        self.counts = {name: 0 for name in EXPLAINED}
        self.released = released_checksums()
        self._skip_source_line = False

    def keep(self, line: str) -> bool:
        if self._skip_source_line:
            self._skip_source_line = False
            if line.startswith(" "):  # the source line that Python's warnings print under a warning
                return False
        for name, pattern in HARMLESS.items():
            if pattern.search(line):
                self.counts[name] += 1
                self._skip_source_line = name == "sqlalchemy"
                return False
        match = CHECKSUM.search(line)
        if match and self.released.get(match[1]) == match[3] and step_of(match[1]) in HIDDEN_TESTS:
            self.counts["hidden"] += 1
            return False
        return True

    def summary(self) -> str:
        parts = [f"{n} {EXPLAINED[name]}" for name, n in self.counts.items() if n]
        return f"(left out of the log above as harmless: {'; '.join(parts)})" if parts else ""


def nbgrader(*args: str, log_level: str = "WARN") -> str:
    """Run an nbgrader command in autograde/course/ (where its config is), print its output without the
    known-harmless lines, and return the output; raise CourseError when it fails.

    Its notebooks run in quick mode unless DDP_LAB_QUICK says otherwise. No time limit: grading a
    class takes as long as it takes.
    """
    env = {"DDP_LAB_COURSE_DIR": str(root()), "DDP_LAB_QUICK": os.environ.get("DDP_LAB_QUICK", "1")}
    cmd = [processes.PYTHON, "-m", "nbgrader", *args, f"--log-level={log_level}"]
    log = LogFilter()
    seen: list[str] = []
    proc = processes.start(cmd, cwd=HERE, env=env, merge_stderr=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if log.keep(line):
                print(line, end="", flush=True)
        proc.wait()
    finally:
        processes.kill_group(proc.pid)  # nothing nbgrader started (kernels, training runs) outlives it
        proc.wait()
    if log.summary():
        print(log.summary())
    if proc.returncode != 0:
        last = next((line.strip() for line in reversed(seen) if line.strip() and log.keep(line)), "(no output)")
        raise CourseError(f"nbgrader {args[0]} failed (exit status {proc.returncode}): {last}")
    return "".join(seen)


# --- the commands ----------------------------------------------------------------------------------

def release(rev: str = "HEAD", part: str = registry.LAB) -> Path:
    """Build the part's source assignment from `rev` and generate the student version; return its folder."""
    built = build_source(rev=rev, part=part)
    notebooks = sum(p.startswith(f"{NOTEBOOKS}/") for p in built.files)
    print(f"releasing {part} from {built.origin}: {notebooks} notebooks, {', '.join(registry.PART[part].files)}")
    for note in built.notes:
        print(note)
    nbgrader("generate_assignment", part, "--force")
    released = root() / "release" / part
    print(f"student version: {released} (hand it out, or `make release-exchange` on a shared machine)")
    return released


def grades(path: Path, part: str = registry.LAB) -> dict[str, float]:
    """Each student's total score for the part in the exported CSV."""
    with path.open(newline="") as handle:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)
                if row["assignment"] == part}


@dataclass
class Outcome:
    student: str
    score: float
    max_score: float
    lost: list[str]  # the steps with fewer points than they are worth, in step order


def outcomes(part: str = registry.LAB) -> list[Outcome]:
    """Each graded student's score for the part and the items lost, from the gradebook."""
    from nbgrader.api import Gradebook  # only where grading happens

    database = root() / "gradebook.db"
    if not database.is_file():  # nbgrader would make an empty one
        raise CourseError(f"no gradebook at {database}: run `make grade` first")
    found = []
    with Gradebook(f"sqlite:///{database}") as gradebook:
        for submission in gradebook.assignment_submissions(part):
            cells = [g for nb in submission.notebooks for g in nb.grades]
            lost = sorted((step_of(g.name) for g in cells if (g.score or 0) < g.max_score), key=registry.STEPS.index)
            found.append(Outcome(submission.student_id, submission.score, submission.max_score, lost))
    return sorted(found, key=lambda o: o.student)


def summary(results: Sequence[Outcome]) -> str:
    """A line per student: the score and the steps that lost points (feedback/ says why)."""
    width = max([len("student"), *(len(o.student) for o in results)])
    lines = [f"{'student':<{width}}  {'score':>7}  steps lost"]
    for o in results:
        lines.append(f"{o.student:<{width}}  {f'{o.score:g}/{o.max_score:g}':>7}  {' '.join(o.lost) or 'none'}")
    return "\n".join(lines)


def grade(part: str = registry.LAB) -> Path:
    """Autograde every submission of the part, write feedback, export grades.csv, print the scores;
    return the CSV."""
    submitted = root() / "submitted"
    students = sorted(p.parent.name for p in submitted.glob(f"*/{part}"))
    if not students:
        raise CourseError(f"no submissions: put each in {submitted}/<student>/{part}/ "
                          f"(`make collect` does from the exchange)")
    if not (root() / "source" / part).is_dir():
        raise CourseError("no source assignment: run `make release` first")
    # Only the step notebooks hold grade cells; running the others (training runs, plots) adds
    # minutes per learner and no points.
    print(f"autograding {len(students)} submission(s): {', '.join(students)} (minutes each: every check runs the script)")
    nbgrader("autograde", part, f"--notebook={registry.PART[part].graded}", "--force")
    nbgrader("generate_feedback", part, "--force")
    export = root() / "grades.csv"
    nbgrader("export", f"--to={export}")
    print(summary(outcomes(part)))
    print(f"grades: {export}; feedback: {root() / 'feedback'}/<student>/{part}/ "
          f"(`make return-feedback` hands it back through the exchange)")
    return export


def exchange_root(path: str) -> str:
    folder = Path(path)
    if not folder.is_dir():
        raise CourseError(f"no exchange folder {folder}: create it, writable by everyone "
                          f"(sudo mkdir -p {folder} && sudo chmod 777 {folder}), or choose another: EXCHANGE=/path")
    return str(folder.resolve())


def exchange(command: str, exchange_dir: str, extra: Sequence[str] = (), part: str = registry.LAB) -> None:
    """release_assignment, collect or release_feedback through nbgrader's exchange at `exchange_dir`."""
    where = exchange_root(exchange_dir)
    if command == "release_assignment" and not (root() / "release" / part).is_dir():
        raise CourseError("no student version to hand out: run `make release` first")
    if command == "release_feedback" and not any((root() / "feedback").glob(f"*/{part}/*.html")):
        raise CourseError("no feedback to hand back: run `make grade` first")
    nbgrader(command, part, f"--Exchange.root={where}", *extra, log_level="INFO")
    if command == "collect":
        print(f"submissions: {root() / 'submitted'}/<student>/{part}/ (next: `make grade`)")


EXCHANGE_COMMANDS = {"release-exchange": "release_assignment", "collect": "collect", "return-feedback": "release_feedback"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.course", description="The DDP Lab's nbgrader course.")
    commands = parser.add_subparsers(dest="command", required=True)
    make_release = commands.add_parser("release", help="build source/ from a commit and the student version release/")
    make_release.add_argument("--from", dest="rev", default="HEAD", metavar="REV",
                              help=f"the commit to release (default HEAD); '{WORKING_COPY}': the files as they are")
    make_grade = commands.add_parser("grade", help="autograde submitted/, write feedback/, export grades.csv")
    subcommands = [make_release, make_grade]
    for name, nbgrader_command in EXCHANGE_COMMANDS.items():
        sub = commands.add_parser(name, help=f"nbgrader {nbgrader_command} through the exchange")
        subcommands.append(sub)
        sub.add_argument("--exchange", default=os.environ.get("DDP_LAB_EXCHANGE") or EXCHANGE_DEFAULT,
                         help=f"the exchange folder, nbgrader's Exchange.root (default {EXCHANGE_DEFAULT})")
        sub.add_argument("nbgrader_args", nargs="*", help="more options for nbgrader, after --, e.g. -- --force")
    for sub in subcommands:
        sub.add_argument("--part", default=registry.LAB, choices=list(registry.PART),
                         help=f"the part of the course, an assignment of its own (default {registry.LAB})")
    args = parser.parse_args(argv)
    try:
        if args.command == "release":
            release(args.rev, args.part)
        elif args.command == "grade":
            grade(args.part)
        else:
            exchange(EXCHANGE_COMMANDS[args.command], args.exchange, args.nbgrader_args, args.part)
    except CourseError as err:
        parser.exit(1, f"error: {err}\n")
    return 0

