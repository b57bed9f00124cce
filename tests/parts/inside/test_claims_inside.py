"""The technical claims of notebooks 20 (DDP by hand) and 21 (sharding), checked against the
installed PyTorch: read from its own constants, or run on 2 CPU processes with gloo.

- A post-accumulate-grad hook sees a tied weight's whole gradient, once; a frozen tensor takes none.
- DDP's buckets: 25 MiB by default, the first only 1 MiB; the first iteration's buckets are
  rebuilt, after it, in the order the gradients arrived (notebook 20).
- An all-reduce gives what a reduce-scatter then an all-gather give: ZeRO-1 and 2, which send
  those two instead, move DDP's volume (notebook 21).
- FSDP2 (`fully_shard`) shards each parameter on dim 0 as a DTensor, not one flat buffer; it
  gathers a unit's parameters before its forward and again before its backward, and
  reduce-scatters each unit's gradients during backward(), one unit at a time: 3 collectives of
  the model's size a step, where DDP's all-reduce costs 2 (notebook 21).
"""
from __future__ import annotations

import datetime
import inspect
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from autograde.engine import processes

pytestmark = pytest.mark.timeout(120)


def _process(rank: int, world_size: int, port: int, out: str, body: Callable[[int, int], Any]) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    found = body(rank, world_size)
    Path(out, f"{rank}.json").write_text(json.dumps(found))
    dist.barrier()  # leave together: a rank that tears down gloo while another still talks to it can abort
    dist.destroy_process_group()


def _on_processes(body: Callable[[int, int], Any], tmp_path: Path, world_size: int = 2) -> list[Any]:
    """What `body(rank, world_size)` returned on each of `world_size` gloo processes (forked: torch
    is imported already)."""
    mp.start_processes(_process, args=(world_size, processes.free_port(), str(tmp_path), body), nprocs=world_size,
                       start_method="fork")
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(world_size)]


# Notebook 20: DDP's buckets ------------------------------------------------------------------------

def test_ddp_buckets_are_25_mib_by_default_and_the_first_1_mib() -> None:
    """torch/nn/parallel/distributed.py: bucket_cap_mb=None means _DEFAULT_BUCKET_CAP_MB (25) MiB,
    and only then is the first bucket capped at dist._DEFAULT_FIRST_BUCKET_BYTES."""
    from torch.nn.parallel import distributed as ddp_module

    assert inspect.signature(DistributedDataParallel).parameters["bucket_cap_mb"].default is None
    assert ddp_module._DEFAULT_BUCKET_CAP_MB == 25
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 1024 * 1024
    default = ddp_module._BucketCapacityConfig.create(None, None, use_python_reducer=False)
    assert (default.bucket_bytes_cap, default.first_bucket_bytes_cap) == (25 * 1024 * 1024, 1024 * 1024)
    chosen = ddp_module._BucketCapacityConfig.create(4, None, use_python_reducer=False)
    assert chosen.first_bucket_bytes_cap == chosen.bucket_bytes_cap == 4 * 1024 * 1024  # a size given: no small first


def test_a_ddp_bucket_closes_once_it_reaches_the_cap_so_it_may_pass_it() -> None:
    """Notebook 20's first cell: DDP adds gradients to a bucket until they reach the cap, then closes
    it, so a bucket may pass the cap (not "at most bucket_cap_mb"): 150k, 150k and 10 floats with
    1 MiB give [[0, 1], [2]], a first bucket of 1.2 MB; the notebook shows that very assignment."""
    tensors = [torch.empty(150_000), torch.empty(150_000), torch.empty(10)]
    buckets, caps = dist._compute_bucket_assignment_by_size(tensors, [1024 * 1024])
    found = [list(bucket) for bucket in buckets]
    assert found == [[0, 1], [2]]
    first = sum(tensors[i].numel() * tensors[i].element_size() for i in found[0])
    assert first == 1_200_000 > caps[0] == 1024 * 1024
    cells = json.loads((Path(__file__).parents[3] / "notebooks" / "20_ddp_by_hand.ipynb").read_text())["cells"]
    first_cell = " ".join("".join(cells[0]["source"]).split())
    assert f"`{found}`" in first_cell and "1.2 MB" in first_cell
    assert "at most `bucket_cap_mb`" not in first_cell and "*reach* `bucket_cap_mb`" in first_cell


def test_a_post_accumulate_grad_hook_runs_once_a_tied_weight_has_all_its_uses_and_never_on_a_frozen_one() -> None:
    """Notebook 20's hints for OverlapDDP: the hook sees the whole gradient of a weight used twice,
    once; a tensor that needs no gradient takes no hook."""
    weight = torch.randn(3, 3, requires_grad=True)
    seen: list[torch.Tensor] = []
    weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    (torch.randn(2, 3) @ weight @ weight.t()).sum().backward()  # used twice
    assert len(seen) == 1 and torch.equal(seen[0], weight.grad)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        torch.randn(3).register_post_accumulate_grad_hook(lambda p: None)


WIDTH = 512  # a 512 x 512 weight is 1 MiB of fp32: the first bucket's cap


def _buckets_per_iteration(rank: int, world_size: int) -> list[list[int]]:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(4))))
    seen: list[list[int]] = []

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations: none. Its all-reduce, sizes noted
        seen[-1].append(bucket.buffer().numel())
        tensor = bucket.buffer().div_(world_size)
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])

    model.register_comm_hook(None, hook)
    for _ in range(3):
        seen.append([])
        model(torch.randn(2, WIDTH)).sum().backward()
    return seen


