"""The technical claims of notebooks 14, 15, 17 and 19 ("launching" and "scaling"), checked
against the installed PyTorch: read from its source's values, or run. Each test fails if the
fact it checks were different."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from autograde.parts.scaling import checks as scaling_check

pytestmark = pytest.mark.timeout(120)


# notebook 19: chained schedulers --------------------------------------------------------

def test_a_linear_lr_then_a_constant_lr_chained_rise_in_a_straight_line_then_hold() -> None:
    """Notebook 19: "chained schedulers" can give each step a warm-up's rate: SequentialLR of
    LinearLR (from start_factor of the rate, over an epoch) and ConstantLR(factor=1.0) gives the
    straight line from 0.02 to 0.08 over 16 steps, then 0.08, as a formula written out does."""
    from torch.optim.lr_scheduler import ConstantLR, LinearLR, SequentialLR

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.08)
    rise = LinearLR(optimizer, start_factor=0.25, total_iters=16)
    scheduler = SequentialLR(optimizer, [rise, ConstantLR(optimizer, factor=1.0, total_iters=0)], milestones=[16])
    rates = []
    for _ in range(40):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.02 + 0.06 * min(s, 16) / 16 for s in range(40)], rel=1e-9)
    assert np.allclose(np.diff(rates[:17]), 0.06 / 16)


# notebook 17: the bandwidth term of a ring all-reduce in the fit ---------------------------

NS = list(range(1, 9))


def _lstsq(times: dict[int, float]) -> np.ndarray:
    rows = np.array([[1 / n, 1.0, n - 1.0] for n in times])
    return np.linalg.lstsq(rows, np.array(list(times.values())), rcond=None)[0]


@pytest.mark.parametrize("bandwidth", [0.0, 3.0, 25.0])
def test_a_fit_of_the_model_puts_the_bandwidth_term_into_t_seq_and_t_par(bandwidth: float) -> None:
    """Notebook 17: times a/N + b + c(N-1) + d(N-1)/N (d: the all-reduce's bandwidth term,
    2KS/B) fit T(N) = t_par/N + t_seq + t_comm(N-1) exactly, with t_par = a - d, t_seq = b + d and
    t_comm = c: the fitted t_comm is the latency-like term alone, whatever d is."""
    a, b, c, d = 64.0, 2.0, 0.75, bandwidth
    times = {n: a / n + b + c * (n - 1) + d * (n - 1) / n for n in NS}
    for fitted in (_lstsq(times), np.array(scaling_check.time_model(times))):  # plain, and the graded fit's
        assert np.allclose(fitted, [a - d, b + d, c], rtol=0, atol=1e-9), fitted
        predicted = [scaling_check.model_time(fitted, n) for n in NS]
        assert np.allclose(predicted, list(times.values()), rtol=0, atol=1e-9)  # no residual: the same span


def test_the_checkers_two_core_study_predicts_more_for_16_processes_than_for_one() -> None:
    """Notebook 17: the checker's times from a 2-core machine (41.2, 24.9, 21.7, 20.8 s) give
    t_comm = 2.6 s and T(16) = 45 s, above T(1)."""
    times = {1: 41.2, 2: 24.9, 3: 21.7, 4: 20.8}
    assert scaling_check.STUDIES[1] == times
    params = scaling_check.time_model(times)
    assert round(params[2], 1) == 2.6
    assert round(scaling_check.model_time(params, 16)) == 45 > times[1]


def test_the_full_wide_resnet_has_17_million_parameters_68_mb_of_float32_gradients() -> None:
    """Notebook 17: 17.1 million parameters, 68 MB of float32 gradients."""
    from conftest import ROOT, load_module

    model = load_module(ROOT / "solutions" / "large_batch_training.py").WideResNet(10)
    count = sum(p.numel() for p in model.parameters())
    assert round(count / 1e6, 1) == 17.1 and round(count * 4 / 1e6) == 68


# notebook 14: time-outs, init_method, and what torchrun puts in the environment ------------

def test_default_timeouts_are_30_minutes_for_gloo_and_10_for_nccl() -> None:
    from torch.distributed import constants, distributed_c10d

    assert constants.default_pg_timeout == datetime.timedelta(minutes=30)
    assert constants.default_pg_nccl_timeout == datetime.timedelta(minutes=10)
    assert distributed_c10d._get_default_timeout("gloo") == datetime.timedelta(minutes=30)
    assert distributed_c10d._get_default_timeout("nccl") == datetime.timedelta(minutes=10)


def _run(command: list[str], env: dict[str, str], timeout: float = 100) -> subprocess.CompletedProcess[str]:
    """`command` in a session of its own, killed whole (torchrun and its workers) if it overstays."""
    proc = subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                          "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@pytest.mark.launch
def test_init_process_group_reads_rank_and_world_size_from_the_environment() -> None:
    """Notebook 14's hints: with neither rank= nor world_size=, init_process_group's default
    init_method "env://" reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""
    from autograde.engine import processes

    program = ("import torch.distributed as dist; dist.init_process_group('gloo'); "
               "print(dist.get_rank(), dist.get_world_size()); dist.destroy_process_group()")
    result = _run([sys.executable, "-c", program],
                  _env(OMP_NUM_THREADS="1", RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(processes.free_port())), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1"]


# each process writes its own file: lines of two processes on one pipe could interleave
SHOW = ("import json, os, sys; names = ('RANK', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'WORLD_SIZE', 'OMP_NUM_THREADS'); "
        "open(os.path.join(sys.argv[1], 'env-' + os.environ['RANK'] + '.json'), 'w').write("
        "json.dumps({n: os.environ.get(n) for n in names}))")


@pytest.mark.launch
@pytest.mark.parametrize("nproc", [1, 2])
def test_torchrun_sets_omp_num_threads_only_when_it_starts_several_processes_per_node(nproc: int, tmp_path: Path) -> None:
    """Notebook 14: with OMP_NUM_THREADS unset, torchrun sets it to 1 (and warns) when it starts
    more than one process per node, and leaves it unset for one; it gives every process its
    RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and WORLD_SIZE."""
    script = tmp_path / "show_env.py"
    script.write_text(SHOW + "\n")
    result = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   str(script), str(tmp_path)], _env())
    assert result.returncode == 0, result.stdout + result.stderr
    rows = sorted((json.loads(p.read_text()) for p in tmp_path.glob("env-*.json")), key=lambda r: int(r["RANK"]))
    assert [r["RANK"] for r in rows] == [str(k) for k in range(nproc)]
    assert all(r["LOCAL_RANK"] == r["RANK"] and r["LOCAL_WORLD_SIZE"] == r["WORLD_SIZE"] == str(nproc) for r in rows)
    warned = "Setting OMP_NUM_THREADS environment variable" in result.stderr
    if nproc == 1:
        assert all(r["OMP_NUM_THREADS"] is None for r in rows) and not warned, result.stderr
    else:
        assert all(r["OMP_NUM_THREADS"] == "1" for r in rows) and warned, result.stderr


# notebook 15: loading a checkpoint ---------------------------------------------------------

def test_the_rng_state_to_restore_must_be_a_cpu_byte_tensor() -> None:
    """Notebook 15's hints: torch.set_rng_state wants a CPU tensor (what torch.get_rng_state gives)."""
    state = torch.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        torch.set_rng_state(state.to("meta"))
    torch.set_rng_state(state)


def test_torch_load_puts_a_tensor_back_where_it_was_saved_unless_map_location_says(tmp_path: Path) -> None:
    """Notebook 15: a saved tensor is loaded onto the device it was saved from; map_location moves it."""
    path = tmp_path / "t.pt"
    torch.save({"w": torch.ones(2)}, path)
    seen = []

    def where(storage, location):  # called with the saved location of each storage
        seen.append(location)
        return storage

    torch.load(path, map_location=where)
    assert seen == ["cpu"]
    assert torch.load(path)["w"].device.type == "cpu"
    assert torch.load(path, map_location="meta")["w"].device.type == "meta"
