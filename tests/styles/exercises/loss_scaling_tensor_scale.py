# replaces: LossScaler
class LossScaler:
    """The scale kept as a tensor, the check for overflow made once for all gradients."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._scale = torch.tensor(float(init_scale))
        self._growth_tracker = 0
        self._found_inf = torch.tensor(0.0)

    def get_scale(self):
        return self._scale.item()

    def scale(self, loss):
        return loss * self._scale

    def step(self, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        inv = 1.0 / self._scale
        for grad in grads:
            grad.mul_(inv)
        self._found_inf = torch.stack([(~torch.isfinite(grad)).any() for grad in grads]).any().float()
        if self._found_inf.item() == 0.0:
            return optimizer.step()
        return None

    def update(self):
        if self._found_inf.item():
            self._scale = self._scale * self.backoff_factor
            self._growth_tracker = 0
            return
        self._growth_tracker += 1
        if self._growth_tracker >= self.growth_interval:
            self._scale = self._scale * self.growth_factor
            self._growth_tracker = 0
