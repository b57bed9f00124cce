# replaces: LARS
class LARS(torch.optim.Optimizer):
    """The buffers in a dict of its own keyed by parameter, the learning rate applied outside the
    buffer (p -= lr x buf, buf = momentum x buf + update: the same steps while lr stays put), the
    ratio in Python floats, and a layer's weights told by their shape's length."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta))
        self.buffers = {}

    def trust_ratio(self, p, group):
        w = p.detach().pow(2).sum().sqrt().item()
        g = p.grad.detach().pow(2).sum().sqrt().item()
        if w == 0.0 or g == 0.0:
            return 1.0
        return group["eta"] * w / (g + group["weight_decay"] * w)

    def step(self):
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if len(p.shape) >= 2:
                        update = self.trust_ratio(p, group) * (p.grad + group["weight_decay"] * p)
                    else:
                        update = p.grad
                    if p in self.buffers:
                        self.buffers[p] = group["momentum"] * self.buffers[p] + update
                    else:
                        self.buffers[p] = update.clone()
                    p -= group["lr"] * self.buffers[p]
