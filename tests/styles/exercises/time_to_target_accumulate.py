# replaces: evaluate, main
MICRO = 16  # samples per process and micro-step; two micro-steps a step


class Trainer:
    """DDP with gradient accumulation (no_sync), a warm-up, and an evaluation reduced to rank 0 and
    broadcast back."""

    def __init__(self, args):
        self.args = args
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        self.train = load_split("train", args.train_bytes)
        self.val = load_split("val", args.val_bytes)
        self.model = DDP(TinyGPT())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=4e-3, weight_decay=0.01)
        self.warmup = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda step: min(1.0, (step + 1) / 20))
        self.step_size = 2 * MICRO * self.world

    def write(self, key, **fields):
        if self.rank == 0:
            with open(self.args.log_file, "a") as f:
                f.write(json.dumps({"key": key, "time": time.time(), **fields}) + "\n")

    def loss(self, rows):
        logits = self.model(rows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), rows[:, 1:].reshape(-1))

    def step(self, rows):
        first, second = rows[:MICRO], rows[MICRO:]
        with self.model.no_sync():  # no all-reduce after the first micro-step
            (self.loss(first) * len(first) / len(rows)).backward()
        (self.loss(second) * len(second) / len(rows)).backward()
        self.opt.step()
        self.opt.zero_grad()
        self.warmup.step()

    def evaluate(self):
        self.model.eval()
        with torch.inference_mode():
            mine = self.val[self.rank::self.world]
            logits = self.model.module(mine[:, :-1])
            total = F.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1), reduction="sum")
        result = torch.tensor([total.item(), mine[:, 1:].numel()], dtype=torch.float64)
        dist.reduce(result, dst=0)
        answer = torch.tensor([result[0] / result[1] if self.rank == 0 else 0.0], dtype=torch.float64)
        dist.broadcast(answer, src=0)
        self.model.train()
        return answer.item()

    def run(self):
        self.write("run_start", division="closed", world_size=self.world, global_batch_size=self.step_size,
                   seed=self.args.seed)
        order = torch.Generator().manual_seed(self.args.seed)
        done, evals = 0, 0
        while done < self.args.max_samples:
            for idx in torch.randperm(len(self.train), generator=order).split(self.step_size):
                if len(idx) < self.step_size:
                    break  # the epoch's ragged end is left out
                self.step(self.train[idx[self.rank::self.world]])
                done += len(idx)
                if done >= (evals + 1) * self.args.eval_every:
                    evals += 1
                    quality = self.evaluate()
                    self.write("eval", samples=done, loss=quality)
                    if quality <= self.args.target_loss:
                        return "success", done
                if done >= self.args.max_samples:
                    break
        return "aborted", done


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target-loss", type=float, default=1.9)
    parser.add_argument("--eval-every", type=int, default=4096)
    parser.add_argument("--max-samples", type=int, default=400_000)
    parser.add_argument("--train-bytes", type=int, default=4_000_000)
    parser.add_argument("--val-bytes", type=int, default=65_537)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-file", default="capstone.jsonl")
    trainer = Trainer(parser.parse_args())
    status, samples = trainer.run()
    trainer.write("run_stop", status=status, samples=samples)
    dist.destroy_process_group()
