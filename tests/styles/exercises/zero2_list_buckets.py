# replaces: Zero2
class Zero2:
    def __init__(self, model, optimizer_cls, bucket_size_mb=1.0, **kwargs):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.world, self.rank = world, rank
        with torch.no_grad():
            for t in model.state_dict().values():
                dist.broadcast(t, src=0)
        # buckets of at most this many elements, filled from the last parameter to the first
        per_bucket = max(1, int(bucket_size_mb * 1024 * 1024 / 4))
        groups, current = [], []
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            if current and sum(q.numel() for q in current) + p.numel() > per_bucket:
                groups.append(current)
                current = []
            current.append(p)
        groups.append(current)
        self.groups = groups
        self.waiting = {}
        self.pieces = []
        for g, group in enumerate(groups):
            total = sum(p.numel() for p in group)
            piece = (total + world - 1) // world
            whole = torch.cat([p.detach().flatten() for p in group] + [torch.zeros(piece * world - total)])
            self.pieces.append(torch.nn.Parameter(whole.chunk(world)[rank].clone()))
            self.waiting[g] = len(group)
            for p in group:
                p.register_post_accumulate_grad_hook(lambda p, g=g: self.arrived(g))
        self.optimizer = optimizer_cls(self.pieces, **kwargs)

    def arrived(self, g):
        self.waiting[g] -= 1
        if self.waiting[g]:
            return
        group, piece = self.groups[g], self.pieces[g]
        total = sum(p.numel() for p in group)
        grads = torch.cat([p.grad.flatten() / self.world for p in group] + [torch.zeros(piece.numel() * self.world - total)])
        for p in group:
            p.grad = None
        out = torch.zeros(piece.numel())
        dist.reduce_scatter(out, list(grads.chunk(self.world)))
        piece.grad = out
        self.waiting[g] = len(group)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()
        for group, piece in zip(self.groups, self.pieces):
            parts = [torch.zeros_like(piece) for _ in range(self.world)]
            dist.all_gather(parts, piece.detach())
            values = torch.cat(parts)
            start = 0
            with torch.no_grad():
                for p in group:
                    p.copy_(values[start:start + p.numel()].reshape(p.shape))
                    start += p.numel()
