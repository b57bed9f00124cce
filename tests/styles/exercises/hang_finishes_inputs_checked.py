# replaces: train_epoch, evaluate
# every rank holds the whole training set, so each looks at the whole global batch's inputs and
# skips it before any forward pass: the same decision everywhere, with no collective; rank 0
# validates over the whole validation set by itself, the other ranks do nothing there.
def train_epoch(model, optimizer, x_train, y_train, epoch, args, rank, world_size):
    model.train()
    steps, skipped, seen, total = 0, 0, 0, 0.0
    for batch in global_batches(len(x_train), args.batch_size, epoch, args.seed):
        seen += len(batch[rank::world_size])
        if not torch.isfinite(x_train[batch]).all():  # a corrupt sample somewhere in the global batch
            skipped += 1
            continue
        mine = batch[rank::world_size]
        loss = F.cross_entropy(model(x_train[mine]), y_train[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        total += loss.item()
    return steps, skipped, seen, total / max(steps, 1)


@torch.no_grad()
def evaluate(model, x_val, y_val, batch_size, rank, world_size):
    if rank != 0:
        return float("nan"), float("nan")  # only rank 0 prints the numbers
    net = model.module
    net.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(x_val), batch_size):
        logits = net(x_val[start:start + batch_size])
        y = y_val[start:start + batch_size]
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == y).sum())
    net.train()
    return loss_sum / len(x_val), correct / len(x_val)
