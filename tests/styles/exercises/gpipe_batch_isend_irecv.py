# replaces: gpipe
def gpipe(stage, micro_batches, targets, loss_fn):
    """Every message through dist.batch_isend_irecv, its requests kept and waited for where needed."""
    rank, size = dist.get_rank(), dist.get_world_size()
    m = len(micro_batches)
    sends, acts = [], []
    for i in range(m):
        if rank == 0:
            x = micro_batches[i]
        else:
            x = torch.empty_like(micro_batches[i])
            for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, x, rank - 1)]):
                req.wait()
            x.requires_grad_(True)
        y = stage(x)
        if rank == size - 1:
            loss = loss_fn(y, targets[i]) * (1.0 / m)
            acts.append((x, loss, None))
        else:
            out = y.detach().clone()
            sends += dist.batch_isend_irecv([dist.P2POp(dist.isend, out, rank + 1)])
            acts.append((x, y, out))
    for x, y, _ in acts:
        if rank == size - 1:
            y.backward()
        else:
            g = torch.empty_like(y)
            for req in dist.batch_isend_irecv([dist.P2POp(dist.irecv, g, rank + 1)]):
                req.wait()
            y.backward(g)
        if rank > 0:
            sends += dist.batch_isend_irecv([dist.P2POp(dist.isend, x.grad, rank - 1)])
    for req in sends:
        req.wait()
