# replaces: one_f_one_b
def one_f_one_b(stage, micro_batches, targets, loss_fn):
    """1F1B's order worked out first, as a list of ("F", i) and ("B", i), then run."""
    rank, stages = dist.get_rank(), dist.get_world_size()
    m = len(micro_batches)
    warmup = min(stages - 1 - rank, m)
    plan = [("F", i) for i in range(warmup)]
    for k in range(m - warmup):
        plan.append(("F", warmup + k))
        plan.append(("B", k))
    plan += [("B", i) for i in range(m - warmup, m)]

    live, requests = {}, []
    for kind, i in plan:
        if kind == "F":
            if rank == 0:
                x = micro_batches[i]
            else:
                x = torch.empty_like(micro_batches[i])
                dist.recv(x, src=rank - 1)
                x.requires_grad_()
            y = stage(x)
            if rank == stages - 1:
                y = loss_fn(y, targets[i]) / m
            else:
                requests.append(dist.isend(y.detach(), dst=rank + 1))
            live[i] = (x, y)
        else:
            x, y = live.pop(i)
            if rank == stages - 1:
                y.backward()
            else:
                grad = torch.empty_like(y)
                dist.recv(grad, src=rank + 1)
                y.backward(grad)
            if rank > 0:
                requests.append(dist.isend(x.grad, dst=rank - 1))
    for r in requests:
        r.wait()
