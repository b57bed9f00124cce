"""Which devices each run of the checker uses: no two ranks of one process group on one GPU.

NCCL refuses two ranks of a group on the same device, and a learner's script puts local rank r
on `cuda:r`. So each simulated node gets GPUs of its own through CUDA_VISIBLE_DEVICES (set in
its processes before CUDA starts): node k of a p-process layout sees GPUs k*p .. k*p+p-1, and
its `cuda:local_rank` lands on them. A run that needs more GPUs than the machine has runs on
the CPU with gloo (CUDA_VISIBLE_DEVICES=""), as on a machine without GPUs.
"""
from __future__ import annotations

# What each run starts: (commands or nodes, processes each). The workers run's layout is the check's.
FIXED = {"program": (1, 2), "two_nodes": (2, 1)}


def plan(gpus: int, procs_per_node: int, nodes: int) -> dict[str, list[str] | None]:
    """For each run, the CUDA_VISIBLE_DEVICES of each node (or command) in it; None: on the CPU."""
    layouts = {"workers": (nodes, procs_per_node), **FIXED}
    result: dict[str, list[str] | None] = {}
    for run, (count, each) in layouts.items():
        if count * each > gpus or gpus < 2:  # one GPU cannot hold a group of 2: the CPU checks it
            result[run] = None
        else:
            result[run] = [",".join(str(k * each + r) for r in range(each)) for k in range(count)]
    return result


def describe(assigned: list[str] | None) -> str:
    """The devices of a run, for a verdict: 'the CPU' or 'GPUs 0,1 | 2,3' (a | between nodes)."""
    return "the CPU" if assigned is None else f"GPUs {' | '.join(assigned)}"


def signature(planned: dict[str, list[str] | None]) -> str:
    """The plan as a short string, part of the key of kept verdicts."""
    return ";".join(f"{run}={'/'.join(a) if a else 'cpu'}" for run, a in sorted(planned.items()))
