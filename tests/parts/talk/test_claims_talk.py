"""The technical claims of the part "how processes talk" (notebooks 11-13, exercises/compute_pi.py,
shard_sampler.py, ring_allreduce.py), each checked against the installed PyTorch: by calling it
in this process, or in one real 2-process gloo group (TALK below, started once for the module).

Claims that only the source can show are named where they are made (gloo's all_reduce of CPU
tensors is its ring at every size: third_party/gloo/gloo/allreduce.cc, called by
ProcessGroupGloo's AsyncAllreduceWork with no algorithm set; NCCL's advice to group a send and a
receive that must progress together: its user guide, "Point-to-point communication").
"""
from __future__ import annotations

import inspect
import json
import math
import textwrap
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import run_script
from torch.utils.data import DistributedSampler

from autograde.engine import processes

pytestmark = pytest.mark.timeout(120)

NUMEL = 100_003  # a large message: more than a small buffer could hold
GROUP_TIMEOUT = 2  # seconds: the groups in which a call is expected to wait for nothing

# Each rank writes one JSON line per claim into a file of its own (out/<rank>.jsonl). The calls that must hang run last, in groups of their
# own with a short timeout, so that the waits end in an error after GROUP_TIMEOUT seconds.
TALK = textwrap.dedent(f"""
    import datetime, json, os, sys, time
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    def report(rank, claim, **values):
        with open(os.path.join(sys.argv[2], f"{{rank}}.jsonl"), "a") as out:
            out.write(json.dumps({{"rank": rank, "claim": claim, **values}}) + "\\n")

    def outcome(call):
        started = time.perf_counter()
        try:
            call()
            result = "returned"
        except RuntimeError as e:
            result = "RuntimeError: " + str(e)
        return result, time.perf_counter() - started

    def worker(rank, port):
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
        right, left = (rank + 1) % 2, (rank - 1) % 2
        mine = torch.arange({NUMEL}, dtype=torch.float32) + 1e6 * rank
        theirs = torch.arange({NUMEL}, dtype=torch.float32) + 1e6 * left

        torch.rand(rank + 1)  # the ranks have drawn different amounts from the global random state
        seeded = torch.randperm(10, generator=torch.Generator().manual_seed(7)).tolist()
        report(rank, "own_generator", order=seeded, global_order=torch.randperm(10).tolist())

        part = torch.tensor(float(rank + 1))  # 0-dimensional, like compute_pi's part
        returned = dist.all_reduce(part)
        report(rank, "all_reduce", value=part.item(), returned=repr(returned))

        incoming = torch.empty({NUMEL})
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
                                           dist.P2POp(dist.irecv, incoming, left)])
        for request in requests:
            request.wait()
        report(rank, "batch_isend_irecv", left=left, right=right, requests=len(requests),
               same=torch.equal(incoming, theirs))

        incoming = torch.empty({NUMEL})  # exercises/ring_allreduce.py's exchange()
        request = dist.isend(mine.contiguous(), dst=right)
        dist.recv(incoming, src=left)
        request.wait()
        report(rank, "isend_then_recv", same=torch.equal(incoming, theirs))

        short = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds={GROUP_TIMEOUT}))
        result, seconds = outcome(lambda: dist.send(torch.ones(6), dst=right, group=short))
        report(rank, "blocking_send_first", outcome=result, seconds=seconds)
        dist.barrier()

        lone = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds={GROUP_TIMEOUT}))
        if rank == 0:  # an all-reduce that rank 1 never makes: rank 1 waits in the barrier below
            result, seconds = outcome(lambda: dist.all_reduce(torch.ones(1), group=lone))
            report(rank, "lone_all_reduce", outcome=result, seconds=seconds)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(int(sys.argv[1]),), nprocs=2)
""")


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, dict[str, Any]]]:
    """What each rank of the 2-process gloo group reported, by claim and rank."""
    folder = tmp_path_factory.mktemp("talk")
    script, out = folder / "talk.py", folder / "out"
    script.write_text(TALK)
    out.mkdir()
    result = run_script(script, str(processes.free_port()), out, timeout=90, records=[out])
    assert result.returncode == 0 and not result.timed_out, result.output
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            found.setdefault(record["claim"], {})[record["rank"]] = record
    return found


