# replaces: evaluate, main
class Windows(torch.utils.data.Dataset):
    """The rules' samples as a data set: item i is sample i."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


@torch.no_grad()
def evaluate(model, val, world, me):
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64)
    targets = 0
    for i in range(me * 128, len(val), world * 128):  # blocks of 128, dealt out in turn
        rows = val[i: i + 128]
        out = model(rows[:, :-1])
        loss_sum += F.cross_entropy(out.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").double()
        targets += rows[:, 1:].numel()
    both = torch.stack([loss_sum, torch.tensor(float(targets), dtype=torch.float64)])
    dist.all_reduce(both, op=dist.ReduceOp.SUM)
    model.train()
    return float(both[0] / both[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target-loss", type=float, default=1.9)
    p.add_argument("--eval-every", type=int, default=4096)
    p.add_argument("--max-samples", type=int, default=400_000)
    p.add_argument("--train-bytes", type=int, default=4_000_000)
    p.add_argument("--val-bytes", type=int, default=65_537)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-file", default="log.jsonl")
    a = p.parse_args()

    dist.init_process_group(backend="gloo")
    world, me = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(a.seed)
    train_set = Windows(load_split("train", a.train_bytes))
    val = load_split("val", a.val_bytes)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True, seed=a.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=sampler)

    net = DDP(TinyGPT())
    opt = torch.optim.AdamW(net.parameters(), lr=4e-3, weight_decay=0.01)
    log_lines = []

    def note(event, **extra):
        if me == 0:
            log_lines.append(json.dumps(dict(key=event, time=time.time(), **extra)))
            with open(a.log_file, "w") as f:
                f.write("\n".join(log_lines) + "\n")

    note("run_start", division="closed", world_size=world, global_batch_size=32 * world, seed=a.seed)
    seen, due, epoch = 0, a.eval_every, 0
    while True:
        sampler.set_epoch(epoch)
        for rows in loader:
            opt.zero_grad()
            out = net(rows[:, :-1])
            F.cross_entropy(out.flatten(0, 1), rows[:, 1:].flatten()).backward()
            opt.step()
            count = torch.tensor([len(rows)])
            dist.all_reduce(count)
            seen += int(count)
            if seen >= due:
                due += a.eval_every
                val_loss = evaluate(net.module, val, world, me)
                note("eval", samples=seen, loss=val_loss)
                if val_loss <= a.target_loss:
                    note("run_stop", status="success", samples=seen)
                    dist.destroy_process_group()
                    return
            if seen >= a.max_samples:
                note("run_stop", status="aborted", samples=seen)
                dist.destroy_process_group()
                return
        epoch += 1
