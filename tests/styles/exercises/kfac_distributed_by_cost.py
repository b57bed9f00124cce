# replaces: KFAC
class KFAC:
    """The work split per factor, not per layer: the six factors handed out largest first (an
    eigendecomposition costs about n^3) to the rank with the least work so far, so one layer's A and
    G may go to two ranks; each owner broadcasts what it found."""

    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping, self.factor_decay, self.update_freq = damping, factor_decay, update_freq
        self.t = 0
        self.acts, self.grads = {}, {}
        self.factors = {}   # (layer, "A" or "G") -> running average
        self.eigs = {}      # (layer, "A" or "G") -> (values, vectors)
        for layer in self.layers:
            layer.register_forward_pre_hook(self._on_forward)
            layer.register_full_backward_hook(self._on_backward)

    def _on_forward(self, layer, inputs):
        if torch.is_grad_enabled():
            self.acts[layer] = inputs[0].detach()

    def _on_backward(self, layer, grad_input, grad_output):
        self.grads[layer] = grad_output[0].detach()

    def _assign(self, world_size):
        keys = sorted(self.factors, key=lambda k: len(self.factors[k]), reverse=True)
        work, owner = [0] * world_size, {}
        for key in keys:
            r = min(range(world_size), key=lambda i: work[i])
            owner[key] = r
            work[r] += len(self.factors[key]) ** 3
        return owner

    @torch.no_grad()
    def step(self):
        ws = dist.get_world_size() if dist.is_initialized() else 1
        if self.t % self.update_freq == 0:
            for layer in self.layers:
                x, dy = self.acts[layer], self.grads[layer]
                if layer.bias is not None:
                    x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
                dy = dy * x.shape[0]
                for name, v in (("A", x), ("G", dy)):
                    f = v.t() @ v / v.shape[0]
                    if ws > 1:
                        dist.all_reduce(f)
                        f.div_(ws)
                    key = (layer, name)
                    old = self.factors.get(key)
                    self.factors[key] = f if old is None else old * self.factor_decay + f * (1 - self.factor_decay)
            me = dist.get_rank() if ws > 1 else 0
            for key, r in self._assign(ws).items():
                f = self.factors[key]
                if r == me:
                    values, vectors = torch.linalg.eigh(f.double())
                    values, vectors = values.float(), vectors.float().contiguous()
                else:
                    values, vectors = torch.empty(f.shape[0]), torch.empty(f.shape)
                if ws > 1:
                    dist.broadcast(values, src=r)
                    dist.broadcast(vectors, src=r)
                self.eigs[key] = (torch.clamp(values, min=0.0), vectors)
        for layer in self.layers:
            (la, qa), (lg, qg) = self.eigs[layer, "A"], self.eigs[layer, "G"]
            g = layer.weight.grad
            if layer.bias is not None:
                g = torch.cat([g, layer.bias.grad.view(-1, 1)], dim=1)
            g = qg @ ((qg.t() @ g @ qa) / (lg.view(-1, 1) * la.view(1, -1) + self.damping)) @ qa.t()
            layer.weight.grad.copy_(g[:, :layer.in_features])
            if layer.bias is not None:
                layer.bias.grad.copy_(g[:, layer.in_features])
        self.t += 1
