# replaces: save_checkpoint, load_checkpoint
def save_checkpoint(path, model, optimizer, epoch):
    """torch.save straight to a fresh temporary path from tempfile.mkstemp, in the checkpoint's own
    folder (a rename across file systems would not be atomic), then os.rename onto it."""
    import tempfile

    if dist.get_rank() == 0:
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".part")
        os.close(handle)
        torch.save({"epoch": epoch, "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}, temporary)
        os.rename(temporary, path)
    dist.barrier()


def load_checkpoint(path, model, optimizer, device):
    """Every rank waits at a barrier first, then reads the file onto the CPU and moves nothing by
    hand: load_state_dict copies into tensors that are already on the device."""
    dist.barrier()
    if not os.path.isfile(path):
        return 1
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return int(state["epoch"]) + 1
