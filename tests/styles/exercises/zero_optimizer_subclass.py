# replaces: ShardedOptimizer
class ShardedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer itself (its param_groups hold every parameter); the shards are
    contiguous runs of parameters cut where the running count of elements crosses k/N of the total;
    the parameters go out with asynchronous broadcasts, all waited for before step() returns."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        everything = [p for group in self.param_groups for p in group["params"]]
        n, me = dist.get_world_size(), dist.get_rank()
        total = sum(p.numel() for p in everything)
        self.sources, start = [], 0
        for p in everything:
            self.sources.append(min(n - 1, start * n // total))
            start += p.numel()
        self.everything = everything
        local = [p for p, source in zip(everything, self.sources) if source == me]
        self.local_optimizer = optimizer_cls(local, **kwargs) if local else None

    @torch.no_grad()
    def step(self, closure=None):
        if self.local_optimizer is not None:
            self.local_optimizer.step()
        handles = [dist.broadcast(p, src=source, async_op=True) for p, source in zip(self.everything, self.sources)]
        for handle in handles:
            handle.wait()
