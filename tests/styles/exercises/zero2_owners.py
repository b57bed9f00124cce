# replaces: Zero2
class Zero2:
    """ZeRO-2 with whole tensors as shards: every tensor has an owner, the only rank that receives the sum of
    its gradient (one dist.reduce per tensor, as soon as backward() has made it); the others drop theirs."""

    def __init__(self, model, optimizer_cls, bucket_size_mb=1.0, **kwargs):
        self.n, self.me = dist.get_world_size(), dist.get_rank()
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        load = [0] * self.n
        self.owner = {}
        for p in sorted(self.trainable, key=lambda p: -p.numel()):  # largest first, to the least loaded rank
            r = load.index(min(load))
            self.owner[p] = r
            load[r] += p.numel()
        for p in self.trainable:
            p.register_post_accumulate_grad_hook(self.send)
        mine = [p for p in self.trainable if self.owner[p] == self.me]
        self.opt = optimizer_cls(mine, **kwargs) if mine else None

    def send(self, p):
        dist.reduce(p.grad, dst=self.owner[p])
        if self.owner[p] == self.me:
            p.grad /= self.n
        else:
            p.grad = None

    def step(self):
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        for p in self.trainable:
            dist.broadcast(p.data, self.owner[p])
