"""Does a task a check asks for (protocol.Task): calls the functions a learner writes in an
exercise file, in launched processes that form a real process group, for the checks that judge
a function rather than a whole program; or, for a task that runs no group of its own (the lab's
setup and workers runs, a SLURM task, plain calls), its part's function once.

    python -m autograde.inprocess.runner --task JSON --out DIR

JSON is `protocol.encode_task(task)`: the task's class (a part's reports.py) and its options.
The function that performs it is in the part's in-process file (`protocol.performs`). For each
world size in turn, a process group of that many processes is started (forked from this one,
which has imported torch already: a launch costs one import of torch, not one per process),
every rank imports the learner's file as a module (its `if __name__ == "__main__":` block does
not run) and does the task; rank r of N writes its report to `DIR/N-r.json`.

The processes use NCCL, one GPU each, where there are GPUs enough and the task allows it (not
`on_cpu`), else gloo on the CPU. The checker never imports the learner's file itself: this
module runs in processes of its own.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autograde.inprocess import tracer
from autograde.protocol import Task, decode_task, free_port, function_of

GROUP_TIMEOUT = datetime.timedelta(seconds=60)  # the checker stops a stalled run long before


def _process(rank: int, task: Task, port: str, out: str) -> None:
    os.environ["MASTER_PORT"] = port
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The hand-made DDPs, the sharded optimizer and model parallelism are judged on their
    # arithmetic, with models on the CPU: gloo, even where there are GPUs.
    on_gpu = (not task.on_cpu and torch.cuda.is_available() and torch.cuda.device_count() >= task.world_size)
    if on_gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=task.world_size,
                            timeout=GROUP_TIMEOUT)
    report: Any = function_of(task)(rank, task, device)
    (Path(out) / f"{task.world_size}-{rank}.json").write_text(json.dumps(asdict(report)))
    if report.error is not None:
        tracer.emit("crash", error=report.error)
        sys.stdout.flush()
        os._exit(1)  # the others may wait for this rank: they fail fast when its sockets close
    if task.on_cpu:  # they make DistributedDataParallel models
        del report
        gc.collect()  # the models freed before their process group: one that outlives it can abort at exit
        dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde.inprocess.runner")
    parser.add_argument("--task", required=True, help="protocol.encode_task's JSON")
    parser.add_argument("--out", default="", help="where each rank writes its report")
    options = parser.parse_args()
    task = decode_task(options.task)
    task.script = os.path.abspath(task.script) if task.script else ""
    if not task.in_a_group:
        function_of(task)(task, options.out)
        return
    import torch.multiprocessing as mp

    os.environ["MASTER_ADDR"] = "localhost"
    for world_size in task.world_sizes:
        task.world_size = world_size
        # fork: the processes start with torch imported (the parent has not started CUDA)
        mp.start_processes(_process, args=(task, str(free_port()), options.out), nprocs=world_size,
                           start_method="fork")


if __name__ == "__main__":
    main()
