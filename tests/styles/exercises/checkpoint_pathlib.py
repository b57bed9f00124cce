# replaces: save_checkpoint
def save_checkpoint(path, model, optimizer, epoch):
    """Rank 0 writes a uniquely named temporary file in the same folder and renames it over the
    checkpoint with pathlib; the others learn that it is done from a broadcast of the epoch."""
    import tempfile
    from pathlib import Path

    target = Path(path)
    if dist.get_rank() == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": epoch, "rng": torch.get_rng_state()}
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=target.name, delete=False) as handle:
            torch.save(state, handle)
        Path(handle.name).replace(target)
    done = [epoch]
    dist.broadcast_object_list(done, src=0)  # returns once rank 0 has sent it: after the rename
