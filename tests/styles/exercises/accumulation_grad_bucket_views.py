# replaces: BucketedDDP, train_step
def plan_buckets(params, cap_bytes):
    """Greedy, in the order given: a bucket takes the next parameter while it stays within cap_bytes; a parameter
    larger than cap_bytes is a bucket alone."""
    plan, used = [], 0
    for p in params:
        size = p.numel() * p.element_size()
        if not plan or used + size > cap_bytes:
            plan.append([])
            used = 0
        plan[-1].append(p)
        used += size
    return plan


class BucketedDDP(nn.Module):
    """Gradients as views of one flat tensor per bucket (DDP's gradient_as_bucket_view): backward accumulates straight
    into the buckets, and a full bucket is all-reduced in place. no_sync() counts how deep it is nested."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, 0)
        params = [p for p in module.parameters() if p.requires_grad]
        self.plan = plan_buckets(list(reversed(params)), bucket_size_mb * 1024 * 1024)
        self.flats, self.view_of, self.index_of = [], {}, {}
        for b, bucket in enumerate(self.plan):
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            self.flats.append(flat)
            offset = 0
            for p in bucket:
                self.view_of[p] = flat[offset:offset + p.numel()].view(p.shape)
                self.index_of[p] = b
                offset += p.numel()
                p.grad = self.view_of[p]
                p.register_post_accumulate_grad_hook(self._hook)
        self.no_sync_depth = 0
        self.waiting = [len(bucket) for bucket in self.plan]
        self.works = {}

    def _as_view(self, p):
        """Make p.grad the bucket's view again (zero_grad(set_to_none=True) dropped it)."""
        view = self.view_of[p]
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
        p.grad = view

    def _hook(self, p):
        self._as_view(p)  # inside no_sync() too: the next backward adds into the bucket itself
        if self.no_sync_depth:
            return
        b = self.index_of[p]
        self.waiting[b] -= 1
        if self.waiting[b] == 0:
            self.works[b] = dist.all_reduce(self.flats[b], async_op=True)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for b, bucket in enumerate(self.plan):
            if b not in self.works:
                for p in bucket:
                    if p.grad is None:
                        self.view_of[p].zero_()  # no gradient this step: it adds nothing to the others'
                    else:
                        self._as_view(p)
                self.works[b] = dist.all_reduce(self.flats[b], async_op=True)
        world = dist.get_world_size()
        for b in sorted(self.works):
            self.works[b].wait()
            self.flats[b].div_(world)  # the gradients are views of it: they are averaged in place
        self.works = {}
        self.waiting = [len(bucket) for bucket in self.plan]

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_depth += 1
        try:
            yield
        finally:
            self.no_sync_depth -= 1


def train_step(model, optimizer, micro_batches):
    """The gradients accumulate over the micro-batches without a word between the processes; the last micro-batch's
    backward sends the buckets."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        if i < k - 1:
            with model.no_sync():
                loss = F.cross_entropy(model(x), y)
                loss.mul(1.0 / k).backward()
        else:
            loss = F.cross_entropy(model(x), y)
            loss.mul(1.0 / k).backward()
            model.finish_gradient_synchronization()
    optimizer.step()
