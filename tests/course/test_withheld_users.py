"""Solutions withheld, for real: Unix users (a learner and an instructor, `ddpw-`), a copy of the course
with its history, and what the hub does when it starts (`withheld.withhold`) done to it, as root.
The learner cannot read the checkout's solutions/, tests/, history or grading/, gets the step
checkpoints and no solution in the first login's copy, catches up from a checkpoint and runs checks
(one that reads the source, also as its notebook's check cell, one that launches processes); the instructor reads everything and
releases a part's solutions through nbgrader's exchange, which the learner could not fetch before
and fetches after, and whose solution then passes its check, run as the learner. Then on a running
hub (`make hub`), in a browser: the hub withholds when it starts, and the instructor releases a
part's solutions with the formgrader's Generate and Release; the learner fetches them in the
Assignments tab.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser import chromium  # noqa: F401 (the fixture)
from classhub import ClassHub, formgrader_action, formgrader_row, members, need_a_hub
from conftest import ROOT

from autograde import settings
from autograde.course import assignment, withheld
from autograde.course.hub import start
from autograde.engine import processes

pytestmark = [pytest.mark.launch,
              pytest.mark.skipif(os.geteuid() != 0, reason="makes Unix users and a group: run as root")]

TEACHER, ADA = "ddpw-teacher", "ddpw-ada"
GROUP = "ddpw-instructors"  # this test's own instructors' group (the class's setting instructors_group)
PART = "processes_talk"
CLOSED = ["solutions", "solutions/ring_allreduce.py", "solutions/compute_pi.py", "tests", "tests/exercise_styles.py",
          "tests/styles", "tests/recorded", ".git", ".git/HEAD", ".git/objects", "grading"]
OPEN = ["solutions/fashion_mnist_after_step_3.py", "solutions/fashion_mnist_after_step_10.py", "autograde",
        "autograde/grading/registry.py", "notebooks", "notebooks/13_ring_allreduce.ipynb", "exercises/compute_pi.py",
        "fashion_mnist.py", "README.md"]
# Run as a class member: which of `paths` (relative to the course) they may read (a folder: list).
PROBE = """import json, os, sys
course, found = sys.argv[1], {}
for path in sys.argv[2:]:
    full = os.path.join(course, path)
    try:
        os.listdir(full) if os.path.isdir(full) else open(full, "rb").read(1)
        found[path] = "read"
    except OSError as err:
        found[path] = type(err).__name__
print(json.dumps(found))
"""


# Run as a learner: the notebook's cell that imports autograde and Step 0's check cell, in a kernel of
# their own started by nbclient; the check cell's output.
CHECK_CELL = """import sys, nbformat
from nbclient import NotebookClient
notebook = nbformat.read(sys.argv[1], as_version=4)
notebook.cells = [c for c in notebook.cells if c.cell_type == "code"
                  and ("import autograde" in c.source or "assert_step(0)" in c.source)]
NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
print("".join(o.get("text", "") for o in notebook.cells[-1].outputs))
"""


@dataclass
class Class:
    hub: ClassHub
    course: Path
    said: str  # withhold's line

    def home(self, user: str) -> Path:
        return Path(pwd.getpwnam(user).pw_dir)

    def run(self, user: str, *command: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        """`command` as `user` (runuser: their own groups), with the environment a class member's server
        gives (spawners.class_env) and nothing of this test's."""
        home = self.home(user)
        base = {"HOME": str(home), "USER": user, "PATH": f"{Path(processes.PYTHON).parent}:/usr/bin:/bin",
                "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(self.course),
                settings.CLASS_COURSE: str(self.course), settings.DATA_DIR: str(self.hub.data),
                settings.EXCHANGE: str(self.hub.exchange),
                settings.CACHE_DIR: str(home / ".ddp-lab-verdicts")}  # in the home: no verdict of an earlier run's user
        assignments = [f"{k}={v}" for k, v in {**base, **env}.items()]
        return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *assignments, *command],
                              cwd=cwd or home, capture_output=True, text=True, timeout=300)

    def python(self, user: str, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(user, processes.PYTHON, *args, cwd=cwd, **env)

    def reads(self, user: str, paths: list[str]) -> dict[str, str]:
        done = self.python(user, "-c", PROBE, str(self.course), *paths)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))


