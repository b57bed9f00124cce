# replaces: fast_loader
def fast_loader(dataset, sampler, batch_size):
    """Two worker processes, kept alive between epochs: each reads its own batches from the disk."""
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=2, persistent_workers=True,
                      prefetch_factor=4)
