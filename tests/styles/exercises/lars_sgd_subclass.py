# replaces: LARS
class LARS(torch.optim.SGD):
    """torch.optim.SGD does the momentum: each weight's gradient is first replaced by its scaled
    update (weight decay inside), and SGD is told there is no weight decay left to add."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        for group in self.param_groups:
            group.setdefault("eta", eta)

    @torch.no_grad()
    def step(self, closure=None):
        decays = []
        for group in self.param_groups:
            decays.append(group["weight_decay"])
            for p in group["params"]:
                if p.grad is None or p.dim() < 2:
                    continue
                wd = group["weight_decay"]
                w_norm, g_norm = torch.norm(p), torch.norm(p.grad)
                trust = 1.0
                if w_norm != 0 and g_norm != 0:
                    trust = group["eta"] * w_norm / (g_norm + wd * w_norm)
                p.grad.add_(p, alpha=wd).mul_(trust)
            group["weight_decay"] = 0.0
        try:
            super().step()
        finally:
            for group, wd in zip(self.param_groups, decays):
                group["weight_decay"] = wd
