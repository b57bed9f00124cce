# replaces: MasterWeights, bf16_allreduce_hook
class MasterWeights:
    """One flat fp32 buffer holds every master; the optimizer steps it as one tensor."""

    def __init__(self, model, optimizer_cls, **kwargs):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.flat = nn.Parameter(torch.cat([p.detach().float().flatten() for p in self.params]))
        self.optimizer = optimizer_cls([self.flat], **kwargs)

    def step(self):
        self.flat.grad = torch.cat([p.grad.float().flatten() for p in self.params])
        for p in self.params:
            p.grad = None
        self.optimizer.step()
        self.flat.grad = None
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(self.flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


def bf16_allreduce_hook(process_group, bucket):
    """Sums in bf16, then divides once back in the bucket's dtype."""
    size = dist.get_world_size(process_group)
    half = bucket.buffer().bfloat16()
    return dist.all_reduce(half, group=process_group, async_op=True).get_future().then(
        lambda fut: fut.value()[0].float() / size)
