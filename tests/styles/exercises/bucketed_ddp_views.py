# replaces: BucketedDDP
class BucketedDDP(nn.Module):
    """One flat buffer per bucket, allocated once; each gradient copied into its slice when ready."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        capacity = int(bucket_size_mb * 2 ** 20)
        groups, used = [], capacity + 1
        for p in list(module.parameters())[::-1]:
            if not p.requires_grad:
                continue
            size = p.numel() * p.element_size()
            if groups and used + size <= capacity:
                groups[-1].append(p)
                used += size
            else:
                groups.append([p])
                used = size
        self.buffers = [torch.zeros(sum(p.numel() for p in g)) for g in groups]
        self.slot = {}
        for k, group in enumerate(groups):
            offset = 0
            for p in group:
                self.slot[p] = (k, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self._arrived)
        self.groups = groups
        self.missing = [len(g) for g in groups]
        self.works = [None] * len(groups)

    def _arrived(self, p):
        k, offset = self.slot[p]
        self.buffers[k][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        self.missing[k] -= 1
        if self.missing[k] == 0:
            self.works[k] = dist.all_reduce(self.buffers[k], async_op=True)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for k in range(len(self.groups)):
            if self.works[k] is None:  # a bucket holding a parameter without gradient this step
                for p in self.groups[k]:
                    if p.grad is None:
                        kk, offset = self.slot[p]
                        self.buffers[k][offset:offset + p.numel()].zero_()
                self.works[k] = dist.all_reduce(self.buffers[k], async_op=True)
        for k, work in enumerate(self.works):
            work.wait()
            self.buffers[k] /= dist.get_world_size()
            for p in self.groups[k]:
                if p.grad is not None:
                    kk, offset = self.slot[p]
                    p.grad.copy_(self.buffers[k][offset:offset + p.numel()].view_as(p))
        self.missing = [len(g) for g in self.groups]
        self.works = [None] * len(self.groups)
