# replaces: Zero3
class Zero3:
    """FSDP2's way, with prefetch: every parameter is sharded on its own (flattened, padded, a piece per rank)."""

    def __init__(self, model, optimizer_cls, prefetch=False, **kwargs):
        self.model, self.prefetch, self.handles = model, prefetch, {}
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
        self.pieces = {}  # parameter -> (its shape, this rank's piece)
        self.units = [m for m in model.children() if any(True for _ in m.parameters())]
        for unit in self.units:
            for p in unit.parameters():
                size = -(-p.numel() // self.world)
                padded = torch.cat([p.detach().flatten(), torch.zeros(size * self.world - p.numel())])
                self.pieces[p] = (p.shape, nn.Parameter(padded[self.rank * size:(self.rank + 1) * size].clone()))
                p.data = torch.empty(0)
                p.register_post_accumulate_grad_hook(self.reduce)
            unit.register_forward_pre_hook(self.before)
            unit.register_forward_hook(self.after)
        self.optimizer = optimizer_cls([piece for _, piece in self.pieces.values()], **kwargs)

    def __call__(self, x):
        return self.model(x)

    def gather(self, unit, async_op=False):
        started = []
        for p in unit.parameters():
            shape, piece = self.pieces[p]
            parts = [torch.empty_like(piece) for _ in range(self.world)]
            started.append((p, shape, parts, dist.all_gather(parts, piece.detach(), async_op=async_op)))
        return started

    def place(self, started):
        for p, shape, parts, work in started:
            if work is not None:
                work.wait()
            p.data = torch.cat(parts)[:shape.numel()].view(shape)

    def before(self, unit, inputs):
        k = self.units.index(unit)
        self.place(self.handles.pop(k) if k in self.handles else self.gather(unit))
        if self.prefetch and k + 1 < len(self.units):
            self.handles[k + 1] = self.gather(self.units[k + 1], async_op=True)

    def after(self, unit, inputs, output):
        for p in unit.parameters():
            p.data = torch.empty(0)
        if output.requires_grad:
            output.register_hook(lambda grad: self.place(self.gather(unit)))

    def reduce(self, p):
        shape, piece = self.pieces[p]
        padded = torch.cat([p.grad.flatten(), torch.zeros(piece.numel() * self.world - p.numel())])
        out = torch.empty_like(piece)
        dist.reduce_scatter(out, list(padded.chunk(self.world)))
        piece.grad = out / self.world
        p.grad = None
        p.data = torch.empty(0)

    def step(self):
        self.optimizer.step()
        for _, piece in self.pieces.values():
            piece.grad = None
