"""Notebook 23's claims about PyTorch, checked against the installed torch: the process group's
default time-outs, and how DDP under Join averages the gradients of a step that only some ranks train."""
from __future__ import annotations

import datetime
import gc
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.timeout(120)


def test_the_default_timeouts_are_30_minutes_for_gloo_and_10_for_nccl() -> None:
    """Notebook 23: "by default 30 minutes with gloo and 10 minutes with NCCL"."""
    from torch.distributed import constants, distributed_c10d

    assert constants.default_pg_timeout == datetime.timedelta(minutes=30)
    assert constants.default_pg_nccl_timeout == datetime.timedelta(minutes=10)
    # what init_process_group uses when it is given no timeout=
    assert distributed_c10d._get_default_timeout("gloo") == datetime.timedelta(minutes=30)
    assert distributed_c10d._get_default_timeout("nccl") == datetime.timedelta(minutes=10)


def _join_worker(rank: int, port: int, out: str) -> None:
    """Rank 1 has one batch more than rank 0. Its gradient in that extra step, with Join's default
    and with divide_by_initial_world_size=False, next to the gradient of its batch alone."""
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    found = {}
    for divide in (True, False):
        model = torch.nn.Linear(1, 1, bias=False)  # one parameter, w
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        batches = [torch.tensor([[float(rank + 1)]])] + ([torch.tensor([[5.0]])] if rank == 1 else [])
        with Join([ddp], divide_by_initial_world_size=divide):
            for k, x in enumerate(batches):
                model.weight.grad = None
                ddp(x).sum().backward()  # d(w * x)/dw = x: this rank's own gradient is x
                if k == 1:
                    found[divide] = (float(model.weight.grad), float(x))
        del ddp
    if rank == 1:
        torch.save(found, out)
    # DDP's reducers freed (gc: its hooks can make cycles), then both ranks leave together: a rank that
    # tears gloo down while the other still talks to it can abort (seen once on a loaded machine)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.launch
def test_join_divides_the_extra_step_by_the_initial_world_size(tmp_path: Path) -> None:
    """Notebook 23: under Join, a rank out of data answers with zeros and DDP divides by the initial
    world size (divide_by_initial_world_size=True by default): rank 1's gradient in its extra step is
    its own gradient / 2, not an average over the ranks still training; with
    divide_by_initial_world_size=False it is its own gradient."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    out = tmp_path / "grads.pt"
    mp.spawn(_join_worker, args=(port, str(out)), nprocs=2)
    found = torch.load(out)
    grad, own = found[True]
    assert own == 5.0 and grad == pytest.approx(own / 2), found
    grad, own = found[False]
    assert grad == pytest.approx(own), found
