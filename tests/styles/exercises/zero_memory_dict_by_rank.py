# replaces: zero1_bytes
import heapq


def zero1_bytes(numels, world_size):
    """A heap of (elements so far, rank) hands out the largest tensors first; the answer is a dict by rank."""
    FP32 = 4
    heap = [(0, rank) for rank in range(world_size)]
    elements = {rank: 0 for rank in range(world_size)}
    tensors = {rank: 0 for rank in range(world_size)}
    for n in sorted(numels, reverse=True):
        load, rank = heapq.heappop(heap)
        elements[rank] += n
        tensors[rank] += 1
        heapq.heappush(heap, (load + n, rank))
    everything = FP32 * sum(numels)
    return {rank: {"parameters": everything, "gradients": everything,
                   "optimizer_state": FP32 * (2 * elements[rank] + tensors[rank])}  # exp_avg, exp_avg_sq; step
            for rank in range(world_size)}
