"""`python -m autograde.course.hub.start [COMMAND...]`: runs as the class member, before their server.

On every start it makes the home folder private (mode 700: nobody else in the class can read it).
On the first login it copies the course (the notebooks, exercises, demos, the starter script and
the lab's step checkpoints, but no solution of a graded exercise: autograde/course/withheld.py)
into ~/ddp-lab-course, which is theirs to edit; later logins leave their copy alone. An
instructor also gets, each where missing: instructor mode in their own Jupyter config (formgrader,
create assignment, course list), the course's nbgrader folder ~/grading with every part's source
assignment built from the installed course (with its hidden tests, ready for the formgrader's
Generate and Release) and each part's solutions as an assignment of its own (<part>_solutions,
released when the instructor chooses), and ~/nbgrader_config.py, which the formgrader reads and
which loads the course's own nbgrader settings. Then it runs COMMAND (the single-user server) in its place.

The spawner sets DDP_LAB_ROLE (learner or instructor), DDP_LAB_CLASS_COURSE (the settings' `course`)
and, for an instructor, DDP_LAB_COURSE_DIR.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from autograde import settings
from autograde.course import withheld
from autograde.grading import registry

COPY = "ddp-lab-course"  # the learner's own copy of the course, in their home
COURSE_FILES = ("README.md", "fashion_mnist.py", "notebooks", "exercises", "demos")  # and the step checkpoints


def copy_course(course: Path, home: Path) -> Path | None:
    """Copy the course into home/ddp-lab-course unless it is there already; the copy, or None if kept."""
    dest = home / COPY
    if dest.exists():
        return None
    partial = home / f".{COPY}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for name in COURSE_FILES:
        source = course / name
        if source.is_dir():
            shutil.copytree(source, partial / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        elif source.is_file():
            partial.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, partial / name)
    for checkpoint in withheld.step_checkpoints():  # by name: learners may not list the checkout's solutions/
        if (course / checkpoint).is_file():
            (partial / checkpoint).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(course / checkpoint, partial / checkpoint)
    partial.rename(dest)  # all or nothing: a login cut short copies again next time
    return dest


def set_up_instructor(course: Path, home: Path) -> list[str]:
    """Instructor mode, ~/grading's sources and ~/nbgrader_config.py, each only where missing; what was done."""
    done = []
    user_config = Path(os.environ.get("JUPYTER_CONFIG_DIR") or home / ".jupyter")
    if not (user_config / "labconfig" / "page_config.json").is_file():
        subprocess.run([sys.executable, str(course / "jupyter-config" / "lab_mode.py"), "instructor", "--level",
                        "user"], check=True, stdout=subprocess.DEVNULL)
        done.append("instructor mode")
    config = home / "nbgrader_config.py"
    if not config.is_file():
        config.write_text(
            "# The formgrader reads this file from the folder your server starts in (your home folder).\n"
            "# The course's nbgrader settings: the gradebook and folders under $DDP_LAB_COURSE_DIR (~/grading),\n"
            "# the time a check cell may take, and the learner's files that grading must not overwrite.\n"
            "c = get_config()  # noqa: F821\n"
            f"load_subconfig({str(course / 'autograde' / 'course' / 'nbgrader_config.py')!r})  # noqa: F821\n")
        done.append(str(config))
    grading = Path(os.environ.get(settings.COURSE_DIR) or home / "grading")
    from autograde.course.assignment import WORKING_COPY, build_source

    os.environ[settings.COURSE_DIR] = str(grading)
    built = []
    for part in registry.PARTS:
        if not (grading / "source" / part.id).is_dir():
            build_source(repo=course, rev=WORKING_COPY, part=part.id)
            built.append(part.id)
        solutions = withheld.solutions_assignment(part.id)
        if withheld.solutions_of(part.id) and not (grading / "source" / solutions).is_dir():
            withheld.build_solutions_source(repo=course, rev=WORKING_COPY, part=part.id)
            built.append(solutions)
    if built:
        done.append(f"{grading}/source: {', '.join(built)}")
    return done


def main(argv: list[str] | None = None) -> None:
    command = list(sys.argv[1:] if argv is None else argv)
    home = Path.home()
    course = Path(os.environ.get(settings.CLASS_COURSE) or settings.REPO)
    home.chmod(0o700)
    copied = copy_course(course, home)
    if copied:
        print(f"first login: the course copied into {copied}", flush=True)
    if os.environ.get(settings.ROLE) == "instructor":
        for what in set_up_instructor(course, home):
            print(f"instructor set up: {what}", flush=True)
    if command:
        os.execvp(command[0], command)


if __name__ == "__main__":
    main()
