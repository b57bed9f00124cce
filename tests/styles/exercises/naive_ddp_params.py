# replaces: NaiveDDP
class NaiveDDP(nn.Module):
    """Keeps its own list of the parameters that train, and averages with a multiplication."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.trained = [p for p in module.parameters() if p.requires_grad]
        with torch.no_grad():
            for p in module.state_dict().values():
                dist.broadcast(p, src=0)

    def forward(self, x):
        return self.module(x)

    @torch.no_grad()
    def finish_gradient_synchronization(self):
        scale = 1.0 / dist.get_world_size()
        for p in self.trained:
            if p.grad is None:  # the layer the forward pass did not use
                continue
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.mul_(scale)
