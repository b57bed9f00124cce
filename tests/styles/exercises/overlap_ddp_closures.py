# replaces: OverlapDDP
class OverlapDDP(nn.Module):
    """Hooks as closures, one per parameter; the handles in a dict keyed by parameter name."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        broadcast_from_rank_0(module)
        self.works = {}
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue

            def hook(param, name=name):
                self.works[name] = (dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True), param)

            p.register_post_accumulate_grad_hook(hook)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for work, param in self.works.values():
            work.wait()
        for work, param in self.works.values():
            param.grad.div_(dist.get_world_size())
        self.works.clear()
