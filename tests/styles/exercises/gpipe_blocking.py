# replaces: gpipe
def gpipe(stage, micro_batches, targets, loss_fn):
    """Blocking send and recv: safe for GPipe, where each stage's neighbour is always ready to receive
    (forward: the next stage waits for its input; backward: the stage before waits for its gradient)."""
    rank = dist.get_rank()
    has_prev, has_next = rank > 0, rank < dist.get_world_size() - 1
    saved = []
    for x, target in zip(micro_batches, targets):
        if has_prev:
            x = torch.empty_like(x)
            dist.recv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if has_next:
            dist.send(y.detach(), rank + 1)
        else:
            y = loss_fn(y, target) / len(micro_batches)
        saved.append((x, y))
    for x, y in saved:
        if has_next:
            grad = torch.empty_like(y)
            dist.recv(grad, rank + 1)
            torch.autograd.backward(y, grad)
        else:
            y.backward()
        if has_prev:
            dist.send(x.grad, rank - 1)
