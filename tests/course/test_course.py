"""The nbgrader course without the exchange (tests/course/test_exchange.py goes through it, grading the
finished solution and the same script done through Step 5, whose verdicts this module's grading
keeps): the grade cells and their points, the hidden tests (the registry's `hidden` layouts) added
only to the source assignment, releases built from a commit,
`make grade`'s log, and a submission copied straight into submitted/ (files handed in on a
learning platform): a script done through Step 5 gets Steps 0-5's points."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
from conftest import ROOT

from autograde.course import assignment, cli, grading, nbgrader_run
from autograde.engine import processes
from autograde.grading import registry
from autograde.parts.capstone import leaderboard

LAB = registry.PART[registry.FIRST]
POINTS = {item.id: item.points for item in registry.ITEMS if item.graded and item.part == LAB.id}  # the lab's


def make(target: str, course_dir: Path, timeout: float, *variables: str) -> processes.Result:
    result = processes.run(["make", "--no-print-directory", target, *variables], cwd=ROOT, timeout=timeout,
                        env={"DDP_LAB_COURSE_DIR": str(course_dir)})
    assert result.returncode == 0 and not result.timed_out, result.output[-3000:]
    return result


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A course released from the committed notebooks (grading a submission is tests/course/test_exchange.py's,
    and each later part's below)."""
    root = tmp_path_factory.mktemp("course")
    make("release", root, timeout=300)
    return root


def cells(notebook: Path) -> list[dict]:
    return [c for c in json.loads(notebook.read_text())["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]


def grade_cells(folder: Path) -> dict[str, str]:
    """grade_id -> source of every grade cell in the notebooks of `folder`."""
    return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"])
            for nb in sorted(folder.glob("*.ipynb")) for c in cells(nb)}


def autograded(folder: Path) -> dict[str, str]:
    """The grade cells of the items (answer cells, graded by hand, left out)."""
    return {k: v for k, v in grade_cells(folder).items() if not assignment.is_answer(k)}


def test_every_graded_step_has_one_grade_cell_with_its_points() -> None:
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    # grading runs each part's graded notebooks (tests/core/test_registry.py): exactly those with grade cells
    graded = {n for p in registry.PARTS for n in p.graded_notebooks}
    answered = {nb.stem for nb in notebooks if any(assignment.answer_ids(json.loads(nb.read_text())))}
    assert {nb.stem for nb in notebooks if cells(nb)} == graded | answered
    found = [c for nb in notebooks for c in cells(nb) if not assignment.is_answer(c["metadata"]["nbgrader"]["grade_id"])]
    points = {c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]["points"] for c in found}
    assert points == {assignment.grade_id(i.id): i.points for i in registry.ITEMS if i.graded}


def test_the_learners_notebooks_carry_no_hidden_tests() -> None:
    for grade_id, source in autograded(ROOT / "notebooks").items():
        step = str(assignment.step_of(grade_id))
        assert "HIDDEN TESTS" not in source and "procs_per_node" not in source, grade_id
        argument = step if step.isdigit() else f'"{step}"'
        assert source.splitlines()[-1] == f"autograde.assert_step({argument})"


@pytest.mark.launch
def test_the_hidden_tests_go_into_the_source_assignment_only(course_dir: Path) -> None:
    source = grade_cells(course_dir / "source" / registry.FIRST)
    for step in POINTS:
        cell = source[assignment.grade_id(step)]
        if step in assignment.HIDDEN_TESTS:
            assert cell.endswith("\n" + assignment.hidden_test_block(step))
        else:
            assert "HIDDEN TESTS" not in cell
    assert "autograde.assert_step(5, procs_per_node=1, nodes=3)" in source["step_5"]
    assert "autograde.assert_step(4, procs_per_node=3, nodes=1)" in source["step_4"]
    released = autograded(course_dir / "release" / registry.FIRST)
    assert released == {k: v for k, v in autograded(ROOT / "notebooks").items()  # the student version: what
                        if registry.item(str(assignment.step_of(k))).part == LAB.id}  # learners ran


@pytest.mark.launch
def test_the_student_version_has_no_solutions(course_dir: Path) -> None:
    released = course_dir / "release" / registry.FIRST
    assert sorted(nb.name for nb in released.glob("*.ipynb")) == sorted(nb.name for nb in (ROOT / "notebooks").glob(LAB.notebooks))
    assert not (released / "solutions").exists()


