"""The instructor's path end to end through nbgrader's real exchange, with the commands docs/instructors.md
gives: `make release`, `make release-exchange`, two learners who fetch, work and
submit with nbgrader's own command line, `make collect`, `make grade`, `make return-feedback`, and
the learners fetching their feedback. Alice hands in the finished solution, Bob a script done
through Step 5: 20 and 8 of 20 points, read back from the export and from the feedback they
fetched. (tests/course/test_course.py grades each later part from submissions copied straight into
submitted/, the way without an exchange.)

The exchange is a temporary folder (`EXCHANGE=...`, nbgrader's Exchange.root). Both learners are
the same OS user here, and nbgrader names a submission after the OS login (its get_username reads
the password database, not $USER), so each learner's commands say `--student=NAME`, and each
has a home of their own (nbgrader keeps a learner's submissions in $JUPYTER_DATA_DIR, where
fetch_feedback looks for them).
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, SOLUTION, snapshot
from nbgrader.validator import Validator
from traitlets.config import Config

from autograde.course import assignment, grading
from autograde.engine import processes
from autograde.grading import registry

pytestmark = pytest.mark.launch  # every test here starts processes

LEARNERS = {"alice": SOLUTION, "bob": snapshot(5)}
POINTS = sum(item.points for item in registry.ITEMS if item.part == registry.FIRST)
BOB = sum(item.points for item in registry.ITEMS if item.part == registry.FIRST and item.id in ("0", "1", "2", "3", "4", "5"))


def make(target: str, course_dir: Path, timeout: float, **variables: str) -> str:
    """`make TARGET VAR=value ...` in the repository, the course kept in `course_dir`; its output."""
    result = processes.run(["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items())],
                        cwd=ROOT, timeout=timeout, env={"DDP_LAB_COURSE_DIR": str(course_dir)})
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    return result.output


@dataclass
class Learner:
    name: str
    home: Path

    @property
    def work(self) -> Path:
        return self.home / "work"

    def nbgrader(self, *args: str, exchange: Path) -> str:
        """A learner's nbgrader command, as docs/instructors.md gives it (the course's venv on PATH)."""
        cmd = ["nbgrader", *args, registry.FIRST, f"--course={assignment.COURSE_ID}", f"--Exchange.root={exchange}",
               f"--student={self.name}"]
        result = processes.run(cmd, cwd=self.work, timeout=120,
                            env={"HOME": str(self.home), "JUPYTER_DATA_DIR": str(self.home / ".local/share/jupyter")})
        assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
        return result.output


@dataclass
class Course:
    root: Path
    exchange: Path
    learners: dict[str, Learner]
    grade_log: str


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory, grading_sandbox: None) -> Course:
    base = tmp_path_factory.mktemp("exchange_course")
    root, exchange = base / "course", base / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)  # nbgrader's exchange is writable by everyone
    learners = {name: Learner(name, base / name) for name in LEARNERS}

    make("release", root, timeout=300)
    make("release-exchange", root, timeout=120, EXCHANGE=str(exchange))
    for learner in learners.values():
        learner.work.mkdir(parents=True)
        learner.nbgrader("fetch_assignment", exchange=exchange)
        shutil.copy(LEARNERS[learner.name], learner.work / registry.FIRST / "fashion_mnist.py")
        learner.nbgrader("submit", exchange=exchange)
    make("collect", root, timeout=120, EXCHANGE=str(exchange))
    grade_log = make("grade", root, timeout=1800)
    make("return-feedback", root, timeout=120, EXCHANGE=str(exchange))
    for learner in learners.values():
        learner.nbgrader("fetch_feedback", exchange=exchange)
    return Course(root, exchange, learners, grade_log)


def fetched_feedback(learner: Learner) -> dict[str, str]:
    """The feedback pages the learner fetched: notebook name -> HTML."""
    pages = sorted((learner.work / registry.FIRST / "feedback").glob("*/*.html"))
    return {page.stem: page.read_text() for page in pages}


def text(fragment: str) -> str:
    """HTML as the reader sees it: no tags, entities resolved, white space collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def test_the_exchange_hands_out_the_committed_starter(graded: Course) -> None:
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:./fashion_mnist.py"],
                               capture_output=True, text=True, check=True).stdout
    released = graded.exchange / assignment.COURSE_ID / "outbound" / registry.FIRST
    assert (released / "fashion_mnist.py").read_text() == committed
    assert not any("HIDDEN TESTS" in nb.read_text() or "procs_per_node" in nb.read_text()
                   for nb in released.glob("*.ipynb"))


