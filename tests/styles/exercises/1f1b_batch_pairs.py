# replaces: one_f_one_b
def _exchange(ops):
    """Post the point-to-point operations together and wait for all of them (none: nothing to do)."""
    ops = [op for op in ops if op is not None]
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()


def one_f_one_b(stage, micro_batches, targets, loss_fn):
    """Megatron's way: in the steady phase a stage sends its output and receives the gradient it needs
    next in one batch, then sends its input's gradient and receives its next input in one batch, so
    that each pair of neighbours always waits on a send and a recv that match."""
    rank, stages = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == stages - 1
    m = len(micro_batches)
    warmup = min(stages - rank - 1, m)
    steady = m - warmup
    held = []  # (input, output) of the micro-batches whose backward pass is still to come

    def recv_input(i):
        if first:
            return micro_batches[i]
        x = torch.empty_like(micro_batches[i])
        _exchange([dist.P2POp(dist.irecv, x, rank - 1)])
        return x.requires_grad_()

    def run_forward(i, x):
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i]) / m
        held.append((x, y))
        return y

    def run_backward(grad):
        x, y = held.pop(0)
        y.backward(grad)
        return None if first else x.grad

    def grad_buffer(y):
        return None if last else torch.empty_like(y)

    for i in range(warmup):
        y = run_forward(i, recv_input(i))
        _exchange([None if last else dist.P2POp(dist.isend, y.detach(), rank + 1)])
    x = recv_input(warmup) if steady > 0 else None
    for k in range(steady):
        y = run_forward(warmup + k, x)
        grad = grad_buffer(held[0][1])
        _exchange([None if last else dist.P2POp(dist.isend, y.detach(), rank + 1),
                   None if last else dist.P2POp(dist.irecv, grad, rank + 1)])
        dx = run_backward(grad)
        if k == steady - 1:
            _exchange([None if first else dist.P2POp(dist.isend, dx, rank - 1)])
        else:
            x = None if first else torch.empty_like(micro_batches[warmup + k + 1])
            _exchange([None if first else dist.P2POp(dist.isend, dx, rank - 1),
                       None if first else dist.P2POp(dist.irecv, x, rank - 1)])
            if first:
                x = micro_batches[warmup + k + 1]
            else:
                x.requires_grad_()
    for _ in range(warmup):
        grad = grad_buffer(held[0][1])
        _exchange([None if last else dist.P2POp(dist.irecv, grad, rank + 1)])
        dx = run_backward(grad)
        _exchange([None if first else dist.P2POp(dist.isend, dx, rank - 1)])
