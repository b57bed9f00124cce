# replaces: save_checkpoint
def save_checkpoint(path, model, optimizer, epoch):
    """Rank 0 writes a uniquely named temporary file in the same folder and renames it over the
    checkpoint with pathlib; the others learn that it is done from a broadcast of the epoch."""
    import tempfile
    from pathlib import Path

    target = Path(path)
    state = torch.get_rng_state().to(next(model.parameters()).device)
    generators = [torch.empty_like(state) for _ in range(dist.get_world_size())] if dist.get_rank() == 0 else None
    dist.gather(state, generators, dst=0)  # each rank's generator, in rank order, on rank 0
    if dist.get_rank() == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": epoch, "rng": [g.cpu() for g in generators]}
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=target.name, delete=False) as handle:
            torch.save(state, handle)
        Path(handle.name).replace(target)
    done = [epoch]
    dist.broadcast_object_list(done, src=0)  # returns once rank 0 has sent it: after the rename
