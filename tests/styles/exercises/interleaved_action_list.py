# replaces: interleaved_1f1b
def interleaved_1f1b(chunks, micro_batches, targets, loss_fn):
    """The whole plan first, as a list of (kind, chunk, micro-batch), then run it; every message has a
    tag of its own made from where it goes and which micro-batch it carries."""
    me, n = dist.get_rank(), dist.get_world_size()
    v, m = len(chunks), len(micro_batches)
    n_virtual = n * v

    def slot(k):
        # k-th chunk pass of this rank: rounds of n micro-batches, each round through chunk 0, 1, ...
        rnd, rest = k // (n * v), k % (n * v)
        return rest // n, rnd * n + rest % n

    forwards = [("F",) + slot(k) for k in range(v * m)]
    backwards = [("B", v - 1 - c, i) for _, c, i in forwards]
    ahead = min(v * m, 2 * (n - me - 1) + (v - 1) * n)
    plan = forwards[:ahead]
    for f, b in zip(forwards[ahead:], backwards):
        plan += [f, b]
    plan += backwards[v * m - ahead:]

    inputs, outputs, pending = {}, {}, []

    def message_tag(direction, virtual, i):
        return direction * n_virtual * m + virtual * m + i

    for kind, c, i in plan:
        virtual = c * n + me
        if kind == "F":
            if virtual == 0:
                x = micro_batches[i]
            else:
                x = torch.zeros_like(micro_batches[i])
                dist.recv(x, (me - 1) % n, tag=message_tag(0, virtual, i))
                x.requires_grad_()
            out = chunks[c](x)
            if virtual == n_virtual - 1:
                out = loss_fn(out, targets[i]) / m
            else:
                sent = out.detach().clone()
                pending.append((dist.isend(sent, (me + 1) % n, tag=message_tag(0, virtual + 1, i)), sent))
            inputs[c, i], outputs[c, i] = x, out
        else:
            x, out = inputs.pop((c, i)), outputs.pop((c, i))
            if virtual == n_virtual - 1:
                out.backward()
            else:
                g = torch.zeros_like(out)
                dist.recv(g, (me + 1) % n, tag=message_tag(1, virtual, i))
                out.backward(g)
            if virtual > 0:
                pending.append((dist.isend(x.grad, (me - 1) % n, tag=message_tag(1, virtual - 1, i)), x.grad))
    for req, _ in pending:
        req.wait()
