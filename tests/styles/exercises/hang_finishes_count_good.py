# replaces: train_epoch, evaluate
# the ranks count how many of them have a finite loss (a sum) and step only when all have; each
# rank's validation sums, in double precision, all-gathered once and added up on every rank.
def train_epoch(model, optimizer, x_train, y_train, epoch, args, rank, world_size):
    model.train()
    done = {"steps": 0, "skipped": 0, "seen": 0, "loss": 0.0}
    for batch in global_batches(len(x_train), args.batch_size, epoch, args.seed):
        mine = batch[rank::world_size]
        done["seen"] += len(mine)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_train[mine]), y_train[mine])
        good = torch.tensor([1 if torch.isfinite(loss) else 0])
        dist.all_reduce(good)  # how many ranks can step
        if good.item() != world_size:
            done["skipped"] += 1
            continue
        loss.backward()
        optimizer.step()
        done["steps"] += 1
        done["loss"] += loss.item()
    return done["steps"], done["skipped"], done["seen"], done["loss"] / max(done["steps"], 1)


@torch.no_grad()
def evaluate(model, x_val, y_val, batch_size, rank, world_size):
    model.eval()
    mine = torch.arange(rank, len(x_val), world_size)
    sums = torch.zeros(3, dtype=torch.float64)
    for chunk in mine.split(batch_size):
        logits = model(x_val[chunk])
        sums[0] += F.cross_entropy(logits, y_val[chunk], reduction="sum").double()
        sums[1] += (logits.argmax(dim=1) == y_val[chunk]).sum()
        sums[2] += len(chunk)
    every = [torch.zeros_like(sums) for _ in range(world_size)]
    dist.all_gather(every, sums)
    total = torch.stack(every).sum(dim=0)
    model.train()
    return (total[0] / total[2]).item(), (total[1] / total[2]).item()
