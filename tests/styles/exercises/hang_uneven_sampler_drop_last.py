# replaces: make_batches
# the batches dealt out by a DistributedSampler with drop_last=True: every rank gets the same number,
# and the remainder is left out.
def make_batches(rank, world_size, count, batch_size=16):
    """This rank's share of the data set's `count` batches, the same number on every rank."""
    from torch.utils.data import DistributedSampler

    generator = torch.Generator().manual_seed(100)
    weights = torch.linspace(-1.0, 1.0, FEATURES)
    batches = []
    for _ in range(count):
        x = torch.randn(batch_size, FEATURES, generator=generator)
        y = x @ weights + 0.1 * torch.randn(batch_size, generator=generator)
        batches.append((x, y.unsqueeze(1)))
    sampler = DistributedSampler(batches, num_replicas=world_size, rank=rank, shuffle=False, drop_last=True)
    return [batches[i] for i in sampler]
