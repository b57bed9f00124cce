# replaces: should_stop
# every rank votes (the others always 0), and the votes are all-reduced with MAX.
def should_stop(model, val_batches, target_loss, epoch):
    """Whether training stops after this epoch (rank 0's decision, on every rank)."""
    vote = torch.zeros(1)
    if dist.get_rank() == 0:
        loss = validation_loss(model, val_batches)
        print(f"epoch {epoch}: validation loss {loss:.6f}", flush=True)
        if loss < target_loss:
            vote += 1
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    return vote.item() > 0