@pytest.mark.launch
def test_ddp_rebuilds_its_buckets_after_the_first_iteration_the_first_at_1_mib(tmp_path: Path) -> None:
    """With the defaults (find_unused_parameters=False), the first iteration sends every gradient in
    one bucket; from the second on, the buckets follow the order the gradients arrived in, the
    first closed at 1 MiB: the last layer's weight and bias alone."""
    for seen in _on_processes(_buckets_per_iteration, tmp_path):
        whole = 4 * (WIDTH * WIDTH + WIDTH)
        assert seen[0] == [whole], seen
        assert seen[1] == seen[2] == [WIDTH * WIDTH + WIDTH, 3 * (WIDTH * WIDTH + WIDTH)], seen


# Notebook 21: ZeRO's communication ---------------------------------------------------------------

def _all_reduce_against_reduce_scatter_then_all_gather(rank: int, world_size: int) -> dict[str, list[float]]:
    gradient = torch.arange(6.0) * (rank + 1)
    summed = gradient.clone()
    dist.all_reduce(summed)
    shard = torch.zeros(6 // world_size)
    dist.reduce_scatter_tensor(shard, gradient)  # this rank's 1/N of the sum, and no more
    gathered = torch.zeros(6)
    dist.all_gather_into_tensor(gathered, shard)  # every shard to every rank
    return {"all_reduce": summed.tolist(), "shard": shard.tolist(), "gathered": gathered.tolist()}


@pytest.mark.launch
def test_an_all_reduce_is_a_reduce_scatter_then_an_all_gather(tmp_path: Path) -> None:
    """ZeRO-1/2 reduce-scatter the gradients (each rank gets its shard's sum) and all-gather the
    updated parameters: together what DDP's all-reduce does, so the same volume."""
    found = _on_processes(_all_reduce_against_reduce_scatter_then_all_gather, tmp_path)
    total = [3.0 * k for k in range(6)]  # ranks 0 and 1: k * 1 + k * 2
    for rank, f in enumerate(found):
        assert f["all_reduce"] == f["gathered"] == total, f
        assert f["shard"] == total[3 * rank:3 * (rank + 1)], f


def _fully_shard_step(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    calls: list[dict[str, Any]] = []
    # what FSDP2 calls (fsdp/_fully_shard/_fsdp_collectives.py), and its argument that holds the whole
    # unit: the gather's output, the scatter's input
    for name, whole in (("all_gather_single", "output_tensor"), ("reduce_scatter_single", "input")):
        original = getattr(dist, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, _whole: str = whole,
                    **kwargs: Any) -> Any:
            unit = inspect.signature(_original).bind(*args, **kwargs).arguments[_whole]
            calls.append({"call": _name, "numel": unit.numel(),
                          "in_backward": torch._C._current_autograd_node() is not None})
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    params = [{"name": n, "dtensor": isinstance(p, DTensor), "placements": list(map(repr, p.placements)),
               "shard_zero": list(p.placements) == [Shard(0)], "shape": list(p.shape),
               "local": list(p.to_local().shape)} for n, p in model.named_parameters()]
    loss = model(torch.randn(3, 8)).sum()
    forward, calls[:] = list(calls), []
    loss.backward()
    backward = list(calls)
    grads = [list(p.grad.to_local().shape) for p in model.parameters()]
    return {"params": params, "forward": forward, "backward": backward, "grads": grads,
            "numel": sum(p.numel() for p in model.parameters())}


@pytest.mark.launch
def test_fully_shard_shards_each_parameter_on_dim_0_and_reduce_scatters_each_unit_in_backward(tmp_path: Path) -> None:
    for f in _on_processes(_fully_shard_step, tmp_path):
        # each parameter its own DTensor, cut on dim 0: half the rows on each of 2 ranks (no flat buffer)
        for p in f["params"]:
            assert p["dtensor"] and p["shard_zero"], p
            assert p["local"] == [p["shape"][0] // 2, *p["shape"][1:]], p
        assert f["grads"] == [p["local"] for p in f["params"]], f  # each rank keeps its shard's gradient only
        units = 2
        assert [c["call"] for c in f["forward"]] == ["all_gather_single"] * units, f["forward"]
        gathers = [c for c in f["backward"] if c["call"] == "all_gather_single"]
        scatters = [c for c in f["backward"] if c["call"] == "reduce_scatter_single"]
        assert len(gathers) == units and len(scatters) == units, f["backward"]  # one per unit, not one for all
        # the last layer's gradients leave first, while autograd still works on the first layer's
        last = 6 * 4 + 4  # Linear(6, 4): weight and bias
        assert scatters[0]["numel"] == last and scatters[0]["in_backward"], f["backward"]
        # the volume: gathered in forward, again in backward, and reduce-scattered: 3 x the model,
        # against DDP's all-reduce of it, a reduce-scatter plus an all-gather: 2 x. ZeRO-3 costs 1.5 x.
        moved = sum(c["numel"] for c in f["forward"] + f["backward"])
        assert moved == 3 * f["numel"], (moved, f["numel"])


def test_an_optimizer_over_no_parameters_is_refused() -> None:
    """Notebook 21's hint for ShardedOptimizer: a rank that owns nothing cannot make its optimizer."""
    with pytest.raises(ValueError, match="empty parameter list"):
        torch.optim.AdamW([], lr=1e-3)
