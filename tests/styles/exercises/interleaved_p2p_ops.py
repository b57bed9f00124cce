# replaces: interleaved_1f1b
def _sequence(world, v, m):
    """(chunk, micro-batch) of a rank's forward passes: in rounds of `world` micro-batches, each round
    through every chunk in turn."""
    order = []
    for start in range(0, m, world):
        for chunk in range(v):
            order.extend((chunk, i) for i in range(start, min(start + world, m)))
    return order


def interleaved_1f1b(chunks, micro_batches, targets, loss_fn):
    rank, world = dist.get_rank(), dist.get_world_size()
    v, m = len(chunks), len(micro_batches)
    fwd = _sequence(world, v, m)
    bwd = [(v - 1 - c, i) for c, i in fwd]  # the backward passes come back through the chunks last to first
    fill = min(len(fwd), 2 * (world - 1 - rank) + world * (v - 1))
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    end = v * world - 1
    acts, works = {}, []

    def key(kind, stage, i):  # a message's tag: its kind, the virtual stage it goes to, its micro-batch
        return (i * v * world + stage) * 2 + kind

    def post(tensor, peer, tag):
        works.extend((w, tensor) for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, tag=tag)]))

    def take(shape_of, peer, tag):
        buf = torch.empty_like(shape_of)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer, tag=tag)]):
            w.wait()
        return buf

    def run_f(c, i):
        stage = c * world + rank
        x = micro_batches[i] if stage == 0 else take(micro_batches[i], prv, key(0, stage, i)).requires_grad_()
        y = chunks[c](x)
        if stage == end:
            y = loss_fn(y, targets[i]) / m
        else:
            post(y.detach(), nxt, key(0, stage + 1, i))
        acts[c, i] = x, y

    def run_b(c, i):
        stage = c * world + rank
        x, y = acts.pop((c, i))
        y.backward() if stage == end else y.backward(take(y, nxt, key(1, stage, i)))
        if stage:
            post(x.grad, prv, key(1, stage - 1, i))

    for c, i in fwd[:fill]:
        run_f(c, i)
    for j, (c, i) in enumerate(fwd[fill:]):
        run_f(c, i)
        run_b(*bwd[j])
    for c, i in bwd[len(fwd) - fill:]:
        run_b(c, i)
    for w, _ in works:
        w.wait()
