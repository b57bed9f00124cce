# replaces: OverlapDDP
class OverlapDDP(nn.Module):
    """Divides in the hook, before sending (a sum of averages is the average), and waits on the
    requests' futures all at once with torch.futures.wait_all."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        self.futures = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._send)

    def _send(self, p):
        p.grad.div_(dist.get_world_size())
        self.futures.append(dist.all_reduce(p.grad, async_op=True).get_future())

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        torch.futures.wait_all(self.futures)
        self.futures = []
