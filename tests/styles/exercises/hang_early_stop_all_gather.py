# replaces: should_stop
# each rank's vote gathered on every rank; every rank reads rank 0's.
def should_stop(model, val_batches, target_loss, epoch):
    """Whether training stops after this epoch (rank 0's decision, on every rank)."""
    mine = torch.tensor([False])
    if dist.get_rank() == 0:
        loss = validation_loss(model, val_batches)
        print(f"validation loss after epoch {epoch} = {loss:.6f}", flush=True)
        mine[0] = loss < target_loss
    votes = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(votes, mine)
    return bool(votes[0].item())
