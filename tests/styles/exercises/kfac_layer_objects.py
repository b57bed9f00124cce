# replaces: KFAC
class LayerCurvature:
    """One layer's share of K-FAC: its hooks (a forward pre-hook, a full backward pre-hook), its
    running factors, and the divisor of the eigenbasis computed once per refresh."""

    def __init__(self, layer):
        self.layer = layer
        self.a = self.g = None
        self.A = self.G = None
        self.eig_a = self.eig_g = None
        self.divisor = None
        layer.register_forward_pre_hook(self.forward_pre)
        layer.register_full_backward_pre_hook(self.backward_pre)

    def forward_pre(self, module, args):
        if torch.is_grad_enabled():
            x = args[0].detach()
            self.a = F.pad(x, (0, 1), value=1.0) if module.bias is not None else x

    def backward_pre(self, module, grad_output):
        self.g = grad_output[0].detach()

    def batch_factors(self):
        n = self.a.shape[0]
        A = torch.einsum("ni,nj->ij", self.a, self.a) / n
        G = torch.einsum("ni,nj->ij", self.g, self.g) * n  # (n g)^T (n g) / n
        return A, G

    def average(self, A, G, decay):
        if self.A is None:
            self.A, self.G = A.clone(), G.clone()
        else:
            self.A = torch.lerp(A, self.A, decay)  # decay x old + (1 - decay) x new
            self.G = torch.lerp(G, self.G, decay)

    def decompose(self):
        values_a, vectors_a = torch.linalg.eigh(self.A.double())
        values_g, vectors_g = torch.linalg.eigh(self.G.double())
        return [values_a.float(), vectors_a.float().contiguous(), values_g.float(), vectors_g.float().contiguous()]

    def receive(self, found, damping):
        values_a, self.vectors_a, values_g, self.vectors_g = found
        self.divisor = values_g.clamp(min=0).unsqueeze(1) * values_a.clamp(min=0).unsqueeze(0) + damping

    def precondition(self):
        w = self.layer.weight
        b = self.layer.bias
        grad = w.grad if b is None else torch.hstack([w.grad, b.grad.reshape(-1, 1)])
        v = self.vectors_g @ ((self.vectors_g.t() @ grad @ self.vectors_a) / self.divisor) @ self.vectors_a.t()
        w.grad = v[:, :w.shape[1]].contiguous()
        if b is not None:
            b.grad = v[:, -1].contiguous()


class KFAC:
    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.curvatures = [LayerCurvature(m) for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping, self.factor_decay, self.update_freq = damping, factor_decay, update_freq
        self.calls = 0

    @torch.no_grad()
    def step(self):
        refresh = self.calls % self.update_freq == 0
        self.calls += 1
        if refresh:
            n = dist.get_world_size() if dist.is_initialized() else 1
            for c in self.curvatures:
                A, G = c.batch_factors()
                if n > 1:
                    both = torch.cat([A.flatten(), G.flatten()])
                    dist.all_reduce(both)
                    both /= n
                    A, G = both[:A.numel()].view_as(A), both[A.numel():].view_as(G)
                c.average(A, G, self.factor_decay)
            me = dist.get_rank() if n > 1 else 0
            for i, c in enumerate(reversed(self.curvatures)):  # round robin from the last layer
                owner = i % n
                if me == owner:
                    found = c.decompose()
                else:
                    found = [torch.empty(len(c.A)), torch.empty_like(c.A), torch.empty(len(c.G)), torch.empty_like(c.G)]
                if n > 1:
                    for t in found:
                        dist.broadcast(t, owner)
                c.receive(found, self.damping)
        for c in self.curvatures:
            c.precondition()