@pytest.mark.launch
def test_grading_without_submissions_says_what_to_do(tmp_path: Path) -> None:
    result = processes.run(["make", "--no-print-directory", "grade"], cwd=ROOT, timeout=120,
                        env={"DDP_LAB_COURSE_DIR": str(tmp_path)})
    assert result.returncode != 0 and "Traceback" not in result.output
    assert f"error: no submissions: put each in {tmp_path}/submitted/<student>/{registry.FIRST}/" in result.output


def test_scores_before_any_grading_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_COURSE_DIR", str(tmp_path))
    with pytest.raises(assignment.CourseError, match=f"no gradebook at {tmp_path}/gradebook.db: run `make grade` first"):
        grading.scores(LAB.id)


# --- releases are built from a commit -------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with the course files committed, and a course folder of its own."""
    repo = tmp_path / "repo"
    for path in [*(f"notebooks/{nb.name}" for nb in (ROOT / "notebooks").glob("*.ipynb")), *LAB.files]:
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, repo / path)
    git(repo, "init", "--quiet")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "the course")
    monkeypatch.setenv("DDP_LAB_COURSE_DIR", str(tmp_path / "course"))
    return repo


@pytest.mark.launch
def test_release_builds_from_the_commit_not_the_edited_working_copy(clone: Path) -> None:
    committed = (clone / "fashion_mnist.py").read_text()
    (clone / "fashion_mnist.py").write_text(committed + "import torch.distributed as dist  # a half-done Step 0\n")
    shutil.copy(clone / "notebooks/03_steps_0_to_2.ipynb", clone / "notebooks/09_draft.ipynb")
    built = assignment.build_source(clone)
    source = assignment.root() / "source" / registry.FIRST
    assert (source / "fashion_mnist.py").read_text() == committed
    assert not (source / "09_draft.ipynb").exists()
    commit = git(clone, "rev-parse", "--short=7", "HEAD").strip()
    assert built.origin.startswith(f"commit {commit}") and built.origin.endswith("the course")
    (note,) = built.notes
    assert "fashion_mnist.py" in note and "notebooks/09_draft.ipynb" in note and "released as committed" in note


@pytest.mark.launch
def test_release_from_the_files_as_they_are_on_request(clone: Path) -> None:
    (clone / "fashion_mnist.py").write_text("# edited\n")
    built = assignment.build_source(clone, assignment.WORKING_COPY)
    assert (assignment.root() / "source" / registry.FIRST / "fashion_mnist.py").read_text() == "# edited\n"
    assert "as they are" in built.origin


@pytest.mark.launch
def test_release_outside_a_git_checkout_says_what_to_do(clone: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(clone / ".git")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(clone.parent))  # no repository above it either
    monkeypatch.setattr(assignment, "REPO", clone)
    with pytest.raises(SystemExit) as exit_status:
        cli.main(["release"])
    assert exit_status.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"error: {clone} is not a git checkout: `make release` builds from a commit; "
                    "`make release FROM=files` builds from the files as they are")


