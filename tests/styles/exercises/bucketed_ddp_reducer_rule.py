# replaces: BucketedDDP
class BucketedDDP(nn.Module):
    """DDP's own reducer rule (a bucket is closed once it reaches the size, so its last parameter may
    take it past), a megabyte of 10**6 bytes, and each bucket's future waited on."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        cap = bucket_size_mb * 1e6
        self.buckets, current, filled = [], [], 0
        for p in reversed(list(module.parameters())):
            if not p.requires_grad:
                continue
            current.append(p)
            filled += p.nelement() * p.element_size()
            if filled >= cap:
                self.buckets.append(current)
                current, filled = [], 0
        if current:
            self.buckets.append(current)
        self.home = {}
        for index, bucket in enumerate(self.buckets):
            for p in bucket:
                self.home[p] = index
                p.register_post_accumulate_grad_hook(self._ready)
        self._reset()

    def _reset(self):
        self.arrived = [set() for _ in self.buckets]
        self.in_flight = {}

    def _ready(self, p):
        index = self.home[p]
        self.arrived[index].add(p)
        if len(self.arrived[index]) == len(self.buckets[index]):
            self._send(index)

    def _send(self, index):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                          for p in self.buckets[index]])
        self.in_flight[index] = (flat, dist.all_reduce(flat, async_op=True).get_future())

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for index in range(len(self.buckets)):
            if index not in self.in_flight:
                self._send(index)
        for index, (flat, future) in self.in_flight.items():
            future.wait()
            pieces = torch.split(flat / dist.get_world_size(), [p.numel() for p in self.buckets[index]])
            for p, piece in zip(self.buckets[index], pieces):
                if p.grad is not None:
                    p.grad.copy_(piece.view_as(p))
        self._reset()
