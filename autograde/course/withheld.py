"""What a class's learners may not read, said once (docs/instructors.md, "What a learner can and cannot read").

- **The graded exercises' solutions.** An item's checkpoint that is the finished version of the
  learner's own exercise file (exercises/ring_allreduce.py -> solutions/ring_allreduce.py), part by
  part, from autograde/grading/registry.py. The lab's step checkpoints
  (solutions/fashion_mnist_after_step_N.py) are not withheld: by the course's design a learner who
  falls behind catches up from them. A learner's first-login copy (hub/start.py) holds the step
  checkpoints and no solution; the instructor hands a part's solutions out once the part is over,
  as an nbgrader assignment of its own, `<part>_solutions` (`release-solutions`, or the
  formgrader's Generate and Release on it).
- **The course checkout's paths that hold a graded answer** (CHECKOUT). `withhold`, as root, makes
  them readable by the class's instructors (a group of theirs) and nobody else; the hub does it at
  every start. The checks and notebooks never read them: they import autograde/ and read the data.
"""
from __future__ import annotations

import grp
import json
import os
import shutil
import stat
from pathlib import Path

from autograde.course.assignment import WORKING_COPY, CourseError, Release, committed, root
from autograde.engine import processes
from autograde.grading import registry
from autograde.grading.items import Item
from autograde.settings import REPO

GROUP = "ddp-lab-instructors"  # the group that may read what learners may not (class.toml: instructors_group)
SOLUTIONS = "solutions"
# The checkout's paths that hold a graded answer, and which: readable by the instructors' group only.
CHECKOUT = {
    SOLUTIONS: "the finished exercises (its step checkpoints stay readable, by name)",
    "tests": "correct programs in other styles (tests/styles/, tests/exercise_styles.py), recordings of the solutions' runs",
    ".git": "the history, where every solution is",
    "grading": "a course folder made in the checkout (`make release`): sources with hidden tests, a gradebook",
}


def is_exercise_solution(item: Item) -> bool:
    """Whether the item's checkpoint is the finished version of the learner's own file (solutions/kfac.py
    for exercises/kfac.py), not a step checkpoint of the lab (fashion_mnist_after_step_4.py)."""
    return bool(item.checkpoint) and item.checkpoint != item.file and Path(str(item.checkpoint)).name == Path(item.file).name


def solutions_of(part: str | None = None) -> list[str]:
    """The graded exercises' solutions of `part` (of every part: None), withheld from learners until released."""
    return list(dict.fromkeys(str(i.checkpoint) for i in registry.ITEMS
                              if (part is None or i.part == part) and is_exercise_solution(i)))


def step_checkpoints() -> list[str]:
    """The lab's step checkpoints: in every learner's copy, and readable in the checkout."""
    return list(dict.fromkeys(str(i.checkpoint) for i in registry.ITEMS if i.checkpoint and not is_exercise_solution(i)))


def solutions_assignment(part: str) -> str:
    """The nbgrader assignment that hands out the part's solutions."""
    return f"{part}_solutions"


def parts_with_solutions() -> list[str]:
    return [p.id for p in registry.PARTS if solutions_of(p.id)]


def _files_at(repo: Path, rev: str, paths: list[str]) -> Release:
    """The files as committed in `rev` (or, with rev "files", as they are)."""
    if rev == WORKING_COPY:
        missing = [p for p in paths if not (repo / p).is_file()]
        if missing:
            raise CourseError(f"{repo} has no {', '.join(missing)}")
        return Release({p: (repo / p).read_bytes() for p in paths}, f"the files in {repo} as they are", [])
    return Release(committed(repo, rev, paths), f"{rev} of {repo}", [])


