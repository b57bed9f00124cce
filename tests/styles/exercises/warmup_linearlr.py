# replaces: warmup_lr
def warmup_lr(step, base_lr, world_size, warmup_steps):
    """As PyTorch's LinearLR(start_factor=1/warmup_steps) ramps: from target/warmup_steps at step 0."""
    target = base_lr * world_size
    if warmup_steps == 0:
        return target
    return target * min(1.0, (step + 1) / warmup_steps)
