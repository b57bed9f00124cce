# replaces: train_one_epoch
def train_one_epoch(model, loader, optimizer, device, lr_at, step):
    """The rate from an LRScheduler: a LambdaLR made on the first call (module-level state), whose
    factor turns the optimizer's own rate (--base-lr) into lr_at(step); it moves on after each step."""
    global scheduler
    if step == 0:
        base = optimizer.param_groups[0]["lr"]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s) / base)
    model.train()
    num_images = 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        num_images += len(labels)
    return num_images, step + len(loader)
