# replaces: KFAC
class KFAC:
    """Everything in lists by layer index; the input saved by a forward hook, which also hangs a hook
    on the output tensor for its gradient; the factors' decompositions from torch.linalg.svd (a
    symmetric positive semi-definite matrix's singular vectors are its eigenvectors); collectives
    made whenever a process group exists, a world of one included."""

    def __init__(self, model, damping=0.001, factor_decay=0.95, update_freq=1):
        self.modules = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.damping = damping
        self.decay = factor_decay
        self.freq = update_freq
        self.count = 0
        n = len(self.modules)
        self.a_in, self.g_out = [None] * n, [None] * n
        self.A, self.G = [None] * n, [None] * n
        self.QA, self.dA, self.QG, self.dG = [None] * n, [None] * n, [None] * n, [None] * n
        for i, m in enumerate(self.modules):
            m.register_forward_hook(self._make_hook(i))

    def _make_hook(self, i):
        def hook(module, inputs, output):
            if not output.requires_grad:  # evaluation: no backward pass will follow
                return
            self.a_in[i] = inputs[0].detach()

            def grad_hook(grad):
                self.g_out[i] = grad.detach()
            output.register_hook(grad_hook)
        return hook

    def _eig(self, M):
        U, S, _ = torch.linalg.svd(M.to(torch.float64))
        return S.to(M.dtype), U.to(M.dtype).contiguous()

    @torch.no_grad()
    def step(self):
        distributed = dist.is_initialized()
        size = dist.get_world_size() if distributed else 1
        me = dist.get_rank() if distributed else 0
        if self.count % self.freq == 0:
            for i, m in enumerate(self.modules):
                a, g = self.a_in[i], self.g_out[i]
                batch = a.shape[0]
                if m.bias is not None:
                    a = torch.cat((a, torch.ones(batch, 1, dtype=a.dtype)), 1)
                g = g * batch
                new_A = torch.matmul(a.T, a) / batch
                new_G = torch.matmul(g.T, g) / batch
                if distributed:
                    dist.all_reduce(new_A)
                    dist.all_reduce(new_G)
                    new_A = new_A / size
                    new_G = new_G / size
                if self.A[i] is None:
                    self.A[i], self.G[i] = new_A, new_G
                else:
                    self.A[i] = self.decay * self.A[i] + (1 - self.decay) * new_A
                    self.G[i] = self.decay * self.G[i] + (1 - self.decay) * new_G
            for i in range(len(self.modules)):
                owner = i % size
                if me == owner:
                    self.dA[i], self.QA[i] = self._eig(self.A[i])
                    self.dG[i], self.QG[i] = self._eig(self.G[i])
                else:
                    k, o = self.A[i].shape[0], self.G[i].shape[0]
                    self.dA[i], self.QA[i] = torch.zeros(k), torch.zeros(k, k)
                    self.dG[i], self.QG[i] = torch.zeros(o), torch.zeros(o, o)
                if distributed:
                    for t in (self.dA[i], self.QA[i], self.dG[i], self.QG[i]):
                        dist.broadcast(t, owner)
        for i, m in enumerate(self.modules):
            grad = m.weight.grad
            if m.bias is not None:
                grad = torch.cat((grad, m.bias.grad.unsqueeze(1)), 1)
            rotated = self.QG[i].T @ grad @ self.QA[i]
            rotated = rotated / (torch.outer(self.dG[i], self.dA[i]) + self.damping)
            result = self.QG[i] @ rotated @ self.QA[i].T
            m.weight.grad.copy_(result[:, :m.weight.shape[1]])
            if m.bias is not None:
                m.bias.grad.copy_(result[:, m.weight.shape[1]])
        self.count += 1