# notebook 11 (the total's hints) ----------------------------------------------------------

@pytest.mark.launch
def test_all_reduce_sums_in_place_by_default_and_returns_none(talk: dict) -> None:
    """`dist.all_reduce(part)` changes `part` in place, sums by default, and returns None."""
    for rank in (0, 1):
        assert talk["all_reduce"][rank] == {"rank": rank, "claim": "all_reduce", "value": 3.0, "returned": "None"}


def test_the_sum_of_a_tensor_is_zero_dimensional() -> None:
    """compute_pi's `part` (a sum divided by a number) is a 0-dimensional tensor."""
    i = torch.arange(0, 10, dtype=torch.float64)
    assert ((i + 0.5).sum() / 10).dim() == 0


@pytest.mark.parametrize("intervals", [16, 300_001, 7, 3])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_the_shares_of_hint_3_cover_every_rectangle_once(world_size: int, intervals: int) -> None:
    """Hint 1 and 3 of the share: consecutive ranges r*n//N .. (r+1)*n//N cover 0..n-1 once, each
    at most ceil(n/N) long; n // N per rank leaves n % N rectangles to nobody."""
    shares = [range(r * intervals // world_size, (r + 1) * intervals // world_size) for r in range(world_size)]
    assert [i for share in shares for i in share] == list(range(intervals))
    assert max(len(s) for s in shares) <= math.ceil(intervals / world_size)
    naive = {i for r in range(world_size) for i in range(r * (intervals // world_size), (r + 1) * (intervals // world_size))}
    assert intervals - len(naive) == intervals % world_size


# notebook 12 --------------------------------------------------------------------------------

def _shards(size: int, n: int, epoch: int = 0, **options: Any) -> list[list[int]]:
    samplers = [DistributedSampler(range(size), num_replicas=n, rank=r, **options) for r in range(n)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


def test_distributed_sampler_pads_to_3_per_rank_or_drops_to_2() -> None:
    """10 images on 4 ranks: padding gives 12 indices, 3 per rank, every image at least once and
    fewer than 4 repeats; drop_last gives 2 per rank, no repeats, 2 images never seen."""
    padded = _shards(10, 4)
    assert [len(s) for s in padded] == [3, 3, 3, 3]
    flat = [i for s in padded for i in s]
    assert set(flat) == set(range(10)) and len(flat) - 10 == 2
    dropped = _shards(10, 4, drop_last=True)
    assert [len(s) for s in dropped] == [2, 2, 2, 2]
    flat = [i for s in dropped for i in s]
    assert len(set(flat)) == 8 and len(flat) == 8


@pytest.mark.parametrize("size", [1, 5, 10, 12, 13])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_distributed_sampler_repeats_or_leaves_out_fewer_than_n(size: int, n: int) -> None:
    """The contract of the sampler exercise, as DistributedSampler keeps it: without drop_last every
    index, fewer than N extra; with drop_last no repeats and fewer than N left out; equal lengths."""
    padded = _shards(size, n, seed=3)
    assert len({len(s) for s in padded}) == 1
    flat = [i for s in padded for i in s]
    assert set(flat) == set(range(size)) and 0 <= len(flat) - size < n
    dropped = _shards(size, n, seed=3, drop_last=True)
    assert len({len(s) for s in dropped}) == 1
    flat = [i for s in dropped for i in s]
    assert len(set(flat)) == len(flat) and 0 <= size - len(flat) < n


def test_distributed_sampler_seeds_its_own_generator_with_seed_plus_epoch() -> None:
    """Its order comes from torch.randperm with a generator seeded with seed + epoch (so seed 0 in
    epoch 1 is seed 1 in epoch 0), padded from the start of the order, rank r taking every N-th
    position from r: the sampler exercise's hints 2 and 3 give the same shards."""
    assert _shards(10, 4, epoch=1, seed=0) == _shards(10, 4, epoch=0, seed=1)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(5 + 2)).tolist()
    total = math.ceil(10 / 4) * 4
    order += order[:total - len(order)]
    assert _shards(10, 4, epoch=2, seed=5) == [order[r:total:4] for r in range(4)]


@pytest.mark.launch
def test_a_generator_seeded_alike_gives_every_rank_the_same_order_and_the_global_state_does_not(talk: dict) -> None:
    """The sampler's order hint 1: a CPU torch.Generator seeded the same way draws the same
    permutation in every process; the global random state, drawn from differently before, does not."""
    ranks = talk["own_generator"]
    assert ranks[0]["order"] == ranks[1]["order"]
    assert ranks[0]["global_order"] != ranks[1]["global_order"]


def test_without_set_epoch_every_epoch_repeats_the_order_and_with_it_the_order_changes() -> None:
    sampler = DistributedSampler(range(10), num_replicas=2, rank=0, shuffle=True, seed=0)
    first = list(sampler)
    assert list(sampler) == first  # no set_epoch: epoch 0's order again
    sampler.set_epoch(1)
    assert list(sampler) != first


@pytest.mark.launch
def test_a_rank_left_alone_in_an_all_reduce_fails_at_the_timeout_not_before(talk: dict) -> None:
    """A rank whose partner never makes the all-reduce waits until the group's timeout, then fails."""
    record = talk["lone_all_reduce"][0]
    assert record["outcome"].startswith("RuntimeError") and "Timed out" in record["outcome"], record
    assert GROUP_TIMEOUT * 0.9 <= record["seconds"] <= GROUP_TIMEOUT + 10, record


# notebook 13 --------------------------------------------------------------------------------

def test_tensor_split_gives_views_the_first_chunks_one_longer() -> None:
    tensor = torch.zeros(10)
    chunks = tensor.view(-1).tensor_split(4)
    assert [len(c) for c in chunks] == [3, 3, 2, 2]
    chunks[2].fill_(7)
    assert tensor.tolist() == [0] * 6 + [7, 7] + [0, 0]


def test_batch_isend_irecv_takes_a_list_of_p2p_ops() -> None:
    """dist.batch_isend_irecv(p2p_op_list) exists, with one parameter, a list of dist.P2POp, and
    P2POp accepts dist.isend and dist.irecv (its constructor checks the op: anything else fails)."""
    parameters = inspect.signature(dist.batch_isend_irecv).parameters
    assert list(parameters) == ["p2p_op_list"]
    assert parameters["p2p_op_list"].annotation in ("list[P2POp]", list[dist.P2POp])
    with pytest.raises(ValueError):
        dist.P2POp(dist.all_reduce, torch.ones(1), 0)


@pytest.mark.launch
def test_batch_isend_irecv_completes_a_ring_step_on_two_ranks(talk: dict) -> None:
    """On a 2-rank ring the left and right neighbours are the same rank; one send and one receive
    posted with batch_isend_irecv complete, and each rank gets the other's values."""
    for rank in (0, 1):
        record = talk["batch_isend_irecv"][rank]
        assert record["left"] == record["right"] == 1 - rank
        assert record["requests"] == 2 and record["same"] is True, record


@pytest.mark.launch
def test_isend_then_recv_completes_on_gloo_with_two_ranks(talk: dict) -> None:
    """An isend, then a blocking recv, then a wait (the unbatched exchange notebook 13 says gloo takes) works on gloo."""
    assert all(talk["isend_then_recv"][rank]["same"] is True for rank in (0, 1))


@pytest.mark.launch
def test_a_blocking_send_on_every_rank_first_waits_for_a_receiver_that_never_comes(talk: dict) -> None:
    """On gloo, dist.send does not return before its receiver receives: with both ranks sending first,
    even 6 floats, neither send returns. Both wait until the timeout; the rank whose timeout fires a
    moment later may see its pair's connection closed by the first one's failure instead."""
    records = [talk["blocking_send_first"][rank] for rank in (0, 1)]
    for record in records:
        assert record["outcome"].startswith("RuntimeError"), record  # neither send returned
        assert "Timed out" in record["outcome"] or "Connection closed by peer" in record["outcome"], record
        assert record["seconds"] >= GROUP_TIMEOUT * 0.9, record
    assert any("Timed out" in record["outcome"] for record in records), records

