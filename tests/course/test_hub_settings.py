"""The class hub's settings, GPU policy and first login, without a hub (tests/course/test_class_hub.py runs one)."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT

from autograde.course.hub import limits, settings, start
from autograde.engine import processes
from autograde.parts.capstone import checks

GOOD = 'instructors = ["teacher"]\nlearners = ["ada", "grace"]\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "class.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("index, learners, gpus, per_learner, expected", [
    (0, 4, 8, 0, [0, 1]), (3, 4, 8, 0, [6, 7]),  # split evenly: two each
    (1, 3, 8, 0, [2, 3]),  # 8 // 3 = 2 each; GPUs 6 and 7 stay free
    (0, 5, 2, 0, [0]), (1, 5, 2, 0, [1]), (4, 5, 2, 0, [0]),  # fewer GPUs than learners: shared in turn
    (1, 2, 4, 1, [1]),  # one GPU each, by the setting
    (2, 3, 4, 3, [0, 2, 3]),  # three each on four GPUs: the third learner wraps around to GPU 0
    (0, 2, 0, 0, []),  # no GPU: nothing to see
])
def test_the_gpu_policy(index: int, learners: int, gpus: int, per_learner: int, expected: list[int]) -> None:
    assert limits.gpus_for(index, learners, gpus, per_learner) == expected


def test_every_learner_gets_a_gpu_and_no_gpu_is_shared_while_there_are_enough() -> None:
    for gpus in range(1, 9):
        for learners in range(1, 12):
            given = [limits.gpus_for(i, learners, gpus) for i in range(learners)]
            assert all(given), (gpus, learners, given)
            if gpus >= learners:
                flat = [g for each in given for g in each]
                assert len(flat) == len(set(flat)), (gpus, learners, given)


def test_the_shipped_settings_load() -> None:
    s = settings.load(ROOT / "deploy" / "jupyterhub" / "class.toml")
    assert s.spawner == "local" and s.instructors and s.learners and s.course == ROOT
    assert s.role(s.instructors[0]) == "instructor" and s.role(s.learners[0]) == "learner"
    assert settings.size_in_bytes(s.local.memory) == 8 * 2**30
    assert s.local.checks_at_once >= 0
    assert s.capstone.speedups == list(checks.SPEEDUPS)  # the course's, measured (autograde/parts/capstone/checks.py)


def test_checks_at_once_gives_learners_a_line_and_instructors_none(tmp_path: Path) -> None:
    """The class's line of checks reaches each learner's server through its environment (spawners.py)."""
    from autograde import settings as course_settings
    from autograde.course.hub import spawners

    loaded = settings.load(write(tmp_path, GOOD + 'port = 8123\n[local]\nchecks_at_once = 3\n'))
    assert loaded.local.checks_at_once == 3 and loaded.check_queue == Path("/tmp/ddp-lab-checks-8123")
    assert settings.load(write(tmp_path, GOOD)).local.checks_at_once == 0  # by default, no line
    env = spawners.queue_env(loaded, "ada")
    assert env == {course_settings.CHECK_QUEUE: "/tmp/ddp-lab-checks-8123", course_settings.CHECKS_AT_ONCE: "3"}
    assert spawners.queue_env(loaded, "teacher") == {}  # grading is not queued behind learners' checks


@pytest.mark.parametrize("text, words", [
    (GOOD + 'spawner = "kubernetes"\n', ["spawner", "local, slurm"]),
    (GOOD + 'ports = 80\n', ["no setting 'ports'"]),
    ('instructors = ["teacher"]\nlearners = "ada"\n', ["learners must be a list"]),
    ('instructors = []\nlearners = ["ada"]\n', ["at least one instructor"]),
    ('instructors = ["ada"]\nlearners = ["ada"]\n', ["'ada' is both"]),
    ('instructors = ["Teacher One"]\nlearners = []\n', ["not a Unix user name"]),
    (GOOD + '[local]\nmemory = "lots"\n', ["[local] memory", "512M or 8G"]),
    (GOOD + '[local]\ngpu = 2\n', ["[local] has no setting 'gpu'"]),
    (GOOD + '[local]\nchecks_at_once = -1\n', ["[local] checks_at_once = -1", "0: no line"]),
    (GOOD + '[local]\nchecks_at_once = "two"\n', ["[local] checks_at_once = 'two'", "whole number"]),
    (GOOD + '[capstone]\nspeedups = [1.5, 1.2]\n', ["[capstone] speedups = [1.5, 1.2]", "the lower first"]),
    (GOOD + '[capstone]\nspeedups = 1.2\n', ["[capstone] speedups = 1.2", "such as [1.15, 1.3]"]),
    (GOOD + 'course = "/nowhere"\n', ["not the course's folder"]),
    ("instructors = [", ["not valid TOML"]),
])
def test_a_wrong_setting_is_one_line_that_names_it(tmp_path: Path, text: str, words: list[str]) -> None:
    with pytest.raises(settings.SettingsError) as caught:
        settings.load(write(tmp_path, text))
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_no_settings_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(settings.SettingsError, match="copy deploy/jupyterhub/class.toml"):
        settings.load(tmp_path / "missing.toml")


def test_a_closed_folder_on_the_way_is_named() -> None:
    with tempfile.TemporaryDirectory() as base:  # in /tmp, open to all (pytest's tmp_path is under a closed folder)
        os.chmod(base, 0o755)
        closed = Path(base) / "closed"
        (closed / "inside").mkdir(parents=True)
        closed.chmod(0o700)
        assert settings.closed_folders(closed / "inside") == [closed]
        with pytest.raises(settings.SettingsError, match=f"chmod o\\+x {closed}"):
            settings.check_open_to_class(closed / "inside")
        closed.chmod(0o711)
        settings.check_open_to_class(closed / "inside")


def test_the_first_login_copies_the_course_once(tmp_path: Path) -> None:
    copied = start.copy_course(ROOT, tmp_path)
    assert copied == tmp_path / start.COPY
    assert (copied / "fashion_mnist.py").read_text() == (ROOT / "fashion_mnist.py").read_text()
    assert sorted(p.name for p in (copied / "notebooks").glob("*.ipynb")) == \
        sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    (copied / "fashion_mnist.py").write_text("# my work\n")
    assert start.copy_course(ROOT, tmp_path) is None  # a later login keeps the learner's copy
    assert (copied / "fashion_mnist.py").read_text() == "# my work\n"


@pytest.mark.launch
def test_the_hub_stops_at_a_wrong_setting_with_one_line(tmp_path: Path) -> None:
    bad = write(tmp_path, GOOD + 'spawner = "cloud"\n')
    done = subprocess.run([str(Path(processes.PYTHON).parent / "jupyterhub"), "-f",
                           str(ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py")], cwd=tmp_path,
                          env={**os.environ, "DDP_LAB_CLASS": str(bad)}, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and "spawner = 'cloud'" in lines[-1], done.stderr
    assert "Traceback" not in done.stderr, done.stderr
