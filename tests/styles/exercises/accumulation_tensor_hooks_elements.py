# replaces: BucketedDDP, train_step
class BucketedDDP(nn.Module):
    """Tensor hooks (they see each backward's gradient before it is added to .grad, so a bucket sends .grad plus
    it), buckets cut by counting elements, each gradient divided by the world size before a summing all-reduce,
    and a preallocated flat tensor per bucket filled by slices."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for _, t in list(module.named_parameters()) + list(module.named_buffers()):
                dist.broadcast(t, src=0)
        order = [p for p in module.parameters() if p.requires_grad][::-1]
        cap = int(bucket_size_mb * 1024 * 1024) // order[0].element_size() if order else 0  # elements
        self.buckets = []
        i = 0
        while i < len(order):
            j, count = i, 0
            while j < len(order) and (j == i or count + order[j].numel() <= cap):
                count += order[j].numel()
                j += 1
            self.buckets.append(order[i:j])
            i = j
        self.flats, self.slot = [], {}
        for b, bucket in enumerate(self.buckets):
            start = 0
            for p in bucket:
                self.slot[p] = (b, start, start + p.numel())
                start += p.numel()
            self.flats.append(torch.empty(start, dtype=bucket[0].dtype, device=bucket[0].device))
        self.require_backward_grad_sync = True
        self.filled = [0] * len(self.buckets)
        self.handles = [None] * len(self.buckets)
        for p in order:
            p.register_hook(self._make_hook(p))

    def _make_hook(self, p):
        def hook(grad):
            if self.require_backward_grad_sync:
                b, lo, hi = self.slot[p]
                total = grad if p.grad is None else p.grad + grad  # what .grad holds once this one is added
                self.flats[b][lo:hi].copy_(total.reshape(-1)).div_(dist.get_world_size())
                self.filled[b] += hi - lo
                if self.filled[b] == self.flats[b].numel():
                    self.handles[b] = dist.all_reduce(self.flats[b], op=dist.ReduceOp.SUM, async_op=True)
            return None  # the gradient itself is left as it is
        return hook

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        n = dist.get_world_size()
        for b, bucket in enumerate(self.buckets):
            if self.handles[b] is None:  # not every gradient of it came: send the bucket as .grad now holds it
                for p in bucket:
                    _, lo, hi = self.slot[p]
                    if p.grad is None:
                        self.flats[b][lo:hi].zero_()
                    else:
                        self.flats[b][lo:hi].copy_(p.grad.reshape(-1)).div_(n)
                self.handles[b] = dist.all_reduce(self.flats[b], op=dist.ReduceOp.SUM, async_op=True)
        for b, bucket in enumerate(self.buckets):
            self.handles[b].wait()
            for p in bucket:
                _, lo, hi = self.slot[p]
                if p.grad is not None:
                    p.grad.copy_(self.flats[b][lo:hi].view_as(p))
        self.filled = [0] * len(self.buckets)
        self.handles = [None] * len(self.buckets)

    @contextlib.contextmanager
    def no_sync(self):
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before


def train_step(model, optimizer, micro_batches):
    """Gradients zeroed in place; each micro-batch's mean loss weighted by its share of the examples; the contexts
    listed up front, no_sync() for all but the last."""
    optimizer.zero_grad(set_to_none=False)
    k = len(micro_batches)
    total = sum(labels.shape[0] for _, labels in micro_batches)
    contexts = [model.no_sync] * (k - 1) + [contextlib.nullcontext]
    for j in range(k):
        inputs, labels = micro_batches[j]
        with contexts[j]():
            loss = F.cross_entropy(model(inputs), labels) * (labels.shape[0] / total)
            loss.backward()
    model.finish_gradient_synchronization()
    optimizer.step()
