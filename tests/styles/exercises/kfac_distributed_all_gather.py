# replaces: KFAC
class KFAC:
    """The factors listed in one sequence [A1, G1, A2, G2, ...], handed out round robin one factor
    at a time; each rank packs what it decomposed into a buffer as long as all the decompositions
    (zeros elsewhere), all_gather brings every rank's buffer, and each factor's part is read from its
    owner's buffer."""

    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping, self.factor_decay, self.update_freq = damping, factor_decay, update_freq
        self.n_steps = 0
        self.captured = [dict() for _ in self.linears]
        self.factors = [None] * (2 * len(self.linears))
        self.eig = [None] * (2 * len(self.linears))
        for i, m in enumerate(self.linears):
            m.register_forward_pre_hook(lambda mod, inp, i=i: self.capture(i, "a", inp[0]))
            m.register_full_backward_hook(lambda mod, gin, gout, i=i: self.capture(i, "g", gout[0]))

    def capture(self, i, what, tensor):
        if what == "g" or torch.is_grad_enabled():
            self.captured[i][what] = tensor.detach().clone()

    @torch.no_grad()
    def step(self):
        on = dist.is_initialized()
        world, me = (dist.get_world_size(), dist.get_rank()) if on else (1, 0)
        if self.n_steps % self.update_freq == 0:
            for i, m in enumerate(self.linears):
                a, g = self.captured[i]["a"], self.captured[i]["g"]
                n = a.size(0)
                if m.bias is not None:
                    a = torch.column_stack([a, torch.ones(n)])
                for j, batch_factor in ((2 * i, a.T @ a / n), (2 * i + 1, n * (g.T @ g))):
                    if on:
                        dist.all_reduce(batch_factor)
                        batch_factor = batch_factor / world
                    old = self.factors[j]
                    self.factors[j] = batch_factor if old is None else self.factor_decay * old + (1 - self.factor_decay) * batch_factor
            spans, total = [], 0
            for f in self.factors:
                spans.append(total)
                total += f.size(0) * (f.size(0) + 1)
            mine = torch.zeros(total)
            for j, f in enumerate(self.factors):
                if j % world == me:
                    values, vectors = torch.linalg.eigh(f.double())
                    s = f.size(0)
                    mine[spans[j]:spans[j] + s] = values.float()
                    mine[spans[j] + s:spans[j] + s * (s + 1)] = vectors.float().flatten()
            everyone = [torch.zeros(total) for _ in range(world)]
            if on:
                dist.all_gather(everyone, mine)
            else:
                everyone = [mine]
            for j, f in enumerate(self.factors):
                s, start, buffer = f.size(0), spans[j], everyone[j % world]
                self.eig[j] = (buffer[start:start + s].clamp(min=0), buffer[start + s:start + s * (s + 1)].reshape(s, s))
        for i, m in enumerate(self.linears):
            (la, qa), (lg, qg) = self.eig[2 * i], self.eig[2 * i + 1]
            grad = m.weight.grad if m.bias is None else torch.column_stack([m.weight.grad, m.bias.grad])
            grad = qg @ ((qg.T @ grad @ qa) / (lg.unsqueeze(1) * la.unsqueeze(0) + self.damping)) @ qa.T
            if m.bias is None:
                m.weight.grad.copy_(grad)
            else:
                m.weight.grad.copy_(grad[:, :-1])
                m.bias.grad.copy_(grad[:, -1])
        self.n_steps += 1
