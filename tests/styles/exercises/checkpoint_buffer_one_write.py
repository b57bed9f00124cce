# replaces: save_checkpoint, load_checkpoint
def save_checkpoint(path, model, optimizer, epoch):
    """Serialise into memory, write the bytes to a temporary file of this process in one write, and
    rename it over the checkpoint; then every rank meets at a barrier."""
    import io

    if dist.get_rank() == 0:
        buffer = io.BytesIO()
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch, "rng": torch.get_rng_state()}, buffer)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "wb") as out:
            out.write(buffer.getvalue())
        os.replace(partial, path)
    dist.barrier()


def load_checkpoint(path, model, optimizer, device):
    """Try the file; no file means a first start."""
    try:
        saved = torch.load(path, map_location=device)
    except FileNotFoundError:
        return 1
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["rng"])
    return saved["epoch"] + 1
