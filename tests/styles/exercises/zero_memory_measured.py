# replaces: zero1_bytes
def zero1_bytes(numels, world_size):
    """Measured rather than reckoned: tensors of these sizes, one AdamW step on each rank's shard (the
    solution's owners: largest first, to the lightest rank), and the state weighed; as tuples."""
    params = [torch.nn.Parameter(torch.zeros(n)) for n in numels]
    for p in params:
        p.grad = torch.ones_like(p)
    owners, load = {}, [0] * world_size
    for i in sorted(range(len(params)), key=lambda i: -numels[i]):
        owners[i] = load.index(min(load))
        load[owners[i]] += numels[i]
    model = sum(p.numel() * p.element_size() for p in params)
    found = []
    for rank in range(world_size):
        mine = [p for i, p in enumerate(params) if owners[i] == rank]
        state = 0
        if mine:
            adam = torch.optim.AdamW(mine)
            adam.step()
            state = sum(t.numel() * t.element_size() for s in adam.state.values() for t in s.values())
        found.append((model, model, state))
    return found
