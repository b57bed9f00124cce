"""Which devices the checker's runs use on machines with 0 to 8 GPUs, and the GPU-only criteria of Steps 4
and 7 on recorded events: logic a CPU machine can test (one workers run checks the plumbing)."""
from __future__ import annotations

import pytest
from conftest import recorded_trace

from autograde.parts.lab import runs as devices

LAYOUTS = [(2, 2), (3, 1), (1, 3)]  # (processes per node, nodes): the default and the hidden tests'


@pytest.mark.parametrize("gpus", [0, 1, 2, 3, 4, 8])
@pytest.mark.parametrize("procs_per_node,nodes", LAYOUTS)
def test_no_group_holds_two_ranks_on_one_gpu(gpus: int, procs_per_node: int, nodes: int) -> None:
    planned = devices.devices_plan(gpus, procs_per_node, nodes)
    layouts = {"workers": (nodes, procs_per_node), **devices.FIXED}
    for run, assigned in planned.items():
        count, each = layouts[run]
        if assigned is None:
            continue
        assert len(assigned) == count
        # local rank r of node k uses cuda:r, the r-th GPU its CUDA_VISIBLE_DEVICES lists
        physical = [int(node.split(",")[r]) for node in assigned for r in range(each)]
        assert len(set(physical)) == len(physical), f"{run}: two ranks on one GPU: {assigned}"
        assert all(0 <= g < gpus for g in physical), f"{run}: a GPU this machine lacks: {assigned}"


@pytest.mark.parametrize("procs_per_node,nodes", LAYOUTS)
def test_each_run_uses_gpus_exactly_when_there_are_enough(procs_per_node: int, nodes: int) -> None:
    for gpus in (0, 1, 2, 3, 4, 8):
        planned = devices.devices_plan(gpus, procs_per_node, nodes)
        assert (planned["workers"] is not None) == (gpus >= max(2, procs_per_node * nodes))
        # the runs the GPU-only criteria read (Optional: the program run) are on GPUs from 2 GPUs on
        assert (planned["program"] is not None) == (gpus >= 2)
        assert (planned["two_nodes"] is not None) == (gpus >= 2)


def test_a_plan_reads_as_devices() -> None:
    planned = devices.devices_plan(4, 2, 2)
    assert planned["workers"] == ["0,1", "2,3"] and planned["two_nodes"] == ["0", "1"]
    assert devices.describe(planned["workers"]) == "GPUs 0,1 | 2,3"
    assert devices.describe(None) == "the CPU"


@pytest.mark.launch
def test_each_simulated_node_sees_only_its_own_gpus() -> None:
    """The workers run's plumbing, on a machine without GPUs: planned for 4 GPUs, each node's
    processes start with that node's CUDA_VISIBLE_DEVICES (what a learner's cuda:local_rank reads)."""
    from conftest import SOLUTION

    from autograde.engine.workspace import Workspace
    from autograde.parts.lab import runs

    with Workspace(SOLUTION, procs_per_node=2, nodes=2, gpus=4) as ws:
        workers = runs.workers(ws)
        seen = {(c["node"], c["local_rank"]): workers.traces[c["pid"]].named("worker_start")[0]["visible_devices"]
                for c in (workers.report or {})["children"]}
    assert seen == {(0, 0): "0,1", (0, 1): "0,1", (1, 0): "2,3", (1, 1): "2,3"}


def test_the_gpu_criteria_read_set_device_nccl_and_the_models_device() -> None:
    """Steps 4 and 7's GPU-only criteria, on recorded events (a GPU run cannot happen here)."""
    from autograde.engine.verdicts import Failed
    from autograde.parts.lab import checks
    init = [{"ev": "enter", "call": "init_process_group"},
            {"ev": "exit", "call": "init_process_group", "backend": "nccl", "rank_joined": 3}]
    checks._pinned_before_group(3, 1, recorded_trace({"ev": "set_device", "device": "1"}, *init))
    for wrong, words in (([], "did not call torch.cuda.set_device(1)"),
                         ([{"ev": "set_device", "device": "cuda:0"}], "it set cuda:0")):
        with pytest.raises(Failed, match=words.replace("(", r"\(").replace(")", r"\)")):
            checks._pinned_before_group(3, 1, recorded_trace(*wrong, *init))
    late = recorded_trace(*init, {"ev": "set_device", "device": "1"})  # pinned only after the group started
    with pytest.raises(Failed, match="before init_process_group"):
        checks._pinned_before_group(3, 1, late)
    checks._model_on_own_gpu(3, 1, recorded_trace({"ev": "ddp", "parameter_device": "cuda:1", "device_ids": [1]}))
    with pytest.raises(Failed, match="expected cuda:1"):
        checks._model_on_own_gpu(3, 1, recorded_trace({"ev": "ddp", "parameter_device": "cuda:0", "device_ids": [1]}))
    with pytest.raises(Failed, match="device_ids"):
        checks._model_on_own_gpu(3, 1, recorded_trace({"ev": "ddp", "parameter_device": "cuda:1", "device_ids": None}))
