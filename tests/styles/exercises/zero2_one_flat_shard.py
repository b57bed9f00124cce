# replaces: Zero2
class Zero2:
    """All of this rank's shards in one flat tensor, which one optimizer steps."""

    def __init__(self, model, optimizer_cls, bucket_size_mb=1.0, **kwargs):
        self.size, self.rank = dist.get_world_size(), dist.get_rank()
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
        for b in model.buffers():
            dist.broadcast(b, src=0)
        limit = int(bucket_size_mb * 2**20)
        self.buckets = [[]]
        for p in reversed(list(model.parameters())):
            if not p.requires_grad:
                continue
            if self.buckets[-1] and sum(q.numel() * 4 for q in self.buckets[-1]) >= limit:
                self.buckets.append([])
            self.buckets[-1].append(p)
        self.lengths = [-(-sum(p.numel() for p in b) // self.size) for b in self.buckets]
        self.starts = [sum(self.lengths[:i]) for i in range(len(self.buckets))]
        flat = []
        for b, length in zip(self.buckets, self.lengths):
            values = torch.zeros(length * self.size)
            n = sum(p.numel() for p in b)
            values[:n] = torch.cat([p.detach().view(-1) for p in b])
            flat.append(values[self.rank * length:(self.rank + 1) * length])
        self.shard = torch.nn.Parameter(torch.cat(flat))
        self.optimizer = optimizer_cls([self.shard], **kwargs)
        self.count = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.seen = [0] * len(self.buckets)
        self.handles = []
        self.grad = None
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, p):
        i = self.count[id(p)]
        self.seen[i] += 1
        if self.seen[i] != len(self.buckets[i]):
            return
        self.seen[i] = 0
        if self.grad is None:
            self.grad = torch.zeros_like(self.shard)
        n = sum(q.numel() for q in self.buckets[i])
        send = torch.zeros(self.lengths[i] * self.size)
        send[:n] = torch.cat([q.grad.view(-1) for q in self.buckets[i]])
        for q in self.buckets[i]:
            q.grad = None
        out = self.grad[self.starts[i]:self.starts[i] + self.lengths[i]]
        self.handles.append((dist.reduce_scatter_tensor(out, send, async_op=True), send))

    def step(self):
        for handle, _ in self.handles:
            handle.wait()
        self.handles = []
        self.shard.grad, self.grad = self.grad / self.size, None
        self.optimizer.step()
        self.shard.grad = None
        for b, start, length in zip(self.buckets, self.starts, self.lengths):
            gathered = torch.empty(length * self.size)
            dist.all_gather_into_tensor(gathered, self.shard.detach()[start:start + length].contiguous())
            offset = 0
            for p in b:
                p.data.copy_(gathered[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
