# replaces: ShardedOptimizer, zero1_bytes
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


def zero1_bytes(numels, world_size):
    """The same contiguous runs as ShardedOptimizer; AdamW's state per element and per tensor found by
    stepping it once on a one-element parameter."""
    probe = torch.nn.Parameter(torch.zeros(1))
    probe.grad = torch.zeros(1)
    adam = torch.optim.AdamW([probe])
    adam.step()
    per_tensor = sum(t.numel() * t.element_size() for t in adam.state[probe].values() if t.numel() == 1 and t.dim() == 0)
    per_element = sum(t.element_size() for t in adam.state[probe].values() if t.dim() > 0)
    total, start = sum(numels), 0
    state = [0] * world_size
    for n in numels:
        state[min(world_size - 1, start * world_size // total)] += n * per_element + per_tensor
        start += n
    model = sum(numels) * probe.element_size()
    return [{"optimizer_state": s, "parameters": model, "gradients": model} for s in state]