@pytest.mark.launch
def test_hidden_tests_written_into_a_notebook_are_refused(clone: Path) -> None:
    path = clone / "notebooks/04_steps_3_to_5.ipynb"
    notebook = json.loads(path.read_text())
    (cell,) = [c for c in notebook["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "step_4"]
    cell["source"] = "".join(cell["source"]) + "\n" + assignment.hidden_test_block("4")
    path.write_text(json.dumps(notebook, indent=1))
    with pytest.raises(assignment.CourseError, match="step_4 has hidden tests of its own: they belong in"):
        assignment.build_source(clone, assignment.WORKING_COPY)


def test_the_log_filter_hides_only_what_is_known_to_be_harmless() -> None:
    log = nbgrader_run.LogFilter()
    checksum = "[AutogradeApp | WARNING] Attribute 'checksum' for cell {} has changed! (should be: bbb, got: {})\n"
    lines = {
        checksum.format("step_4", "aaa"): True,  # grading runs the course's cells: a change nbgrader reports is shown
        "/x/nbgrader/api.py:2229: SAWarning: Object of type <SubmittedAssignment> not in session\n": False,
        "  for notebook in submission.assignment.notebooks:\n": False,  # the warning's source line
        "[IPKernelApp] WARNING | Kernel is running over TCP without encryption. All communication\n": False,
        "[GenerateFeedbackApp | WARNING] Alternative text is missing on 2 image(s).\n": False,
        "[AutogradeApp | ERROR] There was an error processing assignment\n": True,
        "  File \"x.py\", line 3\n": True,
    }
    assert {line: log.keep(line) for line in lines} == lines
    assert log.counts == {"sqlalchemy": 1, "tcp": 1, "alt": 1}
    assert log.summary().startswith("(left out of the log above as harmless: 1 SQLAlchemy warnings")


LATER = [p.id for p in registry.PARTS if p.id != registry.FIRST]
# graded first, beside the others in turn: the longest to grade (measured on a fresh clone of 3e071c6: 497 s
# of test_course's 1154), which, started third, ended alone and left a core idle for minutes
LONGEST = "scaling"
SLURM_NOTEBOOK = "16_slurm"


def release_and_grade(folder: Path, part_id: str) -> Path:
    """`make release PART=...`, every item's checkpoint copied into a learner's submission and every answer cell
    written in, `make grade PART=...`."""
    part = registry.PART[part_id]
    make("release", folder, 300, f"PART={part.id}")
    submission = folder / "submitted" / "solved" / part.id
    shutil.copytree(folder / "release" / part.id, submission)
    for item in registry.ITEMS:
        if item.part == part.id:
            shutil.copy(ROOT / str(item.checkpoint), submission / item.file)
    for path in submission.glob("*.ipynb"):  # and writes in every answer cell (left as it was, one gets 0)
        notebook = json.loads(path.read_text())
        for cell in notebook["cells"]:
            if assignment.is_answer(cell["metadata"].get("nbgrader", {}).get("grade_id", "")):
                cell["source"] = ["An answer of the learner's."]
        path.write_text(json.dumps(notebook, indent=1))
    make("grade", folder, 1200, f"PART={part.id}")
    return folder


@pytest.fixture(scope="module")
def later_parts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                grading_sandbox: None) -> Iterator[dict[str, Future[Path]]]:
    """The later parts this session tests, each released and graded in a folder of its own, two at a
    time: grading one runs its notebooks one after another, on about one core. Each test waits for
    its own part, so none is left running once they have ended."""
    wanted = [p for p in LATER if any(item.nodeid.endswith(f"test_a_later_part_is_an_assignment_of_its_own[{p}]")
                                      for item in request.session.items)]
    wanted.sort(key=lambda p: p != LONGEST)
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {p: pool.submit(release_and_grade, tmp_path_factory.mktemp(f"part_{p}"), p) for p in wanted}
        pool.shutdown(cancel_futures=True)  # after a failure with -x, nothing more is started


@pytest.mark.launch
@pytest.mark.parametrize("part_id", LATER)
def test_a_later_part_is_an_assignment_of_its_own(later_parts: dict[str, Future[Path]], part_id: str) -> None:
    """`make release PART=processes_talk` (or another later part) hands out that part's notebooks and
    files (not the lab's), and `make grade PART=...` gives solved exercises their points. Grading
    runs the graded notebooks top to bottom: no cell of them may raise (tests/notebooks/test_notebooks.py
    leaves them to this test)."""
    part = registry.PART[part_id]
    folder = later_parts[part_id].result()
    released = folder / "release" / part.id
    assert sorted(p.stem for p in released.glob("*.ipynb")) == sorted(p.stem for p in (ROOT / "notebooks").glob(part.notebooks))
    for file in part.files:
        assert (released / file).read_text() == (ROOT / file).read_text(), file
    assert not (released / "fashion_mnist.py").exists()
    # SLURM's notebook needs the cluster, which the grading sandbox cannot reach: its items are left to
    # the instructor (their grade cells say so), and its cells that call srun or sbatch fail there
    by_hand = {i.id for i in registry.ITEMS if i.part == part.id and i.notebook == SLURM_NOTEBOOK}
    assert grading.grades(folder / "grades.csv", part.id) == {
        "solved": sum(i.points for i in registry.ITEMS if i.part == part.id and i.id not in by_hand)}
    answers = [c["metadata"]["nbgrader"]["points"] for nb in released.glob("*.ipynb") for c in cells(nb)
               if assignment.is_answer(c["metadata"]["nbgrader"]["grade_id"])]
    assert grading.pending_by_hand(folder / "grades.csv", part.id) == {"solved": sum(answers)}  # not read yet
    executed = sorted((folder / "autograded" / "solved" / part.id).glob("*.ipynb"))
    assert [nb.stem for nb in executed] == sorted(p.stem for p in released.glob(f"{part.graded}.ipynb"))
    for notebook in executed:
        code = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
        assert all(c.get("execution_count") for c in code), f"{notebook.name}: not every cell ran"
        if notebook.stem == SLURM_NOTEBOOK:  # its grade cells say why they count 0; its other cells need SLURM
            graded = [c for c in code if c["metadata"].get("nbgrader", {}).get("grade")]
            said = [str(o.get("evalue")) for c in graded for o in c.get("outputs", []) if o.get("output_type") == "error"]
            assert len(said) == len(by_hand) and all("cannot be checked where grading runs" in e for e in said), said
            assert any(re.search(r"(srun|sbatch): fatal", str(o.get("evalue"))) for c in code for o in c.get("outputs", []))
            continue  # its other cells submit jobs, or use what a job gave, and fail without the cluster
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{notebook.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    if part_id == "capstone":  # grading put the run on the class's leaderboard, from the verdict the sandbox signed
        (entry,) = leaderboard.read([folder / leaderboard.LEADERBOARD])
        assert entry.learner == "solved" and entry.valid and entry.facts["division"] == "closed", entry
        assert entry.speedup == pytest.approx(entry.facts["baseline"] / entry.facts["seconds"], rel=0.01), entry


def test_make_bench_reads_each_learners_time_from_the_grading_summary() -> None:
    from autograde.tools import bench

    shown = grading.summary([grading.Outcome("ada", 20, 20, []), grading.Outcome("bob", 8, 20, ["6", "7"])],
                            {"ada": 41.6, "bob": 38.2})
    assert shown.splitlines()[0].split() == ["student", "score", "time", "steps", "lost"]
    assert [(m["learner"], m["seconds"]) for m in bench.TIME_COLUMN.finditer(shown)] == [("ada", "42"), ("bob", "38")]
    assert "time" not in grading.summary([grading.Outcome("ada", 20, 20, [])])  # no times known: no column
    waiting = grading.Outcome("cy", 20, 22, [], ["answer_14_lonely_node", "answer_14_ranks_on_two_nodes"], 2)
    shown = grading.summary([grading.Outcome("ada", 22, 22, []), waiting], {"ada": 41.6, "cy": 40.0})
    assert shown.splitlines()[0].split() == ["student", "score", "time", "steps", "lost", "to", "grade", "by", "hand", "(pending)"]
    assert shown.splitlines()[2].split() == ["cy", "20/22", "40", "s", "none", "2", "point(s):",
                                             "answer_14_lonely_node", "answer_14_ranks_on_two_nodes"]
    assert shown.splitlines()[1].endswith("none") and "by hand" in shown.splitlines()[-1]
    assert [m["learner"] for m in bench.TIME_COLUMN.finditer(shown)] == ["ada", "cy"]


# --- answer cells: free text, graded by hand ---------------------------------------------------------

ANSWER_NOTEBOOK = "03_steps_answered"  # a lab notebook (graded: its name says step) holding only a question
LEARNERS_ANSWER = "Rank 0 waits in init_process_group until its timeout: 1 of 2 joined."


@pytest.mark.launch
def test_an_answer_cell_is_released_kept_and_reported_pending_until_graded_by_hand(
        clone: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], grading_sandbox: None) -> None:
    """A notebook with an answer cell, released and graded with nbgrader for real: the student
    version keeps the cell for the learner to write in, autograding keeps the learner's answer and
    leaves it to the instructor (pending, not 0 of 1; one left as it was gets 0), and once it is graded by hand (as the
    formgrader does, in the gradebook) `scores` counts it, and so does grading again."""
    from nbgrader.api import Gradebook

    for old in (clone / "notebooks").glob("*.ipynb"):
        old.unlink()  # the course's notebooks run every check: this one has nothing to run but a question
    question = {"cell_type": "markdown", "id": "question", "metadata": {},
                "source": ["**Predict first:** where does rank 0 wait when node 1 never comes?"]}
    answer = assignment.answer_cell(ANSWER_NOTEBOOK, "lonely_node")
    notebook = {"cells": [question, answer], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (clone / "notebooks" / f"{ANSWER_NOTEBOOK}.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    monkeypatch.setattr(assignment, "HIDDEN_TESTS", {})  # their grade cells are in notebooks left out here
    monkeypatch.setattr(assignment, "REPO", clone)
    grading.release(assignment.WORKING_COPY)

    released = assignment.root() / "release" / LAB.id / f"{ANSWER_NOTEBOOK}.ipynb"
    (cell,) = [c for c in json.loads(released.read_text())["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
    assert not assignment.answer_faults(cell, ANSWER_NOTEBOOK)  # still an answer cell, empty, for the learner

    submission = assignment.root() / "submitted" / "ada" / LAB.id
    shutil.copytree(released.parent, submission)
    handed_in = json.loads(released.read_text())
    (mine,) = [c for c in handed_in["cells"] if c["metadata"].get("nbgrader", {}).get("grade")]
    mine["source"] = [LEARNERS_ANSWER]
    (submission / released.name).write_text(json.dumps(handed_in, indent=1))
    shutil.copytree(released.parent, assignment.root() / "submitted" / "bo" / LAB.id)  # bo leaves it as it was
    capsys.readouterr()
    export = grading.grade(LAB.id)  # both learners at once
    shown = capsys.readouterr().out

    graded = json.loads((assignment.root() / "autograded" / "ada" / LAB.id / released.name).read_text())
    assert LEARNERS_ANSWER in ["".join(c["source"]) for c in graded["cells"]]  # the answer kept
    feedback = (assignment.root() / "feedback" / "ada" / LAB.id / f"{ANSWER_NOTEBOOK}.html").read_text()
    assert LEARNERS_ANSWER in feedback
    # nothing to read from bo: nbgrader gives an answer cell left as it was 0, as it does any solution cell
    assert grading.grades(export, LAB.id) == {"ada": 0, "bo": 0}
    assert grading.pending_by_hand(export, LAB.id) == {"ada": 1, "bo": 0}
    outcome, left = grading.outcomes(LAB.id)
    assert (outcome.lost, outcome.pending, outcome.pending_points) == ([], ["answer_03_lonely_node"], 1)
    assert (left.student, left.pending) == ("bo", [])
    assert "1 point(s): answer_03_lonely_node" in shown and "to grade by hand" in shown

    with Gradebook(f"sqlite:///{assignment.root() / 'gradebook.db'}") as gradebook:  # the formgrader's doing
        grade = gradebook.find_grade("answer_03_lonely_node", ANSWER_NOTEBOOK, LAB.id, "ada")
        assert grade.needs_manual_grade and grade.auto_score is None
        grade.manual_score = 1
        gradebook.db.commit()
    export = grading.scores(LAB.id)
    assert grading.grades(export, LAB.id) == {"ada": 1, "bo": 0}
    assert grading.pending_by_hand(export, LAB.id) == {"ada": 0, "bo": 0}
    assert "to grade by hand" not in capsys.readouterr().out
    export = grading.grade(LAB.id)  # grading again keeps the instructor's score
    assert grading.grades(export, LAB.id) == {"ada": 1, "bo": 0}
    assert grading.pending_by_hand(export, LAB.id) == {"ada": 0, "bo": 0}


@pytest.mark.launch
def test_a_release_refuses_a_broken_answer_cell_and_one_grading_never_runs(clone: Path) -> None:
    path = clone / "notebooks/03_steps_0_to_2.ipynb"
    notebook = json.loads(path.read_text())
    notebook["cells"].append(assignment.answer_cell("03_steps_0_to_2", "why"))
    notebook["cells"][-1]["metadata"]["nbgrader"]["locked"] = True
    path.write_text(json.dumps(notebook, indent=1))
    with pytest.raises(assignment.CourseError, match="answer_03_why is not unlocked"):
        assignment.build_source(clone, assignment.WORKING_COPY)
    notebook["cells"][-1] = assignment.answer_cell("02_baseline", "why")
    (clone / "notebooks/02_baseline.ipynb").write_text(json.dumps(notebook, indent=1))
    path.write_text(json.dumps(json.loads((ROOT / "notebooks/03_steps_0_to_2.ipynb").read_text()), indent=1))
    with pytest.raises(assignment.CourseError, match="02_baseline.ipynb has answer cells, but grading runs only"):
        assignment.build_source(clone, assignment.WORKING_COPY)