def copy_of_the_course(folder: Path) -> Path:
    """The course's files as they are here (tracked, and new ones not ignored), with a history of its own
    that holds its solutions: what a class's checkout is."""
    course = folder / "course"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (course / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, course / name)
    git = ["git", "-C", str(course), "-c", "user.name=course", "-c", "user.email=course@example.org"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the course"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    for path in [course, *course.rglob("*")]:  # as a clone by root with umask 022 would be
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return course


@pytest.fixture(scope="module")
def a_class(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Class]:
    hub = ClassHub(tmp_path_factory.mktemp("withheld"), [TEACHER], [ADA])  # its users, data and exchange; no hub
    try:
        course = copy_of_the_course(hub.folder)
        hub.add_users()
        hub.open_course()
        hub.extra += [f'course = "{course}"', f'instructors_group = "{GROUP}"']
        # what an instructor runs without a hub, as root; the hub runs the same (jupyterhub_config.py)
        done = processes.run([processes.PYTHON, "-m", "autograde.course", "withhold", "--class",
                              str(hub.write_settings("local"))], timeout=120)
        assert done.returncode == 0 and not done.timed_out, done.output
        yield Class(hub, course, done.stdout.strip())
    finally:
        hub.remove()
        subprocess.run(["groupdel", GROUP], capture_output=True)
    assert not hub.leftovers()


def modes(course: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_mode, p.lstat().st_gid) for top in ("solutions", "tests", ".git", "grading")
            for p in [course / top, *(course / top).rglob("*")]}


def test_the_hub_withholds_in_one_line_and_again_changes_nothing(a_class: Class) -> None:
    assert a_class.said.startswith(f"withheld from learners in {a_class.course}: solutions/, tests/, .git/, grading/")
    assert f"group {GROUP} ({TEACHER})" in a_class.said and "\n" not in a_class.said
    before = modes(a_class.course)
    assert withheld.withhold(a_class.course, GROUP, [TEACHER]) == a_class.said
    assert modes(a_class.course) == before


def test_a_learner_cannot_read_the_solutions_tests_history_or_grading(a_class: Class) -> None:
    found = a_class.reads(ADA, CLOSED + OPEN)
    assert {p: found[p] for p in CLOSED} == {p: "PermissionError" for p in CLOSED}
    assert {p: found[p] for p in OPEN} == {p: "read" for p in OPEN}
    history = a_class.run(ADA, "git", "-C", str(a_class.course), "log", "--oneline")
    assert history.returncode != 0 and "the course" not in history.stdout


def test_the_instructor_reads_everything(a_class: Class) -> None:
    found = a_class.reads(TEACHER, CLOSED + OPEN)
    assert found == {p: "read" for p in CLOSED + OPEN}


def test_the_instructor_releases_a_part_from_the_withheld_history(a_class: Class) -> None:
    """`release` builds the part from the checkout's HEAD (git, in the .git only instructors read, of a
    checkout root owns), as the instructor, in a terminal of theirs."""
    grading = a_class.home(TEACHER) / "grading"
    done = a_class.python(TEACHER, "-m", "autograde.course", "release", "--part", PART,
                          **{settings.COURSE_DIR: str(grading)})
    assert done.returncode == 0 and f"releasing {PART} from commit" in done.stdout, done.stdout + done.stderr
    assert (grading / "release" / PART / "exercises" / "ring_allreduce.py").is_file()


def test_the_learners_first_login_copy_holds_the_step_checkpoints_and_no_solution(a_class: Class) -> None:
    done = a_class.python(ADA, "-m", "autograde.course.hub.start", **{settings.ROLE: "learner"})
    assert done.returncode == 0 and "first login: the course copied into" in done.stdout, done.stderr
    copy = a_class.home(ADA) / start.COPY
    assert sorted(f"solutions/{p.name}" for p in (copy / "solutions").iterdir()) == sorted(withheld.step_checkpoints())
    secrets = {(a_class.course / s).read_bytes() for s in withheld.solutions_of()}
    assert not [p for p in copy.rglob("*") if p.is_file() and p.read_bytes() in secrets]


def test_the_learner_catches_up_from_a_checkpoint_and_runs_checks(a_class: Class) -> None:
    copy = a_class.home(ADA) / start.COPY
    if not copy.is_dir():
        a_class.python(ADA, "-m", "autograde.course.hub.start")
    caught_up = a_class.run(ADA, "cp", "solutions/fashion_mnist_after_step_0.py", "fashion_mnist.py", cwd=copy)
    assert caught_up.returncode == 0, caught_up.stderr
    step_0 = a_class.python(ADA, "-m", "autograde", "check", "--step", "0", cwd=copy)
    assert step_0.returncode == 0 and "Step 0" in step_0.stdout and "pass" in step_0.stdout, step_0.stdout + step_0.stderr
    # Step 0's check cell of the learner's notebook, in a kernel of theirs (nbclient), where it runs
    cells = a_class.python(ADA, "-c", CHECK_CELL, str(copy / "notebooks" / "03_steps_0_to_2.ipynb"), cwd=copy / "notebooks")
    assert cells.returncode == 0 and cells.stdout.startswith("Step 0: pass"), cells.stdout + cells.stderr[-3000:]
    # a check that launches the learner's exercise in processes of its own: the starter's verdict, no error
    pi = a_class.python(ADA, "-m", "autograde", "check", "--step", "pi", "--script", "exercises/compute_pi.py", cwd=copy)
    assert pi.returncode == 1 and "FAIL" in pi.stdout and "# TODO pi" in pi.stdout, pi.stdout + pi.stderr
    assert "Error" not in pi.stdout + pi.stderr


