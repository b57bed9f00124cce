# replaces: bytes_per_rank
def bytes_per_rank(model, batch_size, stage, world_size):
    # rather than work out what each layer keeps, run one forward pass and watch what autograd saves
    import torch

    params = list(model.parameters())
    total = sum(p.nelement() * p.element_size() for p in params)  # bytes of every parameter
    per_rank = total / world_size  # a flat vector split evenly (the padding is a few bytes at most)

    weights = {p.untyped_storage().data_ptr() for p in params}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:  # the weights are counted above, not here
            saved[storage.data_ptr()] = storage.nbytes()  # by storage: a ReLU's output is the next Linear's input
        return t

    first = next(m for m in model if isinstance(m, nn.Linear))
    x = torch.zeros(batch_size, first.in_features, dtype=first.weight.dtype)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)  # the graph is dropped at once; nothing is stepped or accumulated

    peak = total
    if stage == 3:  # each layer is gathered whole in turn; take the worst moment
        peak = max(per_rank + sum(p.nelement() * p.element_size() for p in m.parameters())
                   for m in model if isinstance(m, nn.Linear))
    return {
        "peak_parameters": peak,
        "parameters": per_rank if stage == 3 else total,
        "gradients": per_rank if stage in (2, 3) else total,
        "optimizer_state": 2 * (per_rank if stage != 0 else total),  # exp_avg and exp_avg_sq
        "activations": sum(saved.values()),
    }
