# replaces: Zero3
class Zero3:
    """FSDP1's way, with the next unit's gather started before a unit runs: each unit's parameters are views into one flat buffer, whose memory is resized to nothing when
    freed and back when gathered; the views stay valid."""

    def __init__(self, model, optimizer_cls, prefetch=False, **kwargs):
        self.model, self.n, self.r = model, dist.get_world_size(), dist.get_rank()
        self.prefetch, self.in_flight = prefetch, {}
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0)
        self.flats, self.shards, self.counts, self.owners = [], [], [], {}
        for i, unit in enumerate(m for m in model.children() if list(m.parameters())):
            params = list(unit.parameters())
            total = sum(p.numel() for p in params)
            padded = -(-total // self.n) * self.n
            flat = torch.zeros(padded)
            flat[:total] = torch.cat([p.detach().flatten() for p in params])
            self.shards.append(nn.Parameter(flat.chunk(self.n)[self.r].clone()))
            at = 0
            for p in params:
                p.data = flat[at:at + p.numel()].view_as(p)
                at += p.numel()
                p.register_post_accumulate_grad_hook(self._grad_hook)
                self.owners[p] = i
            self.flats.append((flat, params))
            self.counts.append(0)
            flat.untyped_storage().resize_(0)
            unit.register_forward_pre_hook(lambda mod, args, i=i: self._forward_gather(i))
            unit.register_forward_hook(lambda mod, args, out, i=i: self._free(i))
            unit.register_full_backward_pre_hook(lambda mod, grad, i=i: self._gather(i))
        self.optimizer = optimizer_cls(self.shards, **kwargs)

    def __call__(self, x):
        return self.model(x)

    def _forward_gather(self, i):
        if i in self.in_flight:
            self.in_flight.pop(i).wait()
        else:
            self._gather(i)
        if self.prefetch and i + 1 < len(self.flats):
            self.in_flight[i + 1] = self._gather(i + 1, async_op=True)

    def _gather(self, i, async_op=False):
        flat, _ = self.flats[i]
        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
        return dist.all_gather_into_tensor(flat, self.shards[i].detach(), async_op=async_op)

    def _free(self, i):
        self.flats[i][0].untyped_storage().resize_(0)

    def _grad_hook(self, p):
        i = self.owners[p]
        flat, params = self.flats[i]
        self.counts[i] += 1
        if self.counts[i] < len(params):
            return
        self.counts[i] = 0
        grads = torch.zeros(flat.numel())
        grads[:sum(q.numel() for q in params)] = torch.cat([q.grad.flatten() for q in params])
        mine = torch.zeros_like(self.shards[i])
        dist.reduce_scatter_tensor(mine, grads)
        self.shards[i].grad = mine.div_(self.n)
        for q in params:
            q.grad = None
        self._free(i)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
