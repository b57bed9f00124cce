"""The lab (notebooks 00-09): fashion_mnist.py, Steps 0-10, each a TODO in one file."""
from __future__ import annotations

from typing import Callable

from autograde.engine.workspace import RunKind, Workspace
from autograde.grading.items import Item, Layout, Part
from autograde.parts.lab import checks, checks_data, checks_training, runs

PART_ID = "ddp_lab"
ONE_NODE_OF_3 = Layout(procs_per_node=3, nodes=1, why="3 processes on one node")
THREE_NODES_OF_1 = Layout(procs_per_node=1, nodes=3, why="3 nodes of one process: each is local rank 0")


def _step(id: str, title: str, points: int, notebook: str, checkpoint: int, reads: tuple[RunKind, ...],
          check: Callable[[Workspace], str | None], needs_gpu: bool = False, hidden: tuple[Layout, ...] = ()) -> Item:
    return Item(id, title, points, PART_ID, notebook, "fashion_mnist.py",
                f"solutions/fashion_mnist_after_step_{checkpoint}.py", reads, check, needs_gpu,
                "Optional" if id == "optional" else f"Step {id}", hidden)


S, W, P = (runs.SETUP,), (runs.WORKERS,), (runs.PROGRAM,)
ITEMS = [
    _step("0", "import torch.distributed", 1, "03_steps_0_to_2", 0, (), checks.check_0),
    _step("1", "the layout's arguments", 1, "03_steps_0_to_2", 1, S, checks.check_1),
    _step("2", "world size and rendezvous address", 1, "03_steps_0_to_2", 2, S, checks.check_2),
    _step("3", "a function per process", 1, "04_steps_3_to_5", 3, W, checks.check_3),
    _step("4", "join the process group", 2, "04_steps_3_to_5", 4, W, checks.check_4, hidden=(ONE_NODE_OF_3,)),
    _step("5", "one download per node", 2, "04_steps_3_to_5", 5, W, checks_data.check_5, hidden=(THREE_NODES_OF_1,)),
    _step("6", "DistributedSampler", 2, "05_step_6_sampler", 6, W, checks_data.check_6, hidden=(ONE_NODE_OF_3,)),
    _step("6.5", "set_epoch", 1, "05_step_6_sampler", 6, W, checks_data.check_6_5),
    _step("optional", "SyncBatchNorm", 0, "06_step_7_ddp", 7, P, checks_training.check_optional, needs_gpu=True),
    _step("7", "DistributedDataParallel", 2, "06_step_7_ddp", 7, W, checks_training.check_7),
    _step("8", "throughput over all processes", 2, "07_steps_8_and_9", 8, W, checks_training.check_8,
          hidden=(ONE_NODE_OF_3,)),
    _step("9", "global validation metrics", 2, "07_steps_8_and_9", 9, W, checks_training.check_9,
          hidden=(ONE_NODE_OF_3,)),
    _step("10", "mp.spawn and several nodes", 3, "08_step_10_launch", 10, (runs.PROGRAM, runs.TWO_NODES),
          checks.check_10),
]
PART = Part(PART_ID, "The DDP Lab: fashion_mnist.py, Steps 0-10", "0*.ipynb", "*step*",
            ("demos/big_batch_equivalence.py",), tuple(ITEMS))
