# replaces: one_f_one_b
def one_f_one_b(stage, micro_batches, targets, loss_fn):
    """Two counters: forward while fewer than (later stages + 1) micro-batches are in flight, else backward."""
    rank = dist.get_rank()
    n_stages = dist.get_world_size()
    m = len(micro_batches)
    in_flight_limit = n_stages - rank  # this stage's forward, and one per stage after it
    done_f = done_b = 0
    stash = {}
    outgoing = []
    while done_b < m:
        if done_f < m and done_f - done_b < in_flight_limit:
            i = done_f
            if rank > 0:
                inp = torch.empty_like(micro_batches[i])
                dist.recv(inp, src=rank - 1)
                inp.requires_grad_()
            else:
                inp = micro_batches[i]
            out = stage(inp)
            if rank + 1 < n_stages:
                buf = out.detach()
                outgoing.append((dist.isend(buf, dst=rank + 1), buf))
            else:
                out = loss_fn(out, targets[i]) / m
            stash[i] = (inp, out)
            done_f += 1
        else:
            i = done_b
            inp, out = stash.pop(i)
            if rank + 1 < n_stages:
                g = torch.empty_like(out)
                dist.recv(g, src=rank + 1)
                out.backward(g)
            else:
                out.backward()
            if rank > 0:
                outgoing.append((dist.isend(inp.grad, dst=rank - 1), inp.grad))
            done_b += 1
    for request, _ in outgoing:
        request.wait()
