# replaces: train_epoch, evaluate, save_checkpoint
# every rank's verdict on its share gathered, and any bad one skips the batch everywhere; validation
# keeps a collective per batch, the ranks with fewer batches adding zeros until the longest is done;
# the checkpoint's states gathered on rank 0 alone (gather_object, which every rank calls).
def train_epoch(model, optimizer, x_train, y_train, epoch, args, rank, world_size):
    model.train()
    steps, skipped, seen, losses = 0, 0, 0, []
    for batch in global_batches(len(x_train), args.batch_size, epoch, args.seed):
        part = batch[rank::world_size]
        seen += len(part)
        loss = F.cross_entropy(model(x_train[part]), y_train[part])
        verdicts = [torch.zeros(1) for _ in range(world_size)]
        dist.all_gather(verdicts, torch.tensor([float(torch.isfinite(loss).item())]))
        if min(v.item() for v in verdicts) < 1:
            skipped += 1
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        losses.append(loss.item())
    return steps, skipped, seen, sum(losses) / max(len(losses), 1)


@torch.no_grad()
def evaluate(model, x_val, y_val, batch_size, rank, world_size):
    model.eval()
    x_mine, y_mine = x_val[rank::world_size], y_val[rank::world_size]
    batches = torch.tensor([(len(x_mine) + batch_size - 1) // batch_size])
    dist.all_reduce(batches, op=dist.ReduceOp.MAX)  # the longest shard's count
    loss_sum, correct, count = 0.0, 0.0, 0.0
    for k in range(int(batches.item())):
        x, y = x_mine[k * batch_size:(k + 1) * batch_size], y_mine[k * batch_size:(k + 1) * batch_size]
        numbers = torch.zeros(3)
        if len(y):
            logits = model(x)
            numbers[0] = F.cross_entropy(logits, y, reduction="sum")
            numbers[1] = (logits.argmax(dim=1) == y).sum()
            numbers[2] = len(y)
        dist.all_reduce(numbers)
        loss_sum, correct, count = loss_sum + numbers[0].item(), correct + numbers[1].item(), count + numbers[2].item()
    model.train()
    return loss_sum / count, correct / count


def save_checkpoint(path, model, optimizer, epoch, rank_state, rank):
    states = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(rank_state, states, dst=0)
    if rank == 0:
        torch.save({"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "ranks": states}, path)
        print(f"epoch {epoch}: saved {path} with the state of {len(states)} ranks", flush=True)
