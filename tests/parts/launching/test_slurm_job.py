"""The batch-script exercise of notebook 16 (exercises/slurm_job.sbatch, item slurm_job) and the
claims the notebook and the check make about it, each checked under a real SLURM (the `slurm`
fixture: the course's cluster of emulated nodes n1, n2) or against the installed PyTorch: srun
stops the other tasks only when asked to, sbatch's command line wins over the #SBATCH lines,
exports in double quotes give every task the batch script's own values, and how the untouched
file fails.

The check itself is judged on recordings (tests/core/test_checks_recorded.py -k slurm_job)."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from conftest import ROOT, Slurm

from autograde.engine import processes
from autograde.engine.run import STALL_SECONDS
from autograde.grading import api
from autograde.parts.launching import checks_slurm as checks
from autograde.parts.launching import inprocess as launching

pytestmark = pytest.mark.timeout(120)

EXERCISE = ROOT / "exercises" / "slurm_job.sbatch"
SOLUTION = ROOT / "solutions" / "slurm_job.sbatch"


def _job(slurm: Slurm, tmp_path: Path, body: str, *options: str) -> processes.Result:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n" + body)
    return slurm.job(*options, script, timeout=60, cwd=tmp_path)


def _sbatch_lines(script: Path) -> dict[str, str]:
    """The options of a batch script's #SBATCH lines, as `--name=value` says them."""
    found = {}
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH --"):
            name, _, value = line.split()[1][2:].partition("=")
            found[name] = value
    return found


# task 1 fails at once; task 0 writes a file 4 s later, unless it was stopped before
FAILING_STEP = ("srun {option} bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 4; touch ran-on' \n")


@pytest.mark.launch
@pytest.mark.parametrize("option,stopped", [("", False), ("--kill-on-bad-exit=0", False), ("-K", True),
                                            ("-K1", True), ("--kill-on-bad-exit", True), ("--kill-on-bad-exit=1", True)])
def test_srun_stops_the_other_tasks_only_when_asked(slurm: Slurm, tmp_path: Path, option: str, stopped: bool) -> None:
    """As on a cluster whose KillOnBadExit is 0 (SLURM's default): without -K/--kill-on-bad-exit,
    the other tasks of a step run on when one fails; with it, they are stopped."""
    result = _job(slurm, tmp_path, "#SBATCH --ntasks-per-node=2\n" + FAILING_STEP.format(option=option))
    assert result.returncode != 0, result.output  # the job fails either way
    assert (tmp_path / "ran-on").exists() is not stopped, result.output


@pytest.mark.launch
def test_sbatchs_command_line_wins_over_the_sbatch_lines(slurm: Slurm, tmp_path: Path) -> None:
    """The layout given to sbatch replaces the one the script asks for, and srun with no layout of
    its own starts the job's tasks: 1 node x 3 tasks, not the script's 2 x 2."""
    body = "#SBATCH --nodes=2 --ntasks-per-node=2\nsrun bash -c 'echo task $SLURM_PROCID node $SLURM_NODEID'\n"
    asked = _job(slurm, tmp_path, body)
    given = _job(slurm, tmp_path, body, "--nodes", "1", "--ntasks-per-node", "3")
    assert sorted(line for line in asked.stdout.splitlines() if line.startswith("task")) == [
        f"task {t} node {t // 2}" for t in range(4)], asked.output
    assert sorted(line for line in given.stdout.splitlines() if line.startswith("task")) == [
        f"task {t} node 0" for t in range(3)], given.output


@pytest.mark.launch
def test_exports_in_double_quotes_give_every_task_rank_0(slurm: Slurm, tmp_path: Path) -> None:
    """Notebook 16: in double quotes the batch script expands $SLURM_PROCID once, to its own 0,
    before srun starts the tasks; in single quotes each task expands its own."""
    body = "#SBATCH --ntasks-per-node=3\nsrun bash -c \"echo double $SLURM_PROCID\"\nsrun bash -c 'echo single $SLURM_PROCID'\n"
    lines = _job(slurm, tmp_path, body).stdout.split()
    assert [lines[k + 1] for k, w in enumerate(lines) if w == "double"] == ["0", "0", "0"], lines
    assert sorted(lines[k + 1] for k, w in enumerate(lines) if w == "single") == ["0", "1", "2"], lines


