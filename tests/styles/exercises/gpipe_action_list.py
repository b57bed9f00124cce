# replaces: gpipe
def gpipe(stage, micro_batches, targets, loss_fn):
    """GPipe as a list of actions worked through in order: ("forward", i) for every i, then ("backward", i)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    m = len(micro_batches)
    actions = [("forward", i) for i in range(m)] + [("backward", i) for i in range(m)]
    inputs, outputs, pending = [None] * m, [None] * m, []
    for action, i in actions:
        if action == "forward":
            if first:
                x = micro_batches[i]
            else:
                x = torch.zeros_like(micro_batches[i])
                dist.recv(x, src=rank - 1)
                x.requires_grad = True
            out = stage(x)
            if last:
                out = loss_fn(out, targets[i]) / m
            else:
                pending.append(dist.isend(out.detach(), dst=rank + 1))
            inputs[i], outputs[i] = x, out
        else:
            if last:
                outputs[i].backward()
            else:
                grad = torch.zeros_like(outputs[i])
                dist.recv(grad, src=rank + 1)
                outputs[i].backward(grad)
            if not first:
                pending.append(dist.isend(inputs[i].grad, dst=rank - 1))
            inputs[i] = outputs[i] = None  # this micro-batch's activations are no longer needed
    for request in pending:
        request.wait()
