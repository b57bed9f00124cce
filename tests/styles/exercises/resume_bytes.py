# replaces: load_checkpoint
def load_checkpoint(path, model, optimizer, device):
    """Reads the file's bytes first, loads the tensors onto the CPU, and lets load_state_dict put
    them where the model and the optimizer already are."""
    import io

    try:
        with open(path, "rb") as handle:
            state = torch.load(io.BytesIO(handle.read()), map_location="cpu")
    except FileNotFoundError:
        return 1
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["epoch"]) + 1
