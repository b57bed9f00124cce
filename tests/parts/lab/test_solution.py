"""The finished solution, launched for real: 2 gloo processes, two nodes on one machine, failures."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import QUICK, SOLUTION, TRAIN_SIZE, probe_env, reference_metrics, run_python, run_script

from autograde.engine import output, processes

pytestmark = pytest.mark.launch  # every test here starts processes

TWO_EPOCHS = [*QUICK[:-1], "2"]


def assert_trained_one_model(stdout: str, probe_dir: Path, world_size: int, stand_in: Path) -> None:
    """Rank 0 alone printed one line per epoch; every rank ends with the same weights; the
    printed numbers are the whole world's: images/sec summed, metrics over the whole validation set."""
    epochs = output.epochs(stdout)
    assert [e.epoch for e in epochs] == [1, 2], stdout
    weights = [torch.load(probe_dir / f"rank{r}.pt") for r in range(world_size)]
    # Parameters, not BatchNorm's running statistics: each rank updates those from its own batches
    # (DDP copies rank 0's to the others at the start of every forward pass).
    parameters = [k for k in weights[0] if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    for other in weights[1:]:
        assert all(torch.equal(weights[0][k], other[k]) for k in parameters), "ranks hold different models"
    last = epochs[-1]
    # Every process trains on its shard (TRAIN_SIZE / world_size images) in the same epoch time,
    # so the sum of their images/sec is the whole training set over the epoch time.
    assert last.images_per_sec == pytest.approx(TRAIN_SIZE / last.epoch_time, rel=0.05)
    loss, accuracy = reference_metrics(SOLUTION, weights[0], stand_in)
    assert last.val_loss == pytest.approx(loss, abs=2e-4)
    assert last.val_accuracy == pytest.approx(accuracy, abs=1.5e-4)


def test_two_processes_train_one_model(stand_in: Path, tmp_path: Path) -> None:
    result = run_script(SOLUTION, "--num-gpus", "2", "--data-dir", stand_in, *TWO_EPOCHS,
                       "--master-port", str(processes.free_port()), timeout=240, env=probe_env(tmp_path))
    assert result.returncode == 0, result.output
    assert_trained_one_model(result.stdout, tmp_path, 2, stand_in)
    assert not result.leftover


def node_command(node_id: int, port: int, stand_in: Path, *extra: str) -> list[str]:
    return [processes.PYTHON, str(SOLUTION), "--num-nodes", "2", "--node-id", str(node_id), "--num-gpus", "1",
            "--master-port", str(port), "--data-dir", str(stand_in), *extra]


def test_two_nodes_started_together_train_one_model(stand_in: Path, tmp_path: Path) -> None:
    port = processes.free_port()
    started = time.monotonic()
    nodes = [processes.start(node_command(i, port, stand_in, *TWO_EPOCHS), env=probe_env(tmp_path)) for i in (0, 1)]
    node0, node1 = (processes.finish(node, 240, started) for node in nodes)
    assert node0.returncode == 0 and node1.returncode == 0, node0.output + node1.output
    assert output.epochs(node1.stdout) == [], "only global rank 0 (on node 0) prints epochs"
    assert_trained_one_model(node0.stdout, tmp_path, 2, stand_in)


def test_sync_bn_on_cpu_says_so_and_goes_on(stand_in: Path, tmp_path: Path) -> None:
    result = run_script(SOLUTION, "--num-gpus", "2", "--sync-bn", "--data-dir", stand_in, *QUICK,
                       "--master-port", str(processes.free_port()), timeout=240)
    assert result.returncode == 0, result.output
    notes = [line for line in result.output.splitlines() if "--sync-bn" in line]
    assert len(notes) == 1 and "needs GPUs" in notes[0], result.output
    assert len(output.epochs(result.stdout)) == 1


def test_early_stopping_is_decided_together(stand_in: Path, tmp_path: Path) -> None:
    # Any accuracy reaches a target of 0: every rank must stop after epoch 1, together. A rank
    # that decided alone would leave the other waiting in a collective until the time limit.
    result = run_script(SOLUTION, "--num-gpus", "2", "--data-dir", stand_in, *QUICK[:-2], "--epochs", "5",
                       "--target-accuracy", "0", "--patience", "1",
                       "--master-port", str(processes.free_port()), timeout=120)
    assert result.returncode == 0, result.output
    assert [e.epoch for e in output.epochs(result.stdout)] == [1]
    assert result.stdout.count("stopping") == 1


def test_a_crash_in_one_rank_stops_every_rank(stand_in: Path, tmp_path: Path) -> None:
    result = run_python(SOLUTION, "--num-gpus", "2", "--data-dir", stand_in, *QUICK,
                        "--master-port", str(processes.free_port()), timeout=120,
                        env=probe_env(tmp_path, DDP_LAB_PROBE_CRASH_RANK="1"))
    assert not result.timed_out, "the surviving rank hung"
    assert result.returncode != 0
    assert "simulated crash in rank 1" in result.output
    assert not result.leftover, "a rank was left running"


def test_a_crashed_node_stops_the_other_node(stand_in: Path, tmp_path: Path) -> None:
    port = processes.free_port()
    started = time.monotonic()
    node0 = processes.start(node_command(0, port, stand_in, *QUICK))
    node1 = processes.start(node_command(1, port, stand_in, *QUICK),
                         env=probe_env(tmp_path, DDP_LAB_PROBE_CRASH_RANK="1"))
    first, second = processes.finish(node1, 120, started), processes.finish(node0, 120, started)
    assert "simulated crash in rank 1" in first.output
    assert not second.timed_out, "node 0 waited for the crashed node instead of stopping"
    assert first.returncode != 0 and second.returncode != 0
    assert not first.leftover and not second.leftover


def test_ctrl_c_stops_every_rank(stand_in: Path, tmp_path: Path) -> None:
    proc = processes.start([processes.PYTHON, SOLUTION, "--num-gpus", "2", "--data-dir", stand_in, *QUICK[:-2],
                         "--epochs", "100", "--master-port", str(processes.free_port())], env=probe_env(tmp_path))
    deadline = time.monotonic() + 120
    while not (tmp_path / "rank0.pt").exists():  # saved when the first validation starts
        assert proc.poll() is None and time.monotonic() < deadline, "training did not get going"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    result = processes.finish(proc, 30)
    assert not result.timed_out, f"Ctrl-C did not stop the run:\n{result.output}"
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == "interrupted", result.stderr
    assert not result.leftover
