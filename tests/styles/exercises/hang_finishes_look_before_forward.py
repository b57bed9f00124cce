# replaces: train_epoch
# a rank whose half of the batch holds a corrupt sample does not even run the model on it; the
# others do, and then every rank votes (the smallest vote wins): so a rank may run a forward pass
# on a batch that is skipped after all, and the other not.
def train_epoch(model, optimizer, x_train, y_train, epoch, args, rank, world_size):
    model.train()
    steps = skipped = seen = 0
    running = 0.0
    for batch in global_batches(len(x_train), args.batch_size, epoch, args.seed):
        mine = batch[rank::world_size]
        seen += len(mine)
        x, y = x_train[mine], y_train[mine]
        clean = bool(torch.isfinite(x).all())
        loss = F.cross_entropy(model(x), y) if clean else None
        vote = torch.tensor([1.0 if clean and torch.isfinite(loss) else 0.0])
        dist.all_reduce(vote, op=dist.ReduceOp.MIN)
        if vote.item() == 0.0:
            skipped += 1
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        running += loss.item()
    return steps, skipped, seen, running / max(steps, 1)
