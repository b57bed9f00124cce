# replaces: interleaved_1f1b
class _Chunked:
    """One rank's chunks of an interleaved pipeline: counters of the forward and backward passes done,
    and the activations of those whose backward pass is still to come."""

    def __init__(self, chunks, micro_batches, targets, loss_fn):
        self.chunks, self.inputs, self.targets, self.loss_fn = chunks, micro_batches, targets, loss_fn
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.v, self.m = len(chunks), len(micro_batches)
        self.kept, self.requests = {}, []
        self.forwards = self.backwards = 0

    def where(self, count, backward):
        per_round = self.size * self.v
        chunk = (count % per_round) // self.size
        micro = (count // per_round) * self.size + count % self.size
        return (self.v - 1 - chunk if backward else chunk), micro

    def tag(self, stage, micro, grad):
        # one tag per (receiving virtual stage, micro-batch, direction): never two alike between two ranks
        return 2 * (stage * self.m + micro) + (1 if grad else 0)

    def forward(self):
        chunk, micro = self.where(self.forwards, False)
        stage = chunk * self.size + self.rank
        if stage == 0:
            x = self.inputs[micro]
        else:
            x = torch.empty_like(self.inputs[micro])
            dist.recv(x, src=(self.rank - 1) % self.size, tag=self.tag(stage, micro, False))
            x.requires_grad_(True)
        y = self.chunks[chunk](x)
        if stage == self.size * self.v - 1:
            y = self.loss_fn(y, self.targets[micro]) / self.m
        else:
            buf = y.detach()
            self.requests.append((dist.isend(buf, dst=(self.rank + 1) % self.size,
                                             tag=self.tag(stage + 1, micro, False)), buf))
        self.kept[chunk, micro] = (x, y)
        self.forwards += 1

    def backward(self):
        chunk, micro = self.where(self.backwards, True)
        stage = chunk * self.size + self.rank
        x, y = self.kept.pop((chunk, micro))
        if stage == self.size * self.v - 1:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=(self.rank + 1) % self.size, tag=self.tag(stage, micro, True))
            y.backward(grad)
        if stage > 0:
            self.requests.append((dist.isend(x.grad, dst=(self.rank - 1) % self.size,
                                             tag=self.tag(stage - 1, micro, True)), x.grad))
        self.backwards += 1


def interleaved_1f1b(chunks, micro_batches, targets, loss_fn):
    """Forward while fewer chunk passes are in flight than the warm-up allows, then backward and forward
    in turn, until every backward pass is done."""
    p = _Chunked(chunks, micro_batches, targets, loss_fn)
    total = p.v * p.m
    in_flight = min(total, (p.size - p.rank - 1) * 2 + (p.v - 1) * p.size + 1)
    while p.backwards < total:
        if p.forwards < total and p.forwards - p.backwards < in_flight:
            p.forward()
        else:
            p.backward()
    for request, _ in p.requests:
        request.wait()
