# replaces: LARGE_BATCH, large_batch_lr, train_one_epoch
LARGE_BATCH = 32


def large_batch_lr(step, steps_per_epoch, world_size):
    """The reference's 0.02 at 16 images, grown with the global batch; reached from near 0 in
    half an epoch, one equal rise a step."""
    peak = 0.02 * world_size * LARGE_BATCH / 16
    rise_steps = max(1, steps_per_epoch // 2)
    return peak * min(1.0, (step + 1) / rise_steps)


def set_rate(optimizer, rate):
    for group in optimizer.param_groups:
        group["lr"] = rate


def train_one_epoch(model, loader, optimizer, device, lr_at, step):
    model.train()
    seen = 0
    for i, (x, y) in enumerate(loader):
        set_rate(optimizer, lr_at(step + i))
        optimizer.zero_grad()
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
        seen += y.shape[0]
    return seen, step + i + 1
