# replaces: save_checkpoint, load_checkpoint
def save_checkpoint(path, model, optimizer, epoch):
    """A NamedTemporaryFile in the checkpoint's folder, flushed and synced to disk before os.replace;
    the other ranks learn that it is done from an all_reduce they all take part in."""
    import tempfile

    if dist.get_rank() == 0:
        folder = os.path.dirname(os.path.abspath(path))
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False) as tmp:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "rng": torch.get_rng_state()}, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, path)
    done = torch.zeros(1)
    dist.all_reduce(done)  # nobody is past this before rank 0 is


def load_checkpoint(path, model, optimizer, device):
    """Every rank reads it, mapping the saved tensors with a function of its own."""
    if not os.path.exists(path):
        return 1
    checkpoint = torch.load(path, map_location=lambda storage, location: storage)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["rng"])
    return checkpoint["epoch"] + 1
