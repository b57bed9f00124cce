# replaces: gpipe
class PipelineStage:
    """This process's stage and what it keeps between passes: its neighbours, the micro-batches'
    inputs and outputs, and the sends not yet waited for."""

    def __init__(self, module, n_micro):
        self.module = module
        self.rank = dist.get_rank()
        self.prev = self.rank - 1 if self.rank > 0 else None
        self.next = self.rank + 1 if self.rank + 1 < dist.get_world_size() else None
        self.n_micro = n_micro
        self.stash = {}
        self.requests = []

    def forward(self, i, data, target, loss_fn):
        if self.prev is None:
            x = data
        else:
            x = torch.empty(data.shape, dtype=data.dtype)
            dist.recv(x, src=self.prev)
            x.requires_grad_()
        y = self.module(x)
        if self.next is None:
            y = loss_fn(y, target) / self.n_micro
        else:
            self.requests.append(dist.isend(y.detach(), dst=self.next))
        self.stash[i] = (x, y)

    def backward(self, i):
        x, y = self.stash.pop(i)
        if self.next is None:
            y.backward()
        else:
            grad = torch.empty(y.shape, dtype=y.dtype)
            dist.recv(grad, src=self.next)
            y.backward(gradient=grad)
        if self.prev is not None:
            self.requests.append(dist.isend(x.grad, dst=self.prev))

    def finish(self):
        while self.requests:
            self.requests.pop().wait()


def gpipe(stage, micro_batches, targets, loss_fn):
    pipe = PipelineStage(stage, len(micro_batches))
    for i, (data, target) in enumerate(zip(micro_batches, targets)):
        pipe.forward(i, data, target, loss_fn)
    for i in range(len(micro_batches)):
        pipe.backward(i)
    pipe.finish()
