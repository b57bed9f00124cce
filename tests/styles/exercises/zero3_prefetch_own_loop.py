# replaces: Zero3
class Zero3(nn.Module):
    """A module of its own, prefetching when asked: its forward walks the units itself, gathering each one's parameters before calling it
    and freeing them after; a hook on each unit's output gathers them again for its backward."""

    def __init__(self, model, optimizer_cls, prefetch=False, **kwargs):
        super().__init__()
        self.prefetch = prefetch
        self.units = list(model.children())
        self.ws, self.rk = dist.get_world_size(), dist.get_rank()
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        self.flat_shards, self.layout, self.waiting = [], [], {}
        for i, unit in enumerate(self.units):
            params = list(unit.parameters())
            if not params:
                self.flat_shards.append(None)
                self.layout.append(None)
                continue
            numel = sum(p.numel() for p in params)
            per_rank = (numel + self.ws - 1) // self.ws
            flat = F.pad(torch.cat([p.detach().view(-1) for p in params]), (0, per_rank * self.ws - numel))
            self.flat_shards.append(nn.Parameter(flat[self.rk * per_rank:(self.rk + 1) * per_rank].clone()))
            self.layout.append((params, [p.shape for p in params], numel, per_rank))
            for p in params:
                p.data = p.data.new_empty(0)
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._after_backward(i))
        self.opt = optimizer_cls([s for s in self.flat_shards if s is not None], **kwargs)

    def _materialise(self, i, async_op=False):
        params, shapes, numel, per_rank = self.layout[i]
        buffer = torch.empty(per_rank * self.ws)
        work = dist.all_gather_into_tensor(buffer, self.flat_shards[i].detach(), async_op=async_op)
        start = 0
        for p, shape in zip(params, shapes):
            p.data = buffer[start:start + shape.numel()].view(shape)
            start += shape.numel()
        return work

    def _release(self, i):
        for p in self.layout[i][0]:
            p.data = p.data.new_empty(0)

    def _after_backward(self, i):
        params, shapes, numel, per_rank = self.layout[i]
        self.waiting[i] = self.waiting.get(i, 0) + 1
        if self.waiting[i] < len(params):
            return
        self.waiting[i] = 0
        full = torch.zeros(per_rank * self.ws)
        full[:numel] = torch.cat([p.grad.view(-1) for p in params])
        part = torch.empty(per_rank)
        dist.reduce_scatter_single(part, full)
        self.flat_shards[i].grad = part / self.ws
        for p in params:
            p.grad = None
        self._release(i)

    def forward(self, x):
        with_params = [i for i, layout in enumerate(self.layout) if layout is not None]
        coming = None
        for i, unit in enumerate(self.units):
            if self.layout[i] is None:
                x = unit(x)
                continue
            if coming is not None:
                coming.wait()
            else:
                self._materialise(i)
            later = [j for j in with_params if j > i]
            coming = self._materialise(later[0], async_op=True) if self.prefetch and later else None
            x = unit(x)
            self._release(i)
            if x.requires_grad:
                x.register_hook(lambda grad, i=i: self._materialise(i))
        return x

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
