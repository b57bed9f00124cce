"""Calls the functions a learner writes in an exercise file, in launched processes that form a
real process group, for the checks that judge a function rather than a whole program.

    python -m autograde.learner_processes.tasks ring --script exercises/ring_allreduce.py \\
        --world-sizes 2 3 4 --out DIR [--sizes 12 1001] [--ops sum max] [--repeats 1]
    python -m autograde.learner_processes.tasks sampler --script exercises/shard_sampler.py \\
        --world-sizes 1 2 3 4 --out DIR [--sizes 12 10 13] [--seeds 0 5] [--epochs 3]
    python -m autograde.learner_processes.tasks collectives [--script exercises/predict_collectives.py] \\
        --world-sizes 4 --out DIR
    python -m autograde.learner_processes.tasks calls --script exercises/scaling_model.py --out DIR \\
        --calls '[["speedup", [{"1": 20.0, "2": 12.5}]], ["predict_time", [[60, 3, 1.5], 16]]]'
    python -m autograde.learner_processes.tasks ddp --script exercises/ddp_by_hand.py --wrapper NaiveDDP ...
    python -m autograde.learner_processes.tasks tensor_parallel --script exercises/tensor_parallel.py --world-sizes 2 4 ...
    python -m autograde.learner_processes.tasks stages --script exercises/pipeline_parallel.py --world-sizes 2 3 \\
        --schedule gpipe --micro-batches 1 4 6 ...

The tasks (protocol.Task) live in their part's module: talk.py (ring, sampler, collectives),
scaling.py (calls), inside.py (ddp, zero), inside_model_parallel.py (tensor_parallel, two_d,
stages), optimizers.py (lars, kfac). For each world size in turn, a process group of that
many processes is started (forked from this one, which has imported torch already: a launch costs
one import of torch, not one per process), every rank imports the learner's file as a module
(its `if __name__ == "__main__":` block does not run) and does the task; rank r of N writes what
it found to `DIR/N-r.json` (the task's report type in autograde/protocol.py).

The processes use NCCL, one GPU each, where there are GPUs enough (the part inside's tasks: never),
else gloo on the CPU. The checker never imports the learner's file itself: this module runs in
processes of its own.
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
from typing import Any, Callable

from autograde import processes
from autograde.learner_processes import inside, inside_model_parallel, optimizers, scaling, talk, tracer
from autograde.protocol import (RING_SIZES, CollectivesReport, DdpReport, KfacReport, LarsReport, ParallelReport,
                                RingReport, SamplerReport, StagesReport, Task, ZeroReport)

GROUP_TIMEOUT = datetime.timedelta(seconds=60)  # the checker stops a stalled run long before
CPU_TASKS = (Task.DDP, Task.ZERO, Task.TENSOR_PARALLEL, Task.TWO_D, Task.STAGES, Task.LARS, Task.KFAC)
Report = (RingReport | SamplerReport | CollectivesReport | DdpReport | ZeroReport | ParallelReport | StagesReport
          | LarsReport | KfacReport)
# The tasks that run in a process group, each rank calling its function with (rank, options, device)
IN_A_GROUP: dict[Task, Callable[[int, argparse.Namespace, Any], Report]] = {
    Task.RING: talk.ring, Task.SAMPLER: talk.sampler, Task.COLLECTIVES: talk.collectives,
    Task.DDP: inside.ddp, Task.ZERO: inside.zero, Task.TENSOR_PARALLEL: inside_model_parallel.tensor_parallel,
    Task.TWO_D: inside_model_parallel.two_d, Task.STAGES: inside_model_parallel.stages, Task.LARS: optimizers.lars,
    Task.KFAC: optimizers.kfac}


def _process(rank: int, options: argparse.Namespace) -> None:
    os.environ["MASTER_PORT"] = options.port
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The hand-made DDPs, the sharded optimizer and model parallelism are judged on their
    # arithmetic, with models on the CPU: gloo, even where there are GPUs.
    on_gpu = (options.task not in CPU_TASKS and torch.cuda.is_available()
              and torch.cuda.device_count() >= options.world_size)
    if on_gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=options.world_size,
                            timeout=GROUP_TIMEOUT)
    report = IN_A_GROUP[options.task](rank, options, device)
    (Path(options.out) / f"{options.world_size}-{rank}.json").write_text(json.dumps(asdict(report)))
    if report.error is not None:
        tracer.emit("crash", error=report.error)
        sys.stdout.flush()
        os._exit(1)  # the others may wait for this rank: they fail fast when its sockets close
    if options.task in CPU_TASKS:  # they make DistributedDataParallel models
        del report
        gc.collect()  # the models freed before their process group: one that outlives it can abort at exit
        dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde.learner_processes.tasks")
    parser.add_argument("task", type=Task, choices=list(Task))
    parser.add_argument("--script", default="", help="the learner's file (collectives: optional, for its PREDICTIONS)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--calls", default="[]", help="calls: a JSON list of [function name, [arguments]]")
    parser.add_argument("--wrapper", default="NaiveDDP", help="ddp: the class to try")
    parser.add_argument("--bucket-sizes", type=float, nargs="*", default=[], help="ddp: BucketedDDP's sizes (MB)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(RING_SIZES), help="ring: the tensors' sizes")
    parser.add_argument("--ops", nargs="+", default=["sum", "max"], choices=["sum", "max"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 5], help="sampler: the seeds to try")
    parser.add_argument("--epochs", type=int, default=3, help="sampler: the epochs to try")
    parser.add_argument("--schedule", default="gpipe", help="stages: the function of the learner's file to try")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[4], help="stages: the numbers to try")
    parser.add_argument("--width", type=int, default=inside_model_parallel.STAGE_WIDTH, help="stages: the layers' width")
    parser.add_argument("--batch-size", type=int, default=inside_model_parallel.STAGE_BATCH,
                        help="stages: the whole batch, cut into each number of micro-batches")
    options = parser.parse_args()
    options.script = os.path.abspath(options.script) if options.script else ""
    if options.task is Task.CALLS:
        scaling.calls(options)
        return
    import torch.multiprocessing as mp

    os.environ["MASTER_ADDR"] = "localhost"
    for world_size in options.world_sizes:
        options.world_size, options.port = world_size, str(processes.free_port())
        # fork: the processes start with torch imported (the parent has not started CUDA)
        mp.start_processes(_process, args=(options,), nprocs=world_size, start_method="fork")


if __name__ == "__main__":
    main()
