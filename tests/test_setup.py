"""Set-up files agree with each other, and `make run` picks its data honestly."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from autograde import data, launch, output
from conftest import ROOT


def pins(text: str) -> set[str]:
    return set(re.findall(r"^[\s-]*([A-Za-z0-9_.\-]+==[^\s#]+)", text, flags=re.MULTILINE))


def test_conda_environment_has_the_pip_pins() -> None:
    pip_pins = pins((ROOT / "requirements.txt").read_text()) | pins((ROOT / "requirements-test.txt").read_text())
    assert "torch==2.14.1" in pip_pins and "torchvision==0.29.1" in pip_pins
    assert pins((ROOT / "environment.yml").read_text()) == pip_pins


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()


def make_run(data_dir: Path, synthetic_dir: Path) -> launch.Result:
    return launch.run([launch.PYTHON, "-m", "autograde.run", "--data-dir", data_dir, "--synthetic-dir", synthetic_dir,
                       "--synthetic-size", "640", "301", "--", "--epochs", "1", "--batch-size", "64",
                       "--master-port", str(launch.free_port())], timeout=240, cwd=ROOT)


def test_make_run_without_data_trains_on_the_labelled_stand_in(tmp_path: Path) -> None:
    result = make_run(tmp_path / "data", tmp_path / "synthetic")
    assert result.returncode == 0, result.output
    assert "SYNTHETIC STAND-IN DATA" in result.stdout and "NOT Fashion-MNIST results" in result.stdout
    assert "2 CPU processes" in result.stdout
    assert data.is_synthetic(tmp_path / "synthetic")
    assert len(output.epochs(result.stdout)) == 1


def test_make_run_with_the_data_set_uses_it_without_a_banner(tmp_path: Path) -> None:
    # Real files are IDX files without the stand-in's label; stand-in bytes play them here.
    raw = data.write_synthetic(tmp_path / "made", 640, 301, seed=9)
    real = tmp_path / "data" / "FashionMNIST" / "raw"
    real.mkdir(parents=True)
    for f in raw.glob("*-ubyte"):
        shutil.copy(f, real)
    result = make_run(tmp_path / "data", tmp_path / "synthetic")
    assert result.returncode == 0, result.output
    assert "SYNTHETIC" not in result.stdout and "stand-in" not in result.stdout
    assert not (tmp_path / "synthetic").exists()
    assert len(output.epochs(result.stdout)) == 1


def test_every_make_target_in_the_readme_is_defined_once() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = sorted(set(re.findall(r"`make ([a-z-]+)", readme)))
    assert {"lab", "test", "run", "check", "bench", "data", "synthetic-data", "release", "grade", "learner-mode",
            "instructor-mode", "test-notebooks"} <= set(targets)
    for target in targets:
        dry = launch.run(["make", "-n", target], timeout=60, cwd=ROOT)
        assert dry.returncode == 0, dry.output
        assert "warning" not in dry.stderr.lower(), dry.stderr


def test_learner_mode_switches_nbgraders_instructor_tools_off_and_instructor_mode_on(tmp_path: Path) -> None:
    env = {"JUPYTER_CONFIG_DIR": str(tmp_path)}  # a config of its own, not this machine's
    instructor_only = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                       "@jupyter/nbgrader:course-list"]

    def disabled() -> str:
        listing = launch.run([Path(launch.PYTHON).parent / "jupyter", "labextension", "list"], timeout=120, env=env)
        return listing.output.partition("Disabled extensions:")[2]

    learner = launch.run(["make", "--no-print-directory", "learner-mode", "EXT_LEVEL=user"], cwd=ROOT, env=env,
                         timeout=300)
    assert learner.returncode == 0, learner.output
    off = disabled()
    assert all(name in off for name in instructor_only) and "assignment-list" not in off, off
    instructor = launch.run(["make", "--no-print-directory", "instructor-mode", "EXT_LEVEL=user"], cwd=ROOT,
                            env=env, timeout=300)
    assert instructor.returncode == 0, instructor.output
    assert not any(name in disabled() for name in instructor_only)
