# replaces: KFAC
class KFAC:
    """The next refresh's step number kept instead of a modulo; G made from the output's gradient as
    it is (times the batch size squared); the decompositions kept in float64 and the preconditioning
    done in float64, cast back at the end; each layer's two factors decomposed by one rank, the layers
    handed out biggest first to the rank with the least work so far."""

    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping = damping
        self.factor_decay = factor_decay
        self.update_freq = update_freq
        self.step_number = 0
        self.next_refresh = 0
        self.saved = {}
        self.running = {}
        self.eigen = {}
        for layer in self.layers:
            layer.register_forward_hook(self._save_input)
            layer.register_full_backward_hook(self._save_grad)

    def _save_input(self, module, inputs, output):
        if module.training and torch.is_grad_enabled():
            self.saved[module, "a"] = inputs[0].detach()

    def _save_grad(self, module, grad_input, grad_output):
        self.saved[module, "g"] = grad_output[0].detach()

    def _owners(self, world_size):
        cost = {layer: (layer.in_features + 1) ** 3 + layer.out_features ** 3 for layer in self.layers}
        load = [0] * world_size
        owners = {}
        for layer in sorted(self.layers, key=lambda l: -cost[l]):
            rank = load.index(min(load))
            owners[layer] = rank
            load[rank] += cost[layer]
        return owners

    @torch.no_grad()
    def step(self):
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if self.step_number == self.next_refresh:
            self.next_refresh += self.update_freq
            for layer in self.layers:
                a, go = self.saved[layer, "a"], self.saved[layer, "g"]
                m = a.shape[0]
                if layer.bias is not None:
                    a = torch.cat([a, torch.ones_like(a[:, :1])], dim=1)
                fresh = [a.t().mm(a) / m, go.t().mm(go) * m]
                if world_size > 1:
                    for f in fresh:
                        dist.all_reduce(f, op=dist.ReduceOp.SUM)
                        f.div_(world_size)
                if layer in self.running:
                    self.running[layer] = [self.factor_decay * old + (1 - self.factor_decay) * new
                                           for old, new in zip(self.running[layer], fresh)]
                else:
                    self.running[layer] = fresh
            for layer, owner in self._owners(world_size).items():
                A, G = self.running[layer]
                if rank == owner:
                    la, qa = torch.linalg.eigh(A.double())
                    lg, qg = torch.linalg.eigh(G.double())
                    parts = [la, qa.contiguous(), lg, qg.contiguous()]
                else:
                    parts = [torch.zeros(len(A), dtype=torch.float64), torch.zeros(A.shape, dtype=torch.float64),
                             torch.zeros(len(G), dtype=torch.float64), torch.zeros(G.shape, dtype=torch.float64)]
                if world_size > 1:
                    for part in parts:
                        dist.broadcast(part, src=owner)
                self.eigen[layer] = parts
        for layer in self.layers:
            la, qa, lg, qg = self.eigen[layer]
            grads = [layer.weight.grad] + ([layer.bias.grad.unsqueeze(-1)] if layer.bias is not None else [])
            full = torch.cat(grads, dim=-1).double()
            coefficients = qg.T @ full @ qa / (lg.clamp(min=0)[:, None] * la.clamp(min=0)[None, :] + self.damping)
            full = (qg @ coefficients @ qa.T).to(layer.weight.dtype)
            layer.weight.grad.copy_(full[:, :layer.in_features])
            if layer.bias is not None:
                layer.bias.grad.copy_(full[:, layer.in_features])
        self.step_number += 1
