# replaces: ShardedOptimizer
def split_by_size(tensors, parts):
    """Indices of `tensors` for each of `parts` shards: each tensor goes to the lightest shard so far."""
    shards, weights = [[] for _ in range(parts)], [0] * parts
    for index in sorted(range(len(tensors)), key=lambda i: tensors[i].numel(), reverse=True):
        lightest = min(range(parts), key=weights.__getitem__)
        shards[lightest].append(index)
        weights[lightest] += tensors[index].numel()
    return shards


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.all_params = [p for p in params]
        self.shards = split_by_size(self.all_params, dist.get_world_size())
        own = [self.all_params[i] for i in self.shards[dist.get_rank()]]
        self.opt = optimizer_cls(own, **kwargs) if own else None

    def step(self):
        if self.opt:
            self.opt.step()
        with torch.no_grad():
            for source, shard in enumerate(self.shards):
                for i in shard:
                    dist.broadcast(self.all_params[i], source)