def test_grading_the_finished_solution_runs_every_cell_of_the_graded_notebooks_without_an_error(graded: Course) -> None:
    """Alice's graded notebooks, executed top to bottom by the grader with the finished solution and
    without the course's solutions/ (a release holds none): no cell may raise."""
    executed = sorted((graded.root / "autograded" / "alice" / registry.FIRST).glob("*.ipynb"))
    assert [nb.stem for nb in executed] == sorted(registry.PART[registry.FIRST].graded_notebooks)
    for notebook in executed:
        code = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
        assert all(c.get("execution_count") for c in code), f"{notebook.name}: not every cell ran"
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{notebook.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"


def test_collect_files_each_submission_under_its_learner(graded: Course) -> None:
    for name, script in LEARNERS.items():
        submitted = graded.root / "submitted" / name / registry.FIRST
        assert (submitted / "fashion_mnist.py").read_text() == script.read_text()
        graded_script = graded.root / "autograded" / name / registry.FIRST / "fashion_mnist.py"
        assert graded_script.read_text() == script.read_text(), f"{name}'s own script was not the one graded"


def test_scores_from_the_export(graded: Course) -> None:
    assert grading.grades(graded.root / "grades.csv") == {"alice": POINTS, "bob": BOB} and BOB == 8


def test_grade_prints_the_scores_each_learners_time_and_the_steps_lost(graded: Course) -> None:
    log = graded.grade_log
    assert re.search(r"^student +score +time +steps lost$", log, re.M), log[-3000:]
    assert re.search(r"^alice +20/20 +\d+ s +none$", log, re.M), log[-3000:]
    assert re.search(r"^bob +8/20 +\d+ s +6 6\.5 7 8 9 10$", log, re.M), log[-3000:]


def test_learners_are_graded_at_once_each_with_their_own_runs(graded: Course) -> None:
    """Graded two at a time on a machine of two cores or more: alice's finished script and bob's
    mistakes still get their own scores (above), each graded script is the learner's own, and each
    learner's grading says how long it took."""
    at_once = min(2, os.cpu_count() or 1)
    assert f"autograding 2 submission(s), {at_once} at a time" in graded.grade_log
    for name, script in LEARNERS.items():  # nbgrader put back no starter over the learner's own file
        autograded = graded.root / "autograded" / name / registry.FIRST / "fashion_mnist.py"
        assert autograded.read_text() == script.read_text(), f"{name}'s script was replaced"


def test_grade_leaves_known_harmless_warnings_out(graded: Course) -> None:
    log = graded.grade_log
    for noise in ("Attribute 'checksum' for cell", "SAWarning", "Kernel is running over TCP", "Alternative text"):
        assert noise not in log, f"{noise!r} in make grade's log"
    # ... and the hidden tests are back in both learners' grade cells of Steps 4, 5, 6, 8 and 9, without a
    # warning: grading runs the notebook the course wrote (autograde/course/sandbox.py RestoreCourseCells)
    for learner in graded.learners:
        cells = [c for nb in (graded.root / "autograded" / learner / registry.FIRST).glob("*.ipynb")
                 for c in json.loads(nb.read_text())["cells"]]
        for step in assignment.HIDDEN_TESTS:
            (cell,) = [c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == assignment.grade_id(step)]
            assert assignment.hidden_test_block(step) in "".join(cell["source"]), (learner, step)


def test_the_learners_fetch_their_own_feedback_with_their_scores(graded: Course) -> None:
    step_notebooks = sorted(registry.PART[registry.FIRST].graded_notebooks)
    for name, expected in {"alice": POINTS, "bob": BOB}.items():
        pages = fetched_feedback(graded.learners[name])
        assert sorted(pages) == step_notebooks
        scores = [re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)", page) for page in pages.values()]
        assert all(scores)
        assert sum(float(m[1]) for m in scores if m) == expected
        assert sum(float(m[2]) for m in scores if m) == POINTS


def test_feedback_shows_the_whole_verdict_hint_included(graded: Course) -> None:
    page = fetched_feedback(graded.learners["bob"])["05_step_6_sampler"]
    errors = [text(block) for block in re.findall(r'<div class="[^"]*output_error[^"]*">(.*?)</div>', page, re.S)]
    (step_6,) = [e for e in errors if e.startswith("Step 6 ")]
    assert re.fullmatch(r"Step 6 FAIL observed: .*RandomSampler, not a DistributedSampler "
                        r"hint: .*sampler=.*", step_6), step_6
    # every failing check shows its verdict, not the checker's frames
    assert errors and all(e.startswith("Step ") and "Traceback" not in e and 'File "' not in e for e in errors), errors


def test_a_learner_validates_with_nbgraders_api(graded: Course) -> None:
    """`nbgrader validate` exits 0 whatever it finds: its Python API says what failed (in Bob's
    folder, whose verdicts grading has kept: the kernel's start is most of the time)."""
    (notebook,) = (graded.learners["bob"].work / registry.FIRST).glob("05_*.ipynb")
    failed = Validator(config=Config({"Execute": {"timeout": 900}})).validate(str(notebook))["failed"]
    assert [cell["source"].split(" (")[0] for cell in failed] == ["# Check Step 6", "# Check Step 6.5"]
    assert "not a DistributedSampler" in failed[0]["raw_error"]


def test_exchange_commands_without_an_exchange_folder_say_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "no-exchange"
    result = processes.run(["make", "--no-print-directory", "collect", f"EXCHANGE={missing}"], cwd=ROOT, timeout=120,
                        env={"DDP_LAB_COURSE_DIR": str(tmp_path / "course")})
    assert result.returncode != 0 and "Traceback" not in result.output
    assert f"error: no exchange folder {missing}: create it, writable by everyone" in result.output
