"""The nbgrader course: `make release` builds the assignment, `make grade` grades it.

One source of truth: the source assignment (source/ddp_lab/) is built afresh from notebooks/,
the starter fashion_mnist.py and exercises/ every time, never kept by hand; nbgrader then
writes the student version (release/ddp_lab/) without hidden tests. Grading autogrades the step
notebooks of every submission in submitted/<student>/ddp_lab/, writes feedback and exports
grades.csv.

The course root is autograde/ (or $DDP_LAB_COURSE_DIR); nbgrader always runs in autograde/,
the only place it reads nbgrader_config.py from. Grading runs the notebooks in quick mode
(DDP_LAB_QUICK=1): the training runs of the ungraded cells are tiny, the checks are not.

    python -m autograde.course release
    python -m autograde.course grade
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
from pathlib import Path

from autograde import launch
from autograde.lab import LaunchError, run

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent
ASSIGNMENT = "ddp_lab"
COURSE_FILES = ["fashion_mnist.py", "exercises/big_batch_equivalence.py"]
GRADED = "*step*"  # the notebooks with grade cells: 03_steps_0_to_2 ... 08_step_10_launch


def root() -> Path:
    return Path(os.environ.get("DDP_LAB_COURSE_DIR") or PACKAGE).resolve()


def nbgrader(*args: str) -> str:
    """Run an nbgrader command in autograde/ (where its config is); raise LaunchError when it fails.

    Its notebooks run in quick mode unless DDP_LAB_QUICK says otherwise.
    """
    env = {"DDP_LAB_COURSE_DIR": str(root()), "DDP_LAB_QUICK": os.environ.get("DDP_LAB_QUICK", "1")}
    return run([launch.PYTHON, "-m", "nbgrader", *args, "--log-level=WARN"], cwd=PACKAGE, env=env)


def build_source(repo: Path = REPO) -> Path:
    """source/ddp_lab/: every notebook of notebooks/ plus the course files the notebooks use."""
    source = root() / "source" / ASSIGNMENT
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    for notebook in sorted((repo / "notebooks").glob("*.ipynb")):
        shutil.copy(notebook, source / notebook.name)
    for name in COURSE_FILES:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / name, source / name)
    return source


def release() -> Path:
    """Build the source assignment and generate the student version; return its folder."""
    build_source()
    nbgrader("generate_assignment", ASSIGNMENT, "--force")
    released = root() / "release" / ASSIGNMENT
    print(f"student version: {released} (hand it out, or `nbgrader release_assignment {ASSIGNMENT}` on a hub)")
    return released


def grades(path: Path) -> dict[str, float]:
    """Each student's total score in the exported CSV."""
    with path.open(newline="") as handle:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)
                if row["assignment"] == ASSIGNMENT}


def grade() -> Path:
    """Autograde every submission, write feedback and export grades.csv; return the CSV's path."""
    submitted = root() / "submitted"
    students = sorted(p.parent.name for p in submitted.glob(f"*/{ASSIGNMENT}"))
    if not students:
        raise LaunchError(f"no submissions: put each in {submitted}/<student>/{ASSIGNMENT}/ "
                          f"(`nbgrader collect {ASSIGNMENT}` does on a hub)")
    if not (root() / "source" / ASSIGNMENT).is_dir():
        raise LaunchError("no source assignment: run `make release` first")
    # Only the step notebooks hold grade cells; running the others (training runs, plots) adds
    # minutes per learner and no points.
    nbgrader("autograde", ASSIGNMENT, f"--notebook={GRADED}", "--force")
    nbgrader("generate_feedback", ASSIGNMENT, "--force")
    export = root() / "grades.csv"
    nbgrader("export", f"--to={export}")
    for student, score in sorted(grades(export).items()):
        print(f"{student:<20} {score:5.1f}")
    print(f"grades: {export}; feedback: {root() / 'feedback'}/<student>/{ASSIGNMENT}/")
    return export


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.course", description="The DDP Lab's nbgrader course.")
    parser.add_argument("command", choices=["release", "grade"])
    args = parser.parse_args(argv)
    try:
        release() if args.command == "release" else grade()
    except LaunchError as err:
        parser.exit(1, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
