"""Bad input gets one clear line and a non-zero exit: no traceback, no hang, nothing left running."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import QUICK, ROOT, SOLUTION, STARTER, assert_clean_error, probe_env, run_python

from autograde.engine import processes
from autograde.grading import registry

pytestmark = pytest.mark.launch  # every test here starts processes

# Stands in for "no network": urllib sends every download to a port where nothing listens.
OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}


def solution(*args: str | Path, timeout: float = 60, env: dict[str, str] | None = None) -> processes.Result:
    return run_python(SOLUTION, *args, timeout=timeout, env=env)


@pytest.mark.parametrize("args, words", [
    (["--num-gpus", "0"], ["--num-gpus", "at least 1"]),
    (["--num-nodes", "0"], ["--num-nodes", "at least 1"]),
    (["--num-nodes", "2", "--node-id", "2"], ["--node-id", "between 0 and 1"]),
    (["--node-id", "-1"], ["--node-id"]),
    (["--num-gpus", "two"], ["--num-gpus", "invalid int"]),
])
def test_impossible_layouts_are_refused(args: list[str], words: list[str]) -> None:
    assert_clean_error(solution(*args, "--master-port", str(processes.free_port())), *words)


def test_more_processes_than_gpus_is_refused(tmp_path: Path) -> None:
    # CI has no GPU: the probe makes torch.cuda report 2, which is all the check looks at.
    result = solution("--num-gpus", "3", env=probe_env(tmp_path, DDP_LAB_PROBE_FAKE_GPUS="2"))
    assert_clean_error(result, "--num-gpus is 3", "2 GPU(s)")


def test_busy_master_port_is_refused(stand_in: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = solution("--num-gpus", "2", "--data-dir", stand_in, *QUICK, "--master-port", str(port))
    assert_clean_error(result, f"port {port} is busy", "--master-port")


@pytest.mark.parametrize("script", [STARTER, SOLUTION], ids=["starter", "solution"])
def test_offline_without_data_says_where_to_put_it(script: Path, tmp_path: Path) -> None:
    args = ["--data-dir", tmp_path / "data", *QUICK]
    if script == SOLUTION:
        args += ["--num-gpus", "2", "--master-port", str(processes.free_port())]
    result = run_python(script, *args, timeout=90, env=OFFLINE)
    assert_clean_error(result, "no Fashion-MNIST", str(tmp_path / "data"), "make synthetic-data")


def test_unwritable_data_dir_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = solution("--num-gpus", "2", "--data-dir", blocker / "data", *QUICK,
                      "--master-port", str(processes.free_port()), env=OFFLINE)
    assert_clean_error(result, "no Fashion-MNIST", "a_file")


def test_gpu_check_says_no_gpu_in_one_line_where_there_is_none() -> None:
    result = processes.run(["make", "--no-print-directory", "-s", "gpu-check"], timeout=300, cwd=ROOT,
                        env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.output
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith("make gpu-check: no GPU on this machine") and not result.stderr, result.output


# the later parts' programs (a data-only exercise, such as the predictions, takes no arguments)
EXERCISES = sorted({file for part in registry.PARTS if part.id != registry.FIRST for file in part.files
                    if "--world-size" in (ROOT / file).read_text()})


@pytest.mark.parametrize("exercise", EXERCISES)
@pytest.mark.parametrize("value,words", [("0", "below 1"), ("two", "not a whole number")])
def test_an_exercise_refuses_a_bad_world_size_in_one_line(exercise: str, value: str, words: str) -> None:
    result = run_python(ROOT / exercise, "--world-size", value, timeout=60)
    assert_clean_error(result, "--world-size", words)
