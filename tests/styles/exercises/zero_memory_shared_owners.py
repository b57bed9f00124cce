# replaces: ShardedOptimizer, zero1_bytes
def owners_of(numels, world_size):
    """One rule for the optimizer and the prediction: in the model's order, each tensor to the rank
    holding the fewest elements so far."""
    load, owners = [0] * world_size, []
    for n in numels:
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners.append(rank)
        load[rank] += n
    return owners


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        self.owners = owners_of([p.numel() for p in self.params], dist.get_world_size())
        mine = [p for p, o in zip(self.params, self.owners) if o == dist.get_rank()]
        self.inner = optimizer_cls(mine, **kwargs) if mine else None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        if self.inner is not None:
            self.inner.step()
        for p, o in zip(self.params, self.owners):
            dist.broadcast(p, src=o)


def zero1_bytes(numels, world_size):
    owners = owners_of(numels, world_size)
    model = 4 * sum(numels)
    return [[model, model, sum(4 * (2 * n + 1) for n, o in zip(numels, owners) if o == rank)]
            for rank in range(world_size)]
