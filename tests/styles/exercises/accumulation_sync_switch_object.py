# replaces: BucketedDDP, train_step
def copy_rank_0_state(module):
    """Every process starts from rank 0's parameters and buffers."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


class _SyncSwitch:
    """What no_sync() returns: turns the wrapper's sending off on entry, back to what it was on exit."""

    def __init__(self, ddp):
        self.ddp = ddp
        self.was = None

    def __enter__(self):
        self.was = self.ddp.sending
        self.ddp.sending = False
        return self.ddp

    def __exit__(self, kind, value, traceback):
        self.ddp.sending = self.was
        return False


class BucketedDDP(nn.Module):
    """Buckets as lists of parameters, each with the set of its parameters whose gradient is in; a bucket's
    futures and flat tensors kept in a list, in the order they were sent."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        copy_rank_0_state(module)
        budget = bucket_size_mb * 2 ** 20
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.buckets = []
        room = 0
        for p in trainable[::-1]:
            need = p.numel() * p.element_size()
            if not self.buckets or need > room:
                self.buckets.append([])
                room = budget
            self.buckets[-1].append(p)
            room -= need
        self.where = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.in_bucket = [set() for _ in self.buckets]
        self.sent = []  # (bucket index, flat, work)
        self.sending = True
        for p in trainable:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, p):
        if not self.sending:
            return  # no_sync(): the gradient waits in p.grad for the next backward
        i = self.where[p]
        self.in_bucket[i].add(p)
        if len(self.in_bucket[i]) == len(self.buckets[i]):
            self._send(i)

    def _send(self, i):
        parts = []
        for p in self.buckets[i]:
            parts.append(torch.zeros(p.numel(), dtype=p.dtype, device=p.device) if p.grad is None
                         else p.grad.detach().reshape(-1))
        flat = torch.cat(parts)
        self.sent.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        done = {i for i, _, _ in self.sent}
        for i in range(len(self.buckets)):
            if i not in done:  # a parameter of it had no gradient: send what there is
                self._send(i)
        n = dist.get_world_size()
        for i, flat, work in self.sent:
            work.wait()
            start = 0
            for p in self.buckets[i]:
                end = start + p.numel()
                if p.grad is not None:
                    p.grad.copy_(flat[start:end].view(p.shape) / n)
                start = end
        self.sent = []
        self.in_bucket = [set() for _ in self.buckets]

    def no_sync(self):
        return _SyncSwitch(self)


def train_step(model, optimizer, micro_batches):
    """Summed cross-entropy over every example, divided by the example count: the micro-batches' losses add up to
    the whole share's mean. Every micro-batch but the last goes through backward inside no_sync()."""
    optimizer.zero_grad()
    total = sum(len(labels) for _, labels in micro_batches)
    losses = []
    for number, (inputs, labels) in enumerate(micro_batches, start=1):
        with contextlib.ExitStack() as stack:
            if number < len(micro_batches):
                stack.enter_context(model.no_sync())
            loss = F.cross_entropy(model(inputs), labels, reduction="sum") / total
            loss.backward()
        losses.append(loss.detach())
    model.finish_gradient_synchronization()
    optimizer.step()
    return torch.stack(losses).sum()
