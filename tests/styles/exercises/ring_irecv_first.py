# replaces: ring_all_reduce
# irecv posted first, then a blocking send, then wait; the reduce-scatter and the all-gather
# as helpers of their own; the reduction chosen once from a table.
COMBINE = {"sum": torch.add, "max": torch.maximum}


def _round(chunks, send_at, receive_at):
    rank, n = dist.get_rank(), dist.get_world_size()
    buffer = torch.empty_like(chunks[receive_at])
    pending = dist.irecv(buffer, src=(rank - 1 + n) % n)
    dist.send(chunks[send_at].contiguous(), dst=(rank + 1) % n)
    pending.wait()
    return buffer


def _reduce_scatter(chunks, combine):
    rank, n = dist.get_rank(), dist.get_world_size()
    for s in range(n - 1):
        at = (rank - s - 1) % n
        chunks[at].copy_(combine(chunks[at], _round(chunks, (rank - s) % n, at)))


def _all_gather(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    for s in range(n - 1):
        chunks[(rank - s) % n].copy_(_round(chunks, (rank - s + 1) % n, (rank - s) % n))


def ring_all_reduce(tensor, op="sum"):
    chunks = list(torch.tensor_split(tensor.view(-1), dist.get_world_size()))
    _reduce_scatter(chunks, COMBINE[op])
    _all_gather(chunks)
    return tensor
