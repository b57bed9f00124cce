"""Set-up files agree with each other, and `make run` picks its data honestly."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from autograde import data
from autograde.engine import output, processes


def pins(text: str) -> set[str]:
    return set(re.findall(r"^[\s-]*([A-Za-z0-9_.\-]+==[^\s#]+)", text, flags=re.MULTILINE))


def test_every_requirement_is_pinned_and_the_conda_environment_has_the_same_pins() -> None:
    pip_pins: set[str] = set()
    for name in ("requirements.txt", "requirements-test.txt"):
        text = (ROOT / name).read_text()
        lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        assert len(pins(text)) == len(lines), f"{name}: a requirement without its == pin: {lines}"
        pip_pins |= pins(text)
    assert pins((ROOT / "environment.yml").read_text()) == pip_pins


# Stand-ins for the commands .ci/run starts: each writes its name and arguments on a line of LOG.
STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$LOG"
"""


@pytest.mark.launch
def test_ci_installs_chromium_where_it_is_missing_then_runs_make_test_and_nothing_else(tmp_path: Path) -> None:
    """.ci/run with make, apt-get and id replaced by stubs on PATH (id says root, so that the
    Chromium branch runs wherever /usr/bin/chromium is missing): `make test` is the one make it
    starts, after any apt-get, and it fails when make fails."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    for name in ("make", "apt-get"):
        (bin_dir / name).write_text(STUB)
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "failing-make").write_text(STUB + "exit 3\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LOG": str(log)}
    ci = subprocess.run(["bash", ROOT / ".ci" / "run"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ci.returncode == 0, ci.stdout + ci.stderr
    ran = log.read_text().splitlines()
    assert ran[-1] == "make test" and [line for line in ran if line.startswith("make")] == ["make test"], ran
    if not os.access("/usr/bin/chromium", os.X_OK):
        assert ran[:-1] == ["apt-get update -qq", "apt-get install -y -qq chromium"], ran
    else:
        assert ran == ["make test"], ran
    (bin_dir / "failing-make").rename(bin_dir / "make")
    failed = subprocess.run(["bash", ROOT / ".ci" / "run"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode == 3, failed.stdout + failed.stderr


def make_run(data_dir: Path, synthetic_dir: Path) -> processes.Result:
    return processes.run([processes.PYTHON, "-m", "autograde.tools.run", "--data-dir", data_dir, "--synthetic-dir", synthetic_dir,
                       "--synthetic-size", "640", "301", "--", "--epochs", "1", "--batch-size", "64",
                       "--master-port", str(processes.free_port())], timeout=240, cwd=ROOT)


@pytest.mark.launch
def test_make_run_without_data_trains_on_the_labelled_stand_in(tmp_path: Path) -> None:
    result = make_run(tmp_path / "data", tmp_path / "synthetic")
    assert result.returncode == 0, result.output
    assert "SYNTHETIC STAND-IN DATA" in result.stdout and "NOT Fashion-MNIST results" in result.stdout
    assert "2 CPU processes" in result.stdout
    assert data.is_synthetic(tmp_path / "synthetic")
    assert len(output.epochs(result.stdout)) == 1


@pytest.mark.launch
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


@pytest.mark.launch
def test_every_make_target_in_the_readme_is_defined_once() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = sorted(set(re.findall(r"`make ([a-z-]+)", readme)))
    assert {"lab", "test", "run", "check", "bench", "data", "synthetic-data", "release", "grade", "learner-mode",
            "instructor-mode", "test-notebooks"} <= set(targets)
    for target in targets:
        dry = processes.run(["make", "-n", target], timeout=60, cwd=ROOT)
        assert dry.returncode == 0, dry.output
        assert "warning" not in dry.stderr.lower(), dry.stderr


INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:course-list"]
INSTRUCTOR_SERVER_EXTENSIONS = ["nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list"]
VENV = Path(processes.PYTHON).parent.parent
# What a Jupyter server started with `env` would load: which plugins are off, which server extensions on.
EFFECTIVE = """import json, os
from jupyter_core.paths import jupyter_config_path
from jupyter_server.extension.config import ExtensionConfigManager
from jupyterlab_server.config import get_static_page_config
print(json.dumps({"disabled": [k for k, v in get_static_page_config(level="all").get("disabledExtensions", {}).items() if v],
                  "server": ExtensionConfigManager(read_config_path=jupyter_config_path()).get_jpserver_extensions()}))"""


def effective(env: dict[str, str]) -> tuple[set[str], dict[str, bool]]:
    found = processes.run([processes.PYTHON, "-c", EFFECTIVE], timeout=120, env=env)
    assert found.returncode == 0, found.output
    loaded = json.loads(found.stdout)
    return set(loaded["disabled"]), loaded["server"]


@pytest.mark.launch
def test_setup_leaves_the_environment_in_the_mode_chosen_there_with_its_jupyter_settings() -> None:
    mode = (VENV / "etc" / "jupyter" / "ddp-lab-mode").read_text().strip()  # written by make setup
    assert mode in ("learner", "instructor")
    if os.environ.get("CI"):
        assert mode == "learner"  # a fresh clone's make setup: the learner's view
    level = os.path.join(VENV, "etc", "jupyter")
    disabled, server = effective({"JUPYTER_CONFIG_PATH": "", "JUPYTER_CONFIG_DIR": level})
    on = mode == "instructor"
    assert all((plugin in disabled) != on for plugin in INSTRUCTOR_PLUGINS), disabled
    assert all(server[name] == on for name in INSTRUCTOR_SERVER_EXTENSIONS), server
    assert server["nbgrader.server_extensions.validate_assignment"] and server["nbgrader.server_extensions.assignment_list"]
    for name in ("jupyter_server_config.py", "nbgrader_config.py", "ddp-lab-terminal.bashrc"):
        assert (VENV / "etc" / "jupyter" / name).read_text() == (ROOT / "jupyter-config" / name).read_text(), name
    overrides = VENV / "share" / "jupyter" / "lab" / "settings" / "overrides.d" / "ddp-lab.json"
    assert json.loads(overrides.read_text())["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


@pytest.mark.launch
def test_learner_mode_switches_nbgraders_instructor_tools_off_and_instructor_mode_on(tmp_path: Path) -> None:
    # A config of its own (EXT_LEVEL=user), read before the environment's, which stays as it is.
    env = {"JUPYTER_CONFIG_DIR": str(tmp_path), "JUPYTER_PREFER_ENV_PATH": "0"}
    for mode, on in (("instructor", True), ("learner", False), ("instructor", True)):
        switched = processes.run(["make", "--no-print-directory", f"{mode}-mode", "EXT_LEVEL=user"], cwd=ROOT, env=env,
                              timeout=300)
        assert switched.returncode == 0, switched.output
        assert f"{mode} mode ({tmp_path})" in switched.stdout, switched.output
        disabled, server = effective(env)
        assert all((plugin in disabled) != on for plugin in INSTRUCTOR_PLUGINS), (mode, disabled)
        assert "@jupyter/nbgrader:assignment-list" not in disabled
        assert all(server[name] == on for name in INSTRUCTOR_SERVER_EXTENSIONS), (mode, server)
        assert server["nbgrader.server_extensions.validate_assignment"], server


@pytest.mark.launch
def test_lab_mode_says_what_is_wrong_in_one_line() -> None:
    wrong = processes.run([processes.PYTHON, ROOT / "jupyter-config" / "lab_mode.py", "teacher"], timeout=60)
    assert wrong.returncode == 2 and "invalid choice: 'teacher'" in wrong.stderr, wrong.output
    assert "Traceback" not in wrong.output


@pytest.mark.launch
def test_lab_terminals_have_the_environments_python_first_although_a_login_shell_resets_path(tmp_path: Path) -> None:
    """JupyterLab runs the bash that the environment's jupyter_server_config.py names; its start-up file
    reads what a login shell reads (Debian's /etc/profile sets PATH afresh), then puts the environment first."""
    shown = processes.run([VENV / "bin" / "jupyter", "server", "--show-config"], timeout=120, cwd=tmp_path)
    rcfile = VENV / "etc" / "jupyter" / "ddp-lab-terminal.bashrc"
    assert str(rcfile) in shown.stdout and "shell_command" in shown.stdout, shown.output
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("PATH=/usr/bin:/bin\n")  # a start-up file that sets PATH too
    plain_path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != VENV / "bin")
    shell = subprocess.run(["bash", "--rcfile", str(rcfile), "-i"], input="command -v python; command -v jupyter\n",
                           env={**os.environ, "PATH": plain_path, "HOME": str(home)}, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert shell.stdout.split() == [str(VENV / "bin" / "python"), str(VENV / "bin" / "jupyter")], shell


@pytest.mark.launch
def test_validate_button_gives_a_check_cell_the_graders_time_limit() -> None:
    """nbgrader's Validate button reads its config the way its server extension does, from the server's folder."""
    timeout = processes.run([processes.PYTHON, "-c", """
from nbgrader.preprocessors import Execute
from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler
from nbgrader.validator import Validator
print(Execute(parent=Validator(config=ValidateAssignmentHandler.load_config(None))).timeout)"""], timeout=120, cwd=ROOT)
    assert timeout.returncode == 0, timeout.output
    assert timeout.stdout.split()[-1] == "1800", timeout.output
