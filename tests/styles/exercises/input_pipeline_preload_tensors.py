# replaces: fast_loader
def fast_loader(dataset, sampler, batch_size):
    """Read the whole data set once, many images at a time, keep it as two tensors, and slice the
    batches out of them in the sampler's order: no disk at all after that."""
    images, labels = [], []
    for x, y in DataLoader(dataset, batch_size=64, num_workers=8):
        images.append(x)
        labels.append(y)
    memory = torch.utils.data.TensorDataset(torch.cat(images), torch.cat(labels))
    return DataLoader(memory, batch_size=batch_size, sampler=sampler)
