# replaces: compute_pi
# A learner who thinks in loops: a strided share (rank, rank + N, ...) summed in plain Python,
# then one float in a tensor for the all_reduce.
def compute_pi(rank, world_size, intervals, device):
    width = 1.0 / intervals
    total = 0.0
    for k in range(rank, intervals, world_size):
        x = (k + 0.5) * width
        total += 4.0 / (1.0 + x * x)
    mine = torch.tensor([total * width], dtype=torch.float64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.SUM)
    return float(mine[0])
