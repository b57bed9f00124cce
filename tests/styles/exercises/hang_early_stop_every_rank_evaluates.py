# replaces: should_stop
# no collective at all: every rank measures the same validation batches with the same weights (DDP
# keeps them equal), so every rank reaches rank 0's decision by itself; only rank 0 prints.
def should_stop(model, val_batches, target_loss, epoch):
    """Whether training stops after this epoch (the same decision on every rank)."""
    loss = validation_loss(model, val_batches)
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: validation loss {loss:.6f}", flush=True)
    return loss < target_loss
