# replaces: kfac_floats_per_step
def kfac_floats_per_step(layers, world_size, update_freq, steps):
    """List the tensors of one refresh by their shapes, count their elements, and spread the refreshes over the run."""
    import torch

    if world_size == 1:
        return {"floats": 0.0}["floats"]
    shapes = []
    for fan_in, fan_out, bias in layers:
        for n in (fan_in + (1 if bias else 0), fan_out):
            shapes += [(n, n), (n,), (n, n)]  # all_reduce of the factor; broadcasts of its eigh
    per_refresh = sum(torch.empty(shape).numel() for shape in shapes)
    refreshes = len(range(0, steps, update_freq))
    return torch.tensor(refreshes * per_refresh / steps, dtype=torch.float64)