def about(part: str, names: list[str]) -> dict:
    """The notebook that comes with a part's solutions (nbgrader hands out no assignment without one)."""
    title = registry.PART[part].title
    text = (f"# The solutions of {title}\n\nYour instructor has released the finished exercises of this part:\n\n"
            + "".join(f"- `{name}`: `exercises/{name}` with its TODOs done\n" for name in names)
            + "\nCompare them with your own, e.g. in a terminal: "
              f"`diff ~/ddp-lab-course/exercises/{names[0]} {names[0]}`. Your grade is whatever your own files earned.")
    return {"cells": [{"cell_type": "markdown", "id": "about", "metadata": {}, "source": text.splitlines(keepends=True)}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def build_solutions_source(repo: Path | None = None, rev: str = "HEAD", part: str = registry.FIRST) -> Release:
    """source/<part>_solutions/: the part's solutions (flat: ring_allreduce.py) and a notebook that
    says what they are."""
    paths = solutions_of(part)
    if not paths:
        raise CourseError(f"{part} has no solutions to release: its step checkpoints "
                          f"({SOLUTIONS}/fashion_mnist_after_step_N.py) are in every learner's copy already "
                          f"(parts with solutions: {', '.join(parts_with_solutions())})")
    release = _files_at(repo or REPO, rev, paths)
    source = root() / "source" / solutions_assignment(part)
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    names = [Path(p).name for p in paths]
    for path, contents in release.files.items():
        (source / Path(path).name).write_bytes(contents)
    (source / "solutions.ipynb").write_text(json.dumps(about(part, names), indent=1) + "\n")
    return release


def release_solutions(part: str, exchange_dir: str, rev: str = "HEAD", extra: tuple[str, ...] = ()) -> None:
    """Build the part's solutions assignment, generate its student version and hand it to every
    learner through the exchange."""
    from autograde.course.grading import exchange, exchange_root
    from autograde.course.nbgrader_run import nbgrader

    exchange_root(exchange_dir)  # an exchange to hand it out through, before anything is built
    built = build_solutions_source(rev=rev, part=part)
    name = solutions_assignment(part)
    print(f"releasing the solutions of {part} from {built.origin}: {', '.join(Path(p).name for p in built.files)}")
    nbgrader("generate_assignment", name, "--force")
    exchange("release_assignment", exchange_dir, extra, name)
    print(f"learners fetch {name}: their Assignments tab, or `nbgrader fetch_assignment {name} --course=ddp-lab`")


# --- The checkout: its withheld paths readable by the instructors' group only --------------------
def git_dirs(course: Path) -> list[Path]:
    """Where the checkout's history is: .git, and where a .git file (a worktree's) points."""
    dot_git = course / ".git"
    if not dot_git.is_file():
        return []
    text = dot_git.read_text().strip()
    if not text.startswith("gitdir:"):
        return []
    gitdir = (course / text.removeprefix("gitdir:").strip()).resolve()
    common = gitdir / "commondir"
    return [gitdir, *([(gitdir / common.read_text().strip()).resolve()] if common.is_file() else [])]


def withheld_mode(mode: int) -> int:
    """A withheld file's or folder's mode: the owner's as it was, the group reads (and enters, runs)
    what the owner can, others nothing."""
    return (mode & 0o700) | ((mode & 0o500) >> 3)


def _group(name: str, members: list[str]) -> int:
    """The group's id, made if missing, its members exactly `members`."""
    try:
        found = grp.getgrnam(name)
    except KeyError:
        _root_command(["groupadd", "--system", name])
        found = grp.getgrnam(name)
    if set(found.gr_mem) != set(members):
        _root_command(["gpasswd", "--members", ",".join(members), name])
    return found.gr_gid


def _root_command(cmd: list[str]) -> None:
    done = processes.run(cmd, timeout=60)
    if done.returncode != 0:
        raise CourseError(f"{' '.join(cmd)} failed: {(done.output.strip().splitlines() or ['?'])[-1]}")


def _set(path: Path, gid: int, opened: int = 0) -> None:
    """Owned by the group, with the withheld mode (plus the `opened` bits for others)."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):  # a link's own mode means nothing; what it points to is not withheld here
        return
    if info.st_gid != gid:
        os.lchown(path, -1, gid)
    mode = withheld_mode(info.st_mode) | opened
    if stat.S_IMODE(info.st_mode) != mode:
        path.chmod(mode)


def withhold(course: Path, group: str, instructors: list[str]) -> str:
    """As root: the checkout's CHECKOUT paths (and its history where a .git file points) readable by
    `group`, whose members become exactly `instructors`, and by the owner; by nobody else, except the
    step checkpoints in solutions/, which others may read by name (the first login copies them).
    Idempotent; the one line that says what was done."""
    if os.geteuid() != 0:
        raise CourseError("withholding the course's solutions needs root (it makes a group and changes owners): "
                          "run it as root, or let the hub, which runs as root, do it when it starts")
    if not instructors:
        raise CourseError("name at least one instructor: they keep reading what learners may not")
    gid = _group(group, instructors)
    tops = [course / name for name in CHECKOUT] + git_dirs(course)
    try:
        (course / "grading").mkdir(mode=0o750, exist_ok=True)  # withheld before `make release` writes in it
        tops = [top for top in tops if top.exists()]
        for top in tops:
            _set(top, gid)
            if top.is_dir() and not top.is_symlink():
                for folder, dirs, files in os.walk(top):
                    for name in [*dirs, *files]:
                        _set(Path(folder) / name, gid)
        _set(course / SOLUTIONS, gid, opened=0o001)  # others enter, not list: the step checkpoints by name
        for checkpoint in step_checkpoints():
            if (course / checkpoint).is_file():
                _set(course / checkpoint, gid, opened=0o004)
    except OSError as err:  # a read-only or root-squashed file system
        raise CourseError(f"cannot withhold {err.filename or course} from learners: {err.strerror}") from None
    named = ", ".join(f"{p.relative_to(course)}/" if p.is_relative_to(course) else str(p) for p in tops)
    return (f"withheld from learners in {course}: {named} (solutions/'s {len(step_checkpoints())} step checkpoints "
            f"stay readable); group {group} ({', '.join(instructors)}) and the owner read them")
