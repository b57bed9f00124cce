# replaces: warmup_lr
def warmup_lr(step, base_lr, world_size, warmup_steps):
    """A ramp from zero, written with a fraction of the warm-up done."""
    done = 1.0 if warmup_steps <= 0 else min(step / warmup_steps, 1.0)
    return done * world_size * base_lr
