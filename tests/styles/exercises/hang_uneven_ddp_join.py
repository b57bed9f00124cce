# replaces: train_epoch
# DistributedDataParallel's own join() context manager, averaging over the ranks still training.
def train_epoch(model, optimizer, batches):
    """One pass over this rank's batches; this rank's mean loss, as a 1-element tensor."""
    total = torch.zeros(1)
    with model.join(divide_by_initial_world_size=False):
        for x, y in batches:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
    return total / len(batches)
