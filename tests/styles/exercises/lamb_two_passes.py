# replaces: LAMB
class LAMB(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _direction(self, p, group):
        """Adam's bias-corrected direction for p (its state moved on by one step), weight decay included for
        matrices and kernels."""
        beta1, beta2 = group["betas"]
        s = self.state.setdefault(p, {})
        s["t"] = s.get("t", 0) + 1
        s["avg"] = beta1 * s.get("avg", torch.zeros_like(p)) + (1 - beta1) * p.grad
        s["avg_sq"] = beta2 * s.get("avg_sq", torch.zeros_like(p)) + (1 - beta2) * p.grad ** 2
        direction = (s["avg"] / (1 - beta1 ** s["t"])) / ((s["avg_sq"] / (1 - beta2 ** s["t"])).sqrt() + group["eps"])
        if p.dim() > 1:
            direction = direction + group["weight_decay"] * p.detach()
        return direction

    @torch.no_grad()
    def step(self):
        moves = []
        for group in self.param_groups:  # first every direction and ratio, then every move
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = self._direction(p, group)
                ratio = torch.ones(())
                if p.dim() > 1:
                    norms = torch.stack([p.norm(), d.norm()])
                    ratio = torch.where((norms > 0).all(), norms[0] / norms[1].clamp_min(1e-30), torch.ones(()))
                moves.append((p, group["lr"] * ratio * d))
        for p, move in moves:
            p -= move
