# replaces: LossScaler
class LossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.state = {"scale": init_scale, "since_change": 0, "skip": False}

    def get_scale(self):
        return self.state["scale"]

    def scale(self, loss):
        return self.state["scale"] * loss

    def step(self, optimizer):
        total = 0.0
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        for p in params:
            p.grad /= self.state["scale"]
            total += p.grad.abs().sum().item()  # inf or nan anywhere makes the sum inf or nan
        self.state["skip"] = not math.isfinite(total)
        if not self.state["skip"]:
            optimizer.step()

    def update(self):
        s = self.state
        if s["skip"]:
            s["scale"], s["since_change"] = s["scale"] * self.backoff_factor, 0
        elif s["since_change"] + 1 == self.growth_interval:
            s["scale"], s["since_change"] = s["scale"] * self.growth_factor, 0
        else:
            s["since_change"] += 1
