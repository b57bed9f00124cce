"""The nbgrader course end to end, with the real nbgrader command line (`make release`,
`make grade`): three submissions are graded and their scores read back from the export."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from nbgrader.validator import Validator
from traitlets.config import Config

from autograde import course, launch
from conftest import ROOT, SOLUTION, STARTER, snapshot

POINTS = {"0": 1, "1": 1, "2": 1, "3": 1, "4": 2, "5": 2, "6": 2, "6.5": 1, "7": 2, "8": 2, "9": 2, "10": 3}
SUBMISSIONS = {"finished": SOLUTION, "through_step_5": snapshot(5), "untouched": STARTER}


def make(target: str, course_dir: Path, timeout: float) -> launch.Result:
    result = launch.run(["make", "--no-print-directory", target], cwd=ROOT, timeout=timeout,
                        env={"DDP_LAB_COURSE_DIR": str(course_dir)})
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    return result


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A course released from notebooks/, with the three submissions handed in and graded."""
    root = tmp_path_factory.mktemp("course")
    make("release", root, timeout=300)
    for student, script in SUBMISSIONS.items():
        folder = root / "submitted" / student / course.ASSIGNMENT
        shutil.copytree(root / "release" / course.ASSIGNMENT, folder)
        shutil.copy(script, folder / "fashion_mnist.py")
    make("grade", root, timeout=1800)
    return root


def grade_cells(notebook: Path) -> list[dict]:
    return [c for c in json.loads(notebook.read_text())["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]


def test_every_graded_step_has_one_grade_cell_with_its_points() -> None:
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    # grading runs the notebooks that match course.GRADED: exactly those with grade cells
    assert [nb for nb in notebooks if grade_cells(nb)] == sorted((ROOT / "notebooks").glob(f"{course.GRADED}.ipynb"))
    cells = [c for nb in notebooks for c in grade_cells(nb)]
    points = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"] for c in cells}
    assert points == {f"step_{s.replace('.', '_')}": p for s, p in POINTS.items()}
    assert all("BEGIN HIDDEN TESTS" in "".join(c["source"]) for c in cells
               if c["metadata"]["nbgrader"]["grade_id"] in {"step_4", "step_5", "step_6", "step_8", "step_9"})


def test_scores_from_the_export(course_dir: Path) -> None:
    scores = course.grades(course_dir / "grades.csv")
    through_5 = sum(POINTS[s] for s in ("0", "1", "2", "3", "4", "5"))
    assert scores == {"finished": sum(POINTS.values()), "through_step_5": through_5, "untouched": 0}


def test_the_student_version_has_no_hidden_tests_and_no_solutions(course_dir: Path) -> None:
    released = course_dir / "release" / course.ASSIGNMENT
    notebooks = sorted(released.glob("*.ipynb"))
    assert [nb.name for nb in notebooks] == sorted(nb.name for nb in (ROOT / "notebooks").glob("*.ipynb"))
    assert not any("HIDDEN TESTS" in nb.read_text() or "procs_per_node=3" in nb.read_text() for nb in notebooks)
    assert (released / "fashion_mnist.py").read_text() == STARTER.read_text()
    assert not (released / "solutions").exists()


def test_each_learners_own_script_is_graded(course_dir: Path) -> None:
    for student, script in SUBMISSIONS.items():
        graded = course_dir / "autograded" / student / course.ASSIGNMENT / "fashion_mnist.py"
        assert graded.read_text() == script.read_text(), f"{student}'s script was replaced"


def test_feedback_says_what_is_wrong(course_dir: Path) -> None:
    for student in SUBMISSIONS:
        assert len(list((course_dir / "feedback" / student / course.ASSIGNMENT).glob("*.html"))) == len(
            list((ROOT / "notebooks").glob(f"{course.GRADED}.ipynb")))
    feedback = "".join(p.read_text() for p in (course_dir / "feedback" / "untouched" / course.ASSIGNMENT).glob("*.html"))
    assert "the script does not import torch.distributed" in feedback


def test_validation_through_nbgraders_api(course_dir: Path) -> None:
    """`nbgrader validate` exits 0 whatever it finds: its Python API says what failed."""
    (untouched,) = (course_dir / "submitted").glob(f"untouched/{course.ASSIGNMENT}/03_*.ipynb")
    failed = Validator(config=Config({"Execute": {"timeout": 900}})).validate(str(untouched))["failed"]
    assert [cell["source"].split(" (")[0] for cell in failed] == ["# Check Step 0", "# Check Step 1", "# Check Step 2"]
    assert "does not import torch.distributed" in failed[0]["raw_error"]


def test_grading_without_submissions_says_what_to_do(tmp_path: Path) -> None:
    result = launch.run(["make", "--no-print-directory", "grade"], cwd=ROOT, timeout=120,
                        env={"DDP_LAB_COURSE_DIR": str(tmp_path)})
    assert result.returncode != 0 and "Traceback" not in result.output
    assert f"error: no submissions: put each in {tmp_path}/submitted/<student>/{course.ASSIGNMENT}/" in result.output