def test_the_instructor_releases_a_parts_solutions_and_only_then_the_learner_fetches_them(a_class: Class) -> None:
    name = withheld.solutions_assignment(PART)
    fetch = [processes.PYTHON, "-m", "nbgrader", "fetch_assignment", name, f"--course={assignment.COURSE_ID}",
             f"--Exchange.root={a_class.hub.exchange}"]
    early = a_class.run(ADA, *fetch)
    assert early.returncode != 0 and not (a_class.home(ADA) / name).exists(), early.stdout + early.stderr
    assert not any(a_class.hub.exchange.rglob(f"*{name}*"))  # nowhere in the exchange, for anyone

    grading = a_class.home(TEACHER) / "grading"
    released = a_class.python(TEACHER, "-m", "autograde.course", "release-solutions", "--part", PART,
                              "--exchange", str(a_class.hub.exchange), **{settings.COURSE_DIR: str(grading)})
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"releasing the solutions of {PART} from HEAD" in released.stdout
    assert f"learners fetch {name}" in released.stdout

    fetched = a_class.run(ADA, *fetch)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    folder = a_class.home(ADA) / name
    for solution in withheld.solutions_of(PART):
        assert (folder / Path(solution).name).read_bytes() == (a_class.course / solution).read_bytes()
    assert (folder / "solutions.ipynb").is_file()
    # the released solution passes its check, run as the learner
    copy = a_class.home(ADA) / start.COPY
    pi = a_class.python(ADA, "-m", "autograde", "check", "--step", "pi", "--script", str(folder / "compute_pi.py"),
                        cwd=copy if copy.is_dir() else None)
    assert pi.returncode == 0 and "pass" in pi.stdout, pi.stdout + pi.stderr


# --- On a running hub, in a browser: the hub withholds when it starts; the formgrader releases --------
HUB_TEACHER, HUB_ADA, HUB_GROUP = "ddpw-hteacher", "ddpw-hada", "ddpw-hinstructors"


@pytest.mark.timeout(900)
def test_on_the_hub_the_instructor_releases_a_parts_solutions_in_the_formgrader(
        chromium: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    """`make hub` withholds the course (one line in its log); the learner's first login has no solution
    and their Assignments tab no `processes_talk_solutions`; the instructor's formgrader lists it,
    Generate and Release hand it out, and the learner fetches it in the browser."""
    need_a_hub("the withheld course's hub test")
    hub = ClassHub(tmp_path_factory.mktemp("withheld_hub"), [HUB_TEACHER], [HUB_ADA])
    hub.chromium = chromium
    name = withheld.solutions_assignment(PART)
    try:
        course = copy_of_the_course(hub.folder)  # not this checkout: the hub would close its history, shared
        hub.extra += [f'course = "{course}"', f'instructors_group = "{HUB_GROUP}"']
        hub.add_users()
        hub.open_course()
        hub.start()
        assert f"withheld from learners in {course}: solutions/, tests/, .git/, grading/" in hub.log_path.read_text()
        with members(hub, capsys, HUB_TEACHER, HUB_ADA) as (teacher, ada):
            ada.log_in()
            with ada.steps.step("learner-has-no-solution-and-none-to-fetch"):
                copy = ada.home / start.COPY
                assert (copy / "solutions" / "fashion_mnist_after_step_4.py").is_file()
                assert not (copy / "solutions" / "ring_allreduce.py").exists()
                released = ada.assignments().locator("#released_assignments_list")
                assert name not in str(released.text_content()) and not any(hub.exchange.rglob(f"*{name}*"))
            teacher.log_in()
            with teacher.steps.step("instructor-generates-and-releases-the-solutions"):
                sources = teacher.home / "grading" / "source"  # the first login's, beside each part's own
                assert {withheld.solutions_assignment(p) for p in withheld.parts_with_solutions()} <= \
                    {f.name for f in sources.iterdir()}
                row = formgrader_row(teacher.page, hub, name)
                row.wait_for()
                formgrader_action(teacher.page, row.locator("td.assign a"))
                formgrader_action(teacher.page, row.locator("td.release a"))
            with ada.steps.step("learner-fetches-the-solutions"):
                panel = ada.assignments()
                panel.locator("#released_assignments_list .list_item", has_text=name).locator(
                    "button", has_text="Fetch").click()
                panel.locator("#fetched_assignments_list .list_item", has_text=name).first.wait_for()
                assert (ada.home / name / "ring_allreduce.py").read_bytes() == \
                    (course / "solutions" / "ring_allreduce.py").read_bytes()
    finally:
        hub.stop()
        left = hub.leftovers()
        hub.remove()
        subprocess.run(["groupdel", HUB_GROUP], capture_output=True)
    assert not left, f"class members' processes left after the hub stopped: {left}"
