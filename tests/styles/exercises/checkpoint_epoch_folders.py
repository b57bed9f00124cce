# replaces: save_checkpoint, load_checkpoint
def save_checkpoint(path, model, optimizer, epoch):
    """Each epoch's state goes into a folder of its own; a small pointer file at `path` names the
    newest complete one, and only that pointer is replaced atomically. Old folders are pruned."""
    import json
    import shutil

    if dist.get_rank() == 0:
        folder = f"{path}.epochs/{epoch:04d}"
        os.makedirs(folder, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
        torch.save({"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()},
                   os.path.join(folder, "training.pt"))
        with open(f"{path}.next", "w") as pointer:
            json.dump({"epoch": epoch, "folder": folder}, pointer)
        os.replace(f"{path}.next", path)
        for old in os.listdir(f"{path}.epochs"):
            if old != f"{epoch:04d}":
                shutil.rmtree(os.path.join(f"{path}.epochs", old), ignore_errors=True)
    dist.barrier()


def load_checkpoint(path, model, optimizer, device):
    """Rank 0 reads the pointer and the folder it names, then broadcasts what it read to the others."""
    import json

    state = [None]
    if dist.get_rank() == 0 and os.path.exists(path):
        with open(path) as pointer:
            newest = json.load(pointer)
        extra = torch.load(os.path.join(newest["folder"], "training.pt"), map_location="cpu")
        state[0] = {"epoch": newest["epoch"], "extra": extra,
                    "model": torch.load(os.path.join(newest["folder"], "model.pt"), map_location="cpu")}
    dist.broadcast_object_list(state, src=0)
    if state[0] is None:
        return 1
    model.module.load_state_dict(state[0]["model"])
    optimizer.load_state_dict(state[0]["extra"]["optimizer"])
    torch.set_rng_state(state[0]["extra"]["rng"])
    return state[0]["epoch"] + 1
