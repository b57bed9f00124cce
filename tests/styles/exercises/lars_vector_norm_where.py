# replaces: LARS
class LARS(torch.optim.Optimizer):
    """Norms from torch.linalg.vector_norm, the trust ratio chosen with torch.where (no Python branch
    on a tensor), one dimension told by p.ndim, and the buffer made from zeros on the first step."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001):
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "eta": eta}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, momentum, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.ndim == 1:  # biases and norms: plain SGD
                    d_p = p.grad.clone()
                else:
                    w = torch.linalg.vector_norm(p)
                    g = torch.linalg.vector_norm(p.grad)
                    ratio = torch.where((w > 0) & (g > 0), eta * w / (g + wd * w), torch.ones_like(w))
                    d_p = (p.grad + wd * p) * ratio
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["velocity"] = torch.zeros_like(p)
                    state["velocity"].add_(d_p, alpha=lr)
                else:
                    state["velocity"].mul_(momentum).add_(d_p, alpha=lr)
                state["step"] += 1
                p.add_(-state["velocity"])
