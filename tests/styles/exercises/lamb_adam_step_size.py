# replaces: LAMB
class LAMB(torch.optim.Optimizer):
    """Written the way torch's Adam arranges its arithmetic: bias corrections folded into the step size and
    the denominator."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                st = self.state[p]
                if len(st) == 0:
                    st["step"] = torch.tensor(0.0)
                    st["m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["v"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["step"] += 1
                t = st["step"].item()
                st["m"].lerp_(g, 1 - b1)
                st["v"].mul_(b2).add_(g * g, alpha=1 - b2)
                bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
                denom = st["v"].sqrt() / bc2 ** 0.5 + group["eps"]
                adam = st["m"] / bc1 / denom
                if p.ndim >= 2:
                    adam.add_(p, alpha=group["weight_decay"])
                    w, u = torch.linalg.vector_norm(p), torch.linalg.vector_norm(adam)
                    trust = (w / u).item() if w > 0 and u > 0 else 1.0
                else:
                    trust = 1.0
                p.add_(adam, alpha=-group["lr"] * trust)