@pytest.mark.launch
def test_srun_in_double_quotes_fails_the_check_in_its_own_words(slurm: Slurm, tmp_path: Path) -> None:
    """As a learner checks it (api.check_steps: a run spoilt from outside is made again, then blamed on
    the checker): a batch script whose srun command is in double quotes gives every task the batch shell's
    rank 0, so that two tasks of a node both host rank 0's store on one port. That is the script's mistake,
    said as such, never the checker's "a port it was given was taken by another program"."""
    script = tmp_path / "slurm_job.sbatch"
    script.write_text(SOLUTION.read_text().replace("bash -c '", 'bash -c "').replace("' bash", '" bash'))
    _ = slurm.env  # the session's cluster, up (the check finds it running)
    (verdict,) = api.check_steps(["slurm_job"], script, fresh=True, quiet=True)
    assert verdict.passed is False and not verdict.checker_error, verdict
    assert "expanded once, by the batch script's own shell" in verdict.observed, verdict.observed
    assert verdict.hint and "single quotes" in verdict.hint, verdict.hint


def test_the_solution_asks_for_the_checks_layout_and_the_exercise_for_none() -> None:
    """The check's JOB_LAYOUT is what solutions/slurm_job.sbatch asks for; the handed-out file asks
    for no layout (SLURM's default: 1 node, 1 task), so that the untouched file fails the check."""
    nodes, per_node = checks.JOB_LAYOUT
    assert _sbatch_lines(SOLUTION) == {
        "job-name": "slurm-job", "nodes": str(nodes), "ntasks-per-node": str(per_node), "time": "00:30:00"}
    assert _sbatch_lines(EXERCISE) == {"job-name": "slurm-job", "time": "00:30:00"}
    assert "# TODO slurm_job" in EXERCISE.read_text()


@pytest.mark.launch
def test_the_untouched_file_fails_in_init_process_group() -> None:
    """Notebook 16: the untouched script's one task, with no RANK, stops in init_process_group with
    "environment variable RANK expected, but not set" (the recording of the check's run); the
    lab's torchrun script, the batch script's default $TRAIN_SCRIPT, refuses before it gets there."""
    record = json.loads(gzip.decompress((ROOT / "tests" / "recorded" / "slurm_job_exercise.json.gz").read_bytes()))
    assert record["script"] == EXERCISE.read_text()
    output = record["runs"]["slurm_job/asked"]["results"][0]["stdout"]  # the job's output, as the runner shows it
    assert "environment variable RANK expected, but not set" in output, output
    assert "task 0: Exited with exit code 1" in output and "task 1" not in output, output
    assert "TRAIN_SCRIPT=${TRAIN_SCRIPT:-solutions/fashion_mnist_torchrun.py}" in EXERCISE.read_text()
    assert "RANK" not in os.environ  # pytest's own environment: the task's, with none of the six
    result = processes.run([processes.PYTHON, ROOT / "solutions" / "fashion_mnist_torchrun.py"], timeout=60, cwd=ROOT)
    assert result.returncode == 2 and "start me with torchrun" in result.stderr, result.output


@pytest.mark.launch
def test_bash_c_gives_the_word_after_the_command_to_0_and_the_rest_to_its_arguments() -> None:
    """Hint 2 of notebook 16: in `bash -c '...' bash "$@"`, the word after the command becomes $0
    and the job's arguments become "$@"."""
    result = processes.run(["bash", "-c", 'echo "$0|$1|$#"', "bash", "a b", "c"], timeout=10)
    assert result.stdout == "bash|a b|2\n", result.output


@pytest.mark.launch
def test_the_batch_script_runs_on_the_first_node_of_the_job(slurm: Slurm, tmp_path: Path) -> None:
    """Notebook 16: sbatch runs the batch script once, on the job's first node (n1 of n[1-2])."""
    result = _job(slurm, tmp_path, "#SBATCH --nodes=2\necho \"$SLURMD_NODENAME $(hostname) $SLURM_JOB_NODELIST\"\n")
    assert result.stdout.splitlines()[1:] == ["n1 n1 n[1-2]"], result.output


def test_the_probe_waits_longer_than_the_checker_calls_a_stall() -> None:
    """The failing job's verdict rests on this: a task left waiting in the probe's
    init_process_group (60 s) is still waiting when the checker stops the run as stalled."""
    assert launching.PROBE_GROUP_TIMEOUT > STALL_SECONDS
