"""What a class's learners may not read, and what they get, without a process: which files are the
graded exercises' solutions (from the registry), the first login's copy, the modes the checkout's
withheld paths get, the solutions' assignment of a part. tests/course/test_withheld_users.py does it
for real, with Unix users."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from autograde.course import cli, withheld
from autograde.course.assignment import WORKING_COPY
from autograde.course.hub import settings, start
from autograde.grading import registry


def test_every_file_of_solutions_is_a_step_checkpoint_or_a_withheld_solution() -> None:
    """The registry accounts for all of solutions/: nothing in it is copied or left readable by mistake."""
    files = sorted(f"solutions/{p.name}" for p in (ROOT / "solutions").iterdir() if p.is_file())
    steps, solutions = withheld.step_checkpoints(), withheld.solutions_of()
    assert not set(steps) & set(solutions)
    assert sorted([*steps, *solutions]) == files
    assert sorted(steps) == sorted(f"solutions/{p.name}" for p in (ROOT / "solutions").glob("fashion_mnist_after_step_*.py"))


def test_each_parts_solutions_are_the_finished_versions_of_its_exercises() -> None:
    assert withheld.solutions_of(registry.FIRST) == []  # the lab's are its step checkpoints, every learner's
    assert "solutions/ring_allreduce.py" in withheld.solutions_of("processes_talk")
    assert "solutions/tensor_parallel.py" in withheld.solutions_of("inside_ddp")
    assert "solutions/kfac.py" in withheld.solutions_of("optimizers")
    for part in registry.PARTS[1:]:
        exercises = {Path(i.file).name for i in part.items}
        assert {Path(s).name for s in withheld.solutions_of(part.id)} == exercises, part.id
    assert withheld.parts_with_solutions() == [p.id for p in registry.PARTS[1:]]


def test_no_part_hands_out_a_withheld_solution() -> None:
    for part in registry.PARTS:
        assert not set(part.files) & set(withheld.solutions_of()), part.id


def test_the_first_login_copy_holds_the_step_checkpoints_and_no_solution(tmp_path: Path) -> None:
    copied = start.copy_course(ROOT, tmp_path)
    assert copied is not None
    assert sorted(f"solutions/{p.name}" for p in (copied / "solutions").iterdir()) == sorted(withheld.step_checkpoints())
    for checkpoint in withheld.step_checkpoints():
        assert (copied / checkpoint).read_bytes() == (ROOT / checkpoint).read_bytes()
    for name in ("exercises/ring_allreduce.py", "exercises/kfac.py", "fashion_mnist.py", "demos/hangs.py"):
        assert (copied / name).read_bytes() == (ROOT / name).read_bytes()
    # no solution under any name: no file of the copy is one
    secrets = {(ROOT / s).read_bytes() for s in withheld.solutions_of()}
    leaked = [p for p in copied.rglob("*") if p.is_file() and p.read_bytes() in secrets]
    assert not leaked
    assert not (copied / "tests").exists()


@pytest.mark.parametrize("mode, expected", [(0o100644, 0o640), (0o100755, 0o750), (0o40755, 0o750),
                                            (0o40700, 0o750), (0o100600, 0o640), (0o100666, 0o640)])
def test_a_withheld_path_is_the_groups_to_read_and_nobody_elses(mode: int, expected: int) -> None:
    assert withheld.withheld_mode(mode) == expected


def test_a_worktrees_history_is_where_its_git_file_points(tmp_path: Path) -> None:
    main, course = tmp_path / "main", tmp_path / "course"
    gitdir = main / ".git" / "worktrees" / "course"
    gitdir.mkdir(parents=True)
    (gitdir / "commondir").write_text("../..\n")
    course.mkdir()
    (course / ".git").write_text(f"gitdir: {gitdir}\n")
    assert withheld.git_dirs(course) == [gitdir, main / ".git"]
    assert withheld.git_dirs(main) == []  # a .git folder is withheld as it is


def test_a_parts_solutions_assignment_holds_its_solutions_and_says_what_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_COURSE_DIR", str(tmp_path))
    withheld.build_solutions_source(ROOT, WORKING_COPY, "processes_talk")
    source = tmp_path / "source" / withheld.solutions_assignment("processes_talk")
    names = [Path(s).name for s in withheld.solutions_of("processes_talk")]
    assert sorted(p.name for p in source.iterdir()) == sorted([*names, "solutions.ipynb"])
    for name in names:
        assert (source / name).read_bytes() == (ROOT / "solutions" / name).read_bytes()
    notebook = nbformat.reads((source / "solutions.ipynb").read_text(), as_version=4)
    nbformat.validate(notebook)
    assert all(f"`{name}`" in notebook.cells[0].source for name in names)
    assert json.loads((source / "solutions.ipynb").read_text())["nbformat"] == 4


def test_releasing_the_labs_solutions_says_there_are_none_to_release(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDP_LAB_COURSE_DIR", str(tmp_path / "course"))
    with pytest.raises(SystemExit) as stopped:
        cli.main(["release-solutions", "--exchange", str(tmp_path), "--part", registry.FIRST])
    assert stopped.value.code == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith("error: ddp_lab has no solutions to release: its step checkpoints") and "\n" not in said
    assert "processes_talk" in said and not (tmp_path / "course" / "source").exists()


def test_the_instructors_group_is_a_setting(tmp_path: Path) -> None:
    path = tmp_path / "class.toml"
    path.write_text('instructors = ["teacher"]\nlearners = ["ada"]\n')
    assert settings.load(path).instructors_group == withheld.GROUP == "ddp-lab-instructors"
    path.write_text('instructors = ["teacher"]\nlearners = ["ada"]\ninstructors_group = "Staff Room"\n')
    with pytest.raises(settings.SettingsError, match="instructors_group = 'Staff Room' is not a Unix group name"):
        settings.load(path)


def test_only_the_tools_read_the_checkouts_solutions() -> None:
    """What a learner's check or notebook runs never reads the checkout's solutions/ (learners may not):
    settings.SOLUTIONS and settings.SOLUTION are make bench's, make gpu-check's, make run's and the
    nbval runner's (autograde/tools/). A notebook names a file of the learner's own folder instead
    (runtime.course_file), a solution only as a fallback it asks for first (runtime.handed_out)."""
    import ast

    users = []
    for path in sorted((ROOT / "autograde").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("autograde/tools/") or relative == "autograde/settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("SOLUTIONS", "SOLUTION") and \
                    isinstance(node.value, ast.Name) and node.value.id == "settings":
                users.append(relative)
            if isinstance(node, ast.ImportFrom) and node.module == "autograde.settings" and \
                    {a.name for a in node.names} & {"SOLUTIONS", "SOLUTION"}:
                users.append(relative)
    assert not users


def test_withholding_needs_root_and_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(withheld.os, "geteuid", lambda: 1000)
    with pytest.raises(withheld.CourseError, match="needs root") as caught:
        withheld.withhold(tmp_path, withheld.GROUP, ["teacher"])
    assert "\n" not in str(caught.value) and not list(tmp_path.iterdir())
