"""All-reduce by hand: a ring of processes, each talking only to its two neighbours.

    python exercises/ring_allreduce.py --world-size 4

Every process holds a tensor; afterwards every process must hold the element-wise sum (or
max) of all of them, as dist.all_reduce gives. The ring does it in two passes over N ranks:

1. Reduce-scatter. Cut the tensor into N chunks. In each of N-1 rounds, every rank sends one
   chunk to its right neighbour and adds the chunk coming from its left neighbour into its
   own copy. After N-1 rounds, rank r holds the complete sum of chunk (r + 1) % N.
2. All-gather. In N-1 more rounds, the complete chunks travel once round the ring, each rank
   copying the one it receives over its own.

Each rank sends 2(N-1) messages of 1/N of the tensor: 2(N-1)/N of the tensor in all, almost
independent of N. That is why NCCL and gloo use rings (and trees) for large tensors.

Your TODOs are the two loops in ring_all_reduce(). The rest checks your ring against
dist.all_reduce and times both.
"""
import argparse
import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def exchange(send_chunk, recv_chunk, right, left):
    """Send one chunk to the right neighbour while receiving one from the left.

    The send and the receive are posted together, as one batch: if every rank first made a
    blocking send, each would wait for its neighbour to receive, and no one would. The batch is
    also what NCCL needs: there an isend and a recv made one after the other can deadlock (with
    2 processes the left and right neighbours are the same rank); batched, they progress together."""
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, send_chunk.contiguous(), right),
                                       dist.P2POp(dist.irecv, recv_chunk, left)])
    for request in requests:
        request.wait()


def ring_all_reduce(tensor, op="sum"):
    """Reduce `tensor` over all ranks, in place, with a ring: sum or max."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = tensor.view(-1).tensor_split(world_size)  # views: writing a chunk writes the tensor
    # ring: reduce-scatter, world_size - 1 rounds. In round s, send chunk
    # (rank - s) % world_size to the right, receive chunk (rank - s - 1) % world_size from the
    # left into a buffer of its size, and combine the buffer into that chunk (add, or maximum).
    for s in range(world_size - 1):
        send_index, recv_index = (rank - s) % world_size, (rank - s - 1) % world_size
        incoming = torch.empty_like(chunks[recv_index])
        exchange(chunks[send_index], incoming, right, left)
        if op == "sum":
            chunks[recv_index].add_(incoming)
        else:
            torch.maximum(chunks[recv_index], incoming, out=chunks[recv_index])
    # ring: all-gather, world_size - 1 rounds. In round s, send chunk
    # (rank + 1 - s) % world_size to the right, receive chunk (rank - s) % world_size from the
    # left, and copy it over your own.
    for s in range(world_size - 1):
        send_index, recv_index = (rank + 1 - s) % world_size, (rank - s) % world_size
        incoming = torch.empty_like(chunks[recv_index])
        exchange(chunks[send_index], incoming, right, left)
        chunks[recv_index].copy_(incoming)
    return tensor


def worker(rank, args):
    torch.set_num_threads(1)  # one core per process: the processes share the machine's cores
    # One GPU per process where there are enough of them (NCCL), else CPU processes (gloo).
    on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.world_size
    if on_gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.world_size,
                            timeout=datetime.timedelta(seconds=60))  # a ring that hangs: stop
    for numel in args.sizes:
        for op in ("sum", "max"):
            generator = torch.Generator().manual_seed(rank * 1000 + numel)
            mine = torch.randn(numel, generator=generator).to(device)
            expected = mine.clone()
            dist.all_reduce(expected, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
            dist.barrier()
            started = time.perf_counter()
            ring_all_reduce(mine, op)
            if on_gpu:
                torch.cuda.synchronize()  # GPU work is queued: wait for it before reading the clock
            seconds = time.perf_counter() - started
            same = torch.allclose(mine, expected, rtol=1e-5, atol=1e-5)
            if rank == 0:
                print(f"{numel:>9} floats, {op}: {'same as' if same else 'DIFFERENT FROM'} dist.all_reduce"
                      f" ({seconds * 1e3:.2f} ms)")
    dist.destroy_process_group()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description="Ring all-reduce with send and recv, checked against dist.all_reduce.")
    parser.add_argument("--world-size", type=positive_int, default=4, help="how many processes (default 4)")
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[10, 1_000, 1_000_003],
                        help="tensor sizes to try, in floats")
    parser.add_argument("--master-port", type=int, default=0, help="the rendezvous port (default: a free one)")
    args = parser.parse_args()
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(args.master_port or free_port())
    mp.spawn(worker, args=(args,), nprocs=args.world_size)


if __name__ == "__main__":
    main()
