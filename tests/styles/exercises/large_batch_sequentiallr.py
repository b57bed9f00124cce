# replaces: train_one_epoch
def train_one_epoch(model, loader, optimizer, device, lr_at, step):
    """PyTorch's schedulers chained (module-level state, made on the first call): LinearLR from the
    first step's rate up to the one lr_at gives once an epoch is over, then ConstantLR."""
    global scheduler
    if step == 0:
        top = lr_at(len(loader))
        for group in optimizer.param_groups:
            group["lr"] = top
        rise = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=lr_at(0) / top, total_iters=len(loader))
        hold = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
        scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [rise, hold], milestones=[len(loader)])
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
