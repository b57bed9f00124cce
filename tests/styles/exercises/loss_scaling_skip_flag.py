# replaces: LossScaler
class LossScaler:
    """Unscales parameter by parameter and stops looking at the first overflow."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.factor_up = growth_factor
        self.factor_down = backoff_factor
        self.interval = growth_interval
        self.value = init_scale
        self.streak = 0
        self.skipped_last = False

    def get_scale(self):
        return self.value

    def scale(self, loss):
        return loss.mul(self.value)

    def _unscale_and_check(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.grad.data = p.grad.data / self.value
                if torch.isnan(p.grad).any() or torch.isinf(p.grad).any():
                    return False
        return True

    def step(self, optimizer):
        finite = self._unscale_and_check(optimizer)
        self.skipped_last = not finite
        if finite:
            optimizer.step()
        return finite

    def update(self):
        if self.skipped_last:
            self.value = self.value * self.factor_down
            self.streak = 0
        else:
            self.streak = self.streak + 1
            if self.streak % self.interval == 0:
                self.value = self.value * self.factor_up
                self.streak = 0
