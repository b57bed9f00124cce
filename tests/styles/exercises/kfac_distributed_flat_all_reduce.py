# replaces: KFAC
class KFAC:
    """One all_reduce for all factors of all layers (packed in one flat buffer); the decompositions
    shared with a second all_reduce: every rank writes those of its layers (round robin) into a
    zero-filled buffer, and the sum is everyone's."""

    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping, self.factor_decay, self.update_freq = damping, factor_decay, update_freq
        self.steps = 0
        self.a, self.g = {}, {}
        self.running = None
        self.decomposition = None
        for layer in self.layers:
            layer.register_forward_pre_hook(self.keep_input)
            layer.register_full_backward_hook(self.keep_output_grad)

    def keep_input(self, layer, inputs):
        if torch.is_grad_enabled():
            self.a[layer] = inputs[0].detach()

    def keep_output_grad(self, layer, grad_input, grad_output):
        self.g[layer] = grad_output[0].detach()

    def sizes(self):
        return [s for layer in self.layers for s in (layer.in_features + (layer.bias is not None), layer.out_features)]

    @torch.no_grad()
    def step(self):
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if self.steps % self.update_freq == 0:
            flat = []
            for layer in self.layers:
                a, g = self.a[layer], self.g[layer]
                b = len(a)
                if layer.bias is not None:
                    a = torch.cat([a, torch.ones(b, 1)], 1)
                flat += [(a.t() @ a / b).reshape(-1), (g.t() @ g * b).reshape(-1)]
            flat = torch.cat(flat)
            if world > 1:
                dist.all_reduce(flat)
                flat /= world
            self.running = flat if self.running is None else self.factor_decay * self.running + (1 - self.factor_decay) * flat
            sizes = self.sizes()
            factors = [m.view(s, s) for m, s in zip(self.running.split([s * s for s in sizes]), sizes)]
            shared = torch.zeros(sum(s + s * s for s in sizes))
            offset = 0
            for i, (f, s) in enumerate(zip(factors, sizes)):
                if (i // 2) % world == rank:  # factors 2k and 2k+1 are layer k's A and G
                    values, vectors = torch.linalg.eigh(f.double())
                    shared[offset:offset + s] = values.float()
                    shared[offset + s:offset + s + s * s] = vectors.float().reshape(-1)
                offset += s + s * s
            if world > 1:
                dist.all_reduce(shared)
            self.decomposition, offset = [], 0
            for s in sizes:
                self.decomposition.append((shared[offset:offset + s].clamp(min=0),
                                           shared[offset + s:offset + s + s * s].view(s, s)))
                offset += s + s * s
        for k, layer in enumerate(self.layers):
            (va, qa), (vg, qg) = self.decomposition[2 * k], self.decomposition[2 * k + 1]
            parts = [layer.weight.grad] + ([layer.bias.grad[:, None]] if layer.bias is not None else [])
            grad = torch.cat(parts, 1)
            grad = qg @ ((qg.t() @ grad @ qa) / (vg[:, None] * va[None, :] + self.damping)) @ qa.t()
            layer.weight.grad.copy_(grad[:, :layer.in_features])
            if layer.bias is not None:
                layer.bias.grad.copy_(grad[:, -1])
        self.steps += 1
